"""The Python Verdict through both compiled paths (pybind11 _core and the ctypes C judge): status,
inconclusive with its premise, state_dtype, and the fields each row reports."""
import numpy as np
import pytest

from deltaproof import _backend
from deltaproof.dtypes import round_to
from deltaproof.verdict import STATUSES, judge
from production_kernels import wy_chunkwise_kernel

BACKENDS = ["c"] + (["core"] if _backend._core_module is not None else [])


def delta_case(L=20, K=1, V=1, beta=1.0, key=10.0):
    """One head, fla's layout: keys with β k² = beta·key² (100: |T| ~ 99^L, beyond every premise)."""
    rng = np.random.default_rng(4)
    q = np.full((1, L, 1, K), 0.5)
    k = np.full((1, L, 1, K), key)
    v = np.round(rng.standard_normal((1, L, 1, V)), 2)
    b = np.full((1, L, 1), beta)
    return {name: round_to(x, "bf16") for name, x in {"q": q, "k": k, "v": v, "beta": b}.items()}


def exact(inputs):
    """float64 recurrence of one head: o and the final state (fla's layout)."""
    q, k, v = (inputs[n][0, :, 0].astype(np.float64) for n in ("q", "k", "v"))
    b = inputs["beta"][0, :, 0].astype(np.float64)
    S = np.zeros((v.shape[1], k.shape[1]))
    o = np.zeros_like(v)
    for t in range(len(q)):
        S = S - b[t] * np.outer(S @ k[t], k[t]) + b[t] * np.outer(v[t], k[t])
        o[t] = S @ q[t]
    return o[None, :, None, :], S.T[None, None]


@pytest.mark.parametrize("backend", BACKENDS)
def test_outside_a_premise_is_inconclusive_with_its_measure(backend):
    inputs = delta_case()
    o, ht = exact(inputs)
    wrong = o.copy()
    wrong[0, 3, 0, 0] += 1e3 * (1 + abs(wrong[0, 3, 0, 0]))
    v = judge("delta", inputs, {"o": wrong, "ht": ht}, dtype="bf16", backend=backend)
    assert v.status == "inconclusive" and v.inconclusive and not v.agrees and not v.disagrees and not v
    assert v.status in STATUSES
    assert v.premise["measured"] > v.premise["limit"] and v.premise["reason"]
    assert v.undecided() and not v.failing()
    assert "INCONCLUSIVE" in str(v)
    # Within every premise (β k² = 1: an erase, no growth) the same wrong output disagrees.
    inputs = delta_case(beta=0.01)
    o, ht = exact(inputs)
    wrong = o.copy()
    wrong[0, 3, 0, 0] += 1e3 * (1 + abs(wrong[0, 3, 0, 0]))
    v = judge("delta", inputs, {"o": wrong, "ht": ht}, dtype="bf16", backend=backend)
    assert v.status == "disagree" and v.failing() == ["o"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_say_how_they_are_measured(backend):
    inputs = delta_case(L=9, K=4, V=3, beta=0.5, key=0.5)
    o, ht = exact(inputs)
    v = judge("delta", inputs, {"o": round_to(o, "bf16"), "ht": ht}, dtype="bf16", backend=backend)
    assert v.status == "agree" and v.agrees and bool(v)
    assert v.find("o")["norm"] == "rowwise" and v.find("ht")["norm"] == "frobenius"
    for row in v.comparisons:
        assert row["formula"] and row["status"] == "agree" and row["premise"] is None
        assert row["ratio"] == pytest.approx(row["error"] / row["bound"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dtype_keyword(backend):
    """The numpy WY kernel with a bf16 running state, a large h0 and small writes: held to fp32 it is
    caught; declared, it agrees. The fp32-state kernel agrees either way."""
    rng = np.random.default_rng(2)
    L, K, V = 256, 16, 16
    k = rng.standard_normal((1, L, 1, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    args = {"q": round_to(0.25 * rng.standard_normal((1, L, 1, K)), "bf16"), "k": round_to(k, "bf16"),
            "v": round_to(rng.standard_normal((1, L, 1, V)), "bf16"), "beta": np.full((1, L, 1), 2.0 ** -10),
            "h0": round_to(4 * rng.standard_normal((1, 1, K, V)), "fp32")}
    run = dict(args, op="delta", layout="blhd", dtype="bf16", chunk_size=16, scale=1.0, cu_seqlens=None)
    honest, bf16 = wy_chunkwise_kernel()(dict(run)), wy_chunkwise_kernel("bf16")(dict(run))
    assert judge("delta", args, honest, backend=backend).agrees
    assert judge("delta", args, honest, state_dtype="bf16", backend=backend).agrees
    held = judge("delta", args, bf16, backend=backend)
    assert held.status == "disagree" and "ht" in held.failing(), str(held)
    assert judge("delta", args, bf16, state_dtype="bf16", backend=backend).agrees


def test_an_honest_wy_kernel_is_never_rejected_on_check_kernels_cases():
    """The numpy production-style kernels (the WY chunkwise form for the delta family, fla's chunk form for
    linear attention; bf16/fp16 operands, fp32 accumulation and state) over check_kernel's default draws,
    ten seeds per op: no disagreement (the full 200-seed sweep: production_kernels.py)."""
    from production_kernels import sweep
    for seed in range(10):
        for op, result in sweep(cases=48, seed=seed).items():
            assert result["disagree"] == 0, (op, seed, result["rejected"])
