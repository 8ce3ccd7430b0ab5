"""`deltaproof check` (the command line, reading tensor files) and `deltaproof.judge` (Python, on arrays)
give the same verdict on the same data: the same status (agree, disagree or inconclusive; the command's
exit code 0, 1 or 3), the same rows with the same status each, and the same numbers in them.

The cases: check_kernel's default draws for every op (both layouts, varlen, every scale mode, h0),
run through the numpy production-style kernels (agree); the same with one output entry moved
(disagree); a bf16 running state, undeclared (disagree) and declared (agree); and DeltaNet outside a
premise of its bound, DK = 1 keys with β k² = 100, with a wrong output (inconclusive). Each case is
written once, as .npz or as .safetensors (alternately), and both judges read that data. Where a kernel's
output holds NaN or ±Inf (fp16 products that overflow), the command line refuses the file (exit 2, it
judges finite numbers only) and Python judges the row non-finite: that difference is the contract, and is
checked as such.
"""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

from deltaproof import check
from deltaproof.dtypes import round_to
from deltaproof.verdict import judge, oracle
from production_kernels import wy_chunkwise_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.environ.get("DELTAPROOF_CLI") or os.path.join(HERE, "..", "..", "build", "release", "tools", "deltaproof")
STATUS_OF_EXIT = {0: "agree", 1: "disagree", 3: "inconclusive"}
BAD_INPUT = 2
INPUTS = ("q", "k", "v", "beta", "g", "h0")
SCALAR_FIELDS = ("error", "bound", "ratio", "reference", "max_abs", "rms")

pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason=f"no deltaproof command line at {CLI}")


# ---------------------------------------------------------------------------------------------
# Files as the command line reads them: bf16 as its bit patterns, other dtypes as themselves.

_NUMPY = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}


def stored(x, dtype):
    """The array a file holds for values `x` that are exactly `dtype` numbers: bf16 as uint16 bit patterns."""
    if dtype == "bf16":
        return (np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.ascontiguousarray(x, _NUMPY[dtype])


def save_safetensors(path, tensors):
    """The safetensors layout: u64 header length, JSON header, little-endian data (uint16 arrays as BF16)."""
    codes = {"float16": "F16", "float32": "F32", "float64": "F64", "int64": "I64", "uint16": "BF16"}
    header, data = {}, b""
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": codes[a.dtype.name], "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def dtype_of(name, dtype):
    """Storage dtype of a tensor as verify::judge takes it: states and log-gates fp32 (fp64 for fp64)."""
    if name in ("g", "h0", "ht"):
        return "fp64" if dtype == "fp64" else "fp32"
    return dtype


def write(path, tensors, dtype, extra=()):
    arrays = {n: stored(x, dtype_of(n, dtype)) for n, x in tensors.items()}
    arrays.update(extra)
    if path.endswith(".npz"):
        np.savez(path, **arrays)
    else:
        save_safetensors(path, arrays)


# ---------------------------------------------------------------------------------------------
# One case through both judges.

def both_verdicts(tmp_path, name, op, inputs, outputs, dtype, layout, cu_seqlens=None, scale=1.0, state_dtype=None,
                  suffix=".npz"):
    """(the command line's JSON verdict and exit code, the Python Verdict) on the same data; the JSON is None
    where the command line refused non-finite outputs."""
    inputs = {n: x for n, x in inputs.items() if n in INPUTS and x is not None}
    extra = {"cu_seqlens": np.asarray(cu_seqlens, np.int64)} if cu_seqlens is not None else {}
    in_path, out_path = str(tmp_path / f"{name}_in{suffix}"), str(tmp_path / f"{name}_out{suffix}")
    write(in_path, inputs, dtype, extra)
    write(out_path, outputs, dtype)
    command = [CLI, "check", "--op", op, "--inputs", in_path, "--outputs", out_path, "--layout", layout,
               "--scale", repr(float(scale)), "--json"]
    if cu_seqlens is not None:
        command.append("--cu-seqlens")
    if state_dtype is not None:
        command += ["--state-dtype", state_dtype]
    run = subprocess.run(command, capture_output=True, text=True)
    python = judge(op, inputs, outputs, layout=layout, dtype=dtype, scale=scale, cu_seqlens=cu_seqlens,
                   state_dtype=state_dtype)
    if not all(np.isfinite(np.asarray(x, np.float64)).all() for x in outputs.values()):
        assert run.returncode == BAD_INPUT and not run.stdout and run.stderr, \
            f"{' '.join(command)}\n{run.stdout}\n{run.stderr}"
        assert not all(row["finite"] for row in python.comparisons), str(python)
        return None, run.returncode, python
    assert run.returncode in STATUS_OF_EXIT, f"{' '.join(command)}\n{run.stdout}\n{run.stderr}"
    return json.loads(run.stdout), run.returncode, python


def assert_same(cli, code, python, what):
    if cli is None:  # refused: non-finite outputs (checked in both_verdicts)
        return
    assert STATUS_OF_EXIT[code] == cli["status"] == python.status, \
        f"{what}: exit {code}, command line {cli['status']}, Python {python.status}\n{python}"
    rows = {r["tensor"]: r for r in cli["comparisons"]}
    assert sorted(rows) == sorted(r["tensor"] for r in python.comparisons), what
    for row in python.comparisons:
        other = rows[row["tensor"]]
        assert other["status"] == row["status"], f"{what}: {row['tensor']} {other['status']} vs {row['status']}"
        assert other["index"] == row["index"] and other["norm"] == row["norm"], f"{what}: {row['tensor']}"
        for field in SCALAR_FIELDS:
            assert other[field] == pytest.approx(row[field], rel=1e-12, abs=0), f"{what}: {row['tensor']} {field}"
        assert (other["premise"] is None) == (row["premise"] is None), f"{what}: {row['tensor']} premise"


def kernel_outputs(fn, case):
    args = check.kernel_arguments(case)
    out = fn(dict(args))
    return args, {"o": out["o"], "ht": out["ht"]}


def moved(outputs, case):
    """o with one entry moved towards zero and past it by a tenth of o's largest magnitude plus one: far past
    any rounding, and within the dtype's range."""
    o = np.array(outputs["o"], np.float64)
    flat = o.reshape(-1)
    at = flat.size // 2
    if np.isfinite(flat).all():
        step = 0.1 * np.abs(flat).max() + 1.0
        flat[at] = float(round_to(np.array([flat[at] - np.copysign(step, flat[at])]), case.dtype)[0])
    return dict(outputs, o=o)


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_the_command_line_and_python_agree_on_check_kernels_cases(tmp_path, op):
    honest, sixteen = wy_chunkwise_kernel(), wy_chunkwise_kernel("bf16")
    seen = {"agree": 0, "disagree": 0}
    for i, case in enumerate(check.draw_cases(op, dtypes=("bf16", "fp16", "fp32"), max_cases=16, seed=3, backward=False)):
        args, outputs = kernel_outputs(honest, case)
        suffix = ".npz" if i % 2 == 0 else ".safetensors"
        common = dict(op=op, inputs=args, dtype=case.dtype, layout=case.layout, cu_seqlens=case.cu_seqlens,
                      scale=case.judged_scale, suffix=suffix)
        for name, out, state in (("honest", outputs, None), ("moved", moved(outputs, case), None)):
            cli, code, python = both_verdicts(tmp_path, f"{i}_{name}", outputs=out, state_dtype=state, **common)
            assert_same(cli, code, python, f"{name} {case.describe()}")
            seen[python.status] = seen.get(python.status, 0) + 1
        if case.dtype == "bf16" and case.total_length > 1:
            _, out16 = kernel_outputs(sixteen, case)
            for state in (None, "bf16"):
                cli, code, python = both_verdicts(tmp_path, f"{i}_state_{state}", outputs=out16, state_dtype=state, **common)
                assert_same(cli, code, python, f"bf16 state ({state or 'undeclared'}) {case.describe()}")
                seen[python.status] = seen.get(python.status, 0) + 1
    assert seen["agree"] and seen["disagree"], seen


def test_bhld_files_agree(tmp_path):
    """deltaproof's own layout [B, H, L, D], states [N, H, DV, DK]: the oracle stored as a kernel stores it."""
    for i, case in enumerate(check.draw_cases("delta", layout="bhld", dtypes=("bf16", "fp32"), max_cases=6, seed=9,
                                              backward=False)):
        args = check.kernel_arguments(case)
        inputs = {n: x for n, x in args.items() if n in INPUTS and x is not None}
        exact = oracle("delta", inputs, layout="bhld", dtype=case.dtype, scale=case.judged_scale,
                       cu_seqlens=case.cu_seqlens)
        outputs = {"o": round_to(exact["o"], case.dtype), "ht": round_to(exact["ht"], "fp32")}
        for name, out in (("oracle", outputs), ("moved", moved(outputs, case))):
            cli, code, python = both_verdicts(tmp_path, f"bhld{i}_{name}", "delta", inputs, out, case.dtype, "bhld",
                                              case.cu_seqlens, case.judged_scale, suffix=".npz" if i % 2 else ".safetensors")
            assert_same(cli, code, python, f"{name} {case.describe()}")
            assert python.status == ("agree" if name == "oracle" else "disagree"), f"{name} {case.describe()}\n{python}"


def test_outside_a_premise_both_say_inconclusive(tmp_path):
    """DeltaNet, DK = 1 keys with β k² = 100 for 20 tokens: |T| ~ 99¹⁹, beyond a first-order fp32 solve. A wrong
    output is inconclusive (exit 3) for both, with the same premise; within the premises (β k² = 1) it disagrees."""
    rng = np.random.default_rng(4)
    L = 20
    for beta, expected in ((1.0, "inconclusive"), (0.01, "disagree")):
        inputs = {"q": np.full((1, L, 1, 1), 0.5), "k": np.full((1, L, 1, 1), 10.0),
                  "v": np.round(rng.standard_normal((1, L, 1, 1)), 2), "beta": np.full((1, L, 1), beta)}
        inputs = {n: round_to(x, "bf16") for n, x in inputs.items()}
        exact = oracle("delta", inputs, dtype="bf16")
        o = np.array(exact["o"], np.float64)
        o[0, 3, 0, 0] += 1e3 * (1 + abs(o[0, 3, 0, 0]))
        outputs = {"o": round_to(o, "bf16")}  # the exact state leaves fp32's range at β k² = 100
        cli, code, python = both_verdicts(tmp_path, f"steep_{beta}", "delta", inputs, outputs, "bf16", "blhd")
        assert_same(cli, code, python, f"β = {beta}")
        assert python.status == expected and code == {"inconclusive": 3, "disagree": 1}[expected], str(python)
        if expected == "inconclusive":
            assert cli["premise"]["reason"] == python.premise["reason"]
            assert cli["premise"]["measured"] == pytest.approx(python.premise["measured"], rel=1e-12)
