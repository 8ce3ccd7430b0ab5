#!/usr/bin/env python3
"""Turns Google Benchmark JSON (--benchmark_out=F --benchmark_out_format=json) into Markdown tables.

One table per benchmark family (the part of the name before the first '/'), one row per run,
with the named arguments as columns, the time per iteration, and every counter (FLOP/s etc.).

    bench/report.py la.json [more.json ...] > report.md
"""
import json
import sys
from collections import OrderedDict


def split_name(name):
    family, *args = name.split("/")
    named = OrderedDict()
    for a in args:
        key, _, value = a.partition(":")
        if value:
            named[key] = value
    return family, named


def human(x, unit=""):
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".strip()


def main(paths):
    families = OrderedDict()
    contexts = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        contexts.append(data.get("context", {}))
        for run in data["benchmarks"]:
            if run.get("run_type") == "aggregate" and run.get("aggregate_name") != "median":
                continue
            family, args = split_name(run["run_name"] if "run_name" in run else run["name"])
            families.setdefault(family, []).append((args, run))
    for ctx in contexts:
        print(f"Host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs at {ctx.get('mhz_per_cpu', '?')} MHz, "
              f"{ctx.get('date', '')}, load average {ctx.get('load_avg', '?')}\n")
    skip = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads", "iterations", "real_time",
            "cpu_time", "time_unit", "family_index", "per_family_instance_index", "aggregate_name", "aggregate_unit"}
    for family, runs in families.items():
        arg_names = list(OrderedDict.fromkeys(k for args, _ in runs for k in args))
        counters = list(OrderedDict.fromkeys(k for _, r in runs for k in r if k not in skip and isinstance(r[k], (int, float))))
        header = arg_names + ["real time", "CPU time"] + counters
        print(f"### {family}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for args, r in runs:
            unit = r.get("time_unit", "ns")
            cells = [args.get(a, "") for a in arg_names]
            cells += [f"{r['real_time']:.4g} {unit}", f"{r['cpu_time']:.4g} {unit}"]
            cells += [human(r[c], "/s" if c in ("FLOP", "bytes") else "") if c in r else "" for c in counters]
            print("| " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
