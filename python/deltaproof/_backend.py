"""Where the compiled code comes from.

deltaproof._core (pybind11) is built for one Python version (Debian's 3.11 here). Where it does not
import (the H200 machine runs Python 3.12), verify::judge is still reachable through
libdeltaproof_judge.so, a plain C interface loaded with ctypes (any Python 3), shipped beside it
with the GMP and MPFR libraries it needs. The oracle's forms need _core.
"""
import ctypes
import json
import os

import numpy as np

try:
    from . import _core as _core_module
    _core_error = None
except ImportError as e:  # wrong Python version, or not built: the C judge may still load
    _core_module, _core_error = None, e

_here = os.path.dirname(os.path.abspath(__file__))
_clib = None


def core():
    """The pybind11 extension, or ImportError saying why it is missing."""
    if _core_module is None:
        raise ImportError(f"deltaproof._core is not importable here ({_core_error}); the oracle's forms need it. "
                          "verify::judge is still available through libdeltaproof_judge.so.") from _core_error
    return _core_module


def _c_library():
    global _clib
    if _clib is None:
        lib = ctypes.CDLL(os.path.join(_here, "libdeltaproof_judge.so"))
        lib.deltaproof_judge.restype = ctypes.c_void_p
        lib.deltaproof_judge.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_long]
        lib.deltaproof_free.argtypes = [ctypes.c_void_p]
        _clib = lib
    return _clib


def judge(op, layout, inputs, outputs, scale, cu_seqlens, qk_l2norm, tf32, threads, state_dtype=None, chunk_size=0,
          backend=None):
    """(verdict JSON text, table text): through _core, else through the C library (backend: "core" or
    "c" to choose)."""
    if backend not in (None, "core", "c"):
        raise ValueError(f"backend: expected 'core' or 'c' (got {backend!r})")
    if backend == "core" or (backend is None and _core_module is not None):
        return core().judge(op, layout, inputs, outputs, scale, cu_seqlens, qk_l2norm, tf32, threads, state_dtype,
                            chunk_size)
    return _c_judge(op, layout, inputs, outputs, scale, cu_seqlens, qk_l2norm, tf32, threads, state_dtype, chunk_size)


def _c_judge(op, layout, inputs, outputs, scale, cu_seqlens, qk_l2norm, tf32, threads, state_dtype=None, chunk_size=0):
    arrays = []

    def describe(tensors):
        out = {}
        for name, (array, dtype) in tensors.items():
            a = np.ascontiguousarray(array, dtype=np.float64)
            out[name] = {"shape": list(a.shape), "dtype": dtype, "index": len(arrays)}
            arrays.append(a)
        return out

    request = {"op": op, "layout": layout, "scale": scale, "cu_seqlens": list(cu_seqlens), "qk_l2norm": qk_l2norm,
               "tf32": tf32, "threads": threads, "state_dtype": state_dtype, "chunk_size": chunk_size,
               "inputs": describe(inputs), "outputs": describe(outputs)}
    pointers = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
    lib = _c_library()
    raw = lib.deltaproof_judge(json.dumps(request).encode(), pointers, len(arrays))
    try:
        reply = json.loads(ctypes.string_at(raw).decode())
    finally:
        lib.deltaproof_free(raw)
    if "error" in reply:
        raise ValueError(reply["error"])
    return json.dumps(reply["verdict"]), reply["table"]
