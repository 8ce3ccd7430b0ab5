"""numpy <-> deltaproof._core for the oracle's three scalars.

"double" and "high" take and return float64 arrays; "exact" takes float arrays (converted exactly:
every binary float is a dyadic rational) or object arrays of fractions.Fraction, and returns object
arrays of Fraction.
"""
from fractions import Fraction

import numpy as np

SCALARS = ("double", "high", "exact")


class Result(dict):
    """A dict of named results (o, ht, dq, ...) that also reads as attributes: ``r.o``."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _fraction(x):
    if isinstance(x, Fraction):
        return x
    if isinstance(x, (int, np.integer)):
        return Fraction(int(x))
    return Fraction(float(x))  # exact: a float is a dyadic rational


def to_core(x, scalar, name="array"):
    """Converts one input for _core in the given scalar; None stays None."""
    if x is None:
        return None
    if scalar not in SCALARS:
        raise ValueError(f"scalar: expected one of {SCALARS} (got {scalar!r})")
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().double().numpy()
    a = np.asarray(x)
    if scalar == "exact":
        flat = [_fraction(e) for e in a.reshape(-1).tolist()] if a.dtype == object else \
               [Fraction(float(e)) for e in np.asarray(a, dtype=np.float64).reshape(-1)]
        return ("exact", list(a.shape), [f"{f.numerator}/{f.denominator}" for f in flat])
    if a.dtype == object:
        a = np.vectorize(float, otypes=[np.float64])(a) if a.size else a.astype(np.float64)
    if not np.issubdtype(a.dtype, np.number):
        raise TypeError(f"{name}: expected a numeric array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float64)


def from_core(obj):
    """Converts a _core result (arrays, exact tuples, lists and dicts of them) to numpy."""
    if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == "exact":
        values = np.empty(len(obj[2]), dtype=object)
        values[:] = [Fraction(s) for s in obj[2]]
        return values.reshape(tuple(obj[1]))
    if isinstance(obj, dict):
        return Result({k: from_core(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [from_core(v) for v in obj]
    return obj
