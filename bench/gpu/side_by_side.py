#!/usr/bin/env python3
"""deltaproof's kernels, fla's and the derivation's Triton kernels, on the same inputs in one process, side by side.

    bash bench/gpu/side_by_side.sh linear          # on a CUDA GPU (bench/gpu/README.md), one op per run
    PYTHONPATH=build/release/python /usr/bin/python3 bench/gpu/side_by_side.py --dry-run --out /tmp/sbs

For each op (linear, delta, gated-delta) and pass (forward, forward+backward, decode) it times
  deltaproof  through libdeltaproof_kernels.so (ctypes; bench/gpu/kernels_c_api.cpp) on the caller's
              tensors and stream, at C = 16, 32, 64;
  fla         chunk_linear_attn / chunk_delta_rule / chunk_gated_delta_rule (its own C = 64), the
              backward through autograd, decode through its fused_recurrent_* kernels;
  article     the derivation's Triton kernels (article_kernels.py in --peers) at C = 16, 32, 64,
on one set of tensors: inputs as the accuracy inputs of the design page in docs/ (q ~ N(0,1)/√D, k = normalize(N(0,1)),
v ~ N(0,1), β = sigmoid(N(0,1)), g = logsigmoid(N(0,1) + 3), dO ~ N(0,1); bf16, g fp32) at B=8, H=16,
L=4096, D=128 (decode: B=64, one token, fp32 state). deltaproof and the derivation's Triton kernels read the very same
[B, H, L, D] tensors; fla, whose layout is [B, T, H, D], reads contiguous copies of the same values
(made once, not timed), and transposed copies of the states.

Before a kernel is timed its output on one sampled head is judged against the oracle
(deltaproof.judge: verify::judge on the exact values of the inputs, derived bounds) and every output
tensor is checked finite; a kernel that fails is recorded and not timed. Timing: CUDA events around
each call, --warmup calls first, then --repeats (≥ 50) calls, median reported; --sets input sets
rotate so that a call never finds its inputs in the 50 MB L2 (each set is larger than L2).

Writes <out>/side_by_side_<ops>.json (rewritten after every kernel: a run cut short keeps what it
timed) for bench/report.py, and <out>/side_by_side_<ops>.log. --dry-run runs the whole flow on a CPU
with numpy inputs on a small shape, the oracle standing in for every kernel (rounded to bf16), the
real judge, and a probe of the ctypes signatures of libdeltaproof_kernels.so where it is built.
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OPS = ("linear", "delta", "gated-delta")
PASSES = ("forward", "forward+backward", "decode")
IMPLS = ("deltaproof", "fla", "article")
SHAPE = dict(B=8, H=16, L=4096, DK=128, DV=128)
DECODE_SHAPE = dict(B=64, H=16, T=1, DK=128, DV=128)
DRY_SHAPE = dict(B=2, H=2, L=80, DK=16, DV=12)  # L = 80: a partial last chunk at C = 32 and 64
DRY_DECODE_SHAPE = dict(B=2, H=2, T=1, DK=16, DV=12)
FLA_CHUNK = 64  # fla's chunk size (not a parameter of its API)
INPUTS_DESCRIPTION = ("accuracy inputs: q ~ N(0,1)/sqrt(DK), k = normalize(N(0,1)), v ~ N(0,1), "
                      "beta = sigmoid(N(0,1)), g = logsigmoid(N(0,1)+3), dO ~ N(0,1), decode state ~ N(0,1); bf16, "
                      "g and states fp32")
GRADIENTS = {"linear": ("q", "k", "v"), "delta": ("q", "k", "v", "beta"), "gated-delta": ("q", "k", "v", "beta", "g")}
GRADIENT_NAMES = {"q": "dq", "k": "dk", "v": "dv", "beta": "dbeta", "g": "dg"}


# ---------------------------------------------------------------------------------------------
# Backends: torch on the GPU, numpy on a CPU (dry run). Tensors are [B, H, L, D] throughout.
# ---------------------------------------------------------------------------------------------

class TorchBackend:
    dry_run = False

    def __init__(self):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        self.device = torch.device("cuda")

    def inputs(self, op, shape, seed, decode):
        torch, F = self.torch, self.F
        gen = torch.Generator(device=self.device).manual_seed(seed)
        B, H, DK, DV = shape["B"], shape["H"], shape["DK"], shape["DV"]
        L = shape["T"] if decode else shape["L"]

        def randn(*size):
            return torch.randn(*size, generator=gen, device=self.device, dtype=torch.float32)

        bf16 = torch.bfloat16
        x = dict(q=(randn(B, H, L, DK) / math.sqrt(DK)).to(bf16), k=F.normalize(randn(B, H, L, DK), dim=-1).to(bf16),
                 v=randn(B, H, L, DV).to(bf16))
        if op != "linear":
            x["beta"] = torch.sigmoid(randn(B, H, L)).to(bf16)
        if op == "gated-delta":
            x["g"] = F.logsigmoid(randn(B, H, L) + 3)
        if decode:
            x["h0"] = randn(B, H, DV, DK)
        else:
            x["do"] = randn(B, H, L, DV).to(bf16)
        return x

    def head(self, t, b, h):
        """One (batch, head) slice as an exact float32 numpy array, dims kept."""
        return t[b:b + 1, h:h + 1].detach().float().cpu().numpy()

    def all_finite(self, t):
        return bool(self.torch.isfinite(t).all().item())

    def relative_difference(self, a, b):
        a, b = a.detach().double(), b.detach().double()
        return float((a - b).norm() / b.norm())

    def keep(self, t):
        return t.detach().clone()

    def time(self, calls, repeats, warmup):
        torch = self.torch
        for i in range(warmup):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for i in range(repeats):
            call = calls[(i + warmup) % len(calls)]
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)  # ms -> µs
        return times

    def context(self):
        torch = self.torch
        import triton
        props = torch.cuda.get_device_properties(0)
        clocks = "?"
        try:
            clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,"
                                     "power.draw", "--format=csv,noheader"], capture_output=True, text=True,
                                    timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            clocks = f"nvidia-smi failed: {e}"
        return dict(torch=torch.__version__, triton=triton.__version__,
                    gpu=dict(name=props.name, sms=props.multi_processor_count,
                             memory_gib=round(props.total_memory / 2 ** 30, 1),
                             clocks=f"SM, max SM, memory, temperature, power: {clocks}"))


class NumpyBackend:
    """The dry run: numpy arrays instead of CUDA tensors, wall-clock time instead of CUDA events."""
    dry_run = True

    def __init__(self):
        import deltaproof
        self.round_to_bf16 = deltaproof.round_to_bf16

    def inputs(self, op, shape, seed, decode):
        rng = np.random.default_rng(seed)
        B, H, DK, DV = shape["B"], shape["H"], shape["DK"], shape["DV"]
        L = shape["T"] if decode else shape["L"]
        bf16 = self.round_to_bf16
        k = rng.standard_normal((B, H, L, DK))
        x = dict(q=bf16(rng.standard_normal((B, H, L, DK)) / math.sqrt(DK)),
                 k=bf16(k / np.linalg.norm(k, axis=-1, keepdims=True)), v=bf16(rng.standard_normal((B, H, L, DV))))
        if op != "linear":
            x["beta"] = bf16(1 / (1 + np.exp(-rng.standard_normal((B, H, L)))))
        if op == "gated-delta":
            x["g"] = (-np.logaddexp(0, -(rng.standard_normal((B, H, L)) + 3))).astype(np.float32)
        if decode:
            x["h0"] = rng.standard_normal((B, H, DV, DK)).astype(np.float32)
        else:
            x["do"] = bf16(rng.standard_normal((B, H, L, DV)))
        return x

    def head(self, t, b, h):
        return np.ascontiguousarray(t[b:b + 1, h:h + 1])

    def all_finite(self, t):
        return bool(np.isfinite(t).all())

    def relative_difference(self, a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    def keep(self, t):
        return np.array(t, copy=True)

    def time(self, calls, repeats, warmup):
        for i in range(warmup):
            calls[i % len(calls)]()
        times = []
        for i in range(repeats):
            t0 = time.perf_counter()
            calls[(i + warmup) % len(calls)]()
            times.append((time.perf_counter() - t0) * 1e6)
        return times

    def context(self):
        return dict(torch="none (dry run)", triton="none (dry run)", gpu=dict(name="none (dry run on a CPU)", clocks="—"))


# ---------------------------------------------------------------------------------------------
# deltaproof's kernels through ctypes
# ---------------------------------------------------------------------------------------------

class Kernels:
    """libdeltaproof_kernels.so. Calls name their arguments; LAYOUTS puts them in the C order (the dry
    run's probe checks that order against the library's own validator). A non-zero return raises
    with the library's message."""
    # Argument names in the order of the C functions (kernels_c_api.cpp), the required pointers, and
    # whether the validator checks every required pointer for null before any device check.
    LAYOUTS = {
        "deltaproof_linear_attention_forward": (
            ("batch", "heads", "length", "key_dim", "value_dim", "chunk_size"),
            ("q", "k", "v", "output", "initial_state", "final_state", "stream"), {"q", "k", "v", "output"}, True),
        "deltaproof_linear_attention_backward": (
            ("batch", "heads", "length", "key_dim", "value_dim", "chunk_size"),
            ("q", "k", "v", "d_output", "dq", "dk", "dv", "initial_state", "d_final_state", "d_initial_state", "stream"),
            {"q", "k", "v", "d_output", "dq", "dk", "dv"}, True),
        "deltaproof_linear_attention_decode": (
            ("batch", "heads", "tokens", "key_dim", "value_dim"),
            ("q", "k", "v", "output", "initial_state", "final_state", "stream"), {"q", "k", "v", "output", "final_state"}, True),
        "deltaproof_delta_rule_forward": (
            ("batch", "heads", "length", "key_dim", "value_dim", "chunk_size"),
            ("q", "k", "v", "beta", "log_gate", "initial_state", "output", "final_state", "workspace", "saved", "stream"),
            {"q", "k", "v", "beta", "output", "final_state", "workspace"}, True),
        "deltaproof_delta_rule_backward": (
            ("batch", "heads", "length", "key_dim", "value_dim", "chunk_size"),
            ("q", "k", "v", "beta", "log_gate", "d_output", "dq", "dk", "dv", "d_beta", "d_log_gate", "initial_state",
             "d_final_state", "d_initial_state", "workspace", "saved", "stream"),
            {"q", "k", "v", "beta", "d_output", "dq", "dk", "dv", "d_beta", "workspace"}, True),
        "deltaproof_delta_rule_decode": (
            ("batch", "heads", "tokens", "key_dim", "value_dim"),
            ("q", "k", "v", "beta", "log_gate", "initial_state", "output", "final_state", "stream"),
            {"q", "k", "v", "beta", "output", "final_state"}, True),
    }

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.deltaproof_kernels_last_error.restype = ctypes.c_char_p
        for name, (int_names, pointer_names, _, _) in self.LAYOUTS.items():
            function = getattr(self.lib, name)
            function.argtypes = [ctypes.c_char_p] + [ctypes.c_int] * len(int_names) + [ctypes.c_void_p] * len(pointer_names)
            function.restype = ctypes.c_int
        for pass_ in ("forward_workspace", "backward_workspace", "saved"):
            function = getattr(self.lib, f"deltaproof_delta_rule_{pass_}_bytes")
            function.argtypes = [ctypes.c_char_p] + [ctypes.c_int] * 6 + [ctypes.POINTER(ctypes.c_size_t)]
            function.restype = ctypes.c_int

    def delta_rule_bytes(self, buffer, dtype, batch, heads, length, key_dim, value_dim, chunk_size):
        """Bytes of a buffer of deltaproof_delta_rule_*: "forward_workspace", "backward_workspace" or "saved"
        (what a training forward keeps for the backward)."""
        size = ctypes.c_size_t()
        code = getattr(self.lib, f"deltaproof_delta_rule_{buffer}_bytes")(
            dtype, batch, heads, length, key_dim, value_dim, chunk_size, ctypes.byref(size))
        if code != 0:
            raise RuntimeError(f"{buffer} bytes: {self.lib.deltaproof_kernels_last_error().decode()} (code {code})")
        return size.value

    def __call__(self, name, dtype, **arguments):
        int_names, pointer_names, _, _ = self.LAYOUTS[name]
        unknown = set(arguments) - set(int_names) - set(pointer_names)
        if unknown:
            raise TypeError(f"{name}: unknown arguments {sorted(unknown)}")
        values = [arguments[n] for n in int_names] + [arguments.get(n) for n in pointer_names]
        code = getattr(self.lib, name)(dtype, *values)
        if code != 0:
            raise RuntimeError(f"{name}: {self.lib.deltaproof_kernels_last_error().decode()} (code {code})")

    def probe(self):
        """The dry run's check of the ctypes signatures without a GPU: the library's validator names the
        argument it rejects, so each integer made invalid in turn, a bad dtype and each required pointer
        made null in turn must be rejected under that argument's name, and valid sizes with host
        pointers (apart: an output may overlap nothing) must stop at the first device-pointer check (q)."""
        spacing = 4096  # bytes per pointer, past every extent of the valid sizes below
        host = np.zeros(spacing * 16 // 4, np.float32)
        valid = dict(batch=1, heads=1, length=8, tokens=1, key_dim=4, value_dim=4, chunk_size=16)
        invalid = dict(batch=0, heads=0, length=0, tokens=0, key_dim=0, value_dim=0, chunk_size=48)
        failures, calls = [], 0

        def expect(name, dtype, ints, pointers, wanted):
            int_names, pointer_names = self.LAYOUTS[name][:2]
            nonlocal calls
            calls += 1
            try:
                self(name, dtype, **dict(zip(int_names, ints)), **dict(zip(pointer_names, pointers)))
                message = "ran on host pointers"
            except RuntimeError as e:
                message = str(e)
            if f"{name}: {wanted}" not in message:
                failures.append(f"{name}: expected '{wanted}', got '{message}'")

        for name, (int_names, pointer_names, required, nulls_first) in self.LAYOUTS.items():
            ints = [valid[n] for n in int_names]
            pointers = [ctypes.c_void_p(host.ctypes.data + spacing * i) if n in required else None
                        for i, n in enumerate(pointer_names)]
            expect(name, b"bf8", ints, pointers, "dtype:")
            for i, n in enumerate(int_names):
                expect(name, b"bf16", ints[:i] + [invalid[n]] + ints[i + 1:], pointers, f"{n}:")
            expect(name, b"bf16", ints, pointers, "q: must be a device pointer")
            for i, n in enumerate(pointer_names):
                if n in required and (nulls_first or i == 0):
                    expect(name, b"bf16", ints, pointers[:i] + [None] + pointers[i + 1:], f"{n}: must not be null")
        return dict(ok=not failures, calls=calls, failures=failures)


def ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


# ---------------------------------------------------------------------------------------------
# The kernels, each as build(backend, inputs, C) -> run(), run() -> outputs as [B, H, L, D] views
# ---------------------------------------------------------------------------------------------

def _dims(x):
    B, H, L, DK = x["q"].shape
    return B, H, L, DK, x["v"].shape[-1]


def deltaproof_builder(op, pass_, kernels):
    def build(bk, x, C):
        torch = bk.torch
        B, H, L, DK, DV = _dims(x)
        sizes = dict(batch=B, heads=H, key_dim=DK, value_dim=DV, **{"tokens" if pass_ == "decode" else "length": L})
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for name, t in x.items():
            if t.data_ptr() % 16:
                raise ValueError(f"{name}: not 16-byte aligned (the tensor-core paths need it)")
        o = torch.empty_like(x["v"])
        if pass_ == "decode":
            state = x["h0"].clone()  # updated in place, as in bench_*_cuda; x["h0"] stays for the others

            def run():
                if op == "linear":
                    kernels("deltaproof_linear_attention_decode", b"bf16", **sizes, q=ptr(x["q"]), k=ptr(x["k"]),
                            v=ptr(x["v"]), output=ptr(o), initial_state=ptr(state), final_state=ptr(state), stream=stream)
                else:
                    kernels("deltaproof_delta_rule_decode", b"bf16", **sizes, q=ptr(x["q"]), k=ptr(x["k"]),
                            v=ptr(x["v"]), beta=ptr(x["beta"]), log_gate=ptr(x.get("g")), initial_state=ptr(state),
                            output=ptr(o), final_state=ptr(state), stream=stream)
                return dict(o=o, ht=state)
            return run
        ht = torch.empty(B, H, DV, DK, device=x["q"].device, dtype=torch.float32)
        if op == "linear":
            grads = [torch.empty_like(x[n]) for n in ("q", "k", "v")] if pass_ == "forward+backward" else None

            def run():
                kernels("deltaproof_linear_attention_forward", b"bf16", **sizes, chunk_size=C, q=ptr(x["q"]),
                        k=ptr(x["k"]), v=ptr(x["v"]), output=ptr(o), final_state=ptr(ht), stream=stream)
                out = dict(o=o, ht=ht)
                if grads:
                    kernels("deltaproof_linear_attention_backward", b"bf16", **sizes, chunk_size=C, q=ptr(x["q"]),
                            k=ptr(x["k"]), v=ptr(x["v"]), d_output=ptr(x["do"]), dq=ptr(grads[0]), dk=ptr(grads[1]),
                            dv=ptr(grads[2]), stream=stream)
                    out.update(dq=grads[0], dk=grads[1], dv=grads[2])
                return out
            return run
        def buffer(name):  # torch's allocator aligns to 512 bytes
            return torch.empty(kernels.delta_rule_bytes(name, b"bf16", **sizes, chunk_size=C),
                               dtype=torch.uint8, device=x["q"].device)
        forward_workspace = buffer("forward_workspace")  # W and U
        saved = None
        if pass_ == "forward+backward":  # a training step: the forward keeps T, W and U for the backward
            backward_workspace = buffer("backward_workspace")
            saved = buffer("saved")
            grads = {n: torch.empty_like(x[n]) for n in GRADIENTS[op]}  # dg in g's fp32, the rest bf16

        def run():
            kernels("deltaproof_delta_rule_forward", b"bf16", **sizes, chunk_size=C, q=ptr(x["q"]), k=ptr(x["k"]),
                    v=ptr(x["v"]), beta=ptr(x["beta"]), log_gate=ptr(x.get("g")), output=ptr(o), final_state=ptr(ht),
                    workspace=ptr(forward_workspace), saved=ptr(saved), stream=stream)
            out = dict(o=o, ht=ht)
            if pass_ == "forward+backward":  # the backward reads what the forward kept, recomputes the rest
                kernels("deltaproof_delta_rule_backward", b"bf16", **sizes, chunk_size=C, q=ptr(x["q"]), k=ptr(x["k"]),
                        v=ptr(x["v"]), beta=ptr(x["beta"]), log_gate=ptr(x.get("g")), d_output=ptr(x["do"]),
                        dq=ptr(grads["q"]), dk=ptr(grads["k"]), dv=ptr(grads["v"]), d_beta=ptr(grads["beta"]),
                        d_log_gate=ptr(grads.get("g")), workspace=ptr(backward_workspace), saved=ptr(saved),
                        stream=stream)
                out.update({GRADIENT_NAMES[n]: g for n, g in grads.items()})
            return out
        return run
    return build


def fla_builder(op, pass_, lift_hopper_guard=False):
    def build(bk, x, C):
        torch = bk.torch
        # fla's layout: tokens before heads, states key-by-value; copies of the same values, made once.
        t = {n: x[n].transpose(1, 2).contiguous() for n in ("q", "k", "v", "beta", "g", "do") if n in x}
        if pass_ == "decode":
            from fla.ops.delta_rule import fused_recurrent_delta_rule
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
            from fla.ops.linear_attn import fused_recurrent_linear_attn
            h0 = x["h0"].transpose(-1, -2).contiguous()

            def run():
                with torch.no_grad():
                    if op == "linear":
                        o, ht = fused_recurrent_linear_attn(t["q"], t["k"], t["v"], scale=1.0, initial_state=h0,
                                                            output_final_state=True, normalize=False)
                    elif op == "delta":
                        o, ht = fused_recurrent_delta_rule(t["q"], t["k"], t["v"], t["beta"], scale=1.0,
                                                           initial_state=h0, output_final_state=True)
                    else:
                        o, ht = fused_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"],
                                                                 scale=1.0, initial_state=h0, output_final_state=True)
                return dict(o=o.transpose(1, 2), ht=ht.transpose(-1, -2))
            return run
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.linear_attn import chunk_linear_attn
        import fla.ops.common.chunk_o as fla_chunk_o
        backward = pass_ == "forward+backward"
        leaves = {n: t[n].detach().requires_grad_(backward) for n in GRADIENTS[op]}

        def forward():
            q, k, v = leaves["q"], leaves["k"], leaves["v"]
            if op == "linear":
                return chunk_linear_attn(q, k, v, scale=1.0, output_final_state=True, normalize=False)
            if op == "delta":
                return chunk_delta_rule(q, k, v, leaves["beta"], scale=1.0, output_final_state=True)
            return chunk_gated_delta_rule(q, k, v, leaves["g"], leaves["beta"], scale=1.0, output_final_state=True)

        def run():
            guard = fla_chunk_o.IS_NVIDIA_HOPPER
            fla_chunk_o.IS_NVIDIA_HOPPER = guard and not lift_hopper_guard
            try:
                if not backward:
                    with torch.no_grad():
                        o, ht = forward()
                    return dict(o=o.transpose(1, 2), ht=ht.transpose(-1, -2))
                o, ht = forward()
                names = GRADIENTS[op]
                grads = torch.autograd.grad(o, [leaves[n] for n in names], t["do"])
            finally:
                fla_chunk_o.IS_NVIDIA_HOPPER = guard
            out = dict(o=o.detach().transpose(1, 2), ht=ht.detach().transpose(-1, -2))
            out.update({GRADIENT_NAMES[n]: g.transpose(1, 2) for n, g in zip(names, grads)})
            return out
        return run
    return build


def article_builder(op, pass_):
    def build(bk, x, C):
        import article_kernels as article
        if pass_ == "decode":
            def run():
                o, ht = article.linear_recurrent(x["q"], x["k"], x["v"], x["h0"])
                return dict(o=o, ht=ht)
            return run
        if op == "delta":
            def run():
                return dict(o=article.delta_chunk(x["q"], x["k"], x["v"], x["beta"], chunk_size=C))
            return run

        def run():
            o, h, ht = article.linear_chunk_forward(x["q"], x["k"], x["v"], C)
            out = dict(o=o, ht=ht)
            if pass_ == "forward+backward":
                dq, dk, dv = article.linear_chunk_backward(x["q"], x["k"], x["v"], h, x["do"], C)
                out.update(dq=dq, dk=dk, dv=dv)
            return out
        return run
    return build


def standin_builder(op, pass_):
    """Dry run: the oracle (deltaproof.reference_kernel, double) rounded as a bf16 kernel stores."""
    import deltaproof
    oracle = deltaproof.reference_kernel("chunkwise")

    def build(bk, x, C):
        def run():
            args = {n: np.asarray(v, np.float64) for n, v in x.items() if pass_ == "forward+backward" or n != "do"}
            args.update(op=op, layout="bhld", chunk_size=C or FLA_CHUNK, scale=1.0)
            out = oracle(args)
            keep = {"o", "ht"} | ({"dq", "dk", "dv", "dbeta", "dg"} if pass_ == "forward+backward" else set())
            return {n: (deltaproof.round_to_bf16(v) if n in ("o", "dq", "dk", "dv", "dbeta") else np.float32(v))
                    for n, v in out.items() if n in keep and v is not None}
        return run
    return build


class Entry:
    def __init__(self, op, pass_, impl, chunk_size, kernel, build):
        self.op, self.pass_, self.impl, self.chunk_size, self.kernel, self.build = op, pass_, impl, chunk_size, kernel, build


def entries(a, kernels):
    """Every (op, pass, implementation, C) the run covers, with its kernel's name and builder."""
    out = []
    cs = a.chunk_sizes
    real = not a.dry_run

    def add(op, pass_, impl, C, kernel, build):
        if op in a.ops and pass_ in a.passes and impl in a.impls:
            out.append(Entry(op, pass_, impl, C, kernel, build if real else standin_builder(op, pass_)))

    fla_names = {"linear": "chunk_linear_attn", "delta": "chunk_delta_rule", "gated-delta": "chunk_gated_delta_rule"}
    fla_decode = {"linear": "fused_recurrent_linear_attn", "delta": "fused_recurrent_delta_rule",
                  "gated-delta": "fused_recurrent_gated_delta_rule"}
    dp_names = {"linear": "deltaproof_linear_attention", "delta": "deltaproof_delta_rule",
                "gated-delta": "deltaproof_delta_rule (log-gates)"}
    for op in OPS:
        for pass_ in ("forward", "forward+backward"):
            for C in cs:
                add(op, pass_, "deltaproof", C, dp_names[op] + ("_forward + _backward" if pass_ != "forward" else "_forward"),
                    deltaproof_builder(op, pass_, kernels))
            add(op, pass_, "fla", FLA_CHUNK, fla_names[op] + (" + autograd backward" if pass_ != "forward" else ""),
                fla_builder(op, pass_))
            if op == "gated-delta" and pass_ == "forward+backward" and a.lift_hopper_guard:
                add(op, pass_, "fla (Hopper guard lifted)", FLA_CHUNK, fla_names[op] + " + autograd backward, "
                    "fla.ops.common.chunk_o.IS_NVIDIA_HOPPER = False", fla_builder(op, pass_, lift_hopper_guard=True))
            if op == "linear" or (op == "delta" and pass_ == "forward"):
                names = {"forward": "linear_chunk_forward", "forward+backward": "linear_chunk_forward + linear_chunk_backward"}
                for C in cs:
                    add(op, pass_, "article", C, "delta_chunk" if op == "delta" else names[pass_], article_builder(op, pass_))
        add(op, "decode", "deltaproof", None, dp_names[op] + "_decode", deltaproof_builder(op, "decode", kernels))
        add(op, "decode", "fla", None, fla_decode[op], fla_builder(op, "decode"))
        if op == "linear":
            add(op, "decode", "article", None, "linear_recurrent", article_builder(op, "decode"))
    return out


# ---------------------------------------------------------------------------------------------
# Checking and timing
# ---------------------------------------------------------------------------------------------

def check(bk, op, pass_, x, outputs, head, judge):
    """verify::judge on one sampled head (exact values of its inputs) and finiteness of everything."""
    b, h = head
    wanted = {"q", "k", "v", "beta", "g"} | ({"do"} if pass_ == "forward+backward" else set()) | \
             ({"h0"} if pass_ == "decode" else set())
    ins = {n: bk.head(t, b, h) for n, t in x.items() if n in wanted}
    outs = {n: bk.head(t, b, h) for n, t in outputs.items()}
    t0 = time.time()
    verdict = judge(op, ins, outs, layout="bhld", dtype="bf16", scale=1.0)
    tensors = {}
    for c in verdict.comparisons:
        norm = float(np.linalg.norm(np.asarray(outs[c["tensor"]], np.float64)))
        rms = c.get("rms")
        tensors[c["tensor"]] = dict(ratio=c.get("ratio"), error=c.get("error"), bound=c.get("bound"),
                                    max_abs=c.get("max_abs"), rms=rms, agrees=c.get("agrees"),
                                    rel_l2=(rms * math.sqrt(c["count"]) / norm) if rms is not None and norm > 0 else None)
    finite = all(bk.all_finite(t) for t in outputs.values())
    return dict(head=[b, h], agrees=bool(verdict.agrees and finite), all_finite=finite, tensors=tensors,
                judge_seconds=round(time.time() - t0, 2), table=str(verdict))


def median_summary(times):
    s = sorted(times)
    return dict(median_us=statistics.median(s), min_us=s[0], p10_us=s[len(s) // 10], p90_us=s[(9 * len(s)) // 10],
                times_us=[round(t, 3) for t in times])


def ratios(records):
    """deltaproof over each peer, from records of this run: at deltaproof's fastest C, and per C."""
    out = []
    timed = [r for r in records if r["status"] == "timed"]
    for op in OPS:
        for pass_ in PASSES:
            group = [r for r in timed if r["op"] == op and r["pass"] == pass_]
            ours = [r for r in group if r["impl"] == "deltaproof"]
            if not ours:
                continue
            best = min(ours, key=lambda r: r["median_us"])
            name = lambda r: f"{r['impl']}" + (f" (C={r['chunk_size']})" if r.get("chunk_size") else "")  # noqa: E731
            for impl in [i for i in IMPLS if i != "deltaproof"] + ["fla (Hopper guard lifted)"]:
                peers = [r for r in group if r["impl"] == impl]
                if not peers:
                    continue
                fastest = min(peers, key=lambda r: r["median_us"])
                out.append(dict(op=op, **{"pass": pass_}, numerator=name(best), denominator=name(fastest),
                                ratio=best["median_us"] / fastest["median_us"], compares="fastest against fastest"))
                for r in ours:  # and at equal C, where the peer has that C
                    for peer in peers:
                        if peer.get("chunk_size") == r.get("chunk_size") and not (r is best and peer is fastest):
                            out.append(dict(op=op, **{"pass": pass_}, numerator=name(r), denominator=name(peer),
                                            ratio=r["median_us"] / peer["median_us"], compares="equal C"))
    return out


def sampled_heads(seed, shape, decode_shape):
    """The (batch, head) judged for the training passes and for decode: drawn from the seed."""
    rng = np.random.default_rng(seed)
    return ([int(rng.integers(shape["B"])), int(rng.integers(shape["H"]))],
            [int(rng.integers(decode_shape["B"])), int(rng.integers(decode_shape["H"]))])


def run_all(a, bk, kernels, entry_list, log, write):
    import deltaproof
    shape, decode_shape = (DRY_SHAPE, DRY_DECODE_SHAPE) if a.dry_run else (SHAPE, DECODE_SHAPE)
    head, decode_head = sampled_heads(a.seed, shape, decode_shape)
    records, start = [], time.time()
    inputs = {}  # (op, decode) -> list of input sets, made once per op and shared by every kernel
    first_o = {}  # (op, pass) -> the first passing kernel's full o, for the whole-tensor comparison
    for e in entry_list:
        decode = e.pass_ == "decode"
        s = decode_shape if decode else shape
        rec = dict(op=e.op, **{"pass": e.pass_}, impl=e.impl, kernel=e.kernel, chunk_size=e.chunk_size, dtype="bf16",
                   shape=s, status="?")
        records.append(rec)
        if time.time() - start > a.budget_s:
            rec.update(status="skipped", error=f"time budget of {a.budget_s:.0f} s spent")
            log(f"== {e.op} {e.pass_} {e.impl}{f' C={e.chunk_size}' if e.chunk_size else ''}: skipped (budget)")
            write(records)
            continue
        t0 = time.time()
        try:
            key = (e.op, decode)
            if key not in inputs:
                inputs[key] = [bk.inputs(e.op, s, a.seed + 1000 * i, decode) for i in range(a.sets)]
            calls = [e.build(bk, x, e.chunk_size) for x in inputs[key]]
            outputs = calls[0]()
            rec["check"] = check(bk, e.op, e.pass_, inputs[key][0], outputs, decode_head if decode else head,
                                 deltaproof.judge)
            if "o" in first_o.get((e.op, e.pass_), {}):
                rec["o_vs_first"] = dict(of=first_o[(e.op, e.pass_)]["name"],
                                         relative_l2=bk.relative_difference(outputs["o"], first_o[(e.op, e.pass_)]["o"]))
            if not rec["check"]["agrees"]:
                rec["status"] = "check failed"
                log(f"== {e.op} {e.pass_} {e.impl}{f' C={e.chunk_size}' if e.chunk_size else ''}: CHECK FAILED, not timed\n{rec['check']['table']}")
            else:
                first_o.setdefault((e.op, e.pass_), dict(name=f"{e.impl} C={e.chunk_size}", o=bk.keep(outputs["o"])))
                del outputs
                rec.update(median_summary(bk.time(calls, a.repeats, a.warmup)), repeats=a.repeats, warmup=a.warmup,
                           input_sets=a.sets, status="timed")
                worst = max((t["ratio"] or 0) for t in rec["check"]["tensors"].values())
                log(f"== {e.op} {e.pass_} {e.impl}{f' C={e.chunk_size}' if e.chunk_size else ''}: {rec['median_us']:.1f} µs (median of {a.repeats}); "
                    f"oracle check on head {rec['check']['head']}: agrees, worst err/bound {worst:.2g}")
        except Exception as ex:  # recorded; the next kernel still runs
            rec.update(status="raised", error=f"{type(ex).__name__}: {ex}", traceback=traceback.format_exc())
            log(f"== {e.op} {e.pass_} {e.impl}{f' C={e.chunk_size}' if e.chunk_size else ''}: raised {type(ex).__name__}: {ex}")
        rec["seconds"] = round(time.time() - t0, 1)
        write(records)
    return records


def main(argv=None, override=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated: linear, delta, gated-delta")
    p.add_argument("--passes", default=",".join(PASSES), help="comma-separated: forward, forward+backward, decode")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated: deltaproof, fla, article")
    p.add_argument("--chunk-sizes", default="16,32,64", help="deltaproof's and the derivation's chunk sizes")
    p.add_argument("--repeats", type=int, default=60, help="timed calls per kernel (at least 50 on a GPU)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (fla autotunes in the first)")
    p.add_argument("--sets", type=int, default=3, help="input sets rotated between calls (L2 is 50 MB)")
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--budget-s", type=float, default=540, help="skip (and record) what is left once this much time has gone")
    p.add_argument("--peers", default=os.environ.get("DELTAPROOF_PEERS") or os.path.join(ROOT, ".peers"),
                   help="folder holding fla/ and article_kernels.py (default $DELTAPROOF_PEERS, else .peers)")
    p.add_argument("--kernels-lib", default=os.environ.get("DELTAPROOF_KERNELS_LIB") or
                   os.path.join(ROOT, "build", "release", "bench", "gpu", "libdeltaproof_kernels.so"))
    p.add_argument("--lift-hopper-guard", action="store_true",
                   help="also run fla's gated backward with its Hopper guard lifted (checked before it is timed)")
    p.add_argument("--out", default=os.environ.get("OUT", "side_by_side_out"))
    p.add_argument("--dry-run", action="store_true", help="CPU only: numpy inputs, the oracle as every kernel")
    a = p.parse_args(argv)
    a.ops = [s for s in a.ops.split(",") if s]
    a.passes = [s for s in a.passes.split(",") if s]
    a.impls = [s for s in a.impls.split(",") if s]
    a.chunk_sizes = [int(c) for c in a.chunk_sizes.split(",") if c]
    for name, given, allowed in (("--ops", a.ops, OPS), ("--passes", a.passes, PASSES), ("--impls", a.impls, IMPLS)):
        bad = [g for g in given if g not in allowed]
        if bad:
            p.error(f"{name}: unknown {', '.join(bad)} (allowed: {', '.join(allowed)})")
    if not a.dry_run and a.repeats < 50:
        p.error("--repeats: at least 50 on a GPU (the median of >= 50 runs)")
    if a.sets < 2:
        p.error("--sets: at least 2, so that inputs rotate")
    if a.lift_hopper_guard:
        a.impls.append("fla (Hopper guard lifted)")

    os.makedirs(a.out, exist_ok=True)
    tag = "_".join(o.replace("-", "_") for o in a.ops)
    if set(a.passes) != set(PASSES):  # a call split by pass keeps its own file name
        tag += "_" + "_".join(p_.replace("+", "_") for p_ in a.passes)
    tag += "_dry_run" if a.dry_run else ""
    json_path = os.path.join(a.out, f"side_by_side_{tag}.json")
    log_file = open(os.path.join(a.out, f"side_by_side_{tag}.log"), "a", buffering=1)

    def log(line):
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} {line}", flush=True)
        log_file.write(f"{stamp} {line}\n")

    sys.path.insert(0, os.path.abspath(a.peers))
    import deltaproof
    bk = NumpyBackend() if a.dry_run else TorchBackend()
    kernels, probe = None, None
    if os.path.exists(a.kernels_lib):
        kernels = Kernels(a.kernels_lib)
        if a.dry_run:
            probe = kernels.probe()
    elif not a.dry_run and "deltaproof" in a.impls:
        p.error(f"--kernels-lib: {a.kernels_lib} does not exist (build target deltaproof_kernels_c)")
    fla_version = "?"
    if not a.dry_run:
        try:
            import fla
            fla_version = getattr(fla, "__version__", "?")
        except ImportError as e:
            fla_version = f"not importable: {e}"
    context = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   host=socket.gethostname(), python=platform.python_version(), fla=fla_version,
                   deltaproof=os.path.dirname(deltaproof.__file__), kernels_lib=a.kernels_lib if kernels else None,
                   kernels_lib_probe=probe, dry_run=a.dry_run, shape=DRY_SHAPE if a.dry_run else SHAPE,
                   decode_shape=DRY_DECODE_SHAPE if a.dry_run else DECODE_SHAPE, seed=a.seed, repeats=a.repeats,
                   warmup=a.warmup, input_sets=a.sets, inputs=INPUTS_DESCRIPTION,
                   timing=("CUDA events around each call (torch.cuda.Event), one call per timing, median; input sets "
                           "rotated" if not a.dry_run else "dry run: time.perf_counter around each call"),
                   check=("deltaproof.judge (verify::judge) on one sampled head of the first input set, every output "
                          "tensor checked finite; rel_l2 = ||kernel - oracle|| / ||kernel|| on that head"),
                   argv=sys.argv[1:] if argv is None else list(argv), **bk.context())
    log(f"side by side: ops {a.ops}, passes {a.passes}, impls {a.impls}, C {a.chunk_sizes}; "
        f"{context['gpu']['name']}; deltaproof from {context['deltaproof']}")
    if probe is not None:
        log(f"kernels library probe: {probe['calls']} calls, {'ok' if probe['ok'] else 'FAILED: ' + '; '.join(probe['failures'])}")

    sys.path.insert(0, os.path.dirname(HERE))
    import provenance
    versions = dict(torch=context["torch"], triton=context["triton"], fla=fla_version)
    record_provenance = provenance.collect(__file__, sys.argv[1:] if argv is None else list(argv),
                                           gpu=context["gpu"]["name"], extra_versions=versions)

    def write(records):
        doc = dict(side_by_side=1, provenance=record_provenance, context=context, records=records,
                   ratios=ratios(records))
        tmp = json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, json_path)

    entry_list = entries(a, kernels)
    for e in entry_list:
        if override and (e.op, e.pass_, e.impl) in override:
            e.build = override[(e.op, e.pass_, e.impl)]
    records = run_all(a, bk, kernels, entry_list, log, write)
    write(records)
    timed = sum(r["status"] == "timed" for r in records)
    log(f"done: {timed} of {len(records)} kernels timed; {json_path}")
    return 0 if probe is None or probe["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
