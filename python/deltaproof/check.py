"""check_kernel: a property-based driver that brings any kernel of the family to the oracle.

It draws cases over shapes and regimes (lengths around the chunk size and over many chunks, odd head
dims with DK ≠ DV, varlen batches with empty and one-token sequences, h0 present or absent, the
scale 1, K^-1/2, a random value or the kernel's own default, unnormalised keys, β near 0 and 1, very
negative gates), rounds every input to the kernel's dtype, calls the kernel, judges what it returns
with verify::judge, and shrinks a failure greedily to the smallest case that fails the same way.

Case attributes are drawn by a pairwise covering design (see `draws._covering_rows`): every pair of
values of every two attributes occurs among the first cases, so a bug that needs two settings at once
(fp32 with h0, C = 64 with a long sequence, the default scale with DK ≠ DV) is met at the default size.

This module holds what depends on the judge: the arguments (a 16-bit state_dtype needs a judge that
models it), running and judging one case (`run_case`, `CaseResult`) and `check_kernel`. The rest
lives beside it and is imported from here as well: `cases` (Case, its attributes and inputs),
`draws` (the covering design and the cases drawn from it), `shrinking` (simpler neighbours and the
greedy search) and `report` (Report, progress, hints).
"""
import collections.abc
import dataclasses
import functools
import math
import time
import traceback

import numpy as np

from .cases import (DEFAULT_HEAD_DIMS, DEFAULT_MAX_CASES, DRAWN, GRADIENT_MODES,  # noqa: F401 (re-exported)
                    HEAD_DIM_CLASSES, LAYOUTS, LENGTH_CLASSES, OPS, REGIMES, SCALE_MODES, STATE_DTYPES, Case,
                    _canonical_op, inputs_of, kernel_arguments)
from .draws import (_dims, attribute_domains, case_attributes, draw_validated,  # noqa: F401 (re-exported)
                    head_dim_class, pair_coverage)
from .dtypes import DTYPES, canonical
from .report import STATUSES, Report, _Progress, _hints, _progress_wanted, _ratio  # noqa: F401 (re-exported)
from .shrinking import greedy_shrink, simplifications  # noqa: F401 (re-exported)
from .verdict import OUTPUT_NAMES, judge

_FORWARD = ("o", "ht")
_SIXTEEN_BIT = ("bf16", "fp16")


def _fla_output_order(op):
    """The names of a tuple a kernel returns, in fla's order: (o, ht) and the gradients in the order
    of fla's arguments (q, k, v, then g, beta for gated-delta; beta for delta; initial_state)."""
    grads = {"linear": [], "delta": ["dbeta"], "gated-delta": ["dg", "dbeta"]}[op]
    return ["o", "ht", "dq", "dk", "dv"] + grads + ["dh0"]


# ---------------------------------------------------------------------------------------------
# Running and judging one case

@dataclasses.dataclass
class CaseResult:
    """The outcome of one case. status: "agree", "disagree", "inconclusive" (the judge found the
    case outside a bound's premise; `reasons` says why) or "error" (`error_kind`: "raised",
    "calling convention", "outputs rejected", "missing outputs"; `error` and `traceback`)."""
    case: Case
    status: str
    verdict: object = None     # Verdict, when the kernel returned judgeable outputs
    error: str = None
    seconds: float = 0.0
    error_kind: str = None
    traceback: str = None
    reasons: tuple = ()        # inconclusive: one line per reason, with the quantity measured

    @property
    def passed(self):
        return self.status == "agree"

    @property
    def failed(self):
        return self.status in ("disagree", "error")

    def worst_row(self):
        """The verdict row with the largest err/bound (a non-finite one first), or None."""
        if self.verdict is None or not self.verdict.comparisons:
            return None
        rows = self.verdict.comparisons
        bad = [c for c in rows if not c["finite"]]
        if bad:
            return bad[0]
        return max(rows, key=_ratio)

    def worst(self):
        """(tensor, err/bound) of the worst comparison, or (None, nan)."""
        row = self.worst_row()
        if row is None:
            return None, float("nan")
        return row["tensor"], _ratio(row)

    def to_json(self):
        return {"case": self.case.to_json(), "description": self.case.describe(),
                "kernel_scale": self.case.kernel_scale, "judged_scale": self.case.judged_scale, "status": self.status,
                "passed": self.passed, "verdict": self.verdict.to_json() if self.verdict is not None else None,
                "error": self.error, "error_kind": self.error_kind, "traceback": self.traceback,
                "reasons": list(self.reasons), "seconds": self.seconds}


def _expected_outputs(case, expect=None):
    if expect is not None:
        return [n for n in expect if case.backward or n in _FORWARD]
    names = ["o", "ht"]
    if case.backward:
        names += ["dq", "dk", "dv"]
        names += {"linear": [], "delta": ["dbeta"], "gated-delta": ["dbeta", "dg"]}[case.op]
        names += ["dh0"] if case.h0 else []
    return names


def _returned_outputs(returned, op):
    """A kernel's return value as a dict: a mapping as it is, a tuple or list in fla's order
    (`_fla_output_order`), a single tensor as o. Raises ValueError when it is none of those."""
    if returned is None:
        raise ValueError("the kernel returned None")
    if isinstance(returned, collections.abc.Mapping):
        return {k: v for k, v in returned.items() if v is not None}
    if isinstance(returned, (tuple, list)):
        names = _fla_output_order(op)
        if len(returned) > len(names):
            raise ValueError(f"the kernel returned {len(returned)} values; a tuple holds at most {len(names)} "
                             f"for {op}: ({', '.join(names)})")
        return {n: v for n, v in zip(names, returned) if v is not None}
    if hasattr(returned, "shape"):
        return {"o": returned}
    raise ValueError(f"the kernel returned a {type(returned).__name__}; expected a dict or fla's tuple "
                     f"({', '.join(_fla_output_order(op))})")


def _verdict_status(verdict):
    """(status, reasons) of a Verdict: the judge's own status, and for an inconclusive one each
    inconclusive row's broken premise ("o: max ‖I − β k kᵀ‖ = 19.8 > 1")."""
    reasons = tuple(f"{row['tensor']}: {row['premise']['text']}" for row in verdict.comparisons
                    if row.get("status") == "inconclusive" and row.get("premise"))
    return verdict.status, reasons


def run_case(fn, case, tf32=False, threads=0, expect=None):
    """Calls fn on the case's inputs and judges what it returns (`expect`: the output names the
    kernel must return; default o, ht and, for backward cases, every gradient)."""
    start = time.perf_counter()
    args = kernel_arguments(case)
    seconds = lambda: time.perf_counter() - start
    try:
        returned = fn(dict(args))
    except TypeError as e:  # what the kernel was given does not fit its signature or types
        return CaseResult(case, "error", error=f"kernel raised TypeError: {e}", seconds=seconds(),
                          error_kind="calling convention", traceback=traceback.format_exc())
    except Exception as e:  # a kernel that raises fails the case; the message is the evidence
        return CaseResult(case, "error", error=f"kernel raised {type(e).__name__}: {e}", seconds=seconds(),
                          error_kind="raised", traceback=traceback.format_exc())
    try:
        returned = _returned_outputs(returned, case.op)
    except ValueError as e:
        return CaseResult(case, "error", error=f"outputs rejected: {e}", seconds=seconds(),
                          error_kind="outputs rejected")
    expected = _expected_outputs(case, expect)
    missing = [n for n in expected if n not in returned]
    outputs = {k: v for k, v in returned.items() if k in expected}
    tensors = {k: v for k, v in args.items() if k in ("q", "k", "v", "beta", "g", "h0", "do", "dht")}
    extra = {}
    if case.state_dtype is not None and case.dtype in _SIXTEEN_BIT:
        extra["state_dtype"] = case.state_dtype
    try:
        verdict = judge(case.op, tensors, outputs, layout=case.layout, dtype=case.dtype, scale=case.judged_scale,
                        cu_seqlens=case.cu_seqlens, qk_l2norm=case.qk_l2norm, tf32=tf32, threads=threads, **extra)
    except (ValueError, TypeError) as e:  # malformed outputs (shape, names): the kernel's fault
        return CaseResult(case, "error", error=f"outputs rejected: {e}", seconds=seconds(),
                          error_kind="outputs rejected")
    status, reasons = _verdict_status(verdict)
    if missing:
        return CaseResult(case, "error", verdict, f"missing outputs: {', '.join(missing)}", seconds(),
                          error_kind="missing outputs")
    return CaseResult(case, status, verdict, None, seconds(), reasons=reasons)


# ---------------------------------------------------------------------------------------------
# Validating the arguments

def _positive_ints(name, values, example, minimum=1):
    try:
        items = list(values)
    except TypeError:
        raise ValueError(f"{name}: expected a sequence of integers ≥ {minimum}, e.g. {example} "
                         f"(got {values!r})") from None
    bad = [x for x in items if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < minimum]
    if not items or bad:
        raise ValueError(f"{name}: expected a non-empty sequence of integers ≥ {minimum}, e.g. {example} "
                         f"(got {values!r})")
    return [int(x) for x in items]


def _validated(op, layout, dtypes, chunk_sizes, head_dims, regimes, scale, state_dtype, expect, max_cases,
               max_heads, max_batch):
    """The canonical settings, or ValueError naming the argument and what it may be."""
    op = _canonical_op(op)
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS} (\"blhd\": fla's [B, T, H, D], states "
                         f"[N, H, DK, DV]; \"bhld\": [B, H, L, D], states [N, H, DV, DK]) (got {layout!r})")
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    try:
        dtypes = list(dict.fromkeys(canonical(d) for d in dtypes))
    except ValueError:
        raise ValueError(f"dtypes: expected a sequence of {DTYPES} (got {dtypes!r})") from None
    if not dtypes:
        raise ValueError(f"dtypes: expected at least one of {DTYPES} (got an empty sequence)")
    chunk_sizes = list(dict.fromkeys(_positive_ints("chunk_sizes", chunk_sizes, "(16, 32, 64)")))
    dims = None if head_dims is None else list(dict.fromkeys(_dims(head_dims)))
    if regimes is not None:
        if isinstance(regimes, str):
            regimes = (regimes,)
        unknown = [r for r in regimes if r not in REGIMES]
        if unknown or not regimes:
            raise ValueError(f"regimes: expected names among {REGIMES} (got {regimes!r})")
        regimes = list(regimes)
    if scale is not None and scale != DRAWN:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)) or \
                not math.isfinite(scale):
            raise ValueError(f"scale: expected \"{DRAWN}\" (1, K^-1/2, a random value or None, per case), None "
                             f"(the kernel's default, judged as K^-1/2) or a finite number (got {scale!r})")
    if state_dtype is not None:
        given = state_dtype
        try:
            state_dtype = canonical(state_dtype)
        except ValueError:
            state_dtype = None
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype: expected None (an fp32 running state) or one of {STATE_DTYPES} "
                             f"(got {given!r})")
        if state_dtype == "fp32":
            state_dtype = None  # the default contract
    if expect is not None:
        unknown = [n for n in expect if n not in OUTPUT_NAMES]
        if unknown:
            raise ValueError(f"expect: expected names among {OUTPUT_NAMES} (got {list(expect)!r})")
    for name, value in (("max_cases", max_cases), ("max_heads", max_heads), ("max_batch", max_batch)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected an integer ≥ 1 (got {value!r})")
    return op, dtypes, chunk_sizes, dims, regimes, state_dtype


def draw_cases(op, layout="blhd", dtypes=("bf16", "fp32"), chunk_sizes=(16, 32, 64), max_cases=DEFAULT_MAX_CASES,
               seed=0, backward=True, varlen=True, head_dims=None, regimes=None, scale=DRAWN, qk_l2norm=False,
               max_heads=3, max_batch=2, initial_state=True, state_dtype=None):
    """The cases check_kernel runs, in order, a pure function of the arguments and `seed`.

    Attributes (`attribute_domains`): dtype, chunk size C, length class L ∈ {1, 2, 3..8, C−1, C,
    C+1, 2C+3, 8C+5}, keys (unit rows or unnormalised), β (sigmoid, near 0, near 1), gates (log-
    sigmoid, very negative), h0, varlen (an empty and a one-token sequence around the drawn length),
    gradients (forward, backward, backward with dht), scale (1, K^-1/2, a random value, or None: the
    kernel's default, judged at K^-1/2) and head dims (by default DK and DV drawn independently by
    class: 1, 15/60/100, 16/64/128, 256). Every pair of values of two attributes occurs among the
    first ~40 cases (a pairwise covering design, `draws._covering_rows`); later cases are independent.
    Batch and heads are drawn from 1..max_batch and 1..max_heads (1 and 1 at L = 8C+5)."""
    op, dtypes, chunk_sizes, dims, regimes, state_dtype = _validated(
        op, layout, dtypes, chunk_sizes, head_dims, regimes, scale, state_dtype, None, max_cases, max_heads,
        max_batch)
    return draw_validated(op, layout, dtypes, chunk_sizes, max_cases, seed, backward, varlen, dims, regimes, scale,
                          qk_l2norm, max_heads, max_batch, initial_state, state_dtype)


def shrink(fn, failure, max_steps=400, tf32=False, allowed_dims=None, log=None, expect=None, time_budget_s=None,
           threads=0, chunk_sizes=None, scale_drawn=True):
    """Greedy: take the first simpler neighbour that fails the same way, until none does (or
    max_steps kernel calls, or time_budget_s seconds). Returns (smallest failing CaseResult, kernel
    calls made)."""
    deadline = None if time_budget_s is None else time.perf_counter() + time_budget_s
    run = functools.partial(run_case, fn, tf32=tf32, expect=expect, threads=threads)
    failure, steps, _ = greedy_shrink(run, failure, max_steps, allowed_dims, log, deadline, chunk_sizes, scale_drawn)
    return failure, steps


def check_kernel(fn, op="linear", layout="blhd", dtypes=("bf16", "fp32"), chunk_sizes=(16, 32, 64),
                 max_cases=DEFAULT_MAX_CASES, seed=0, backward=True, varlen=True, tf32=False, head_dims=None,
                 regimes=None, scale=DRAWN, qk_l2norm=False, shrink_failures=True, max_shrink_steps=400,
                 stop_on_failure=False, log=None, name=None, initial_state=True, expect=None, time_budget_s=None,
                 state_dtype=None, progress=None, threads=0, max_heads=3, max_batch=2):
    """Runs fn on drawn cases and judges each with verify::judge; shrinks the first failure.

    fn(inputs) gets a dict: numpy arrays q, k, v (beta for delta ops, g log-gates for gated-delta,
    h0 when given, do and dht when gradients are asked for) in `layout`, rounded to inputs["dtype"]
    (bf16 values in float32 arrays; g, h0, dht fp32), plus cu_seqlens (int64 array or None), scale
    (a float, or None: the kernel's own default, judged as K^-1/2 like fla's), chunk_size, op,
    layout, dtype, qk_l2norm. It returns either a dict with o, ht and, when inputs hold do, dq, dk,
    dv (dbeta, dg) and dh0 (when h0 was given), or a tuple in fla's order: (o, ht) or
    (o, ht, dq, dk, dv, dh0) for linear, (o, ht, dq, dk, dv, dbeta, dh0) for delta,
    (o, ht, dq, dk, dv, dg, dbeta, dh0) for gated-delta (gradients in the order of fla's arguments;
    None or a shorter tuple where an output is absent); numpy arrays or torch tensors.

    Cases (`draw_cases`): a pairwise covering design over dtype, chunk size, length class, regimes,
    h0, varlen, gradients (forward / backward / with dht), scale mode and head dims.
    scale: "drawn" (default: 1, K^-1/2, a random value or None, per case), None (every case gives
    the kernel None and is judged at K^-1/2) or a number (every case).
    head_dims: ints (DK = DV = d) or (DK, DV) pairs; default draws DK and DV from 1 … 256.
    state_dtype: None (default) holds 16-bit kernels to an fp32 running state; "bf16" or "fp16"
    declares a 16-bit running state, judged as such in the 16-bit cases.
    log: a callable given one line per case and per shrink step. progress: a line per case on
    stderr (and a bar with an ETA once a run is long); default on when stderr is a terminal and
    not under pytest. initial_state=False: never give h0 (for kernels without one). expect: the
    outputs the kernel returns (default o, ht and every gradient). time_budget_s: the whole run,
    shrinking included; the report says what it cut. Errors in the arguments raise ValueError
    before any case runs, naming the argument and what it may be.
    """
    started = time.perf_counter()
    deadline = None if time_budget_s is None else started + float(time_budget_s)
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or not isinstance(
            time_budget_s, (int, float, np.integer, np.floating)) or not time_budget_s >= 0):
        raise ValueError(f"time_budget_s: expected None or a number of seconds ≥ 0 (got {time_budget_s!r})")
    if not callable(fn):
        raise ValueError(f"fn: expected a callable taking the input dict (got {fn!r})")
    op, dtype_list, chunk_list, dims, regime_list, state = _validated(
        op, layout, dtypes, chunk_sizes, head_dims, regimes, scale, state_dtype, expect, max_cases, max_heads,
        max_batch)
    cases = draw_cases(op, layout, dtype_list, chunk_list, max_cases, seed, backward, varlen, dims, regime_list,
                       scale, qk_l2norm, max_heads=max_heads, max_batch=max_batch, initial_state=initial_state,
                       state_dtype=state)
    domains = attribute_domains(op, dtype_list, chunk_list, dims, regime_list, scale, backward, varlen,
                                initial_state)
    settings = {"op": op, "layout": layout, "dtypes": dtype_list, "chunk_sizes": chunk_list,
                "max_cases": max_cases, "seed": seed, "backward": backward, "varlen": varlen, "tf32": tf32,
                "head_dims": None if dims is None else [list(d) for d in dims], "scale": scale,
                "qk_l2norm": qk_l2norm, "initial_state": initial_state, "expect": expect, "state_dtype": state,
                "time_budget_s": time_budget_s, "max_shrink_steps": max_shrink_steps}
    progress = _Progress(len(cases), _progress_wanted(progress), log)
    results, stopped_by = [], None
    for i, case in enumerate(cases):
        if deadline is not None and time.perf_counter() > deadline:
            stopped_by = "time budget"
            break
        result = run_case(fn, case, tf32=tf32, expect=expect, threads=threads)
        results.append(result)
        tensor, ratio = result.worst()
        progress.case(i + 1, f"[{i + 1}/{len(cases)}] {result.status:12} {case.describe()}: worst {tensor} "
                             f"err/bound {ratio:.3g} ({result.seconds:.1f} s)"
                             + (f" — {result.error}" if result.error else ""))
        if stop_on_failure and result.failed:
            stopped_by = "first failure" if i + 1 < len(cases) else None
            break
    not_run = len(cases) - len(results)
    if not_run:
        progress.line(f"{not_run} cases not run: {stopped_by}")
    failures = [r for r in results if r.failed]
    counterexample, first, steps, shrink_stopped_by = None, None, 0, None
    if failures:
        shrinkable = [r for r in failures if r.error_kind != "calling convention"]
        first = (shrinkable or failures)[0]
        counterexample = first
        if not shrinkable:
            shrink_stopped_by = "calling convention"
        elif shrink_failures:
            run = functools.partial(run_case, fn, tf32=tf32, expect=expect, threads=threads)
            counterexample, steps, shrink_stopped_by = greedy_shrink(
                run, first, max_shrink_steps, dims, progress.line, deadline, chunk_list, scale == DRAWN)
            if shrink_stopped_by:
                progress.line(f"shrinking stopped after {steps} steps: {shrink_stopped_by}")
        counterexample.inputs = inputs_of(counterexample.case)
    progress.close()
    coverage = pair_coverage([r.case for r in results], domains, dims)
    return Report(name or getattr(fn, "__name__", "kernel"), settings, results, counterexample, first, steps,
                  cases_not_run=not_run, stopped_by=stopped_by, shrink_stopped_by=shrink_stopped_by,
                  coverage=coverage, seconds=time.perf_counter() - started, hints=_hints(results))
