#!/usr/bin/env python3
"""The benchmark report: JSON records in, bench/results/REPORT.md and PNG plots out.

    /usr/bin/python3 bench/report.py                       # bench/results/*.json -> bench/results/
    /usr/bin/python3 bench/report.py A.json B.json --out DIR

Reads Google Benchmark JSON, side-by-side JSON (bench/gpu/side_by_side.py) and accuracy records, each
with its provenance (bench/reporting/records.py says how they are recognised). REPORT.md opens with
the headline table (per op and pass: deltaproof, each peer, their ratio, the run's date), then every
record's provenance, then the details. Writes <out>/REPORT.md and <out>/*.png (matplotlib, Agg).
"""
import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reporting import plots, records, tables  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="*",
                        help="JSON files (Google Benchmark, side-by-side, accuracy records); default bench/results/*.json")
    parser.add_argument("--out", default=RESULTS, help="folder for REPORT.md and the PNGs (default bench/results)")
    a = parser.parse_args(argv)
    given = bool(a.inputs)
    if not given:
        a.inputs = sorted(glob.glob(os.path.join(RESULTS, "*.json")))
        if not a.inputs:
            parser.error(f"no inputs given and no JSON in {RESULTS}")
    os.makedirs(a.out, exist_ok=True)
    data = records.load(a.inputs)
    command = "/usr/bin/python3 bench/report.py"
    if given or os.path.abspath(a.out) != RESULTS:
        command = " ".join([command] + (a.inputs if given else []) + ["--out", a.out])
    rep = tables.Report(a.out, command, plots)
    fits = records.latency_fits(data.measurements)
    tables.title_section(rep)
    tables.headline_section(rep, data)
    tables.records_section(rep, data)
    tables.side_by_side_section(rep, data.side_by_side)
    tables.time_vs_chunk_section(rep, data.measurements, fits)
    tables.decode_section(rep, data.measurements)
    tables.model_section(rep)
    tables.counters_section(rep, data.runs)
    tables.roofline_section(rep, data.measurements)
    tables.accuracy_section(rep, data, data.measurements)
    tables.cpu_section(rep, data.runs)
    tables.all_benchmarks_section(rep, data.runs)
    rep.write()
    print(f"wrote {os.path.join(a.out, 'REPORT.md')} and {len(rep.figures)} plots: {', '.join(rep.figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
