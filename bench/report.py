#!/usr/bin/env python3
"""The benchmark report: benchmark JSON in, bench/results/REPORT.md and PNG plots out.

    /usr/bin/python3 bench/report.py                       # bench/results/*.json -> bench/results/
    /usr/bin/python3 bench/report.py A.json B.json --out DIR

Inputs are recognised by their content, any number in any order:
  - Google Benchmark JSON (--benchmark_out=F --benchmark_out_format=json): the CUDA benchmarks
    (bench_*_cuda, CUDA-event times) and the CPU oracle benchmarks (bench_linear_attention,
    bench_delta_rule, or any other). Every run is keyed by its name: the family before the first
    '/', a template argument as the scalar (BM_Chunkwise<Exact>), then the ArgNames (C:64/D:128).
    Families the report does not know still get a table. A file whose context holds
    "transcribed_from" (figures copied from notes; no JSON was kept) is read the same way and
    marked as transcribed wherever it is shown.
  - side-by-side JSON of bench/h200/side_by_side.py (top-level key "side_by_side").
  - accuracy records (top-level key "accuracy"): bench/results/accuracy_h200_notes.json.
Writes <out>/REPORT.md and <out>/*.png (matplotlib, Agg backend; nothing else is needed).
"""
import argparse
import datetime
import glob
import json
import math
import os
import statistics
import sys
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import numpy as np

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

# The H200 of DESIGN.md, measured on that card: bf16 dense GEMM and device-to-device copy.
PEAK_FLOPS = 790e12
PEAK_BYTES_PER_S = 4.3e12
H200_SMS = 132
# Shapes of the CUDA benchmarks (bench_*_cuda.cpp: kBatch, kHeads, kLength, kDim; decode: B and
# T from the run's name). The FLOP and byte counters in their JSON are checked against the model
# at these shapes (section "Counters against the model").
GPU_SHAPE = dict(B=8, H=16, L=4096, DK=128, DV=128)
GPU_DECODE_SHAPE = dict(H=16, T=1, DK=128, DV=128)
CHUNK_SIZES = (16, 32, 64)

OPS = OrderedDict([("linear", "Linear attention"), ("delta", "DeltaNet"), ("gated-delta", "Gated DeltaNet")])
PASSES = ("forward", "backward", "forward+backward", "prepare stage", "scan stage", "decode")
# Passes whose deltaproof kernel walks each head's chunks in order (the latency model applies).
SEQUENTIAL_PASSES = {"forward", "backward", "forward+backward", "scan stage"}
IMPL_STYLE = {"deltaproof": dict(color="tab:blue", marker="o"), "fla": dict(color="tab:orange", marker="s"),
              "article": dict(color="tab:green", marker="^")}

# Targets of issue 13 / DESIGN.md ("Performance targets"): ratios measured in one run, and goals.
RATIO_TARGETS = {("linear", "forward"): ("fla", 0.65), ("linear", "forward+backward"): ("fla", 0.65),
                 ("delta", "forward"): ("fla", 0.9), ("gated-delta", "forward"): ("fla", 0.9),
                 ("linear", "decode"): ("article", 1.0)}
GOALS_US = {("linear", "forward"): 210, ("linear", "forward+backward"): 1000, ("delta", "forward"): 500,
            ("delta", "forward+backward"): 1500, ("gated-delta", "forward"): 520,
            ("gated-delta", "forward+backward"): 1600, ("linear", "decode"): 34, ("delta", "decode"): 34,
            ("gated-delta", "decode"): 34}

# Google Benchmark's own fields and the name segments that are settings, not arguments.
_STANDARD_FIELDS = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads", "iterations",
                    "real_time", "cpu_time", "time_unit", "family_index", "per_family_instance_index",
                    "aggregate_name", "aggregate_unit", "label", "error_occurred", "error_message", "transcribed",
                    "big_o", "rms"}
_SETTING_KEYS = {"iterations", "repeats", "min_time", "min_warmup_time", "threads"}
_SETTING_WORDS = {"manual_time", "real_time", "process_time"}
_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


# ---------------------------------------------------------------------------------------------
# The cost model (derivations: proofs/linear_attention.md §2-3, proofs/delta_rule.md §3-6).
# FLOPs are algorithmic: a multiply-add counts 2, the causal mask saves nothing. Bytes are
# compulsory: every input read once and every output written once, states left out (≤ 2 %).
# ---------------------------------------------------------------------------------------------

def model_flops(op, pass_, s, C):
    """FLOPs of one call on shape s (B, H, L or T, DK, DV) at chunk size C; None where no model."""
    B, H, DK, DV = s["B"], s["H"], s["DK"], s["DV"]
    if pass_ == "decode":  # S += v kᵀ and S q (linear); S k, the rank-one correction and S q (delta)
        return B * H * s["T"] * (4 if op == "linear" else 6) * DK * DV
    tokens = B * H * s["L"]
    if op == "linear":
        # Q Kᵀ and (·⊙M) V inside each chunk, Q S_[c]ᵀ and S_[c+1] = S_[c] + V_[c]ᵀ K_[c] across chunks.
        forward = tokens * (2 * C * (DK + DV) + 4 * DK * DV)
        # Three forward-shaped scans: dQ over (dO, V, K), dK over (V, dO, Q), dV over (K, Q, dO).
        return {"forward": forward, "backward": 3 * forward, "forward+backward": 4 * forward}.get(pass_)
    # K Kᵀ, W = T diag(β) K, U = T diag(β) V, and T = A⁻¹ by substitution (C³/3 per chunk).
    prepare = tokens * (2 * C * DK + 2 * C * DK + 2 * C * DV + C * C / 3)
    # V̄ = U − W S_[c]ᵀ, Q S_[c]ᵀ, S_[c+1] = S_[c] + V̄ᵀ K (2·DK·DV each), Q Kᵀ and (·⊙M) V̄.
    scan = tokens * (2 * C * DK + 2 * C * DV + 6 * DK * DV)
    forward = prepare + scan
    # The backward takes only the inputs: the forward recomputed, then each product's adjoint (two
    # products of its size, one per operand): 3 × forward, as for linear attention.
    return {"forward": forward, "backward": 3 * forward, "forward+backward": 4 * forward, "prepare stage": prepare,
            "scan stage": scan}.get(pass_)


def model_bytes(op, pass_, s, C, element=2):
    """Compulsory bytes of one call: inputs read and outputs written once (16-bit tensors, fp32 g)."""
    B, H, DK, DV = s["B"], s["H"], s["DK"], s["DV"]
    beta = element if op != "linear" else 0
    gate = 4 if op == "gated-delta" else 0
    if pass_ == "decode":  # the fp32 state in and out, and one token's q, k, v, β, g, o
        return B * H * (8 * DK * DV + s["T"] * (element * (2 * DK + 2 * DV) + beta + gate))
    tokens = B * H * s["L"]
    forward = tokens * (element * (2 * DK + 2 * DV) + beta + gate)  # q, k, v (β, g) in; o out
    backward = tokens * (element * (4 * DK + 3 * DV) + 2 * beta + 2 * gate)  # q, k, v, dO (β, g) in; dq, dk, dv (dβ, dg) out
    return {"forward": forward, "backward": backward, "forward+backward": forward + backward,
            "prepare stage": tokens * (element * (2 * DK + 2 * DV) + beta + gate),  # k, v (β, g) in; w, u out
            "scan stage": tokens * (element * (3 * DK + 2 * DV) + gate),  # q, k, w, u (g) in; o out
            }.get(pass_)


def roofline_us(op, pass_, s, C):
    """max(FLOPs / peak, bytes / bandwidth) in µs: no kernel can be faster."""
    f, b = model_flops(op, pass_, s, C), model_bytes(op, pass_, s, C)
    if b is None:
        return None
    return max((f or 0) / PEAK_FLOPS, b / PEAK_BYTES_PER_S) * 1e6


def chunk_steps(s, C):
    return math.ceil(s["L"] / C)


def fit_latency(points, op, pass_, s):
    """Fits T(C) = τ·⌈L/C⌉ + F(C)/R by least squares: τ the fixed cost of one chunk step (the
    sequential scan pays it L/C times), R the rate at which the work itself runs. Returns a dict
    (tau_us, rate, max_residual, points) or None with fewer than two chunk sizes."""
    cs = sorted(points)
    if len(cs) < 2:
        return None
    a = np.array([[chunk_steps(s, C), model_flops(op, pass_, s, C) / 1e6] for C in cs])  # µs·FLOP/µs
    t = np.array([points[C] for C in cs])
    (tau, inv_rate), *_ = np.linalg.lstsq(a, t, rcond=None)
    fitted = a @ np.array([tau, inv_rate])
    ok = tau >= 0 and inv_rate > 0
    # inv_rate is in µs per MFLOP, so R = 10⁶ FLOP / (inv_rate · 10⁻⁶ s).
    return dict(tau_us=float(tau), rate=1e12 / float(inv_rate) if inv_rate > 0 else float("nan"),
                inv_rate=float(inv_rate), max_residual=float(np.max(np.abs(fitted - t) / t)), points=len(cs), ok=ok)


def latency_us(fit, op, pass_, s, C):
    return fit["tau_us"] * chunk_steps(s, C) + fit["inv_rate"] * model_flops(op, pass_, s, C) / 1e6


# ---------------------------------------------------------------------------------------------
# Reading the inputs
# ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    """One benchmark of a Google Benchmark file: median of its repetitions."""
    source: str
    family: str
    base: str
    scalar: str
    args: OrderedDict
    time_us: float
    cpu_us: float
    counters: dict
    label: str
    gpu: bool
    transcribed: bool
    repetitions: int


@dataclass
class Measurement:
    """A kernel time at one (op, pass, implementation, chunk size), from any source."""
    op: str
    pass_: str
    impl: str
    C: object
    time_us: float
    shape: dict
    source: str
    series: str  # legend label: implementation and source
    transcribed: bool = False
    variant: str = ""
    check: dict = field(default_factory=dict)


def _number(text):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def split_name(run_name):
    """'BM_Chunkwise<Exact>/L:256/C:16/iterations:1' -> ('BM_Chunkwise<Exact>', 'BM_Chunkwise', 'Exact', {L, C})."""
    family, *segments = run_name.split("/")
    args, positional = OrderedDict(), 0
    for segment in segments:
        key, sep, value = segment.partition(":")
        if sep and key in _SETTING_KEYS or segment in _SETTING_WORDS:
            continue
        if sep:
            args[key] = _number(value)
        else:
            args[f"arg{positional}"] = _number(segment)
            positional += 1
    base, scalar = family, ""
    if "<" in family and family.endswith(">"):
        base, scalar = family[:family.index("<")], family[family.index("<") + 1:-1]
    if "scalar" in args:
        scalar = str(args["scalar"])
    return family, base, scalar, args


def read_google_benchmark(path, data):
    context = data.get("context", {})
    transcribed = "transcribed_from" in context
    executable = os.path.basename(str(context.get("executable", "")))
    groups = OrderedDict()
    for entry in data.get("benchmarks", []):
        if entry.get("error_occurred") or entry.get("aggregate_name") in ("BigO", "RMS"):
            continue
        groups.setdefault(entry.get("run_name", entry["name"]), []).append(entry)
    runs = []
    for run_name, entries in groups.items():
        medians = [e for e in entries if e.get("run_type") == "aggregate" and e.get("aggregate_name") == "median"]
        iterations = [e for e in entries if e.get("run_type", "iteration") == "iteration"]
        if medians:
            chosen, reps = medians[0], medians[0].get("repetitions", 0)
            real, cpu = chosen["real_time"], chosen.get("cpu_time", float("nan"))
        elif iterations:
            chosen, reps = iterations[0], len(iterations)
            real = statistics.median(e["real_time"] for e in iterations)
            cpu = statistics.median(e.get("cpu_time", float("nan")) for e in iterations)
        else:
            continue
        scale = _TO_US[chosen.get("time_unit", "ns")]
        counters = {k: v for k, v in chosen.items() if k not in _STANDARD_FIELDS and isinstance(v, (int, float))
                    and not isinstance(v, bool)}
        if not medians:  # plain repetitions: the median of each counter too
            counters = {k: statistics.median(e[k] for e in iterations if k in e) for k in counters}
        family, base, scalar, args = split_name(run_name)
        gpu = executable.endswith("_cuda") or "manual_time" in run_name
        runs.append(Run(os.path.basename(path), family, base, scalar, args, real * scale, cpu * scale, counters,
                        chosen.get("label", ""), gpu, transcribed or bool(chosen.get("transcribed")), reps))
    return runs


# Which kernel each CUDA benchmark family times: (op, pass, variant) from the run's arguments.
def _delta_op(args):
    return "gated-delta" if args.get("gated") else "delta"


DEFAULT_DELTA_PIPELINE = 4  # runs before the scan versions were removed carry `pipeline`: 0 and 4 are today's register scan
GPU_FAMILIES = {
    "BM_LinearAttentionForward": lambda a: ("linear", "forward", ""),
    "BM_LinearAttentionBackward": lambda a: ("linear", "backward", ""),
    "BM_LinearAttentionDecode": lambda a: ("linear", "decode", ""),
    "BM_DeltaRuleForward": lambda a: (_delta_op(a), "forward", _pipeline_variant(a)),
    "BM_DeltaRuleWyPrepare": lambda a: (_delta_op(a), "prepare stage", ""),
    "BM_DeltaRuleChunkScan": lambda a: (_delta_op(a), "scan stage", _pipeline_variant(a)),
    "BM_DeltaRuleDecode": lambda a: (_delta_op(a), "decode", ""),
    "BM_DeltaRuleBackward": lambda a: (_delta_op(a), "backward", ""),
    "BM_DeltaRuleForwardBackward": lambda a: (_delta_op(a), "forward+backward", ""),
    # A training step's two halves, and the inference forward with the backward that recomputes T, W and U.
    "BM_DeltaRuleTrainingForward": lambda a: (_delta_op(a), "forward", "training forward (keeps T, W, U, S, V̄)"),
    "BM_DeltaRuleBackwardFromSaved": lambda a: (_delta_op(a), "backward", "backward from the kept T, W, U"),
    "BM_DeltaRuleForwardBackwardRecomputing": lambda a: (_delta_op(a), "forward+backward", "backward recomputing T, W, U"),
}


def _pipeline_variant(args):
    p = args.get("pipeline", 0)
    return "" if p in (0, DEFAULT_DELTA_PIPELINE) else f"scan v{p}"


def _short_date(text):
    return str(text)[:10] if text else "?"


def measurements_from_runs(runs, contexts):
    out = []
    for r in runs:
        if not r.gpu or r.base not in GPU_FAMILIES:
            continue
        op, pass_, variant = GPU_FAMILIES[r.base](r.args)
        if pass_ == "decode":
            shape = dict(GPU_DECODE_SHAPE, B=r.args.get("B", 64), T=r.args.get("T", 1))
        else:
            shape = dict(GPU_SHAPE)
        date = _short_date(contexts[r.source].get("date"))
        series = f"deltaproof ({r.source}, {date}{', transcribed' if r.transcribed else ''})"
        out.append(Measurement(op, pass_, "deltaproof", r.args.get("C"), r.time_us, shape, r.source, series,
                               r.transcribed, variant))
    return out


def measurements_from_side_by_side(path, data):
    out = []
    date = _short_date(data.get("context", {}).get("date"))
    dry = data.get("context", {}).get("dry_run")
    for rec in data.get("records", []):
        if rec.get("status") != "timed":
            continue
        # Named by the file as well as the date: two runs of one day are two series, never one curve.
        label = f"{rec['impl']} ({os.path.basename(path)}{' DRY RUN' if dry else ''}, {date})"
        out.append(Measurement(rec["op"], rec["pass"], rec["impl"], rec.get("chunk_size"), rec["median_us"],
                               rec["shape"], os.path.basename(path), label, False, "", rec.get("check", {})))
    return out


def load(paths):
    runs, contexts, side_by_side, accuracy = [], OrderedDict(), [], []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        name = os.path.basename(path)
        if "side_by_side" in data:
            side_by_side.append((name, data))
            contexts[name] = dict(data.get("context", {}), kind="side by side")
        elif "accuracy" in data:
            accuracy.append((name, data))
            contexts[name] = dict(data.get("context", {}), kind="accuracy records")
        elif "benchmarks" in data:
            contexts[name] = dict(data.get("context", {}), kind="Google Benchmark")
            runs.extend(read_google_benchmark(path, data))
        else:
            raise SystemExit(f"{path}: neither Google Benchmark JSON nor side-by-side nor accuracy records")
    return runs, contexts, side_by_side, accuracy


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------

def us(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.3g}" if x < 10 else f"{x:.0f}"


def human(x, unit=""):
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".strip()


def duration(x_us):
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "µs")):
        if x_us >= scale:
            return f"{x_us / scale:.3g} {unit}"
    return f"{x_us * 1e3:.3g} ns"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def shape_text(s):
    keys = ("B", "H", "T" if "T" in s else "L", "DK", "DV")
    return ", ".join(f"{k}={s.get(k, '?')}" for k in keys)


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------

class Report:
    def __init__(self, out_dir, command):
        self.out_dir, self.command = out_dir, command
        self.lines, self.figures = [], []

    def add(self, text=""):
        self.lines.append(text)

    def figure(self, fig, name, alt):
        fig.savefig(os.path.join(self.out_dir, name), dpi=100)
        plt.close(fig)
        self.figures.append(name)
        self.add(f"![{alt}]({name})\n")

    def write(self):
        with open(os.path.join(self.out_dir, "REPORT.md"), "w") as f:
            f.write("\n".join(self.lines).rstrip() + "\n")


def header_section(rep, contexts):
    rep.add("# deltaproof benchmark report\n")
    rep.add(f"Generated by `{rep.command}` on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC "
            "from the files below; figures are medians. Only ratios measured in one run are trusted (DESIGN.md).\n")
    rows = []
    for name, c in contexts.items():
        if c["kind"] == "Google Benchmark":
            load_avg = c.get("load_avg")
            load_text = ", ".join(f"{x:.1f}" for x in load_avg) if isinstance(load_avg, list) else "?"
            host = f"{c.get('host_name', '?')}: {c.get('num_cpus', '?')} CPUs at {c.get('mhz_per_cpu', '?')} MHz"
            what = os.path.basename(str(c.get("executable", "?")))
            if what.endswith("_cuda"):
                host += " (the GPU machine's host CPU)"
            notes = f"load average {load_text}; libbenchmark built as {c.get('library_build_type', '?')}"
            notes += "".join(f"; {c[k]}" for k in ("merged", "note") if c.get(k))
            if "transcribed_from" in c:
                host = c.get("host_name", "?")
                notes = f"**transcribed** on {c.get('transcribed_on', '?')} from {c['transcribed_from']}. {c.get('note', '')}"
            rows.append([f"`{name}`", what, c.get("date", "?"), host, notes])
        elif c["kind"] == "side by side":
            gpu = c.get("gpu", {})
            host = f"{c.get('host', '?')}, {gpu.get('name', '?')}"
            clocks = gpu.get("clocks", "?")
            notes = (f"{'**DRY RUN on a CPU: stand-in kernels, times meaningless**; ' if c.get('dry_run') else ''}"
                     f"GPU clocks: {clocks}; torch {c.get('torch', '?')}, triton {c.get('triton', '?')}, "
                     f"fla {c.get('fla', '?')}; {c.get('repeats', '?')} timed calls after {c.get('warmup', '?')} "
                     f"warm-up, {c.get('input_sets', '?')} input sets rotated"
                     f"{'; ' + c['note'] if c.get('note') else ''}")
            rows.append([f"`{name}`", "bench/h200/side_by_side.py", c.get("date", "?"), host, notes])
        else:
            rows.append([f"`{name}`", "accuracy records", c.get("transcribed_on", "?"), "—",
                         f"transcribed; {c.get('note', '')}"])
    rep.add(table(["file", "from", "date", "host", "notes"], rows))
    rep.add(f"Peaks used throughout (DESIGN.md, measured on the H200): bf16 GEMM {PEAK_FLOPS / 1e12:.0f} TFLOP/s, "
            f"device copy {PEAK_BYTES_PER_S / 1e12:.1f} TB/s. GPU clocks are not in Google Benchmark's JSON; "
            "cuda/NOTES.md records the runs at the H200's 1980 MHz maximum SM clock, clocks not touched. Shapes of the "
            f"CUDA benchmarks: {shape_text(GPU_SHAPE)}, bf16 inputs, fp32 accumulation; decode "
            f"{shape_text(dict(GPU_DECODE_SHAPE, B=64))}, fp32 state.\n")


def model_section(rep):
    rep.add("## The cost model\n")
    rep.add("Per call, with `N = B·H·L` tokens, chunk size `C` and head dims `DK`, `DV` (multiply-add = 2 FLOPs; "
            "the causal mask saves nothing; derivations: proofs/linear_attention.md §2–3, proofs/delta_rule.md §3–6):\n")
    rep.add(table(["op, pass", "FLOPs", "compulsory bytes (16-bit tensors, fp32 g)"], [
        ["linear, forward", "N·(2C·(DK+DV) + 4·DK·DV): Q Kᵀ, (·⊙M) V; Q S_[c]ᵀ, S_[c+1] = S_[c] + V_[c]ᵀK_[c]",
         "N·2·(2DK + 2DV): q, k, v in, o out"],
        ["linear, backward", "3 × forward: dQ over (dO, V, K), dK over (V, dO, Q), dV over (K, Q, dO)",
         "N·2·(4DK + 3DV): q, k, v, dO in; dq, dk, dv out"],
        ["linear, forward+backward", "4 × forward", "forward + backward"],
        ["delta, prepare stage", "N·(4C·DK + 2C·DV + C²/3): K Kᵀ, W = T diag(β) K, U = T diag(β) V, T = A⁻¹",
         "N·(2·(2DK + 2DV) + 2 [β] + 4 [g]): k, v, β, g in; w, u out"],
        ["delta, scan stage", "N·(2C·DK + 2C·DV + 6·DK·DV): Q Kᵀ, (·⊙Γ⊙M) V̄; V̄ = U − W S_[c]ᵀ, Q S_[c]ᵀ, S update",
         "N·(2·(3DK + 2DV) + 4 [g]): q, k, w, u, g in; o out"],
        ["delta, forward", "prepare + scan = N·(6C·DK + 4C·DV + 6·DK·DV + C²/3)",
         "N·(2·(2DK + 2DV) + 2 + 4 [g]): q, k, v, β, g in; o out"],
        ["delta, backward", "3 × forward: the forward recomputed from the inputs, then two adjoint products per product",
         "N·(2·(4DK + 3DV) + 4 + 8 [g]): q, k, v, dO, β, g in; dq, dk, dv, dβ, dg out"],
        ["delta, forward+backward", "4 × forward", "forward + backward"],
        ["decode (one token)", "B·H·T·c·DK·DV, c = 4 (linear), 6 (delta)",
         "B·H·(8·DK·DV + T·(2·(2DK+2DV) + 2 + 4)): fp32 state in and out, q, k, v, β, g, o"],
    ]))
    rep.add("`[g]` counts for Gated DeltaNet only, `[β]` for both delta ops. Predicted time: the roofline bound "
            f"max(FLOPs / {PEAK_FLOPS / 1e12:.0f} TFLOP/s, bytes / {PEAK_BYTES_PER_S / 1e12:.1f} TB/s), which no kernel "
            "can beat, and for deltaproof's sequential chunk scans the latency model\n")
    rep.add("    T(C) = τ · ⌈L/C⌉ + FLOPs(C) / R\n")
    rep.add("with two parameters fitted by least squares to the measured chunk sizes of each series: τ is the fixed "
            "cost of one chunk step (barriers, dependent loads, the first products of a step), paid once per chunk "
            "because each head's chunks are walked in order; R is the rate at which the work itself then runs. "
            "It is a description, not a prediction: with three chunk sizes and two parameters, its residual is what "
            "tests it. (cuda/NOTES_delta.md's ≈ 9.2 µs per chunk step for the DeltaNet scan at C = 64 is a whole step, "
            "τ and work together.)\n")


def counters_section(rep, runs):
    rows = []
    for r in runs:
        if not r.gpu or r.base not in GPU_FAMILIES:
            continue
        op, pass_, _ = GPU_FAMILIES[r.base](r.args)
        shape = dict(GPU_DECODE_SHAPE, B=r.args.get("B", 64), T=r.args.get("T", 1)) if pass_ == "decode" else GPU_SHAPE
        C = r.args.get("C", 0)
        f_model, b_model = model_flops(op, pass_, shape, C), model_bytes(op, pass_, shape, C)
        seconds = r.time_us * 1e-6
        f_json = next((v for k, v in r.counters.items() if k.upper().startswith("FLOP")), None)
        b_json = r.counters.get("bytes")
        if f_json is None and b_json is None:
            continue
        rows.append([r.family + "".join(f"/{k}:{v}" for k, v in r.args.items()),
                     f"{f_json * seconds / f_model:.3f}" if f_json and f_model else "—",
                     f"{b_json * seconds / b_model:.3f}" if b_json and b_model else "—"])
    if not rows:
        return
    rep.add("### Counters against the model\n")
    rep.add("The CUDA benchmarks' own FLOP and byte counters (rates × median time) divided by the model above at "
            f"{shape_text(GPU_SHAPE)}: 1.000 where the benchmark counts what the model counts. (bench_delta_rule_cuda's "
            "counters, absent from transcribed JSON, leave out the triangular inverse, C²/3 per token or < 1 %, and "
            "its stage benchmarks report the whole forward's counters.) The report uses the model.\n")
    rep.add(table(["benchmark", "FLOPs: JSON / model", "bytes: JSON / model"], rows))


def _series(measurements):
    out = OrderedDict()
    for m in measurements:
        out.setdefault(m.series, []).append(m)
    return out


def _fits(measurements):
    """The latency fit of every deltaproof series of a sequential pass, by (op, pass, series)."""
    fits = {}
    for (op, pass_), group in _by_op_pass(measurements).items():
        if pass_ not in SEQUENTIAL_PASSES:
            continue
        for series, ms in _series(group).items():
            if ms[0].impl != "deltaproof":
                continue
            points = {m.C: m.time_us for m in ms if isinstance(m.C, int)}
            fit = fit_latency(points, op, pass_, ms[0].shape)
            if fit:
                fits[(op, pass_, series)] = fit
    return fits


def _by_op_pass(measurements):
    out = OrderedDict()
    for op in OPS:
        for pass_ in PASSES:
            group = [m for m in measurements if m.op == op and m.pass_ == pass_ and not m.variant]
            if group:
                out[(op, pass_)] = group
    return out


def time_vs_chunk_section(rep, measurements, fits):
    rep.add("## Time against chunk size\n")
    chunked = [m for m in measurements if m.pass_ != "decode"]
    if not chunked:
        rep.add("No kernel times: not measured.\n")
        return
    groups = _by_op_pass(chunked)
    for op in OPS:
        passes = [p for (o, p) in groups if o == op]
        if not passes:
            rep.add(f"### {OPS[op]}\n\nNot measured.\n")
            continue
        rep.add(f"### {OPS[op]}\n")
        fig, axes = plt.subplots(1, len(passes), figsize=(4.6 * len(passes), 4.6), squeeze=False, layout="constrained")
        for ax, pass_ in zip(axes[0], passes):
            group = groups[(op, pass_)]
            shape = group[0].shape
            grid = np.linspace(16, 64, 97)
            bound = [roofline_us(op, pass_, shape, c) for c in grid]
            if bound[0] is not None:
                ax.plot(grid, bound, "--", color="grey", label="roofline bound")
            for series, ms in _series(group).items():
                style = IMPL_STYLE.get(ms[0].impl, dict(color="black", marker="x"))
                pts = sorted((m.C, m.time_us) for m in ms if isinstance(m.C, int))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=style["marker"], color=style["color"],
                        linestyle="-" if len(pts) > 1 else "none", label=series,
                        fillstyle="none" if ms[0].transcribed else "full")
                fit = fits.get((op, pass_, series))
                if fit and fit["ok"]:
                    ax.plot(grid, [latency_us(fit, op, pass_, shape, c) for c in grid], ":", color=style["color"],
                            label=f"latency model (τ={fit['tau_us']:.2f} µs, R={fit['rate'] / 1e12:.0f} TFLOP/s)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(CHUNK_SIZES, [str(c) for c in CHUNK_SIZES])
            ax.set_xlabel("chunk size C")
            ax.set_ylabel("time per call (µs)")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{OPS[op]}, {pass_}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.16))
        fig.suptitle(shape_text(shape) + ", bf16", fontsize=9)
        rep.figure(fig, f"time_vs_chunk_{op}.png", f"{OPS[op]}: time against C")
        if not {"backward", "forward+backward"} & set(passes):
            rep.add("Backward: not measured in the files given.\n")
        for pass_ in passes:
            chunk_table(rep, op, pass_, groups[(op, pass_)], fits)
    variants = [m for m in chunked if m.variant]
    if variants:
        rep.add("### Other kernel versions (not plotted)\n")
        rows = defaultdict(dict)
        for m in variants:
            rows[(OPS[m.op], m.pass_, m.variant, m.series)][m.C] = m.time_us
        rep.add(table(["op", "pass", "version", "source"] + [f"C={c}" for c in CHUNK_SIZES],
                      [list(k) + [us(v.get(c)) for c in CHUNK_SIZES] for k, v in rows.items()]))


def chunk_table(rep, op, pass_, group, fits):
    shape = group[0].shape
    cs = sorted({m.C for m in group if isinstance(m.C, int)} | set(CHUNK_SIZES))
    rows = []
    for series, ms in _series(group).items():
        times = {m.C: m.time_us for m in ms}
        rows.append([series] + [us(times.get(c)) for c in cs])
    rows.append(["roofline bound"] + [us(roofline_us(op, pass_, shape, c)) for c in cs])
    for (o, p, series), fit in fits.items():
        if (o, p) == (op, pass_) and fit["ok"]:
            rows.append([f"latency model of {series.split(' (')[0]} ({fit['points']} points)"] +
                        [us(latency_us(fit, op, pass_, shape, c)) for c in cs])
    rep.add(f"**{OPS[op]}, {pass_}** (µs)\n")
    rep.add(table(["series"] + [f"C={c}" for c in cs], rows))
    rep.add(explain(op, pass_, group, fits) + "\n")


def explain(op, pass_, group, fits):
    """Where the model curves and the measurements part, and why (numbers from the data)."""
    shape = group[0].shape
    notes = []
    for series, ms in _series(group).items():
        if ms[0].impl != "deltaproof":
            continue
        times = {m.C: m.time_us for m in ms if isinstance(m.C, int)}
        if not times:
            continue
        over = {c: t / roofline_us(op, pass_, shape, c) for c, t in times.items() if roofline_us(op, pass_, shape, c)}
        bound_by = "bytes" if all((model_flops(op, pass_, shape, c) or 0) / PEAK_FLOPS <
                                  model_bytes(op, pass_, shape, c) / PEAK_BYTES_PER_S for c in times) else "FLOPs"
        best = min(times, key=times.get)
        text = (f"{series.split(' (')[0]}: {', '.join(f'{over[c]:.1f}×' for c in sorted(over))} the roofline bound at "
                f"C = {', '.join(str(c) for c in sorted(over))} (the bound is set by {bound_by}); fastest at C = {best}.")
        fit = fits.get((op, pass_, series))
        if fit and not fit["ok"]:
            text += " The latency model does not fit this series (a negative τ or R)."
        elif fit:
            steps = chunk_steps(shape, best)
            step_share = fit["tau_us"] * steps / latency_us(fit, op, pass_, shape, best)
            text += (f" Latency model: τ = {fit['tau_us']:.2f} µs per chunk step, R = {fit['rate'] / 1e12:.0f} TFLOP/s "
                     f"({fit['rate'] / PEAK_FLOPS:.0%} of the peak), largest residual {fit['max_residual']:.1%}"
                     f"{' (two points: an exact fit, no test of the model)' if fit['points'] == 2 else ''}; at C = {best} "
                     f"the {steps} fixed step costs are {step_share:.0%} of the time.")
        notes.append(text)
    why = {
        "forward": "Why the bound is not reached: deltaproof's forward walks each head's ⌈L/C⌉ chunks in order, one "
                   "block per head (and per 64 value columns for DeltaNet), so the SMs neither stream memory nor keep "
                   "the tensor cores busy; each step's barriers and dependent loads are paid ⌈L/C⌉ times (τ), and the "
                   "work inside a step runs on mma.sync at R (cuda/NOTES.md, 'Where v8 stands'; cuda/NOTES_delta.md, "
                   "'Where it stands'). A larger C means fewer steps but more work per step (FLOPs grow with C).",
        "backward": "The backward is two such scans (dQ forward in time, dK and dV fused in reverse), so the same "
                    "step latency is paid twice per chunk.",
        "scan stage": "The scan stage is the sequential part of the DeltaNet forward (2 blocks of 8 warps per SM, "
                      "each walking one head's chunks for 64 value columns); cuda/NOTES_delta.md's ≈ 9.2 µs per chunk "
                      "step at C = 64 is the whole step (590 µs / 64), which the model splits into τ and the work at R.",
        "prepare stage": "The prepare stage is parallel over chunks (B·H·⌈L/C⌉ blocks), not a scan, so the latency "
                         "model does not apply; it still runs several times its memory bound (cuda/NOTES_delta.md, "
                         "'What would move it next', item 3), and its C² and C³ terms make it grow with C.",
    }
    if op != "linear" and pass_ == "forward":
        why["forward"] += (" For DeltaNet the forward adds the parallel prepare stage, whose cost grows with C, to the "
                           "scan, whose cost falls with C: the sum is what the two-term model has to describe.")
    if why.get(pass_) and notes:
        notes.append(why[pass_])
    return " ".join(notes)


def _order(m):
    return (list(OPS).index(m.op) if m.op in OPS else 99, PASSES.index(m.pass_) if m.pass_ in PASSES else 99,
            m.series, m.C if isinstance(m.C, int) else 0)


def decode_section(rep, measurements):
    rep.add("## Decode (one token)\n")
    decode = sorted((m for m in measurements if m.pass_ == "decode"), key=_order)
    if not decode:
        rep.add("Not measured.\n")
        return
    rows, labels, values, colors = [], [], [], []
    for m in decode:
        bound = roofline_us(m.op, "decode", m.shape, 0)
        bw = model_bytes(m.op, "decode", m.shape, 0) / (m.time_us * 1e-6)
        rows.append([OPS[m.op], m.series, shape_text(m.shape), us(m.time_us), us(bound),
                     f"{bw / 1e12:.2f} TB/s ({bw / PEAK_BYTES_PER_S:.0%})"])
        labels.append(f"{OPS[m.op]}\n{m.impl}")
        values.append(m.time_us)
        colors.append(IMPL_STYLE.get(m.impl, {}).get("color", "black"))
    rep.add(table(["op", "series", "shape", "time (µs)", "memory bound (µs)", "achieved bandwidth"], rows))
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(decode), 3.4), layout="constrained")
    ax.bar(range(len(values)), values, color=colors)
    for i, m in enumerate(decode):
        ax.plot([i - 0.4, i + 0.4], [roofline_us(m.op, "decode", m.shape, 0)] * 2, "k--", lw=1)
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("time per call (µs)")
    ax.set_title("decode, one token (dashed: memory bound)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    rep.figure(fig, "decode.png", "decode times against the memory bound")
    rep.add("Decode reads and writes the fp32 state once, so it is memory-bound by design: the gap to the dashed "
            "line is bandwidth not reached (cuda/NOTES.md, 'What limits', item 3).\n")


def roofline_section(rep, measurements):
    rep.add("## Roofline\n")
    points = []
    for m in sorted((m for m in measurements if not m.variant), key=_order):
        C = m.C if isinstance(m.C, int) else 0
        f, b = model_flops(m.op, m.pass_, m.shape, C), model_bytes(m.op, m.pass_, m.shape, C)
        if not f or not b:
            continue
        seconds = m.time_us * 1e-6
        points.append((m, f / b, f / seconds, b / seconds))
    if not points:
        rep.add("Not measured.\n")
        return
    fig, ax = plt.subplots(figsize=(7.5, 5), layout="constrained")
    ai = np.logspace(-1, 3, 200)
    ax.loglog(ai, np.minimum(PEAK_FLOPS, ai * PEAK_BYTES_PER_S), "k-", lw=1.2, label="H200 roofline (790 TFLOP/s, 4.3 TB/s)")
    op_colors = {"linear": "tab:blue", "delta": "tab:red", "gated-delta": "tab:purple"}
    pass_markers = {"forward": "o", "backward": "s", "forward+backward": "D", "prepare stage": "v",
                    "scan stage": "^", "decode": "*"}
    seen = set()
    for m, x, fl, _ in points:
        key = (m.op, m.pass_, m.impl)
        label = f"{OPS[m.op]}, {m.pass_}, {m.impl}" if key not in seen else None
        seen.add(key)
        ax.scatter(x, fl, color=op_colors.get(m.op, "black"), marker=pass_markers.get(m.pass_, "x"), s=36,
                   facecolors="none" if m.impl != "deltaproof" else None, label=label)
        if isinstance(m.C, int):
            ax.annotate(str(m.C), (x, fl), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_xlabel("arithmetic intensity (model FLOPs / compulsory byte)")
    ax.set_ylabel("achieved FLOP/s (model FLOPs / time)")
    ax.set_title("kernels against the H200 roofline (numbers: C; hollow: peers)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="lower right")
    rep.figure(fig, "roofline.png", "roofline")
    rows = []
    for m, x, fl, bw in points:
        rows.append([OPS[m.op], m.pass_, m.series, m.C if m.C is not None else "—", us(m.time_us), f"{x:.1f}",
                     f"{fl / 1e12:.1f} ({fl / PEAK_FLOPS:.0%})", f"{bw / 1e12:.2f} ({bw / PEAK_BYTES_PER_S:.0%})"])
    rep.add(table(["op", "pass", "series", "C", "time (µs)", "FLOP/byte", "TFLOP/s (of 790)", "TB/s (of 4.3)"], rows))
    share = lambda x, fl: fl / min(PEAK_FLOPS, x * PEAK_BYTES_PER_S)  # noqa: E731  (of the roof at that intensity)
    chunked = [share(x, fl) for m, x, fl, _ in points if m.pass_ != "decode"]
    decode = [share(x, fl) for m, x, fl, _ in points if m.pass_ == "decode"]
    text = []
    if chunked:
        text.append(f"The chunkwise kernels reach {min(chunked):.0%} to {max(chunked):.0%} of the roof at their "
                    "intensity: neither memory nor tensor throughput is what limits them (the latency-bound picture "
                    "of the sections above).")
    if decode:
        text.append(f"Decode reaches {min(decode):.0%} to {max(decode):.0%} of the memory roof.")
    text.append("Executed tensor work exceeds the algorithmic count (hi + lo bf16 operands for S and P, padding): "
                "cuda/NOTES.md counted 67.6 GFLOP executed against 51.5 algorithmic for the linear forward at C = 64.")
    rep.add(" ".join(text) + "\n")


def accuracy_section(rep, accuracy_files, side_by_side, measurements):
    rep.add("## Accuracy against chunk size and dtype\n")
    records = []
    for name, data in accuracy_files:
        for r in data.get("records", []):
            records.append(dict(r, file=name, note="transcribed"))
    for name, data in side_by_side:
        dry = data.get("context", {}).get("dry_run")
        for rec in data.get("records", []):
            for tensor, t in rec.get("check", {}).get("tensors", {}).items():
                if t.get("rel_l2") is None:
                    continue
                records.append(dict(op=rec["op"], impl=rec["impl"], dtype=rec.get("dtype", "bf16"),
                                    chunk_size=rec.get("chunk_size"), tensor=f"{tensor} ({rec['pass']})",
                                    rel_l2=t["rel_l2"], shape=shape_text(rec["shape"]) + ", one sampled head",
                                    file=name, note="side by side" + (" DRY RUN" if dry else "")))
    if not records:
        rep.add("Not measured.\n")
        return
    rep.add("Relative L2 error ‖x − x_ref‖ / ‖x_ref‖ against a float64 reference on the same rounded inputs. The "
            "accuracy shape (DESIGN.md: B=2, H=4, L=512, D=128) differs from the timing shape; side-by-side figures "
            "are on one sampled head of the timing shape. 'not measured' means no figure exists yet.\n")
    rows = OrderedDict()
    for r in records:
        key = (OPS.get(r["op"], r["op"]), r["tensor"], r["impl"], r["dtype"], r["shape"], r["note"])
        rows.setdefault(key, {})[r["chunk_size"]] = r["rel_l2"]
    # Every deltaproof op in every kernel dtype gets a row, so that missing figures show.
    for op in OPS:
        for dtype in ("bf16", "fp16", "fp32"):
            if not any(k[0] == OPS[op] and k[2] == "deltaproof" and k[3] == dtype for k in rows):
                rows[(OPS[op], "o", "deltaproof", dtype, "—", "—")] = {}
    body = []
    for key, by_c in rows.items():
        if None in by_c:  # a figure that does not depend on C (rounding floors, peers at their own C)
            cells = [f"{by_c[None]:.3e} (any C)"] + [""] * (len(CHUNK_SIZES) - 1)
        else:
            cells = [f"{by_c[c]:.3e}" if c in by_c else "not measured" for c in CHUNK_SIZES]
        body.append(list(key[:4]) + cells + [key[4], key[5]])
    rep.add(table(["op", "tensor", "implementation", "dtype"] + [f"C={c}" for c in CHUNK_SIZES] + ["shape", "source"],
                  body))
    sources = OrderedDict((r["source"], None) for r in records if r.get("source"))
    if sources:
        rep.add("Sources of the transcribed figures: " + "; ".join(sources) + ".\n")
    # Plot: error against C, and error against time (the trade-off).
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    op_colors = {"linear": "tab:blue", "delta": "tab:red", "gated-delta": "tab:purple"}
    for op in OPS:
        for impl in ("deltaproof", "fla", "article"):
            pts = sorted((r["chunk_size"], r["rel_l2"]) for r in records if r["op"] == op and r["impl"] == impl and
                         r["tensor"].split(" ")[0] == "o" and isinstance(r["chunk_size"], int) and r["dtype"] == "bf16")
            if pts:
                style = IMPL_STYLE[impl]
                ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker=style["marker"], color=op_colors[op],
                         linestyle="-" if impl == "deltaproof" else "none", label=f"{OPS[op]}, {impl}",
                         fillstyle="full" if impl == "deltaproof" else "none")
        floor = [r["rel_l2"] for r in records if r["op"] == op and r["impl"].startswith("bf16 rounding")]
        if floor:
            ax1.axhline(floor[0], color=op_colors[op], lw=0.8, ls="--", label=f"{OPS[op]}: bf16 rounding of the exact output")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(CHUNK_SIZES, [str(c) for c in CHUNK_SIZES])
    ax1.set_xlabel("chunk size C")
    ax1.set_ylabel("relative L2 error of o (bf16)")
    ax1.set_title("accuracy against C", fontsize=9)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=6)
    forward_times = {(m.op, m.impl, m.C): m.time_us for m in measurements if m.pass_ == "forward"}
    traded = 0
    for r in records:
        t = forward_times.get((r["op"], r["impl"], r["chunk_size"]))
        if t is None or r["tensor"].split(" ")[0] != "o" or r["dtype"] != "bf16":
            continue
        style = IMPL_STYLE.get(r["impl"], dict(marker="x"))
        ax2.scatter(t, r["rel_l2"], color=op_colors[r["op"]], marker=style["marker"],
                    facecolors="none" if r["impl"] != "deltaproof" else None)
        ax2.annotate(f"C={r['chunk_size']}", (t, r["rel_l2"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        traded += 1
    ax2.set_xlabel("forward time at the timing shape (µs)")
    ax2.set_ylabel("relative L2 error of o (bf16)")
    ax2.set_title("accuracy next to speed (colour: op as on the left; hollow: peers)", fontsize=9)
    ax2.grid(alpha=0.3)
    rep.figure(fig, "accuracy.png", "accuracy against C, and against time")
    if not traded:
        rep.add("No (time, accuracy) pair exists yet for the right panel.\n")


def side_by_side_section(rep, side_by_side):
    rep.add("## Side by side with fla and the article's kernels\n")
    if not side_by_side:
        rep.add("Not measured: bench/h200/side_by_side.py has not run on a GPU yet (bench/h200/README.md gives the "
                "command). DESIGN.md's performance table holds the last one-session figures (2026-12-01), of which "
                "no JSON was kept, so they are not plotted here.\n")
        return
    for name, data in side_by_side:
        c = data.get("context", {})
        rep.add(f"`{name}` ({c.get('date', '?')}{', **DRY RUN: stand-in kernels on a CPU**' if c.get('dry_run') else ''}): "
                f"{shape_text(c.get('shape', GPU_SHAPE))}, decode {shape_text(c.get('decode_shape', GPU_DECODE_SHAPE))}; "
                f"{c.get('inputs', '')}. {c.get('timing', '')}\n")
        rows = []
        for rec in data.get("records", []):
            check = rec.get("check", {})
            verdict = ("agrees" if check.get("agrees") else "DISAGREES") if check else "—"
            worst = max((t.get("ratio") or 0 for t in check.get("tensors", {}).values()), default=None)
            rows.append([OPS.get(rec["op"], rec["op"]), rec["pass"], rec["impl"], rec.get("chunk_size") or "—",
                         us(rec.get("median_us")) if rec.get("status") == "timed" else rec.get("status", "?"),
                         verdict + (f" (err/bound ≤ {worst:.2g})" if worst is not None and check else ""),
                         (rec.get("error") or "")[:120]])
        rep.add(table(["op", "pass", "implementation", "C", "median (µs)", "oracle check, sampled head", "note"], rows))
        # Targets hold for the benchmark shape on the GPU, deltaproof's fastest C against the peer's fastest.
        judged = not c.get("dry_run") and c.get("shape", GPU_SHAPE) == GPU_SHAPE
        ratio_rows = []
        for r in data.get("ratios", []):
            target = RATIO_TARGETS.get((r["op"], r["pass"]))
            met = ""
            if target and r["denominator"].startswith(target[0]) and r.get("compares", "fastest against fastest") == \
                    "fastest against fastest":
                met = f"≤ {target[1]}: " + (("met" if r["ratio"] <= target[1] else "not met") if judged else "not judged")
            ratio_rows.append([OPS.get(r["op"], r["op"]), r["pass"], r["numerator"], r["denominator"],
                               f"{r['ratio']:.2f}", met])
        if ratio_rows:
            rep.add("Ratios of this run: deltaproof's fastest C against each peer's fastest (the target applies to "
                    "these), then at equal C:\n")
            rep.add(table(["op", "pass", "numerator", "denominator", "ratio", "target (issue 13)"], ratio_rows))
        goal_rows = []
        for (op, pass_), goal in GOALS_US.items():
            best = [rec["median_us"] for rec in data.get("records", []) if rec["op"] == op and rec["pass"] == pass_ and
                    rec["impl"] == "deltaproof" and rec.get("status") == "timed"]
            if best:
                verdict = ("met" if min(best) <= goal else "not met") if judged else "not judged (dry run or other shape)"
                goal_rows.append([OPS[op], pass_, us(min(best)), f"≤ {goal}", verdict])
        if goal_rows:
            rep.add(table(["op", "pass", "deltaproof, fastest C (µs)", "goal (µs)", ""], goal_rows))


def cpu_section(rep, runs):
    rep.add("## The CPU oracle\n")
    cpu = [r for r in runs if not r.gpu]
    if not cpu:
        rep.add("Not measured.\n")
        return
    rep.add("CPU time per call (the machine was shared; the header gives its load). FLOP rates are the benchmarks' "
            "own counters (model FLOPs per CPU second; bench/bench_*.cpp state their models).\n")
    series = OrderedDict()
    for r in cpu:
        if "C" not in r.args:
            continue
        rest = ", ".join(f"{k}={v}" for k, v in r.args.items() if k != "C")
        series.setdefault((r.family, rest, r.source), []).append(r)
    if series:
        fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
        for (family, rest, _), rs in series.items():
            pts = sorted((r.args["C"], r.cpu_us) for r in rs if isinstance(r.args["C"], (int, float)))
            if len(pts) < 2:
                ax.scatter([p[0] for p in pts], [p[1] / 1e3 for p in pts], label=f"{family} ({rest})")
            else:
                ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="o", label=f"{family} ({rest})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({r.args["C"] for rs in series.values() for r in rs if isinstance(r.args["C"], (int, float))})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("chunk size C (for BM_TriangularSolve: the size of the system)")
        ax.set_ylabel("CPU time per call (ms)")
        ax.set_title("CPU oracle: cost against C", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
        rep.figure(fig, "cpu_oracle.png", "CPU oracle time against C")
        for (family, rest, source), rs in series.items():
            rs = sorted(rs, key=lambda r: r.args["C"])
            rate = next((k for k in rs[0].counters if k.upper().startswith("FLOP")), None)
            cells = [f"C={r.args['C']}: {duration(r.cpu_us)}" + (f" ({human(r.counters[rate], 'FLOP/s')})" if rate else "")
                     for r in rs]
            best = min(rs, key=lambda r: r.cpu_us)
            fastest = f" Fastest at C = {best.args['C']}." if "L" in rs[0].args and len(rs) > 1 else ""
            rep.add(f"- `{family}` ({rest}; `{source}`): " + ", ".join(cells) + "." + fastest)
        rep.add("")
    # The cost of exactness: the same form in other scalars, per model FLOP.
    by_base = defaultdict(list)
    for r in cpu:
        by_base[r.base].append(r)
    rows = []
    for base, rs in by_base.items():
        scalars = {r.scalar for r in rs}
        if len(scalars) < 2 or "double" not in scalars:
            continue
        doubles = [r for r in rs if r.scalar == "double"]
        for r in rs:
            if r.scalar == "double":
                continue
            rate_key = next((k for k in r.counters if k.upper().startswith("FLOP")), None)
            same_c = [d for d in doubles if d.args.get("C") == r.args.get("C")] or doubles
            ref = min(same_c, key=lambda d: abs(d.args.get("L", 0) - r.args.get("L", 0)))
            slowdown = (ref.counters[rate_key] / r.counters[rate_key]) if rate_key and rate_key in ref.counters else None
            rows.append([base, r.scalar, ", ".join(f"{k}={v}" for k, v in r.args.items()), duration(r.cpu_us),
                         ", ".join(f"{k}={v}" for k, v in ref.args.items()), duration(ref.cpu_us),
                         f"{slowdown:.0f}×" if slowdown else "—"])
    rep.add("### The cost of exactness\n")
    if rows:
        rep.add("Each exact or high-precision run against the double run of the same form (same C where there is one): "
                "slowdown per model FLOP, since the shapes differ. Exact entries grow in size with L, so the "
                "slowdown grows with the shape too.\n")
        rep.add(table(["form", "scalar", "shape", "CPU time", "double run", "double CPU time", "slowdown per FLOP"], rows))
    else:
        rep.add("No benchmark runs one form in two scalars: not measured.\n")
    present = sorted({r.scalar for r in cpu if r.scalar})
    missing = [s for s in ("Exact", "High") if s not in present]
    if missing:
        rep.add(f"Not measured by the benchmarks given: {', '.join(missing)} (no family with that scalar).\n")


def all_benchmarks_section(rep, runs):
    rep.add("## Every benchmark\n")
    rep.add("One table per family and file, as read (median over repetitions; counters as rates).\n")
    families = OrderedDict()
    for r in runs:
        families.setdefault((r.source, r.family), []).append(r)
    for (source, family), rs in families.items():
        arg_names = list(OrderedDict.fromkeys(k for r in rs for k in r.args))
        counters = list(OrderedDict.fromkeys(k for r in rs for k in r.counters))
        header = arg_names + ["time", "CPU time", "reps"] + counters + (["label"] if any(r.label for r in rs) else [])
        rows = []
        for r in rs:
            row = [r.args.get(a, "") for a in arg_names] + [duration(r.time_us),
                                                            duration(r.cpu_us) if not math.isnan(r.cpu_us) else "—",
                                                            r.repetitions or 1]
            row += [human(r.counters[c], "/s") if c in r.counters else "" for c in counters]
            if any(x.label for x in rs):
                row.append(r.label)
            rows.append(row)
        rep.add(f"### {family} (`{source}`{', transcribed' if rs[0].transcribed else ''})\n")
        rep.add(table(header, rows))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    parser.add_argument("inputs", nargs="*",
                        help="JSON files (Google Benchmark, side-by-side, accuracy records); default bench/results/*.json")
    parser.add_argument("--out", default=results, help="folder for REPORT.md and the PNGs (default bench/results)")
    a = parser.parse_args(argv)
    given = bool(a.inputs)
    if not given:
        a.inputs = sorted(glob.glob(os.path.join(results, "*.json")))
        if not a.inputs:
            parser.error(f"no inputs given and no JSON in {results}")
    os.makedirs(a.out, exist_ok=True)
    runs, contexts, side_by_side, accuracy = load(a.inputs)
    measurements = measurements_from_runs(runs, contexts)
    for name, data in side_by_side:
        measurements += measurements_from_side_by_side(name, data)
    command = "/usr/bin/python3 bench/report.py"
    if given or os.path.abspath(a.out) != results:
        command += " " + " ".join(a.inputs if given else []) + f" --out {a.out}"
    rep = Report(a.out, command)
    fits = _fits(measurements)
    header_section(rep, contexts)
    side_by_side_section(rep, side_by_side)
    time_vs_chunk_section(rep, measurements, fits)
    decode_section(rep, measurements)
    model_section(rep)
    counters_section(rep, runs)
    roofline_section(rep, measurements)
    accuracy_section(rep, accuracy, side_by_side, measurements)
    cpu_section(rep, runs)
    all_benchmarks_section(rep, runs)
    rep.write()
    print(f"wrote {os.path.join(a.out, 'REPORT.md')} and {len(rep.figures)} plots: {', '.join(rep.figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
