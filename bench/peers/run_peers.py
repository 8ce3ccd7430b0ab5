#!/usr/bin/env python3
"""check_kernel on kernels nobody on this project wrote, on a CUDA GPU: flash-linear-attention's
chunk_linear_attn, chunk_delta_rule, chunk_gated_delta_rule (forward and backward; bf16, fp32 judged
as TF32 products, and one fp32 run judged as true fp32; fixed length and varlen; the gated backward
also with fla's Hopper guard lifted) and the derivation's Triton kernels (forward).

    PYTHONPATH=build/release/python python3 bench/peers/run_peers.py --peers <peers folder> --out OUT \
        [--max-cases 16] [--only fla_delta]
    ... run_peers.py --set audit --max-cases 50 --only audit_fused_recurrent_delta_rule_bf16 --out OUT

The audit set (--set audit) is every one of fla's linear attention, DeltaNet and Gated DeltaNet functions
(chunk_*, fused_chunk_linear_attn, fused_recurrent_*) through deltaproof.adapters.fla, one configuration per
function and dtype (bf16, fp16; fixed and varlen cases drawn together; forward and backward where fla has a
backward; DeltaNet and Gated DeltaNet also with use_qk_l2norm_in_kernel=True), at one head-dim pair so that
Triton compiles few shapes: a run per configuration (--only) fits a time-limited machine. Records go to
OUT/audit_fla.json.

Writes OUT/run_peers.log (progress, flushed per case), one JSON file per kernel family
(fla_linear.json, fla_delta.json, fla_gated_delta.json, article.json: {"provenance": date, commit, GPU,
versions and command of the run; "configurations": configuration name -> its settings, start date,
status and check_kernel's report, or the exception it raised}; rewritten as each configuration
finishes) and OUT/summary.json (the same provenance, one line per configuration). fla autotunes each
kernel on its first call for a new shape (minutes): the cases use chunk size 64 (fla's) and two
head-dim pairs only. A configuration that raises is recorded and the run goes on. Needs torch,
triton, numpy and an importable deltaproof (see python/README.md).
"""
import argparse
import datetime
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import provenance  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", default=os.environ.get("DELTAPROOF_PEERS") or os.path.join(ROOT, "..", "shared", "peers"),
                   help="the folder holding fla/ and article_kernels.py (default $DELTAPROOF_PEERS, else ../shared/peers)")
    p.add_argument("--out", default=os.environ.get("OUT", "peers_out"), help="output folder")
    p.add_argument("--max-cases", type=int, default=16, help="cases per configuration")
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--only", default="", help="comma-separated substrings: run the matching configurations only")
    p.add_argument("--budget-s", type=float, default=500,
                   help="stop drawing cases and skip configurations once this much time has gone")
    p.add_argument("--max-shrink-steps", type=int, default=40)
    p.add_argument("--set", choices=("peers", "audit"), default="peers",
                   help="peers: the configurations above; audit: every fla function of the three families")
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: the oracle stands in for every kernel (a guarded gated backward raises as fla's does)")
    a = p.parse_args()

    os.makedirs(a.out, exist_ok=True)
    log_file = open(os.path.join(a.out, "run_peers.log"), "a", buffering=1)

    def log(line):
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} {line}", flush=True)
        log_file.write(f"{stamp} {line}\n")
        log_file.flush()

    sys.path.insert(0, os.path.abspath(a.peers))
    import deltaproof

    if a.dry_run:  # the script's plumbing on a CPU: the oracle stands in for every peer kernel
        import types
        fla_chunk_o = types.SimpleNamespace(IS_NVIDIA_HOPPER=True)

        def stand_in(name):  # a function named as fla's: the adapter takes the op from the name
            def f(*args, **kwargs):
                raise NotImplementedError("dry run")
            f.__name__ = name
            return f
        (chunk_linear_attn, fused_chunk_linear_attn, fused_recurrent_linear_attn, chunk_delta_rule,
         fused_recurrent_delta_rule, chunk_gated_delta_rule, fused_recurrent_gated_delta_rule) = map(stand_in, (
            "chunk_linear_attn", "fused_chunk_linear_attn", "fused_recurrent_linear_attn", "chunk_delta_rule",
            "fused_recurrent_delta_rule", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"))
        log(f"dry run, deltaproof from {os.path.dirname(deltaproof.__file__)}")
    else:
        import torch
        log(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}, deltaproof from "
            f"{os.path.dirname(deltaproof.__file__)}")
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        from fla.ops.linear_attn import chunk_linear_attn, fused_chunk_linear_attn, fused_recurrent_linear_attn
        import article_kernels as article

    hopper_guard = fla_chunk_o.IS_NVIDIA_HOPPER

    # fla's functions with deltaproof's keyword names; layout [B, T, H, D], states [N, H, K, V].
    def fla_linear(q, k, v, initial_state=None, cu_seqlens=None, scale=1.0, **_):
        return chunk_linear_attn(q, k, v, scale=scale, initial_state=initial_state, output_final_state=True,
                                 normalize=False, cu_seqlens=cu_seqlens)

    def fla_delta(q, k, v, beta, initial_state=None, cu_seqlens=None, scale=1.0, qk_l2norm=False, **_):
        return chunk_delta_rule(q, k, v, beta, scale=scale, initial_state=initial_state, output_final_state=True,
                                use_qk_l2norm_in_kernel=qk_l2norm, cu_seqlens=cu_seqlens)

    def fla_gated(q, k, v, beta, g, initial_state=None, cu_seqlens=None, scale=1.0, qk_l2norm=False, **_):
        return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                      output_final_state=True, use_qk_l2norm_in_kernel=qk_l2norm,
                                      cu_seqlens=cu_seqlens)

    # The derivation's Triton kernels: layout [B, H, L, D], states [B, H, DV, DK], no scale.
    def article_linear_chunk(q, k, v, chunk_size=64, **_):
        o, _boundary, ht = article.linear_chunk_forward(q.contiguous(), k.contiguous(), v.contiguous(), chunk_size)
        return o, ht

    def article_linear_recurrent(q, k, v, initial_state=None, **_):
        h0 = None if initial_state is None else initial_state.contiguous()
        return article.linear_recurrent(q.contiguous(), k.contiguous(), v.contiguous(), h0)

    def article_delta_chunk(q, k, v, beta, chunk_size=64, **_):
        return article.delta_chunk(q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(),
                                   chunk_size=chunk_size), None

    fla_dims = ((64, 64), (60, 100))
    common = dict(max_cases=a.max_cases, seed=a.seed, max_shrink_steps=a.max_shrink_steps)
    fla_common = dict(common, layout="blhd", chunk_sizes=(64,), head_dims=fla_dims, varlen=True)
    configurations = []
    for op, fn in (("linear", fla_linear), ("delta", fla_delta)):
        for dtype, tf32 in (("bf16", False), ("fp32", True)):
            suffix = "tf32" if tf32 else ""
            configurations.append(dict(name=f"fla_{op}_{dtype}{suffix}", fn=fn, op=op, dtypes=(dtype,), tf32=tf32,
                                       backward=True, guard=True, **fla_common))
    # fla as shipped: the gated backward refuses on Hopper with this Triton (two cases show it).
    configurations.append(dict(name="fla_gated_delta_bf16_guarded", fn=fla_gated, op="gated-delta", dtypes=("bf16",),
                               tf32=False, backward=True, guard=True,
                               **dict(fla_common, max_cases=2, shrink_failures=False)))
    # fp32 judged as true fp32 products: what a plain-fp32 verdict says about a TF32 kernel.
    configurations.append(dict(name="fla_delta_fp32_strict", fn=fla_delta, op="delta", dtypes=("fp32",), tf32=False,
                               backward=True, guard=True, **fla_common))
    # The gated backward refuses on Hopper with this Triton (fla #640): forward alone, then the guard lifted.
    configurations.append(dict(name="fla_gated_delta_forward_bf16", fn=fla_gated, op="gated-delta", dtypes=("bf16",),
                               tf32=False, backward=False, guard=True, **fla_common))
    configurations.append(dict(name="fla_gated_delta_forward_fp32tf32", fn=fla_gated, op="gated-delta",
                               dtypes=("fp32",), tf32=True, backward=False, guard=True, **fla_common))
    for dtype, tf32 in (("bf16", False), ("fp32", True)):
        configurations.append(dict(name=f"fla_gated_delta_{dtype}{'tf32' if tf32 else ''}_guard_lifted", fn=fla_gated,
                                   op="gated-delta", dtypes=(dtype,), tf32=tf32, backward=True, guard=False,
                                   **fla_common))
    # These kernels take no scale (they multiply q as given): judged at scale 1.
    article_common = dict(common, layout="bhld", chunk_sizes=(16, 32, 64), head_dims=((64, 64), (60, 100)),
                          varlen=False, backward=False, guard=True, scale=1.0)
    for dtype, tf32 in (("bf16", False), ("fp32", True)):
        suffix = "tf32" if tf32 else ""
        configurations.append(dict(name=f"article_linear_chunk_{dtype}{suffix}", fn=article_linear_chunk, op="linear",
                                   dtypes=(dtype,), tf32=tf32, initial_state=False, **article_common))
        configurations.append(dict(name=f"article_linear_recurrent_{dtype}{suffix}", fn=article_linear_recurrent,
                                   op="linear", dtypes=(dtype,), tf32=tf32, **article_common))
        configurations.append(dict(name=f"article_delta_chunk_{dtype}{suffix}", fn=article_delta_chunk, op="delta",
                                   dtypes=(dtype,), tf32=tf32, initial_state=False, expect=("o",), **article_common))

    if a.set == "audit":
        from deltaproof.adapters import fla as fla_adapter
        # fla's functions, as shipped (the gated chunk backward's Hopper guard lifted: as shipped it refuses to run).
        audit_common = dict(common, layout="blhd", chunk_sizes=(64,), head_dims=((64, 64),), varlen=True, tf32=False)
        configurations = []
        for fn, backward in ((chunk_linear_attn, True), (fused_chunk_linear_attn, True), (fused_recurrent_linear_attn, True),
                             (chunk_delta_rule, True), (fused_recurrent_delta_rule, True),
                             (chunk_gated_delta_rule, True), (fused_recurrent_gated_delta_rule, False)):
            op = fla_adapter.op_of(fn)
            for dtype in ("bf16", "fp16"):
                for l2norm in (False, True) if op != "linear" else (False,):
                    configurations.append(dict(
                        name=f"audit_{fn.__name__}_{dtype}{'_qk_l2norm' if l2norm else ''}", fn=fla_adapter.forward(fn),
                        op=op, dtypes=(dtype,), backward=backward, qk_l2norm=l2norm, guard=op != "gated-delta",
                        **audit_common))

    run_provenance = provenance.collect(__file__, sys.argv[1:], gpu=None if not a.dry_run else "none (dry run)")
    only = [s for s in a.only.split(",") if s]
    summary, groups = [], {}
    start = time.time()
    for config in configurations:
        name = config.pop("name")
        if only and not any(s in name for s in only):
            continue
        group = next(g for g in ("fla_linear", "fla_delta", "fla_gated_delta", "article", "audit_fla")
                     if name.startswith(g) or (g == "audit_fla" and name.startswith("audit_")))
        path = os.path.join(a.out, f"{group}.json")
        if time.time() - start > a.budget_s:
            log(f"== {name}: skipped (time budget of {a.budget_s:.0f} s spent)")
            summary.append({"configuration": name, "status": "skipped"})
            continue
        fn, guard = config.pop("fn"), config.pop("guard")
        if not a.dry_run:
            kernel = deltaproof.torch_kernel(fn, device="cuda", name=f"{fn.__name__}")
        elif guard and config["op"] == "gated-delta" and config["backward"]:
            def kernel(args):
                raise NotImplementedError("dry run: fla refuses the gated backward on Hopper (#640)")
        elif deltaproof._backend._core_module is not None:
            kernel = deltaproof.reference_kernel("chunkwise")
        else:  # no _core (another Python): tests/numpy_kernels.py, forward only, through the C judge
            sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
            from numpy_kernels import numpy_kernel
            kernel = numpy_kernel() if config["layout"] == "blhd" else None
            if kernel is None:
                continue
        log(f"== {name}: {fn.__name__} op={config['op']} dtypes={config['dtypes']} tf32={config['tf32']} "
            f"backward={config['backward']} hopper_guard={'on' if guard else 'lifted'}")
        record = {"configuration": name, "kernel": fn.__name__, "hopper_guard": guard,
                  "settings": {k: v for k, v in config.items()},
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        t0 = time.time()
        try:
            fla_chunk_o.IS_NVIDIA_HOPPER = hopper_guard if guard else False
            report = deltaproof.check_kernel(kernel, log=log, name=name,
                                             time_budget_s=max(0.0, a.budget_s - (time.time() - start)), **config)
            record.update(status="passed" if report.passed else "failed", report=report.to_json())
            log(str(report))
        except Exception as e:  # recorded; the next configuration still runs
            record.update(status="raised", exception=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
            log(f"   raised {type(e).__name__}: {e}")
        finally:
            fla_chunk_o.IS_NVIDIA_HOPPER = hopper_guard
        record["seconds"] = time.time() - t0
        groups.setdefault(group, {})[name] = record
        with open(path, "w") as f:
            json.dump({"provenance": run_provenance, "configurations": groups[group]}, f, indent=1, default=str)
        summary.append({"configuration": name, "status": record["status"], "seconds": record["seconds"],
                        "cases": len(record.get("report", {}).get("cases", [])),
                        "failed_cases": sum(1 for c in record.get("report", {}).get("cases", []) if not c["passed"]),
                        "counterexample": (record.get("report") or {}).get("counterexample", {}) and
                        record["report"]["counterexample"]["description"]})
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump({"provenance": run_provenance, "configurations": summary}, f, indent=1, default=str)
        log(f"== {name}: {record['status']} in {record['seconds']:.0f} s")
    log("done")


if __name__ == "__main__":
    main()
