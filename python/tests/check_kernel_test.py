"""check_kernel on the oracle itself: the project's forms in double, wrapped as a kernel, pass for
every op, forward and backward, fixed and varlen, both layouts; the drawn cases cover the regimes
the design asks for; reports print and serialise."""
import json

import numpy as np
import pytest

import deltaproof
from deltaproof.check import draw_cases, inputs_of
from numpy_kernels import numpy_kernel


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_oracle_as_kernel_passes(op):
    report = deltaproof.check_kernel(deltaproof.reference_kernel("chunkwise"), op=op, layout="blhd",
                                     dtypes=("bf16", "fp32", "fp16"), max_cases=21, seed=1)
    assert report.passed, str(report)
    assert len(report.cases) == 21
    assert any(c.case.varlen for c in report.cases) and any(c.case.backward for c in report.cases)


def test_oracle_as_kernel_passes_in_deltaproof_layout_with_scale_and_l2norm():
    report = deltaproof.check_kernel(deltaproof.reference_kernel("recurrent"), op="delta", layout="bhld",
                                     max_cases=8, seed=2, scale=0.5, qk_l2norm=True)
    assert report.passed, str(report)


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_faithful_numpy_fp32_kernel_passes(op):
    report = deltaproof.check_kernel(numpy_kernel(), op=op, dtypes=("bf16", "fp32"), max_cases=14, seed=3,
                                     backward=False)
    assert report.passed, str(report)


def test_cases_cover_the_required_regimes():
    cases = draw_cases("gated-delta", dtypes=("bf16", "fp16"), chunk_sizes=(16,), max_cases=42, seed=0)
    lengths = {n for c in cases for n in c.lengths}
    assert {1, 2, 15, 16, 17} <= lengths and any(n <= 8 for n in lengths)
    assert {c.regime for c in cases} >= {"normal", "keys_unnormalized", "beta_small", "beta_one",
                                         "gates_very_negative", "long"}
    assert any(c.varlen and 0 in c.lengths and 1 in c.lengths for c in cases)
    assert any(c.h0 for c in cases) and any(not c.h0 for c in cases)
    assert any(c.regime == "long" and c.dtype == "fp16" and c.total_length > 100 for c in cases)
    assert max(max(c.key_dim, c.value_dim) for c in cases) == 256
    dims = {d for c in cases for d in (c.key_dim, c.value_dim)}
    assert dims & {1, 15, 60, 100}


def test_inputs_are_rounded_to_the_dtype_and_deterministic():
    case = draw_cases("delta", dtypes=("bf16",), max_cases=3, seed=5)[2]
    a, b = inputs_of(case), inputs_of(case)
    for name in ("q", "k", "v", "beta"):
        np.testing.assert_array_equal(a[name], b[name])
        assert np.all(a[name].view(np.uint32) & 0xFFFF == 0), name  # bf16 values
    if "h0" in a:
        assert a["h0"].dtype == np.float32


def test_report_prints_and_serialises():
    report = deltaproof.check_kernel(numpy_kernel("lose_h0"), op="linear", max_cases=4, seed=0, backward=False)
    text = str(report)
    assert "FAILED" in text and "smallest failing case" in text
    data = json.loads(report.dumps())
    assert data["passed"] is False and data["counterexample"]["inputs"]["h0"] is not None
    assert len(data["cases"]) == 4 and "verdict" in data["cases"][0]


def test_kernel_exceptions_and_missing_outputs_fail_the_case():
    def raises(args):
        raise RuntimeError("no kernel for this shape")

    report = deltaproof.check_kernel(raises, op="linear", max_cases=2, backward=False, shrink_failures=False)
    assert not report.passed and "RuntimeError" in report.cases[0].error
    forward_only = deltaproof.reference_kernel("chunkwise")

    def no_gradients(args):
        out = forward_only({k: v for k, v in args.items() if k not in ("do", "dht")})
        return out

    report = deltaproof.check_kernel(no_gradients, op="linear", max_cases=2, backward=True, shrink_failures=False)
    assert not report.passed and "missing outputs" in report.cases[0].error


def test_judge_and_oracle_direct():
    case = draw_cases("gated-delta", dtypes=("fp32",), max_cases=1, seed=4, varlen=False)[0]
    inputs = {k: v for k, v in inputs_of(case).items() if k != "cu_seqlens"}
    outputs = deltaproof.oracle("gated-delta", inputs, dtype="fp32")
    assert set(outputs) >= {"o", "ht", "dq", "dk", "dv", "dbeta", "dg"}
    verdict = deltaproof.judge("gated-delta", inputs, outputs, dtype="fp32")
    assert verdict.agrees and verdict.find("o")["ratio"] <= 1
    broken = dict(outputs, o=outputs["o"] * 1.01)
    verdict = deltaproof.judge("gated-delta", inputs, broken, dtype="fp32")
    assert not verdict.agrees and verdict.failing() == ["o"]
    assert "DISAGREE" in str(verdict)


def test_c_judge_gives_the_same_verdict_as_the_module(monkeypatch):
    """The ctypes path (libdeltaproof_judge.so: what a Python without _core uses, e.g. on the H200)."""
    from deltaproof import _backend
    case = draw_cases("delta", dtypes=("bf16",), max_cases=3, seed=6)[2]  # varlen, backward
    inputs = {k: v for k, v in inputs_of(case).items() if k != "cu_seqlens"}
    outputs = deltaproof.reference_kernel("recurrent")(deltaproof.check.kernel_arguments(case))
    outputs["o"] = outputs["o"] * (1 + 2.0 ** -6)
    a = deltaproof.judge("delta", inputs, outputs, dtype="bf16", cu_seqlens=case.cu_seqlens)
    monkeypatch.setattr(_backend, "_core_module", None)
    b = deltaproof.judge("delta", inputs, outputs, dtype="bf16", cu_seqlens=case.cu_seqlens)
    assert a.to_json() == b.to_json() and str(a) == str(b)
    with pytest.raises(ValueError, match="shape"):
        deltaproof.judge("delta", inputs, dict(outputs, o=outputs["o"][:, :1]), dtype="bf16",
                         cu_seqlens=case.cu_seqlens)


def _truncated(x, kept_bits):
    """x (float32) with all but the first `kept_bits` mantissa bits cleared: what a tensor core does
    to an fp32 operand in TF32 (kept_bits = 10)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return (bits & np.uint32((0xFFFFFFFF << (23 - kept_bits)) & 0xFFFFFFFF)).view(np.float32)


@pytest.mark.parametrize("kept_bits, agrees", [(10, True), (8, False)])
def test_tf32_truncated_products_are_judged_as_truncation(kept_bits, agrees):
    """fla's and the article's fp32 kernels (Triton, TF32 tl.dot) truncate operands: at L = 1,
    ht = kᵀv from two truncated operands errs by up to 2·2⁻¹⁰, more than three TF32 roundings allow.
    Operands whose 15 low bits are all set are the worst case for both: TF32 must agree, 8 bits must not."""
    rng = np.random.default_rng(7)
    worst = lambda shape: (np.float32(1) + np.float32((2 ** 15 - 1) * 2.0 ** -23)) * \
        rng.choice([-1, 1], size=shape).astype(np.float32) * np.float32(2) ** rng.integers(-2, 3, size=shape)
    inputs = {"q": worst((1, 1, 1, 8)), "k": worst((1, 1, 1, 8)), "v": worst((1, 1, 1, 8))}
    outputs = deltaproof.oracle("linear", inputs, dtype="fp32")
    k, v = (_truncated(inputs[n][0, 0, 0], kept_bits).astype(np.float64) for n in ("k", "v"))
    outputs["ht"] = np.outer(k, v).astype(np.float32)[None, None]
    verdict = deltaproof.judge("linear", inputs, outputs, dtype="fp32", tf32=True)
    assert verdict.agrees == agrees, str(verdict)
    assert verdict.find("ht")["ratio"] > (0.5 if agrees else 1), str(verdict)
