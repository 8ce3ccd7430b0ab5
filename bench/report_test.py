"""bench/report.py and bench/reporting/: the report from the committed records, its figures against the
JSON, the headline table, every record's provenance, the cost model against the benchmarks' own counters,
the latency fit, and JSON it has never seen (new families, a High scalar, a side-by-side file).
ctest: bench_report (label report)."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)
import report  # noqa: E402
from reporting import model, records  # noqa: E402
from reporting.tables import us  # noqa: E402

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
    for section in ("# deltaproof benchmark report", "## Headline", "## Records", "## Side by side",
                    "## Time against chunk size",
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
        cells = [us(median_us(path, f"BM_LinearAttention{family}/C:{c}/iterations:1/repeats:60/manual_time"))
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
            cells = [us(median_us(path, f"BM_DeltaRule{family}/C:{c}/gated:{gated}/iterations:1/repeats:60/manual_time"))
                     for c in (16, 32, 64)]
            row = f"| deltaproof (delta_rule_cuda_h200.json, {date}) | " + " | ".join(cells) + " |"
            assert row in text, row


def test_transcribed_figures_are_marked(committed_report):
    _, text = committed_report
    assert "| `accuracy.json` | accuracy records | 2026-12-03 | `109f311` | NVIDIA H200 |" in text
    # each transcribed figure's own run: what it was transcribed from, when, which commit, the command
    assert re.search(r"\| the DeltaNet backward GPU suite's accuracy lines [^|]*\| 2026-12-03 \| `f5ae268` \| NVIDIA H200 \| "
                     r"`RC_PARAMS=seed=20261129 build/release/property_tests/delta_rule_backward_gpu_test ", text)
    # Missing accuracy figures say so instead of being left out.
    assert "| DeltaNet | o | deltaproof | fp16 | not measured | not measured | not measured |" in text


# Brackets around one letter each keep this line from matching the words it looks for.
PROCESS_WORDS = re.compile(r"sessio[n] ?[0-9]+|cal[l] [0-9]+|device tim[e]|DESIG[N]\\.md|issu[e] [0-9]+", re.IGNORECASE)


def all_records():
    return committed_inputs() + sorted(glob.glob(os.path.join(RESULTS, "peers", "*.json")))


def git_knows(commit):
    try:
        return subprocess.run(["git", "-C", HERE, "cat-file", "-e", commit + "^{commit}"],
                              capture_output=True).returncode == 0
    except OSError:
        return None


@pytest.mark.parametrize("path", all_records(), ids=os.path.basename)
def test_every_record_carries_provenance(path):
    """date, commit, GPU, versions and command at the top of every committed record (and of each part of a
    merged one); the commit is one git knows; no diary words anywhere in the file."""
    with open(path) as f:
        text = f.read()
    data = json.loads(text)
    p = data["provenance"]
    for entry in [p] + p.get("parts", []):
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}(T[\d:]+\+00:00)?", entry["date"]), entry["date"]
        assert re.fullmatch(r"[0-9a-f]{7,40}", entry["commit"]), entry["commit"]
        assert git_knows(entry["commit"]) in (True, None), entry["commit"]
        assert entry["command"] and "h200/" not in entry["command"], entry["command"]
    assert p["gpu"] and isinstance(p["versions"], dict) and p["versions"]
    for part in p.get("parts", []):
        assert part["selects"]
    assert not PROCESS_WORDS.search(text), PROCESS_WORDS.search(text).group(0)


def test_headline_is_the_first_table_and_holds_the_runs_ratios(committed_report):
    _, text = committed_report
    first_table = text.index("\n|")
    assert text.index("## Headline") < first_table < text.index("## Records")
    with open(os.path.join(RESULTS, "side_by_side_linear.json")) as f:
        run = json.load(f)
    timed = [r for r in run["records"] if r["status"] == "timed" and r["op"] == "linear" and r["pass"] == "forward"]
    fastest = {impl: min((r for r in timed if r["impl"] == impl), key=lambda r: r["median_us"])
               for impl in ("deltaproof", "fla", "article")}
    ratio = {r["denominator"].split(" (")[0]: r["ratio"] for r in run["ratios"] if r["op"] == "linear" and
             r["pass"] == "forward" and r["compares"] == "fastest against fastest"}
    row = ("| Linear attention | forward | " + " | ".join(
        f"{us(fastest[i]['median_us'])} (C={fastest[i]['chunk_size']})" for i in ("deltaproof", "fla", "article")) +
        f" | {ratio['fla']:.2f} | {ratio['article']:.2f} | {run['provenance']['date'][:10]} | "
        f"`{run['provenance']['commit']}` | `side_by_side_linear.json` |")
    assert row in text, row


def side_by_side_file(tmp_path, name, date, commit, records_, ratios, parts=()):
    path = tmp_path / name
    path.write_text(json.dumps({"side_by_side": 1, "provenance": {
        "date": date, "commit": commit, "gpu": "Test GPU", "versions": {"torch": "0"}, "command": "bash run.sh",
        "parts": list(parts)}, "context": {"date": date, "shape": model.GPU_SHAPE, "dry_run": False},
        "records": records_, "ratios": ratios}))
    return str(path)


def test_headline_takes_the_latest_run_of_each_pass(tmp_path):
    """Two runs time the DeltaNet forward: the later one's figures and ratio fill the row, with its date and
    commit; a pass only the earlier run timed keeps the earlier run; a peer that raised says so; a merged
    file's part gives its pass its own date."""
    shape = dict(model.GPU_SHAPE)

    def rec(pass_, impl, t, status="timed", C=64):
        r = dict(op="delta", **{"pass": pass_}, impl=impl, chunk_size=C, dtype="bf16", status=status,
                 shape=dict(model.GPU_DECODE_SHAPE, B=64) if pass_ == "decode" else shape,
                 check={"agrees": True, "tensors": {}})
        if status == "timed":
            r["median_us"] = t
        else:
            r["error"] = "RuntimeError: refused"
        return r
    early = side_by_side_file(tmp_path, "side_by_side_early.json", "2026-12-01T10:00:00+00:00", "aaaaaaa",
                              [rec("forward", "deltaproof", 900.0), rec("forward", "fla", 1000.0),
                               rec("forward+backward", "deltaproof", 3000.0),
                               rec("forward+backward", "fla", None, status="raised"),
                               rec("decode", "deltaproof", 70.0, C=None), rec("decode", "fla", 200.0, C=None)],
                              [dict(op="delta", **{"pass": "forward"}, numerator="deltaproof (C=64)",
                                    denominator="fla (C=64)", ratio=0.9, compares="fastest against fastest"),
                               dict(op="delta", **{"pass": "decode"}, numerator="deltaproof", denominator="fla",
                                    ratio=0.35, compares="fastest against fastest")],
                              parts=[dict(selects=["decode"], date="2026-11-30T10:00:00+00:00", commit="ccccccc",
                                          command="bash old.sh")])
    late = side_by_side_file(tmp_path, "side_by_side_late.json", "2026-12-02T10:00:00+00:00", "bbbbbbb",
                             [rec("forward", "deltaproof", 800.0), rec("forward", "fla", 1000.0)],
                             [dict(op="delta", **{"pass": "forward"}, numerator="deltaproof (C=64)",
                                   denominator="fla (C=64)", ratio=0.8, compares="fastest against fastest")])
    out = tmp_path / "out"
    assert report.main([early, late, "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    headline = text[text.index("## Headline"):text.index("## Records")]
    assert ("| DeltaNet | forward | 800 (C=64) | 1000 (C=64) | — | 0.80 | — | 2026-12-02 | `bbbbbbb` | "
            "`side_by_side_late.json` |") in headline
    assert ("| DeltaNet | forward+backward | 3000 (C=64) | not timed: raised | — | — | — | 2026-12-01 | `aaaaaaa` | "
            "`side_by_side_early.json` |") in headline
    assert "| DeltaNet | decode | 70 | 200 | — | 0.35 | — | 2026-11-30 | `ccccccc` | `side_by_side_early.json` |" in headline
    assert "Not timed: DeltaNet, forward+backward, fla: RuntimeError: refused." in headline
    # the records table: each file's provenance, and the part as its own row
    assert "| `side_by_side_late.json` | bench/gpu/side_by_side.py | 2026-12-02 | `bbbbbbb` | Test GPU | `bash run.sh` |" in text
    assert "| `side_by_side_early.json`: decode | part | 2026-11-30 | `ccccccc` | Test GPU | `bash old.sh` |" in text


def test_provenance_from_a_benchmark_context(tmp_path):
    """bench/gpu/run.sh puts the provenance into Google Benchmark's context (--benchmark_context): read from
    there; a file with none says 'not recorded' rather than inventing one."""
    bench = {"name": "BM_X/C:16", "run_name": "BM_X/C:16", "run_type": "iteration", "iterations": 1,
             "real_time": 1.0, "cpu_time": 1.0, "time_unit": "ms"}
    with_keys = tmp_path / "with.json"
    with_keys.write_text(json.dumps({"context": {"date": "2026-12-05T00:00:00+00:00", "executable": "./bench_x",
                                                 "commit": "abc1234+dirty", "gpu": "Test GPU", "cuda_toolkit": "13.0.88",
                                                 "command": "bash bench/gpu/run.sh bench"}, "benchmarks": [bench]}))
    without = tmp_path / "without.json"
    without.write_text(json.dumps({"context": {"date": "2026-12-05T00:00:00+00:00", "executable": "./bench_x"},
                                   "benchmarks": [bench]}))
    got = records.load([str(with_keys), str(without)]).files
    p = got["with.json"].provenance
    assert (p["commit"], p["gpu"], p["command"], p["versions"]) == (
        "abc1234+dirty", "Test GPU", "bash bench/gpu/run.sh bench", {"cuda_toolkit": "13.0.88"})
    q = got["without.json"].provenance
    assert (q["date"], q["commit"], q["gpu"], q["command"]) == ("not recorded",) * 4


def test_model_matches_the_linear_benchmark_counters():
    """The model's FLOPs and bytes equal what bench_linear_attention_cuda counts (its rates × time)."""
    path = os.path.join(RESULTS, "linear_attention_cuda_h200.json")
    checked = 0
    for r in records.load([path]).runs:
        if r.base not in records.GPU_FAMILIES:  # as the report does (BM_LinearAttentionDecodeQueued: no cost model)
            continue
        op, pass_, _ = records.GPU_FAMILIES[r.base](r.args)
        shape = dict(model.GPU_DECODE_SHAPE, B=r.args["B"], T=r.args["T"]) if pass_ == "decode" else model.GPU_SHAPE
        seconds = r.time_us * 1e-6
        assert r.counters["FLOPs"] * seconds == pytest.approx(model.model_flops(op, pass_, shape, r.args.get("C", 0)), rel=1e-3)
        assert r.counters["bytes"] * seconds == pytest.approx(model.model_bytes(op, pass_, shape, r.args.get("C", 0)), rel=1e-3)
        checked += 1
    assert checked == 7


def test_latency_fit_recovers_its_parameters():
    shape = dict(model.GPU_SHAPE)
    tau, rate = 3.0, 150e12
    points = {c: tau * model.chunk_steps(shape, c) + model.model_flops("linear", "forward", shape, c) / rate * 1e6
              for c in (16, 32, 64)}
    fit = model.fit_latency(points, "linear", "forward", shape)
    assert fit["ok"] and fit["tau_us"] == pytest.approx(tau) and fit["rate"] == pytest.approx(rate)
    assert fit["max_residual"] < 1e-9
    assert model.latency_us(fit, "linear", "forward", shape, 48) == pytest.approx(
        tau * 86 + model.model_flops("linear", "forward", shape, 48) / rate * 1e6)


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
