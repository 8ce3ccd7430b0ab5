"""Storage dtypes of kernel tensors and exact rounding to them in numpy.

numpy has no bfloat16: values are rounded to bf16 by bit manipulation of their float32 encoding
(round to nearest, ties to even, exactly as a cast to torch.bfloat16 does) and kept in float32
arrays, which hold every bf16 number exactly.
"""
import numpy as np

DTYPES = ("bf16", "fp16", "fp32", "fp64")
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "f16": "fp16", "float32": "fp32",
            "float": "fp32", "f32": "fp32", "float64": "fp64", "double": "fp64", "f64": "fp64"}

UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24, "fp64": 2.0 ** -53}


def canonical(dtype):
    """'bf16', 'fp16', 'fp32' or 'fp64' for any common spelling (torch dtypes included)."""
    name = str(dtype).replace("torch.", "")
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES} (got {dtype!r})")
    return name


def round_to_bf16(x):
    """x rounded to bfloat16, round to nearest, ties to even, as a float32 array (which holds every
    bf16 value exactly). float32 input is rounded on its bit pattern (what a cast to torch.bfloat16
    does); float64 input is rounded once, directly (no double rounding through float32)."""
    a = np.asarray(x)
    if a.dtype == np.float64:
        return _round_float64_to_bf16(a)
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32).copy()
    out[np.isnan(f)] = np.nan
    return out


def _round_float64_to_bf16(a):
    a = np.ascontiguousarray(a, dtype=np.float64)
    bits = a.view(np.uint64)
    lsb = (bits >> np.uint64(45)) & np.uint64(1)
    rounded = ((bits + np.uint64(2 ** 44 - 1) + lsb) >> np.uint64(45)) << np.uint64(45)
    out = rounded.view(np.float64)
    tiny = np.abs(a) < 2.0 ** -126  # bf16 subnormals: a fixed grid of 2^-133
    if tiny.any():
        out = out.copy()
        out[tiny] = np.round(a[tiny] * 2.0 ** 133) * 2.0 ** -133
    with np.errstate(over="ignore"):
        result = out.astype(np.float32)
    result[np.isnan(a)] = np.nan
    return result


def round_to(x, dtype):
    """x rounded to the storage dtype, returned in the narrowest numpy type that holds it exactly
    (float32 for bf16)."""
    dtype = canonical(dtype)
    if dtype == "bf16":
        return round_to_bf16(x)
    if dtype == "fp16":
        return np.asarray(x, dtype=np.float64).astype(np.float16)
    if dtype == "fp32":
        return np.asarray(x, dtype=np.float64).astype(np.float32)
    return np.asarray(x, dtype=np.float64)


def is_representable(x, dtype):
    """True where every entry of x is exactly a value of dtype."""
    x = np.asarray(x, dtype=np.float64)
    return bool(np.array_equal(np.asarray(round_to(x, dtype), dtype=np.float64), x, equal_nan=True))
