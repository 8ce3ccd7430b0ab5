"""check_kernel on the oracle itself: the project's forms in double, wrapped as a kernel, pass for
every op, forward and backward, fixed and varlen, both layouts, every scale mode; what a kernel may
return (a dict, fla's tuple), how its errors are reported (traceback; a TypeError from the calling
convention not shrunk), arguments refused before any case runs, the time budget, progress, the
table's error measured as its bound is stated, inconclusive verdicts and the running-state keyword."""
import json

import numpy as np
import pytest

import deltaproof
from deltaproof import check, verdict as verdict_module
from deltaproof.check import draw_cases, inputs_of
from numpy_kernels import numpy_kernel
from planted_kernels import fla_tuple_kernel


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_oracle_as_kernel_passes_at_the_defaults(op):
    report = deltaproof.check_kernel(deltaproof.reference_kernel("chunkwise"), op=op)
    assert report.passed, str(report)
    assert len(report.cases) == check.DEFAULT_MAX_CASES and report.counts["agree"] == len(report.cases)
    assert report.coverage[0] == report.coverage[1]
    modes = {c.case.scale_mode for c in report.cases}
    assert modes == {"one", "inv_sqrt_k", "random", "default"}


@pytest.mark.parametrize("op,seed", [("linear", 1), ("delta", 2), ("gated-delta", 3)])
def test_oracle_as_kernel_passes_at_other_seeds_and_dtypes(op, seed):
    report = deltaproof.check_kernel(deltaproof.reference_kernel("chunkwise"), op=op,
                                     dtypes=("bf16", "fp16", "fp32"), max_cases=24, seed=seed)
    assert report.passed, str(report)


def test_oracle_as_kernel_passes_in_deltaproof_layout_with_scale_and_l2norm():
    report = deltaproof.check_kernel(deltaproof.reference_kernel("recurrent"), op="delta", layout="bhld",
                                     max_cases=8, seed=2, scale=0.5, qk_l2norm=True)
    assert report.passed, str(report)
    assert all(c.case.kernel_scale == 0.5 for c in report.cases)


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_faithful_numpy_fp32_kernel_passes(op):
    report = deltaproof.check_kernel(numpy_kernel(), op=op, max_cases=16, seed=3, backward=False)
    assert report.passed, str(report)


def test_a_kernel_may_return_flas_tuple():
    report = deltaproof.check_kernel(fla_tuple_kernel(deltaproof.reference_kernel("chunkwise")), op="gated-delta",
                                     max_cases=10, seed=4)
    assert report.passed, str(report)
    assert any(c.case.backward and c.case.h0 for c in report.cases)
    too_long = lambda args: (0,) * 9
    report = deltaproof.check_kernel(too_long, op="gated-delta", max_cases=1, shrink_failures=False)
    assert report.cases[0].error_kind == "outputs rejected" and "at most 8" in report.cases[0].error


def test_a_kernel_that_does_not_take_scale_none_is_told_so_and_not_shrunk():
    reference = deltaproof.reference_kernel("chunkwise")

    def needs_a_number(args):
        scale = float(args["scale"])  # TypeError on None
        return reference(dict(args, scale=scale))

    report = deltaproof.check_kernel(needs_a_number, op="linear", max_cases=12, seed=0)
    assert not report.passed
    default = [c for c in report.cases if c.case.scale_mode == "default"]
    assert default and all(c.status == "error" and c.error_kind == "calling convention" for c in default)
    assert all(c.passed for c in report.cases if c.case.scale_mode != "default")
    assert report.shrink_steps == 0 and report.counterexample is report.first_failure
    text = str(report)
    assert "scale=None" in text and "K^-1/2" in text and "not shrunk" in text
    assert "float(args[\"scale\"])" in text  # the kernel's own traceback
    report = deltaproof.check_kernel(needs_a_number, op="linear", max_cases=12, seed=0, scale=0.25)
    assert report.passed, str(report)


def test_kernel_exceptions_and_missing_outputs_fail_the_case():
    def raises(args):
        raise RuntimeError("no kernel for this shape")

    report = deltaproof.check_kernel(raises, op="linear", max_cases=2, backward=False, shrink_failures=False)
    assert not report.passed and "RuntimeError" in report.cases[0].error
    assert report.cases[0].error_kind == "raised" and "no kernel for this shape" in report.cases[0].traceback
    assert "Traceback" in str(report)
    forward_only = deltaproof.reference_kernel("chunkwise")

    def no_gradients(args):
        return forward_only({k: v for k, v in args.items() if k not in ("do", "dht")})

    report = deltaproof.check_kernel(no_gradients, op="linear", max_cases=3, shrink_failures=False)
    assert not report.passed
    assert any(c.error and "missing outputs" in c.error for c in report.cases)


def test_a_disagreement_does_not_shrink_into_a_refusal():
    """A kernel that refuses small head dims and has a planted bug: shrinking stays with the bug."""
    buggy = numpy_kernel("mask_off_by_one")

    def refuses_small_dims(args):
        if args["q"].shape[-1] < 8:
            raise NotImplementedError("head dim below 8")
        return buggy(args)

    report = deltaproof.check_kernel(refuses_small_dims, op="linear", max_cases=8, seed=5, backward=False,
                                     head_dims=(8, 16, 64), stop_on_failure=True)
    cx = report.counterexample
    assert cx.status == "disagree" and cx.case.key_dim == 8, str(report)


@pytest.mark.parametrize("kwargs,named", [
    (dict(op="deltanet"), "op"), (dict(layout="bthd"), "layout"), (dict(dtypes=("bf16", "int8")), "dtypes"),
    (dict(dtypes=()), "dtypes"), (dict(head_dims=(64, 0)), "head_dims"), (dict(head_dims=((64, 64, 64),)), "head_dims"),
    (dict(chunk_sizes=(64, 0)), "chunk_sizes"), (dict(chunk_sizes=(16.5,)), "chunk_sizes"),
    (dict(regimes=("spiky",)), "regimes"), (dict(scale="fla"), "scale"), (dict(state_dtype="int8"), "state_dtype"),
    (dict(max_cases=0), "max_cases"), (dict(expect=("o", "y")), "expect"), (dict(time_budget_s=-1), "time_budget_s"),
])
def test_arguments_are_refused_before_any_case_runs(kwargs, named):
    calls = []
    with pytest.raises(ValueError, match=f"^{named}: expected"):
        deltaproof.check_kernel(lambda args: calls.append(1), **kwargs)
    assert not calls


def test_time_budget_covers_shrinking_and_the_report_says_what_it_cut():
    import time
    slow_bug = numpy_kernel("mask_off_by_one")

    def kernel(args):
        time.sleep(0.05)
        return slow_bug(args)

    report = deltaproof.check_kernel(kernel, op="linear", backward=False, max_cases=30, time_budget_s=0.5)
    assert report.cases_not_run > 0 and report.stopped_by == "time budget"
    assert report.shrink_stopped_by == "time budget" and report.seconds < 3
    text = str(report)
    assert "cases not run: time budget of 0.5 s spent" in text and "shrinking stopped by time budget" in text
    report = deltaproof.check_kernel(kernel, op="linear", backward=False, max_cases=2, max_shrink_steps=3)
    assert report.shrink_stopped_by == "max_shrink_steps" and report.shrink_steps == 3


def test_progress_is_quiet_under_pytest_and_shown_when_asked(monkeypatch, capsys):
    kernel = deltaproof.reference_kernel("chunkwise")
    deltaproof.check_kernel(kernel, op="linear", max_cases=2, backward=False)
    assert capsys.readouterr().err == ""
    lines = []
    deltaproof.check_kernel(kernel, op="linear", max_cases=2, backward=False, progress=True, log=lines.append)
    err = capsys.readouterr().err
    assert "[1/2]" in err and "[2/2]" in err and len(lines) == 2


def test_the_table_states_each_error_as_its_bound_is_stated():
    """Delta rule: o's bound is on a row's 2-norm, ht's on the state's Frobenius norm."""
    reference = deltaproof.reference_kernel("chunkwise")

    def off(args):
        out = reference(args)
        out["ht"] = out["ht"] * (1 + 2.0 ** -4)
        return out

    report = deltaproof.check_kernel(off, op="delta", max_cases=1, backward=False, varlen=False, seed=1,
                                     shrink_failures=False)
    c = report.cases[0]
    ht = c.verdict.find("ht")
    assert c.worst_row()["tensor"] == "ht"
    row = report.rows()[0]
    assert row["norm"] == "‖·‖F" and row["worst_error"] == ht["error"] and row["worst_bound"] == ht["bound"]
    table = report.verdict_table(c)
    ht_line = next(line for line in table.splitlines() if line.split()[0] == "ht")
    assert "‖·‖F" in ht_line and f"{ht['error']:.3g}" in ht_line and f"{ht['bound']:.3g}" in ht_line
    o_line = next(line for line in table.splitlines() if line.split()[0] == "o")
    assert "row‖·‖₂" in o_line


def test_inconclusive_verdicts_are_counted_apart(monkeypatch):
    """A judge that marks some cases outside a bound's premise (a reason and a measured quantity)."""
    real = verdict_module.judge

    def judge(*args, **kwargs):
        v = real(*args, **kwargs)
        if kwargs["dtype"] == "fp32":  # as the judge states a broken premise: the verdict's status, the row's
            v.data["status"] = "inconclusive"
            premise = {"reason": "growth", "measured": 3.5e9, "limit": 1.0, "text": "growth = 3.5e+09 > 1"}
            v.data["comparisons"][0].update(status="inconclusive", agrees=False, premise=premise)
        return v

    monkeypatch.setattr(check, "judge", judge)
    report = deltaproof.check_kernel(deltaproof.reference_kernel("chunkwise"), op="linear", max_cases=6,
                                     backward=False)
    n = report.counts
    assert n["inconclusive"] == sum(c.case.dtype == "fp32" for c in report.cases) > 0
    assert n["agree"] == len(report.cases) - n["inconclusive"] and n["disagree"] == n["error"] == 0
    assert report.passed and not report.failures
    text = str(report)
    assert "inconclusive (outside a bound's premise)" in text and "o: growth = 3.5e+09 > 1" in text


def test_an_honest_case_is_agree_with_no_reasons():
    case = draw_cases("delta", dtypes=("bf16",), max_cases=3, seed=6)[2]
    result = check.run_case(deltaproof.reference_kernel("chunkwise"), case)
    assert result.verdict.data["status"] == "agree" and result.status == "agree" and result.reasons == ()


def test_state_dtype_reaches_the_judge_in_sixteen_bit_cases_only(monkeypatch):
    seen = []
    real = verdict_module.judge

    def judge(op, inputs, outputs, state_dtype=None, **kwargs):
        seen.append((kwargs["dtype"], state_dtype))
        return real(op, inputs, outputs, **kwargs)

    monkeypatch.setattr(check, "judge", judge)
    report = deltaproof.check_kernel(deltaproof.reference_kernel("chunkwise"), op="linear", max_cases=6,
                                     backward=False, state_dtype="bf16")
    assert report.passed and {d for d, _ in seen} == {"bf16", "fp32"}
    assert all((s == "bf16") == (d == "bf16") for d, s in seen)
    assert all(c.case.state_dtype == "bf16" for c in report.cases)
    seen.clear()
    deltaproof.check_kernel(deltaproof.reference_kernel("chunkwise"), op="linear", max_cases=4, backward=False)
    assert all(s is None for _, s in seen)


def test_inputs_are_rounded_to_the_dtype_and_deterministic():
    case = next(c for c in draw_cases("delta", dtypes=("bf16",), seed=5) if c.h0)
    a, b = inputs_of(case), inputs_of(case)
    for name in ("q", "k", "v", "beta"):
        np.testing.assert_array_equal(a[name], b[name])
        assert np.all(a[name].view(np.uint32) & 0xFFFF == 0), name  # bf16 values
    assert a["h0"].dtype == np.float32


def test_report_prints_and_serialises():
    report = deltaproof.check_kernel(numpy_kernel("lose_h0"), op="linear", max_cases=4, seed=0, backward=False)
    text = str(report)
    assert "FAILED" in text and "smallest failing case" in text
    assert "pairs of attribute values covered by the cases run" in text
    data = json.loads(report.dumps())
    assert data["passed"] is False and data["counterexample"]["inputs"]["h0"] is not None
    assert len(data["cases"]) == 4 and "verdict" in data["cases"][0] and data["counts"]["disagree"] > 0
    assert data["cases"][0]["case"]["scale_mode"] in check.SCALE_MODES
    rebuilt = check.Case(**dict(data["cases"][0]["case"], lengths=tuple(data["cases"][0]["case"]["lengths"])))
    assert rebuilt == report.cases[0].case


def test_judge_and_oracle_direct():
    # Normal regimes: every premise of the bounds holds, so a 1 % error in o is a disagreement (keys far off the
    # unit sphere can make it inconclusive instead: the fp32 solve's premise).
    case = draw_cases("gated-delta", dtypes=("fp32",), max_cases=1, seed=4, varlen=False, backward=True,
                      regimes=("normal",))[0]
    case = check.dataclasses.replace(case, backward=True, dht=True)
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
    case = next(c for c in draw_cases("delta", dtypes=("bf16",), seed=6) if c.varlen and c.backward)
    inputs = {k: v for k, v in inputs_of(case).items() if k != "cu_seqlens"}
    outputs = deltaproof.reference_kernel("recurrent")(deltaproof.check.kernel_arguments(case))
    outputs["o"] = outputs["o"] * (1 + 2.0 ** -6)
    scale = case.judged_scale
    a = deltaproof.judge("delta", inputs, outputs, dtype="bf16", cu_seqlens=case.cu_seqlens, scale=scale)
    monkeypatch.setattr(_backend, "_core_module", None)
    b = deltaproof.judge("delta", inputs, outputs, dtype="bf16", cu_seqlens=case.cu_seqlens, scale=scale)
    assert a.to_json() == b.to_json() and str(a) == str(b)
    with pytest.raises(ValueError, match="shape"):
        deltaproof.judge("delta", inputs, dict(outputs, o=outputs["o"][:, :1]), dtype="bf16",
                         cu_seqlens=case.cu_seqlens, scale=scale)


def _truncated(x, kept_bits):
    """x (float32) with all but the first `kept_bits` mantissa bits cleared: what a tensor core does
    to an fp32 operand in TF32 (kept_bits = 10)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return (bits & np.uint32((0xFFFFFFFF << (23 - kept_bits)) & 0xFFFFFFFF)).view(np.float32)


@pytest.mark.parametrize("kept_bits, agrees", [(10, True), (8, False)])
def test_tf32_truncated_products_are_judged_as_truncation(kept_bits, agrees):
    """fla's and the derivation's Triton kernels in fp32 (TF32 tl.dot) truncate operands: at L = 1,
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
