"""The report's figures (matplotlib, Agg backend): each function takes data from records.py and
model.py and returns a Figure; tables.Report saves it beside REPORT.md."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402

from .model import (CHUNK_SIZES, OPS, PEAK_BYTES_PER_S, PEAK_FLOPS, latency_us,  # noqa: E402
                    roofline_us)
from .records import series_of  # noqa: E402

IMPL_STYLE = {"deltaproof": dict(color="tab:blue", marker="o"), "fla": dict(color="tab:orange", marker="s"),
              "article": dict(color="tab:green", marker="^")}
OP_COLORS = {"linear": "tab:blue", "delta": "tab:red", "gated-delta": "tab:purple"}
PASS_MARKERS = {"forward": "o", "backward": "s", "forward+backward": "D", "prepare stage": "v", "scan stage": "^",
                "decode": "*"}


def save(fig, path):
    fig.savefig(path, dpi=100)
    plt.close(fig)


def time_vs_chunk(op, passes, groups, fits, title):
    """One panel per pass: every series' time against C, the roofline bound, the latency model."""
    fig, axes = plt.subplots(1, len(passes), figsize=(4.6 * len(passes), 4.6), squeeze=False, layout="constrained")
    for ax, pass_ in zip(axes[0], passes):
        group = groups[(op, pass_)]
        shape = group[0].shape
        grid = np.linspace(16, 64, 97)
        bound = [roofline_us(op, pass_, shape, c) for c in grid]
        if bound[0] is not None:
            ax.plot(grid, bound, "--", color="grey", label="roofline bound")
        for series, ms in series_of(group).items():
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
    fig.suptitle(title, fontsize=9)
    return fig


def decode(measurements):
    """Bars of the decode times, each with its memory bound dashed."""
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(measurements), 3.4), layout="constrained")
    values = [m.time_us for m in measurements]
    ax.bar(range(len(values)), values,
           color=[IMPL_STYLE.get(m.impl, {}).get("color", "black") for m in measurements])
    for i, m in enumerate(measurements):
        ax.plot([i - 0.4, i + 0.4], [roofline_us(m.op, "decode", m.shape, 0)] * 2, "k--", lw=1)
    ax.set_xticks(range(len(values)), [f"{OPS[m.op]}\n{m.impl}" for m in measurements], fontsize=7)
    ax.set_ylabel("time per call (µs)")
    ax.set_title("decode, one token (dashed: memory bound)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return fig


def roofline(points):
    """Every kernel's achieved FLOP rate against its arithmetic intensity, under the roofline."""
    fig, ax = plt.subplots(figsize=(7.5, 5), layout="constrained")
    ai = np.logspace(-1, 3, 200)
    ax.loglog(ai, np.minimum(PEAK_FLOPS, ai * PEAK_BYTES_PER_S), "k-", lw=1.2,
              label=f"H200 roofline ({PEAK_FLOPS / 1e12:.0f} TFLOP/s, {PEAK_BYTES_PER_S / 1e12:.1f} TB/s)")
    seen = set()
    for m, x, fl, _ in points:
        key = (m.op, m.pass_, m.impl)
        label = f"{OPS[m.op]}, {m.pass_}, {m.impl}" if key not in seen else None
        seen.add(key)
        ax.scatter(x, fl, color=OP_COLORS.get(m.op, "black"), marker=PASS_MARKERS.get(m.pass_, "x"), s=36,
                   facecolors="none" if m.impl != "deltaproof" else None, label=label)
        if isinstance(m.C, int):
            ax.annotate(str(m.C), (x, fl), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_xlabel("arithmetic intensity (model FLOPs / compulsory byte)")
    ax.set_ylabel("achieved FLOP/s (model FLOPs / time)")
    ax.set_title("kernels against the H200 roofline (numbers: C; hollow: peers)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="lower right")
    return fig


def accuracy(records, measurements):
    """Error against C (left) and error against forward time (right). Returns the figure and the
    number of (time, error) pairs on the right."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for op in OPS:
        for impl in ("deltaproof", "fla", "article"):
            pts = sorted((r["chunk_size"], r["rel_l2"]) for r in records if r["op"] == op and r["impl"] == impl and
                         r["tensor"].split(" ")[0] == "o" and isinstance(r["chunk_size"], int) and r["dtype"] == "bf16")
            if pts:
                style = IMPL_STYLE[impl]
                ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker=style["marker"], color=OP_COLORS[op],
                         linestyle="-" if impl == "deltaproof" else "none", label=f"{OPS[op]}, {impl}",
                         fillstyle="full" if impl == "deltaproof" else "none")
        floor = [r["rel_l2"] for r in records if r["op"] == op and r["impl"].startswith("bf16 rounding")]
        if floor:
            ax1.axhline(floor[0], color=OP_COLORS[op], lw=0.8, ls="--", label=f"{OPS[op]}: bf16 rounding of the exact output")
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
        ax2.scatter(t, r["rel_l2"], color=OP_COLORS[r["op"]], marker=style["marker"],
                    facecolors="none" if r["impl"] != "deltaproof" else None)
        ax2.annotate(f"C={r['chunk_size']}", (t, r["rel_l2"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        traded += 1
    ax2.set_xlabel("forward time at the timing shape (µs)")
    ax2.set_ylabel("relative L2 error of o (bf16)")
    ax2.set_title("accuracy next to speed (colour: op as on the left; hollow: peers)", fontsize=9)
    ax2.grid(alpha=0.3)
    return fig, traded


def cpu_oracle(series):
    """CPU time against C, one line per (family, other arguments, file)."""
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
    return fig
