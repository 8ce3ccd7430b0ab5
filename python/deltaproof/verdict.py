"""verify::judge and verify::oracle on dicts of numpy arrays (fla's names and layouts).

Inputs:  q, k, v, beta (delta, gated-delta), g (gated-delta: log-gates ln α), h0, and the
         cotangents do, dht when gradients are judged.
Outputs: o, ht, and for the cotangents given dq, dk, dv, dbeta, dg, dh0.
Layouts: "blhd" (fla: [B, T, H, D], states [N, H, DK, DV]) or "bhld" (deltaproof: [B, H, L, D],
         states [N, H, DV, DK]); varlen packs sequences along T with B = 1 and cu_seqlens.
Values are taken exactly (float32 arrays holding bf16 values are bf16 values); ``dtype`` names the
storage type of q, k, v, beta, do and of o, dq, dk, dv, dbeta; states and log-gates (h0, ht, dht,
dh0, g, dg) are fp32 as in fla (fp64 when dtype is fp64). ``dtypes`` overrides any one of them.
"""
import json

import numpy as np

from . import _backend
from .dtypes import canonical

INPUT_NAMES = ("q", "k", "v", "beta", "g", "h0", "do", "dht")
OUTPUT_NAMES = ("o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0")
_FP32_TENSORS = {"g", "dg", "h0", "ht", "dht", "dh0"}


def tensor_dtype(name, dtype, overrides=None):
    """The storage dtype judged for tensor `name` when the kernel's inputs are `dtype`."""
    if overrides and name in overrides:
        return canonical(overrides[name])
    dtype = canonical(dtype)
    if name in _FP32_TENSORS:
        return "fp64" if dtype == "fp64" else "fp32"
    return dtype


def as_float64(x, name="tensor"):
    """An exact float64 copy of a numpy array, torch tensor (any dtype, any device) or nested list."""
    if hasattr(x, "detach"):
        x = x.detach().to("cpu")
        x = x.double() if x.is_floating_point() else x.to(dtype=__import__("torch").float64)
        return np.ascontiguousarray(x.numpy())
    a = np.asarray(x)
    if a.dtype == object:
        a = np.vectorize(float, otypes=[np.float64])(a) if a.size else a.astype(np.float64)
    if not np.issubdtype(a.dtype, np.number):
        raise TypeError(f"{name}: expected a numeric array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float64)


def _exact_array(x, name):
    """float32 and float64 numpy arrays as they are (the compiled side reads both exactly, without a
    float64 copy of a float32 array here); anything else as an exact float64 copy."""
    if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64):
        return x
    return as_float64(x, name)


def _tensors(d, names, dtype, overrides, what):
    out = {}
    for key, value in d.items():
        if value is None:
            continue
        if key not in names:
            raise ValueError(f"{key}: not an {what} name ({', '.join(names)})")
        out[key] = (_exact_array(value, key), tensor_dtype(key, dtype, overrides))
    return out


def _cu_seqlens(cu_seqlens):
    if cu_seqlens is None:
        return []
    return [int(x) for x in np.asarray(as_float64(cu_seqlens, "cu_seqlens")).reshape(-1)]


STATUSES = ("agree", "disagree", "inconclusive")


class Verdict:
    """verify::Verdict as data: ``.status`` ("agree", "disagree" or "inconclusive"), ``.agrees``,
    ``.disagrees``, ``.inconclusive``, ``.premise`` (the broken premise of the first inconclusive row:
    reason, measured, limit, text; None when none), ``.comparisons`` (one dict per tensor: tensor,
    batch, head, chunk, index, error, bound, ratio, reference, max_abs, rms, count, norm (how error and
    bound are measured: elementwise, rowwise or frobenius), formula (the bound as stated), finite,
    status, premise, agrees), ``.oracle_share``, ``.units``, ``.units_in_high``; prints as the C++ table.

    inconclusive: an error beyond its bound where the inputs lie outside a premise of that bound (the
    bound says nothing there), never a disagreement. ``bool(verdict)`` is True only for agree."""

    def __init__(self, data, table):
        self.data = data
        self.table = table

    status = property(lambda self: self.data.get("status", "agree" if self.data["agrees"] else "disagree"))
    agrees = property(lambda self: self.status == "agree")
    disagrees = property(lambda self: self.status == "disagree")
    inconclusive = property(lambda self: self.status == "inconclusive")
    premise = property(lambda self: self.data.get("premise"))
    comparisons = property(lambda self: self.data["comparisons"])
    oracle_share = property(lambda self: self.data.get("oracle_share"))
    units = property(lambda self: self.data.get("units"))
    units_in_high = property(lambda self: self.data.get("units_in_high"))

    def __bool__(self):
        return self.agrees

    def find(self, tensor):
        return next((c for c in self.comparisons if c["tensor"] == tensor), None)

    def failing(self):
        """Tensors whose rows disagree."""
        return [c["tensor"] for c in self.comparisons if c.get("status", "agree" if c["agrees"] else "disagree") == "disagree"]

    def undecided(self):
        """Tensors whose rows are inconclusive."""
        return [c["tensor"] for c in self.comparisons if c.get("status") == "inconclusive"]

    def to_json(self):
        return dict(self.data)

    def __str__(self):
        return self.table

    def __repr__(self):
        extra = f", inconclusive={self.undecided()}" if self.inconclusive else ""
        return f"Verdict(status={self.status!r}, failing={self.failing()}{extra})"


def judge(op, inputs, outputs, layout="blhd", dtype="bf16", scale=1.0, cu_seqlens=None, qk_l2norm=False,
          tf32=False, dtypes=None, threads=0, state_dtype=None, chunk_size=0, backend=None):
    """Judges a kernel's outputs against the oracle on the exact values of its inputs (verify::judge).

    op: "linear", "delta" or "gated-delta". tf32: the kernel multiplies fp32 operands in TF32 (Triton's
    tl.dot default), so fp32 is judged with operands truncated to TF32 (|δ| < 2⁻¹⁰). state_dtype: the
    running state's dtype between chunks (default fp32, fp64 for fp64 kernels); a kernel that keeps a
    bf16 or fp16 state says so ("bf16"), one that does not is held to fp32. chunk_size: the kernel's
    chunk size for the delta family's WY bounds (0: unknown, chunks of 16, 32 and 64 are covered).
    backend: "core" (pybind11) or "c" (ctypes), default whichever loads. Returns a Verdict."""
    state = None if state_dtype is None else canonical(state_dtype)
    text, table = _backend.judge(op, layout, _tensors(inputs, INPUT_NAMES, dtype, dtypes, "input"),
                                 _tensors(outputs, OUTPUT_NAMES, dtype, dtypes, "output"), float(scale),
                                 _cu_seqlens(cu_seqlens), bool(qk_l2norm), bool(tf32), int(threads), state,
                                 int(chunk_size), backend)
    return Verdict(json.loads(text), table)


def oracle(op, inputs, layout="blhd", dtype="bf16", scale=1.0, cu_seqlens=None, qk_l2norm=False, dtypes=None,
           threads=0):
    """The oracle's o, ht (and gradients when inputs hold do) in double, in the inputs' layout."""
    return _backend.core().oracle(op, layout, _tensors(inputs, INPUT_NAMES, dtype, dtypes, "input"), float(scale),
                        _cu_seqlens(cu_seqlens), bool(qk_l2norm), int(threads))
