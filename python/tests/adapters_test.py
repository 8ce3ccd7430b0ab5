"""deltaproof.adapters.fla without torch or a GPU.

fla's functions are replaced by numpy functions with fla 0.5.2's exact signatures (checked against
fla's source when the peers folder is present) and fla's conventions (scale defaults to 1/sqrt(K),
no final state unless output_final_state, chunk_/fused_chunk_linear_attn normalise unless
normalize=False, g before beta), computed by the float32 chunkwise kernel of numpy_kernels.py. torch
is replaced by a numpy stand-in of what deltaproof.torch_kernel calls (forward only), so the
adapter runs through the real torch_kernel. Gradients through fla and torch run on the GPU machine.
"""
import ast
import inspect
import os
import sys
import types

import numpy as np
import pytest

from deltaproof.adapters import fla
from deltaproof.dtypes import round_to
from numpy_kernels import numpy_kernel

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS = os.environ.get("DELTAPROOF_PEERS", os.path.join(REPO, "..", "shared", "peers"))


# ---------------------------------------------------------------------------------------------
# A numpy stand-in for the part of torch that torch_kernel uses

class _Dtype(str):
    pass


_STORAGE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


class FakeTensor(np.ndarray):
    """float64 values already rounded to `storage` (what a torch tensor of that dtype holds)."""

    def __array_finalize__(self, obj):
        self.storage = getattr(obj, "storage", "fp64")

    def to(self, *args, device=None, dtype=None):
        for a in args:
            if isinstance(a, _Dtype):
                dtype = a
        return self if dtype is None else _tensor(np.asarray(self), dtype)

    def requires_grad_(self, flag=True):
        return self

    def detach(self):
        return self

    def numpy(self):
        return np.asarray(self)


def _tensor(x, dtype):
    if dtype == "long":
        t = np.array(x, dtype=np.int64).view(FakeTensor)
        t.storage = "int64"
        return t
    storage = _STORAGE[dtype]
    t = np.array(round_to(np.asarray(x, dtype=np.float64), storage), dtype=np.float64).view(FakeTensor)
    t.storage = storage
    return t


def _fake_torch():
    torch = types.ModuleType("torch")
    for name in list(_STORAGE) + ["long"]:
        setattr(torch, name, _Dtype(name))
    torch.from_numpy = lambda a: np.array(a, dtype=np.float64).view(FakeTensor)
    torch.as_tensor = lambda x, dtype=None, device=None: _tensor(x, dtype)

    def grad(*args, **kwargs):
        raise NotImplementedError("the numpy stand-in for torch has no autograd")

    torch.autograd = types.SimpleNamespace(grad=grad)
    torch.cuda = types.SimpleNamespace(synchronize=lambda: None)
    return torch


@pytest.fixture
def fake_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())


# ---------------------------------------------------------------------------------------------
# fla's functions in numpy, with fla 0.5.2's signatures

_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def _fla(op, q, k, v, beta=None, g=None, scale=None, initial_state=None, output_final_state=False, normalize=False,
         l2norm=False, cu_seqlens=None, bug=None):
    f32 = np.float32
    qn, kn = np.asarray(q, f32), np.asarray(k, f32)
    if l2norm:  # fla's l2norm: x / sqrt(|x|^2 + 1e-6), in float32
        qn = qn / np.sqrt((qn * qn).sum(-1, keepdims=True) + f32(1e-6))
        kn = kn / np.sqrt((kn * kn).sum(-1, keepdims=True) + f32(1e-6))
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    args = {"op": op, "layout": "blhd", "dtype": q.storage, "chunk_size": 64, "scale": scale, "q": qn, "k": kn,
            "v": np.asarray(v, f32), "cu_seqlens": None if cu_seqlens is None else np.asarray(cu_seqlens)}
    for name, x in (("beta", beta), ("g", g), ("h0", initial_state)):
        if x is not None:
            args[name] = np.asarray(x, f32)
    out = numpy_kernel(bug)(args)
    o = out["o"]
    if normalize:  # divided by <q_t, sum of keys so far>, as fla's normalised linear attention
        o = o / ((qn * scale * np.cumsum(kn, axis=1)).sum(-1, keepdims=True) + 1e-10)
    return _tensor(o, _NAMES[q.storage]), (_tensor(out["ht"], "float32") if output_final_state else None)


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True,
                      cu_seqlens=None):
    return _fla("linear", q, k, v, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                normalize=normalize, cu_seqlens=cu_seqlens)


def fused_chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True,
                            cu_seqlens=None):
    return _fla("linear", q, k, v, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                normalize=normalize, cu_seqlens=cu_seqlens)


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, reverse=False,
                                normalize=False, cu_seqlens=None):
    assert not reverse
    return _fla("linear", q, k, v, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                normalize=normalize, cu_seqlens=cu_seqlens)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    return _fla("delta", q, k, v, beta=beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, l2norm=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)


def fused_recurrent_delta_rule(q, k, v, beta=None, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    return _fla("delta", q, k, v, beta=beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, l2norm=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    assert not (use_beta_sigmoid_in_kernel or allow_neg_eigval or state_v_first)
    return _fla("gated-delta", q, k, v, beta=beta, g=g, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, l2norm=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, **kwargs):
    assert gk is None and gv is None and not (use_gate_in_kernel or use_beta_sigmoid_in_kernel or allow_neg_eigval
                                              or state_v_first)
    return _fla("gated-delta", q, k, v, beta=beta, g=g, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, l2norm=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)


FAKES = [chunk_linear_attn, fused_chunk_linear_attn, fused_recurrent_linear_attn, chunk_delta_rule,
         fused_recurrent_delta_rule, chunk_gated_delta_rule, fused_recurrent_gated_delta_rule]
SOURCES = {"chunk_linear_attn": "linear_attn/chunk.py", "fused_chunk_linear_attn": "linear_attn/fused_chunk.py",
           "fused_recurrent_linear_attn": "linear_attn/fused_recurrent.py", "chunk_delta_rule": "delta_rule/chunk.py",
           "fused_recurrent_delta_rule": "delta_rule/fused_recurrent.py",
           "chunk_gated_delta_rule": "gated_delta_rule/chunk.py",
           "fused_recurrent_gated_delta_rule": "gated_delta_rule/fused_recurrent.py"}
ids = [f.__name__ for f in FAKES]


def _real_signature(name):
    """(parameter names, their defaults as source text, takes **kwargs) of fla's function."""
    path = os.path.join(PEERS, "fla", "ops", SOURCES[name])
    if not os.path.isfile(path):
        pytest.skip(f"fla's source not found ({path}; set DELTAPROOF_PEERS)")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    a = node.args
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    return ([x.arg for x in a.args], [None if d is None else ast.unparse(d) for d in defaults], a.kwarg is not None)


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fake", FAKES, ids=ids)
def test_the_stand_ins_have_flas_signatures(fake):
    names, defaults, var_kwargs = _real_signature(fake.__name__)
    params = inspect.signature(fake).parameters
    mine = [p for p in params.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    assert [p.name for p in mine] == names
    assert [None if p.default is inspect.Parameter.empty else repr(p.default) for p in mine] == defaults
    assert any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()) == var_kwargs


@pytest.mark.parametrize("fake", FAKES, ids=ids)
@pytest.mark.parametrize("varlen,h0,l2norm", [(False, False, False), (True, True, False), (False, True, True)])
def test_every_keyword_passed_is_a_named_parameter_of_fla(fake, varlen, h0, l2norm):
    """fla's chunk functions also take **kwargs: a misspelt keyword would vanish there silently."""
    op = fla.op_of(fake)
    if op == "linear" and l2norm:
        pytest.skip("linear attention has no qk l2norm")
    names, _, _ = _real_signature(fake.__name__)
    seen = {}

    def record(q, k, v, **kwargs):
        seen.update(positional=(q, k, v), **kwargs)
        return "o", "ht"

    record.__name__ = fake.__name__
    forward = fla.forward(record)
    forward("q", "k", "v", beta="beta" if op != "linear" else None, g="g" if op == "gated-delta" else None,
            initial_state="h0" if h0 else None, cu_seqlens="cu" if varlen else None, scale=1.0, qk_l2norm=l2norm,
            chunk_size=64)
    assert names[:3] == ["q", "k", "v"] and seen.pop("positional") == ("q", "k", "v")
    assert set(seen) <= set(names), f"not parameters of fla's {fake.__name__}: {sorted(set(seen) - set(names))}"
    assert seen["output_final_state"] is True and seen["scale"] == 1.0
    assert ("initial_state" in seen) == h0 and ("cu_seqlens" in seen) == varlen
    if op == "linear":
        assert seen["normalize"] is False
    else:
        assert seen["beta"] == "beta" and seen["use_qk_l2norm_in_kernel"] is l2norm
    if op == "gated-delta":
        assert seen["g"] == "g"


def test_op_of_reads_flas_names():
    assert [fla.op_of(f) for f in FAKES] == ["linear"] * 3 + ["delta"] * 2 + ["gated-delta"] * 2

    def chunk_gdn():
        pass

    def fused_chunk_delta_rule():
        pass

    def chunk_gla():
        pass

    assert fla.op_of(chunk_gdn) == "gated-delta" and fla.op_of(fused_chunk_delta_rule) == "delta"
    with pytest.raises(ValueError, match="pass op="):
        fla.op_of(chunk_gla)
    assert fla.forward(chunk_gla, op="gated_delta").op == "gated-delta"


def test_linear_attention_refuses_qk_l2norm():
    with pytest.raises(ValueError, match="l2norm"):
        fla.forward(chunk_linear_attn)(None, None, None, qk_l2norm=True)


@pytest.mark.parametrize("fake", FAKES, ids=ids)
def test_flas_functions_pass_check_kernel_through_the_adapter(fake, fake_torch):
    report = fla.check(fake, device="cpu", dtypes=("bf16", "fp32"), max_cases=9, seed=3, backward=False,
                       head_dims=((16, 16), (15, 60)))
    assert report.passed, str(report)
    assert report.kernel_name == fake.__name__ and report.settings["op"] == fla.op_of(fake)
    assert any(c.case.varlen for c in report.cases) and any(c.case.h0 for c in report.cases)


def test_qk_l2norm_reaches_fla(fake_torch):
    report = fla.check(chunk_gated_delta_rule, device="cpu", dtypes=("bf16",), max_cases=4, seed=5, backward=False,
                       head_dims=((16, 16),), qk_l2norm=True)
    assert report.passed, str(report)
    # a kernel that leaves the keys unnormalised does not pass the same cases
    def unnormalised(q, k, v, g, beta, use_qk_l2norm_in_kernel=False, **kwargs):
        return chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)

    unnormalised.__name__ = "chunk_gated_delta_rule"
    assert not fla.check(unnormalised, device="cpu", dtypes=("bf16",), max_cases=4, seed=5, backward=False,
                         head_dims=((16, 16),), qk_l2norm=True, shrink_failures=False).passed


@pytest.mark.parametrize("fake,dropped", [(chunk_delta_rule, "output_final_state"), (chunk_gated_delta_rule, "scale"),
                                          (chunk_linear_attn, "normalize"), (fused_recurrent_delta_rule,
                                                                             "initial_state")])
def test_each_keyword_the_adapter_passes_matters(fake, dropped, fake_torch):
    """The same function with one of the adapter's keywords dropped on the way fails: each keyword
    the adapter sets changes what fla computes, and check_kernel sees it."""
    def without(*args, **kwargs):
        kwargs.pop(dropped, None)
        return fake(*args, **kwargs)

    without.__name__ = fake.__name__
    report = fla.check(without, device="cpu", dtypes=("fp32",), max_cases=6, seed=3, backward=False,
                       head_dims=((16, 16),), shrink_failures=False)
    assert not report.passed, str(report)


def test_a_bug_in_an_fla_signature_function_is_caught_and_shrunk(fake_torch):
    def buggy(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
        return _fla("gated-delta", q, k, v, beta=beta, g=g, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, cu_seqlens=kwargs.get("cu_seqlens"), bug="gate_wrong_token")

    buggy.__name__ = "chunk_gated_delta_rule"
    report = fla.check(buggy, device="cpu", dtypes=("fp32",), max_cases=8, seed=11, backward=False,
                       head_dims=((16, 16), (4, 4)), stop_on_failure=True)
    assert not report.passed
    assert report.counterexample.case.tokens <= 4, str(report)


def test_kernel_takes_another_converter():
    calls = []

    def convert(forward, device, name, **kwargs):
        calls.append((forward.op, device, name, kwargs))
        return lambda args: {}

    k = fla.kernel(chunk_delta_rule, device="cuda:1", convert=convert, state_dtype="fp32")
    assert k.op == "delta" and calls == [("delta", "cuda:1", "chunk_delta_rule", {"state_dtype": "fp32"})]
