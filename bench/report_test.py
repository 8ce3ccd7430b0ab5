"""bench/report.py: the report from the committed JSON, its figures against the JSON, the cost model
against the benchmarks' own counters, the latency fit, and JSON it has never seen (new families, a
High scalar, a side-by-side file). ctest: bench_report (label report)."""
import glob
import json
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)
import report  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def committed_inputs():
    return sorted(p for p in glob.glob(os.path.join(RESULTS, "*.json")))


@pytest.fixture(scope="module")
def committed_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert report.main(committed_inputs() + ["--out", str(out)]) == 0
    return out, (out / "REPORT.md").read_text()


def median_us(path, run_name):
    with open(path) as f:
        data = json.load(f)
    (entry,) = [b for b in data["benchmarks"] if b.get("run_name") == run_name and b.get("aggregate_name") == "median"]
    return entry["real_time"] * {"us": 1, "ns": 1e-3, "ms": 1e3}[entry["time_unit"]]


def test_markdown_and_every_plot_it_names_exist(committed_report):
    out, text = committed_report
    for section in ("# deltaproof benchmark report", "## Side by side", "## Time against chunk size",
                    "## Decode (one token)", "## The cost model", "## Roofline", "## Accuracy against chunk size and dtype",
                    "## The CPU oracle", "### The cost of exactness", "## Every benchmark"):
        assert section in text, section
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert {"roofline.png", "accuracy.png", "decode.png", "cpu_oracle.png", "time_vs_chunk_linear.png"} <= set(images)
    for name in images:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name


def test_linear_attention_times_are_the_json_medians(committed_report):
    _, text = committed_report
    path = os.path.join(RESULTS, "linear_attention_cuda_h200.json")
    with open(path) as f:
        date = json.load(f)["context"]["date"][:10]
    for family in ("Forward", "Backward"):
        cells = [report.us(median_us(path, f"BM_LinearAttention{family}/C:{c}/iterations:1/repeats:60/manual_time"))
                 for c in (16, 32, 64)]
        row = f"| deltaproof (linear_attention_cuda_h200.json, {date}) | " + " | ".join(cells) + " |"
        assert row in text, row


def test_delta_rule_times_are_the_json_medians(committed_report):
    _, text = committed_report
    path = os.path.join(RESULTS, "delta_rule_cuda_h200.json")
    with open(path) as f:
        date = json.load(f)["context"]["date"][:10]
    for family in ("Forward", "Backward", "ForwardBackward"):
        for gated in (0, 1):
            cells = [report.us(median_us(path, f"BM_DeltaRule{family}/C:{c}/gated:{gated}/iterations:1/repeats:60/manual_time"))
                     for c in (16, 32, 64)]
            row = f"| deltaproof (delta_rule_cuda_h200.json, {date}) | " + " | ".join(cells) + " |"
            assert row in text, row


def test_transcribed_figures_are_marked(committed_report):
    _, text = committed_report
    assert "| `accuracy_h200_notes.json` | accuracy records | 2026-12-01 | — | transcribed;" in text
    # Missing accuracy figures say so instead of being left out.
    assert "| DeltaNet | o | deltaproof | fp16 | not measured | not measured | not measured |" in text


def test_model_matches_the_linear_benchmark_counters():
    """The model's FLOPs and bytes equal what bench_linear_attention_cuda counts (its rates × time)."""
    path = os.path.join(RESULTS, "linear_attention_cuda_h200.json")
    runs, _, _, _ = report.load([path])
    checked = 0
    for r in runs:
        if r.base not in report.GPU_FAMILIES:  # as the report does (BM_LinearAttentionDecodeQueued: no cost model)
            continue
        op, pass_, _ = report.GPU_FAMILIES[r.base](r.args)
        shape = dict(report.GPU_DECODE_SHAPE, B=r.args["B"], T=r.args["T"]) if pass_ == "decode" else report.GPU_SHAPE
        seconds = r.time_us * 1e-6
        assert r.counters["FLOPs"] * seconds == pytest.approx(report.model_flops(op, pass_, shape, r.args.get("C", 0)), rel=1e-3)
        assert r.counters["bytes"] * seconds == pytest.approx(report.model_bytes(op, pass_, shape, r.args.get("C", 0)), rel=1e-3)
        checked += 1
    assert checked == 7


def test_latency_fit_recovers_its_parameters():
    shape = dict(report.GPU_SHAPE)
    tau, rate = 3.0, 150e12
    points = {c: tau * report.chunk_steps(shape, c) + report.model_flops("linear", "forward", shape, c) / rate * 1e6
              for c in (16, 32, 64)}
    fit = report.fit_latency(points, "linear", "forward", shape)
    assert fit["ok"] and fit["tau_us"] == pytest.approx(tau) and fit["rate"] == pytest.approx(rate)
    assert fit["max_residual"] < 1e-9
    assert report.latency_us(fit, "linear", "forward", shape, 48) == pytest.approx(
        tau * 86 + report.model_flops("linear", "forward", shape, 48) / rate * 1e6)


def test_json_never_seen_before(tmp_path):
    """A new family with a High scalar, plain repetitions (no aggregates), positional arguments and a
    side-by-side file: all read, none fatal."""
    def run(name, real, cpu, flop_rate, rep):
        return {"name": name, "run_name": name, "run_type": "iteration", "repetitions": 3, "repetition_index": rep,
                "iterations": 1, "real_time": real, "cpu_time": cpu, "time_unit": "ms", "FLOP": flop_rate}
    benchmarks = []
    for rep in range(3):
        benchmarks.append(run("BM_NewForm<double>/L:64/C:16/D:8", 2.0 + rep, 1.0 + rep, 1e9, rep))
        benchmarks.append(run("BM_NewForm<High>/L:64/C:16/D:8", 200.0, 100.0 + rep, 1e6 * (1 + rep), rep))
        benchmarks.append(run("BM_Positional/7/min_time:0.100", 1.0, 1.0, 5.0, rep))
    gb = tmp_path / "new.json"
    gb.write_text(json.dumps({"context": {"date": "2026-12-02", "host_name": "test", "num_cpus": 2, "load_avg": [0.5, 0, 0],
                                          "executable": "./bench_new"}, "benchmarks": benchmarks}))
    shape = dict(B=8, H=16, L=4096, DK=128, DV=128)
    records = [dict(op="linear", **{"pass": "forward"}, impl=impl, chunk_size=64, dtype="bf16", shape=shape, status="timed",
                    median_us=t, check={"agrees": True, "tensors": {"o": {"ratio": 0.1, "rel_l2": 2e-3}}})
               for impl, t in (("deltaproof", 300.0), ("fla", 400.0), ("article", 500.0))]
    records.append(dict(op="delta", **{"pass": "forward"}, impl="fla", chunk_size=64, dtype="bf16", shape=shape,
                        status="check failed", check={"agrees": False, "tensors": {"o": {"ratio": 3.0, "rel_l2": 0.5}}}))
    sbs = tmp_path / "side_by_side_linear.json"
    sbs.write_text(json.dumps({"side_by_side": 1, "context": {"date": "2026-12-02", "shape": shape, "dry_run": True},
                               "records": records,
                               "ratios": [{"op": "linear", "pass": "forward", "numerator": "deltaproof (C=64)",
                                           "denominator": "fla", "ratio": 0.75}]}))
    real = tmp_path / "side_by_side_real.json"  # the same shape on a GPU: judged against the targets
    real.write_text(json.dumps({"side_by_side": 1, "context": {"date": "2026-12-03", "shape": shape, "dry_run": False},
                                "records": records[:2], "ratios": [
                                    {"op": "linear", "pass": "forward", "numerator": "deltaproof (C=64)",
                                     "denominator": "fla (C=64)", "ratio": 0.6, "compares": "fastest against fastest"},
                                    {"op": "linear", "pass": "forward", "numerator": "deltaproof (C=16)",
                                     "denominator": "fla (C=64)", "ratio": 0.7, "compares": "equal C"}]}))
    out = tmp_path / "out"
    assert report.main([str(gb), str(sbs), str(real), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert "### BM_NewForm<High> (`new.json`)" in text and "### BM_Positional (`new.json`)" in text
    # Medians over the repetitions: CPU times 1, 2, 3 ms -> 2 ms; rates 1e9 / median(1e6, 2e6, 3e6) = 500x.
    assert "| BM_NewForm | High | L=64, C=16, D=8 | 101 ms | L=64, C=16, D=8 | 2 ms | 500× |" in text
    assert "| arg0 | time | CPU time | reps | FLOP |\n|---|---|---|---|---|\n| 7 |" in text
    assert "Not measured by the benchmarks given: Exact" in text
    assert "DRY RUN" in text
    # a dry run is not judged against the targets
    assert "| Linear attention | forward | deltaproof (C=64) | fla | 0.75 | ≤ 0.65: not judged |" in text
    assert "| DeltaNet | forward | fla | 64 | check failed | DISAGREES (err/bound ≤ 3) |" in text
    assert "| Linear attention | forward | deltaproof (C=64) | fla (C=64) | 0.60 | ≤ 0.65: met |" in text
    assert "| Linear attention | forward | deltaproof (C=16) | fla (C=64) | 0.70 |  |" in text
    assert "| Linear attention | forward | 300 | ≤ 210 | not met |" in text


def test_two_side_by_side_runs_of_one_day_stay_two_series(tmp_path):
    """Two side-by-side files of one op and one date (a full run, then a C = 64 rerun): each its own row, never one
    curve mixing the runs' chunk sizes."""
    shape = dict(B=8, H=16, L=4096, DK=128, DV=128)
    paths = []
    for name, times in (("side_by_side_delta.json", {16: 1000.0, 32: 900.0, 64: 950.0}),
                        ("side_by_side_delta_rerun.json", {64: 800.0})):
        records = [dict(op="delta", **{"pass": "forward"}, impl="deltaproof", chunk_size=c, dtype="bf16", shape=shape,
                        status="timed", median_us=t, check={"agrees": True, "tensors": {}}) for c, t in times.items()]
        path = tmp_path / name
        path.write_text(json.dumps({"side_by_side": 1, "context": {"date": "2026-12-04", "shape": shape, "dry_run": False},
                                    "records": records, "ratios": []}))
        paths.append(str(path))
    out = tmp_path / "out"
    assert report.main(paths + ["--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert "| deltaproof (side_by_side_delta.json, 2026-12-04) | 1000 | 900 | 950 |" in text
    assert "| deltaproof (side_by_side_delta_rerun.json, 2026-12-04) | — | — | 800 |" in text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
