"""flash-linear-attention's functions as check_kernel kernels.

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from deltaproof.adapters import fla
    report = fla.check(chunk_gated_delta_rule, dtypes=("bf16",), max_cases=16)

fla's layout is check_kernel's "blhd": q, k [B, T, H, K], v [B, T, H, V], beta and g [B, T, H],
states [N, H, K, V] (key by value), varlen through cu_seqlens with B = 1. The adapter calls

    chunk_linear_attn(q, k, v, scale=, initial_state=, output_final_state=True, normalize=False, cu_seqlens=)
    chunk_delta_rule(q, k, v, beta=, scale=, initial_state=, output_final_state=True,
                     use_qk_l2norm_in_kernel=, cu_seqlens=)
    chunk_gated_delta_rule(q, k, v, g=, beta=, scale=, ...)          # g: log-decay per token

(the fused_chunk_* and fused_recurrent_* functions take the same names) and reads (o, final_state).
scale is always passed, None where a case asks for the function's own default (fla's 1/sqrt(K));
cu_seqlens and initial_state only when the case has them. Gradients come from torch's autograd through
deltaproof.torch_kernel, which converts the case's arrays to torch tensors exactly and back.
fla compiles and autotunes each kernel on its first call for a new shape: fix head_dims (e.g.
((64, 64),)) to keep a run to a few shapes.
"""
from ..check import check_kernel

OPS = ("linear", "delta", "gated-delta")
_SUFFIXES = (("gated_delta_rule", "gated-delta"), ("gdn", "gated-delta"), ("delta_rule", "delta"),
             ("linear_attn", "linear"))
_PREFIXES = ("chunk_", "fused_chunk_", "fused_recurrent_")


def op_of(fn):
    """check_kernel's op for one of fla's functions, from its name (chunk_gated_delta_rule ->
    "gated-delta"); ValueError for a name that is none of them (then pass op=)."""
    name = getattr(fn, "__name__", "")
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            for suffix, op in _SUFFIXES:
                if rest == suffix:
                    return op
    raise ValueError(f"{name or fn!r}: not one of fla's chunk_/fused_chunk_/fused_recurrent_ functions of "
                     f"linear_attn, delta_rule, gated_delta_rule; pass op= (one of {OPS})")


def _canonical(op):
    op = op.replace("_", "-")
    if op not in OPS:
        raise ValueError(f"op: expected one of {OPS} (got {op!r})")
    return op


def forward(fn, op=None):
    """fla's ``fn`` with torch_kernel's calling convention: forward(q, k, v, beta=None, g=None,
    initial_state=None, cu_seqlens=None, scale=1.0, qk_l2norm=False, **_) -> (o, final_state);
    scale=None is passed on as None (fla's default, 1/sqrt(K))."""
    op = _canonical(op) if op is not None else op_of(fn)

    def call(q, k, v, beta=None, g=None, initial_state=None, cu_seqlens=None, scale=1.0, qk_l2norm=False, **_):
        kwargs = {"scale": None if scale is None else float(scale), "output_final_state": True}
        if op == "linear":
            if qk_l2norm:
                raise ValueError("fla's linear attention has no use_qk_l2norm_in_kernel")
            kwargs["normalize"] = False  # chunk_ and fused_chunk_linear_attn normalise by default
        else:
            kwargs["use_qk_l2norm_in_kernel"] = bool(qk_l2norm)
            if op == "gated-delta":
                kwargs["g"] = g
            kwargs["beta"] = beta
        if initial_state is not None:
            kwargs["initial_state"] = initial_state
        if cu_seqlens is not None:
            kwargs["cu_seqlens"] = cu_seqlens
        o, final_state = fn(q, k, v, **kwargs)
        return o, final_state

    call.__name__ = getattr(fn, "__name__", "fla_kernel")
    call.op = op
    return call


def kernel(fn, op=None, device="cuda", name=None, convert=None, **torch_kernel_args):
    """check_kernel's dict-in/dict-out kernel running fla's ``fn`` on ``device``.

    convert: the wrapper from a torch forward function to a kernel (default
    deltaproof.torch_kernel); torch_kernel_args (state_dtype=, gate_dtype=, ...) go to it."""
    if convert is None:
        from ..torch_adapter import torch_kernel as convert
    call = forward(fn, op)
    k = convert(call, device=device, name=name or call.__name__, **torch_kernel_args)
    k.op = call.op
    return k


def check(fn, op=None, device="cuda", convert=None, kernel_args=None, **check_kernel_args):
    """check_kernel on fla's ``fn``: op from its name, layout "blhd", chunk_sizes (64,) (fla's
    chunk size) unless given; every other keyword goes to check_kernel, kernel_args to `kernel`."""
    k = kernel(fn, op, device=device, convert=convert, **(kernel_args or {}))
    check_kernel_args.setdefault("chunk_sizes", (64,))
    check_kernel_args.setdefault("layout", "blhd")
    return check_kernel(k, op=k.op, **check_kernel_args)
