"""Reading the records: benchmark JSON in, plain data out (no Markdown, no plotting).

Inputs are recognised by their content, any number in any order:
  - Google Benchmark JSON (--benchmark_out=F --benchmark_out_format=json): the CUDA benchmarks
    (bench_*_cuda, CUDA-event times) and the CPU oracle benchmarks (bench_linear_attention,
    bench_delta_rule, or any other). Every run is keyed by its name: the family before the first
    '/', a template argument as the scalar (BM_Chunkwise<Exact>), then the ArgNames (C:64/D:128).
    A file whose context holds "transcribed_from" (figures copied from notes) is read the same way
    and marked as transcribed wherever it is shown.
  - side-by-side JSON of bench/gpu/side_by_side.py (top-level key "side_by_side").
  - accuracy records (top-level key "accuracy"), each with its own provenance.
Every file's provenance (date, commit, GPU, versions, command; bench/provenance.py describes the
object) is read from its top-level "provenance", or from Google Benchmark's context where a run
put those keys there (bench/gpu/run.sh does); a merged file's "parts" give each family or pass
its own.
"""
import json
import os
import statistics
from collections import OrderedDict
from dataclasses import dataclass, field

from .model import GPU_DECODE_SHAPE, GPU_SHAPE, OPS, PASSES, PEERS, SEQUENTIAL_PASSES, fit_latency

# Google Benchmark's own fields and the name segments that are settings, not arguments.
_STANDARD_FIELDS = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads", "iterations",
                    "real_time", "cpu_time", "time_unit", "family_index", "per_family_instance_index",
                    "aggregate_name", "aggregate_unit", "label", "error_occurred", "error_message", "transcribed",
                    "big_o", "rms"}
_SETTING_KEYS = {"iterations", "repeats", "min_time", "min_warmup_time", "threads"}
_SETTING_WORDS = {"manual_time", "real_time", "process_time"}
_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
PROVENANCE_KEYS = ("date", "commit", "commit_source", "gpu", "host", "versions", "command", "note")


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
    provenance: dict = field(default_factory=dict)


@dataclass
class SourceFile:
    """One input file: its kind, its provenance and, for Google Benchmark, its context."""
    name: str
    kind: str  # "Google Benchmark", "side by side" or "accuracy records"
    provenance: dict
    context: dict
    data: dict


@dataclass
class Records:
    """Everything read from the inputs."""
    files: OrderedDict  # name -> SourceFile
    runs: list  # Run, every Google Benchmark run
    side_by_side: list  # (name, data) of the side-by-side files
    accuracy: list  # (name, data) of the accuracy files
    measurements: list  # Measurement, GPU kernel times from every source


def provenance_of(data):
    """The file's provenance: its top-level object, else the keys a run put into Google Benchmark's
    context; missing keys read "not recorded"."""
    given = data.get("provenance")
    if given is None:
        context = data.get("context", {})
        given = {k: context[k] for k in PROVENANCE_KEYS if k in context}
        if "commit" not in given:
            given = {}
        versions = {k: context[k] for k in ("nvidia_driver", "cuda_toolkit") if k in context}
        if given and versions:
            given["versions"] = versions
    out = OrderedDict((k, given.get(k, "not recorded")) for k in ("date", "commit", "gpu", "command"))
    for k, v in given.items():
        out.setdefault(k, v)
    return out


def part_for(provenance, key):
    """The provenance of one benchmark family or pass of a merged file: its part, else the file's."""
    for part in provenance.get("parts", []):
        if key in part.get("selects", []):
            return OrderedDict(provenance, **part)
    return provenance


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



def measurements_from_runs(runs, files):
    out = []
    for r in runs:
        if not r.gpu or r.base not in GPU_FAMILIES:
            continue
        op, pass_, variant = GPU_FAMILIES[r.base](r.args)
        if pass_ == "decode":
            shape = dict(GPU_DECODE_SHAPE, B=r.args.get("B", 64), T=r.args.get("T", 1))
        else:
            shape = dict(GPU_SHAPE)
        source = files[r.source]
        date = _short_date(source.context.get("date"))
        series = f"deltaproof ({r.source}, {date}{', transcribed' if r.transcribed else ''})"
        out.append(Measurement(op, pass_, "deltaproof", r.args.get("C"), r.time_us, shape, r.source, series,
                               r.transcribed, variant, provenance=part_for(source.provenance, r.base)))
    return out


def measurements_from_side_by_side(name, data, provenance):
    out = []
    date = _short_date(data.get("context", {}).get("date"))
    dry = data.get("context", {}).get("dry_run")
    for rec in data.get("records", []):
        if rec.get("status") != "timed":
            continue
        # Named by the file as well as the date: two runs of one day are two series, never one curve.
        label = f"{rec['impl']} ({name}{' DRY RUN' if dry else ''}, {date})"
        out.append(Measurement(rec["op"], rec["pass"], rec["impl"], rec.get("chunk_size"), rec["median_us"],
                               rec["shape"], name, label, False, "", rec.get("check", {}),
                               part_for(provenance, rec["pass"])))
    return out


def load(paths):
    files, runs, side_by_side, accuracy = OrderedDict(), [], [], []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        name = os.path.basename(path)
        provenance = provenance_of(data)
        if "side_by_side" in data:
            side_by_side.append((name, data))
            kind = "side by side"
        elif "accuracy" in data:
            accuracy.append((name, data))
            kind = "accuracy records"
        elif "benchmarks" in data:
            kind = "Google Benchmark"
            runs.extend(read_google_benchmark(path, data))
        else:
            raise SystemExit(f"{path}: neither Google Benchmark JSON nor side-by-side nor accuracy records")
        files[name] = SourceFile(name, kind, provenance, data.get("context", {}), data)
    measurements = measurements_from_runs(runs, files)
    for name, data in side_by_side:
        measurements += measurements_from_side_by_side(name, data, files[name].provenance)
    return Records(files, runs, side_by_side, accuracy, measurements)


# ---------------------------------------------------------------------------------------------
# Grouping and the latency fits
# ---------------------------------------------------------------------------------------------

def series_of(measurements):
    out = OrderedDict()
    for m in measurements:
        out.setdefault(m.series, []).append(m)
    return out


def by_op_pass(measurements):
    out = OrderedDict()
    for op in OPS:
        for pass_ in PASSES:
            group = [m for m in measurements if m.op == op and m.pass_ == pass_ and not m.variant]
            if group:
                out[(op, pass_)] = group
    return out


def latency_fits(measurements):
    """The latency fit of every deltaproof series of a sequential pass, by (op, pass, series)."""
    fits = {}
    for (op, pass_), group in by_op_pass(measurements).items():
        if pass_ not in SEQUENTIAL_PASSES:
            continue
        for series, ms in series_of(group).items():
            if ms[0].impl != "deltaproof":
                continue
            points = {m.C: m.time_us for m in ms if isinstance(m.C, int)}
            fit = fit_latency(points, op, pass_, ms[0].shape)
            if fit:
                fits[(op, pass_, series)] = fit
    return fits


def order_key(m):
    return (list(OPS).index(m.op) if m.op in OPS else 99, PASSES.index(m.pass_) if m.pass_ in PASSES else 99,
            m.series, m.C if isinstance(m.C, int) else 0)


# ---------------------------------------------------------------------------------------------
# The headline: per op and pass, the latest run that timed deltaproof beside a peer
# ---------------------------------------------------------------------------------------------

@dataclass
class Headline:
    op: str
    pass_: str
    deltaproof_us: float
    deltaproof_C: object
    peers: dict  # impl -> (median µs of its fastest timed record, its C) or a status text where none was timed
    ratios: dict  # impl -> deltaproof's fastest / the peer's fastest, as the run computed it
    peer_errors: dict  # impl -> the first error of a peer that was not timed
    source: str
    provenance: dict
    dry_run: bool


def _ratio_impl(denominator, impl):
    return denominator == impl or denominator.startswith(impl + " (C=")


def headline(side_by_side, files):
    """One Headline per (op, pass) that some side-by-side run timed deltaproof in: the latest such run
    (by the date of the part of its record that holds the pass). Ratios only within that run."""
    best = OrderedDict()
    for name, data in side_by_side:
        provenance = files[name].provenance
        records = data.get("records", [])
        for op in OPS:
            for pass_ in PASSES:
                group = [r for r in records if r["op"] == op and r["pass"] == pass_]
                ours = [r for r in group if r["impl"] == "deltaproof" and r.get("status") == "timed"]
                if not ours:
                    continue
                part = part_for(provenance, pass_)
                if (op, pass_) in best and str(best[(op, pass_)].provenance.get("date")) >= str(part.get("date")):
                    continue
                fastest = min(ours, key=lambda r: r["median_us"])
                peers, ratios, errors = OrderedDict(), OrderedDict(), OrderedDict()
                for impl in PEERS:
                    theirs = [r for r in group if r["impl"] == impl]
                    timed = [r for r in theirs if r.get("status") == "timed"]
                    if timed:
                        f = min(timed, key=lambda r: r["median_us"])
                        peers[impl] = (f["median_us"], f.get("chunk_size"))
                    elif theirs:
                        peers[impl] = "not timed: " + ", ".join(sorted({r.get("status", "?") for r in theirs}))
                        errors[impl] = next((r["error"] for r in theirs if r.get("error")), "")
                    for r in data.get("ratios", []):
                        if (r["op"], r["pass"]) == (op, pass_) and r.get("compares", "fastest against fastest") == \
                                "fastest against fastest" and _ratio_impl(r["denominator"], impl):
                            ratios[impl] = r["ratio"]
                best[(op, pass_)] = Headline(op, pass_, fastest["median_us"], fastest.get("chunk_size"), peers, ratios,
                                             errors, name, part, bool(data.get("context", {}).get("dry_run")))
    return list(best.values())


def accuracy_records(accuracy_files, side_by_side):
    """Relative L2 errors from the accuracy records and from every side-by-side check, as dicts."""
    records = []
    for name, data in accuracy_files:
        file_provenance = provenance_of(data)
        for r in data.get("records", []):
            records.append(dict(r, file=name, note="transcribed",
                                provenance=r.get("provenance", file_provenance)))
    for name, data in side_by_side:
        dry = data.get("context", {}).get("dry_run")
        for rec in data.get("records", []):
            for tensor, t in rec.get("check", {}).get("tensors", {}).items():
                if t.get("rel_l2") is None:
                    continue
                records.append(dict(op=rec["op"], impl=rec["impl"], dtype=rec.get("dtype", "bf16"),
                                    chunk_size=rec.get("chunk_size"), tensor=f"{tensor} ({rec['pass']})",
                                    rel_l2=t["rel_l2"], shape=rec["shape"], sampled_head=True,
                                    file=name, note="side by side" + (" DRY RUN" if dry else "")))
    return records
