"""check_kernel: a property-based driver that brings any kernel of the family to the oracle.

It draws cases over shapes and regimes (lengths around the chunk size and over many chunks, odd head
dims with DK ≠ DV, varlen batches with empty and one-token sequences, h0 present or absent, the
scale 1, K^-1/2, a random value or the kernel's own default, unnormalised keys, β near 0 and 1, very
negative gates), rounds every input to the kernel's dtype, calls the kernel, judges what it returns
with verify::judge, and shrinks a failure greedily to the smallest case that fails the same way.

Case attributes are drawn by a pairwise covering design (see `_covering_rows`): every pair of values
of every two attributes occurs among the first cases, so a bug that needs two settings at once (fp32
with h0, C = 64 with a long sequence, the default scale with DK ≠ DV) is met at the default size.
"""
import collections.abc
import dataclasses
import inspect
import json
import math
import os
import sys
import time
import traceback

import numpy as np

from .dtypes import DTYPES, canonical, round_to
from .verdict import OUTPUT_NAMES, judge, tensor_dtype

OPS = ("linear", "delta", "gated-delta")
LAYOUTS = ("blhd", "bhld")
# Named input regimes. Keys, β and gates are drawn independently of one another, so a case may hold
# several ("keys_unnormalized+beta_one"); "long" is kept as a name only: long sequences are the
# length class 8C+5, drawn for every op.
REGIMES = ("normal", "keys_unnormalized", "beta_small", "beta_one", "gates_very_negative", "long")
LENGTH_CLASSES = ("1", "2", "3..8", "C-1", "C", "C+1", "2C+3", "8C+5")
SCALE_MODES = ("one", "inv_sqrt_k", "random", "default")
GRADIENT_MODES = ("forward", "backward", "backward+dht")
STATE_DTYPES = ("bf16", "fp16", "fp32")
DEFAULT_HEAD_DIMS = (1, 15, 16, 60, 64, 100, 128, 256)
# Default head dims are drawn by class, DK and DV independently: the degenerate 1, sizes that are
# not a power of two (partial tiles), powers of two, and the largest.
HEAD_DIM_CLASSES = {"1": (1,), "ragged": (15, 60, 100), "pow2": (16, 64, 128), "256": (256,)}
DEFAULT_MAX_CASES = 48
DRAWN = "drawn"  # check_kernel(scale=DRAWN): the scale is an attribute of each case
_FORWARD = ("o", "ht")
_SIXTEEN_BIT = ("bf16", "fp16")


def _canonical_op(op):
    name = str(op).replace("_", "-")
    if name not in OPS:
        raise ValueError(f"op: expected one of {OPS} (got {op!r})")
    return name


def _fla_output_order(op):
    """The names of a tuple a kernel returns, in fla's order: (o, ht) and the gradients in the order
    of fla's arguments (q, k, v, then g, beta for gated-delta; beta for delta; initial_state)."""
    grads = {"linear": [], "delta": ["dbeta"], "gated-delta": ["dg", "dbeta"]}[op]
    return ["o", "ht", "dq", "dk", "dv"] + grads + ["dh0"]


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn case. Inputs are a pure function of these fields (see `inputs_of`)."""
    op: str
    layout: str
    dtype: str
    chunk_size: int
    batch: int             # B (1 when varlen)
    heads: int             # H
    lengths: tuple         # (L,) fixed length; one entry per sequence when varlen
    varlen: bool
    key_dim: int
    value_dim: int
    h0: bool
    backward: bool
    dht: bool
    regime: str            # "normal" or non-normal regimes joined by "+"
    values: str            # "random" or "simple" (small dyadic numbers)
    seed: int
    scale: float = 1.0     # the value given in scale modes "fixed" and "random"
    qk_l2norm: bool = False
    scale_mode: str = "fixed"    # "one", "inv_sqrt_k", "random", "default" (None given), "fixed"
    state_dtype: str = None      # a declared 16-bit running state (judged as such in 16-bit cases)
    length_class: str = None     # the length class drawn (None once shrinking changed the lengths)

    @property
    def total_length(self):
        return sum(self.lengths) if self.varlen else self.lengths[0]

    @property
    def sequences(self):
        return len(self.lengths) if self.varlen else self.batch

    @property
    def tokens(self):
        return self.total_length * (1 if self.varlen else self.batch)

    @property
    def cu_seqlens(self):
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64) if self.varlen else None

    @property
    def regimes(self):
        """The non-normal regimes of this case, as a set of names."""
        return {r for r in self.regime.split("+") if r and r != "normal"}

    @property
    def kernel_scale(self):
        """What the kernel is given as `scale`: None in mode "default" (the kernel's own default)."""
        if self.scale_mode == "default":
            return None
        if self.scale_mode == "inv_sqrt_k":
            return self.key_dim ** -0.5
        if self.scale_mode == "one":
            return 1.0
        return float(self.scale)

    @property
    def judged_scale(self):
        """The scale the oracle uses: fla's default K^-1/2 where the kernel was given None."""
        return self.key_dim ** -0.5 if self.scale_mode == "default" else self.kernel_scale

    @property
    def gradients(self):
        return ("backward+dht" if self.dht else "backward") if self.backward else "forward"

    def describe_scale(self):
        return {"one": "1", "inv_sqrt_k": "K^-1/2", "default": "None(K^-1/2)"}.get(self.scale_mode,
                                                                                   f"{self.scale:g}")

    def describe(self):
        shape = (f"varlen{list(self.lengths)} H={self.heads}" if self.varlen
                 else f"B={self.batch} H={self.heads} L={self.lengths[0]}")
        extra = [x for x, on in (("h0", self.h0), ("bwd", self.backward), ("dht", self.backward and self.dht),
                                 ("l2norm", self.qk_l2norm), (f"state={self.state_dtype}", self.state_dtype))
                 if on]
        return (f"{self.op} {self.dtype} C={self.chunk_size} {shape} DK={self.key_dim} DV={self.value_dim} "
                f"scale={self.describe_scale()} {self.regime}/{self.values} {' '.join(extra)} "
                f"seed={self.seed}").replace("  ", " ").strip()

    def to_json(self):
        d = dataclasses.asdict(self)
        d["lengths"] = list(self.lengths)
        return d


# ---------------------------------------------------------------------------------------------
# Inputs of a case

def _normalise_rows(x):
    norm = np.sqrt((x * x).sum(-1, keepdims=True))
    return np.where(norm > 0, x / np.where(norm > 0, norm, 1), x)


def _logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def inputs_of(case):
    """The inputs the kernel is given, as numpy arrays in the case's layout, each rounded to its
    storage dtype (bf16 values in float32 arrays), plus cu_seqlens. Deterministic in the case."""
    rng = np.random.default_rng([case.seed, case.batch, case.heads, case.total_length, case.key_dim,
                                 case.value_dim, len(case.lengths)])
    B = 1 if case.varlen else case.batch
    T, H, K, V, N = case.total_length, case.heads, case.key_dim, case.value_dim, case.sequences
    simple = case.values == "simple"
    regimes = case.regimes

    def draw(shape, spread=1.0):
        if simple:
            return rng.integers(-2, 3, size=shape) / 2.0
        return rng.standard_normal(shape) * spread

    q = draw((B, T, H, K), 1 / math.sqrt(K))
    if case.op != "linear" and "keys_unnormalized" not in regimes and not simple:
        k = _normalise_rows(rng.standard_normal((B, T, H, K)))
    elif "keys_unnormalized" in regimes and not simple:
        k = rng.standard_normal((B, T, H, K)) * (1.5 / math.sqrt(K))
    else:
        k = draw((B, T, H, K), 1 / math.sqrt(K))
    v = draw((B, T, H, V))
    out = {}
    if case.op != "linear":
        if simple:  # dyadic, and varying from token to token (a bug in which token's β is read shows)
            beta = rng.choice([0.25, 0.5, 0.75], size=(B, T, H))
        elif "beta_small" in regimes:
            beta = rng.uniform(0, 1e-3, (B, T, H))
        elif "beta_one" in regimes:
            beta = np.where(rng.uniform(size=(B, T, H)) < 0.5, 1.0, 1.0 - 2.0 ** -8)
        else:
            beta = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
        out["beta"] = beta
    if case.op == "gated-delta":
        if simple:
            g = rng.choice([-0.125, -0.25, -0.5], size=(B, T, H))
        elif "gates_very_negative" in regimes:
            g = np.where(rng.uniform(size=(B, T, H)) < 0.5, -rng.uniform(20, 100, (B, T, H)),
                         _logsigmoid(rng.standard_normal((B, T, H)) + 3))
        else:
            g = _logsigmoid(rng.standard_normal((B, T, H)) + 3)
        out["g"] = g
    state = (N, H, K, V)
    if case.h0:
        out["h0"] = draw(state, 0.5)
    if case.backward:
        out["do"] = draw((B, T, H, V))
        if case.dht:
            out["dht"] = draw(state, 0.5)
    tensors = {"q": q, "k": k, "v": v, **out}
    if case.layout == "bhld":
        for name, x in tensors.items():
            if x.ndim == 4 and name not in ("h0", "dht"):
                tensors[name] = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
            elif x.ndim == 3:
                tensors[name] = np.ascontiguousarray(x.transpose(0, 2, 1))
            else:  # states: [N, H, DK, DV] -> [N, H, DV, DK]
                tensors[name] = np.ascontiguousarray(x.transpose(0, 1, 3, 2))
    result = {name: round_to(x, tensor_dtype(name, case.dtype)) for name, x in tensors.items()}
    result["cu_seqlens"] = case.cu_seqlens
    return result


def kernel_arguments(case):
    """What `fn` receives: the tensors of `inputs_of` plus the case's settings (scale None: the
    kernel's own default, which the case is judged at as K^-1/2)."""
    args = inputs_of(case)
    args.update(op=case.op, layout=case.layout, dtype=case.dtype, scale=case.kernel_scale,
                chunk_size=case.chunk_size, qk_l2norm=case.qk_l2norm)
    return args


# ---------------------------------------------------------------------------------------------
# Running and judging one case

STATUSES = ("agree", "disagree", "inconclusive", "error")


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


def _ratio(row):
    """A verdict row's err/bound; infinite where the JSON holds null (an error beside a zero bound,
    or a non-finite candidate)."""
    return float("inf") if row.get("ratio") is None or not row["finite"] else row["ratio"]


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


def _judge_accepts(keyword):
    try:
        return keyword in inspect.signature(judge).parameters
    except (TypeError, ValueError):
        return False


def _row_inconclusive(row):
    return row.get("status") == "inconclusive" or row.get("verdict") == "inconclusive" or \
        bool(row.get("inconclusive"))


def _measured_text(measured):
    if measured is None:
        return ""
    if isinstance(measured, dict):
        return " (measured " + ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                                         for k, v in measured.items()) + ")"
    return f" (measured {measured})"


def _verdict_status(verdict):
    """(status, reasons) of a Verdict. Works with verdicts that know only agree/disagree (no
    inconclusive field: never inconclusive) and with a status "inconclusive" at the top level or
    per row, each with a "reason" and a "measured" quantity."""
    data = verdict.data
    rows = verdict.comparisons
    reasons = []
    top_flag = data.get("inconclusive")
    if data.get("reason") or isinstance(top_flag, str):
        reasons.append(str(data.get("reason") or top_flag) + _measured_text(data.get("measured")))
    for row in rows:
        if _row_inconclusive(row):
            why = row.get("reason") or (row["inconclusive"] if isinstance(row.get("inconclusive"), str) else
                                        "outside the bound's premise")
            reasons.append(f"{row['tensor']}: {why}{_measured_text(row.get('measured'))}")
    top = data.get("status") or data.get("verdict")
    if top in ("agree", "disagree", "inconclusive"):
        return top, tuple(reasons)
    disagreeing = [r for r in rows if not r["agrees"] and not _row_inconclusive(r)]
    if disagreeing:
        return "disagree", ()
    if reasons or top_flag:
        return "inconclusive", tuple(reasons) or ("the judge marked the case inconclusive",)
    return ("agree" if verdict.agrees else "disagree"), ()


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


def _dims(head_dims):
    """head_dims as (DK, DV) pairs: an int d is (d, d). Raises ValueError naming the argument."""
    example = "(64, (60, 100))"
    try:
        items = list(head_dims)
    except TypeError:
        raise ValueError(f"head_dims: expected ints d (DK = DV = d) or (DK, DV) pairs, e.g. {example} "
                         f"(got {head_dims!r})") from None
    pairs = []
    for d in items:
        pair = (d, d) if isinstance(d, (int, np.integer)) and not isinstance(d, bool) else d
        try:
            pair = tuple(pair)
        except TypeError:
            pair = ()
        if len(pair) != 2 or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in pair):
            raise ValueError(f"head_dims: expected ints d ≥ 1 (DK = DV = d) or (DK, DV) pairs of ints ≥ 1, "
                             f"e.g. {example} (got {d!r} in {head_dims!r})")
        pairs.append((int(pair[0]), int(pair[1])))
    if not pairs:
        raise ValueError(f"head_dims: expected at least one head dim, e.g. {example} (got {head_dims!r})")
    return pairs


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
        elif not _judge_accepts("state_dtype"):
            raise ValueError("state_dtype: this build's judge has no model of a 16-bit running state "
                             "(verdict.judge takes no state_dtype); only None is possible here")
    if expect is not None:
        unknown = [n for n in expect if n not in OUTPUT_NAMES]
        if unknown:
            raise ValueError(f"expect: expected names among {OUTPUT_NAMES} (got {list(expect)!r})")
    for name, value in (("max_cases", max_cases), ("max_heads", max_heads), ("max_batch", max_batch)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected an integer ≥ 1 (got {value!r})")
    return op, dtypes, chunk_sizes, dims, regimes, state_dtype


# ---------------------------------------------------------------------------------------------
# Drawing cases

def _regime_domains(op, regimes):
    """The values of the keys, β and gate attributes for `op`, restricted to `regimes` when given
    (with "normal" among them, plain values are drawn too)."""
    allowed = set(REGIMES) if regimes is None else set(regimes)
    plain = ("normal",) if regimes is None or "normal" in allowed or not allowed - {"normal", "long"} else ()

    def domain(options):
        named = tuple(r for r in options if r in allowed)
        return (plain + named) or ("normal",)

    domains = {"keys": domain(("keys_unnormalized",))}
    if op != "linear":
        domains["beta"] = domain(("beta_small", "beta_one"))
    if op == "gated-delta":
        domains["gates"] = domain(("gates_very_negative",))
    return domains


def attribute_domains(op, dtypes=("bf16", "fp32"), chunk_sizes=(16, 32, 64), head_dims=None, regimes=None,
                      scale=DRAWN, backward=True, varlen=True, initial_state=True):
    """Every attribute a case is drawn over, with the values it can take, for these arguments:
    dtype, chunk_size, length (class), keys, beta, gates, h0, varlen, gradients, scale (mode) and
    key_dim, value_dim (classes, default) or head_dims (the given (DK, DV) pairs)."""
    domains = {"dtype": tuple(canonical(d) for d in dtypes), "chunk_size": tuple(int(c) for c in chunk_sizes),
               "length": LENGTH_CLASSES}
    domains.update(_regime_domains(_canonical_op(op), regimes))
    domains["h0"] = (False, True) if initial_state else (False,)
    domains["varlen"] = (False, True) if varlen else (False,)
    domains["gradients"] = GRADIENT_MODES if backward else ("forward",)
    domains["scale"] = SCALE_MODES if scale == DRAWN else (("default",) if scale is None else ("fixed",))
    if head_dims is None:
        domains["key_dim"] = domains["value_dim"] = tuple(HEAD_DIM_CLASSES)
    else:
        domains["head_dims"] = tuple(_dims(head_dims))
    return domains


def head_dim_class(d):
    """The class of a default head dim (HEAD_DIM_CLASSES); sizes shrinking reaches are classed alike."""
    if d == 1 or d == 256:
        return str(d)
    return "pow2" if d & (d - 1) == 0 else "ragged"


def case_attributes(case, head_dims=None):
    """The attribute values of a drawn case (the keys of `attribute_domains`), read off its fields."""
    regimes = case.regimes
    attributes = {"dtype": case.dtype, "chunk_size": case.chunk_size, "length": case.length_class,
                  "keys": "keys_unnormalized" if "keys_unnormalized" in regimes else "normal"}
    if case.op != "linear":
        attributes["beta"] = next((r for r in ("beta_small", "beta_one") if r in regimes), "normal")
    if case.op == "gated-delta":
        attributes["gates"] = "gates_very_negative" if "gates_very_negative" in regimes else "normal"
    attributes.update(h0=case.h0, varlen=case.varlen, gradients=case.gradients, scale=case.scale_mode)
    if head_dims is None:
        attributes.update(key_dim=head_dim_class(case.key_dim), value_dim=head_dim_class(case.value_dim))
    else:
        attributes["head_dims"] = (case.key_dim, case.value_dim)
    return attributes


def pair_coverage(cases, domains, head_dims=None):
    """(covered, total, missing): pairs of values of two attributes that some case holds, out of
    every such pair `domains` allows; missing lists ((attribute, value), (attribute, value))."""
    names = list(domains)
    seen = set()
    for case in cases:
        a = case_attributes(case, head_dims)
        for i, x in enumerate(names):
            for y in names[i + 1:]:
                seen.add((x, a[x], y, a[y]))
    missing, total = [], 0
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            for vx in domains[x]:
                for vy in domains[y]:
                    total += 1
                    if (x, vx, y, vy) not in seen:
                        missing.append(((x, vx), (y, vy)))
    return total - len(missing), total, missing


def _covering_rows(sizes, rows, rng, candidates=16):
    """`rows` rows of attribute value indices: first a pairwise covering design, then independent
    uniform draws.

    Why a covering design and not independent draws: with the default attributes (8 length classes
    beside 4 scale modes and 4 head-dim classes of each of DK and DV, 3 chunk sizes, …) a pair of
    values has probability 1/32 of being in a random case, so 48 independent cases miss a given
    pair with probability (31/32)^48 ≈ 22 %, and some of the ~1000 pairs always go missing. The
    greedy construction of Cohen et al. (AETG, 1997) covers every pair in about 36-40 cases (the
    lower bound is the largest product, 32): each case is the best of `candidates` candidates,
    each filled attribute by attribute in random order with the value that covers the most pairs
    not yet covered (ties drawn at random). Later cases are independent draws, which add triples
    no design planned. Everything is drawn from `rng`: the design is a pure function of the seed."""
    n = len(sizes)
    uncovered = {(i, a, j, b) for i in range(n) for j in range(i + 1, n)
                 for a in range(sizes[i]) for b in range(sizes[j])}

    def key(i, a, j, b):
        return (i, a, j, b) if i < j else (j, b, i, a)

    out = []
    while len(out) < rows and uncovered:
        best, best_gain = None, -1
        for _ in range(candidates):
            row = [None] * n
            for i in rng.permutation(n):
                scores = [sum(key(i, a, j, row[j]) in uncovered for j in range(n) if row[j] is not None)
                          for a in range(sizes[i])]
                top = max(scores)
                ties = [a for a, s in enumerate(scores) if s == top]
                row[i] = ties[int(rng.integers(len(ties)))]
            gain = sum((i, row[i], j, row[j]) in uncovered for i in range(n) for j in range(i + 1, n))
            if gain > best_gain:
                best, best_gain = row, gain
        out.append(best)
        uncovered -= {(i, best[i], j, best[j]) for i in range(n) for j in range(i + 1, n)}
    while len(out) < rows:
        out.append([int(rng.integers(s)) for s in sizes])
    return out


def _length_of(length_class, C, rng):
    return max(1, {"1": 1, "2": 2, "3..8": int(rng.integers(3, 9)), "C-1": C - 1, "C": C, "C+1": C + 1,
                   "2C+3": 2 * C + 3, "8C+5": 8 * C + 5}[length_class])


def _random_scale(rng):
    """A scale ≠ 1 with four significant bits (exact in every dtype), log-uniform in [1/16, 2)."""
    while True:
        s = 2.0 ** rng.uniform(-4, 1)
        e = math.floor(math.log2(s))
        s = round(s / 2.0 ** e * 8) / 8 * 2.0 ** e
        if s != 1.0:
            return s


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
    first ~40 cases (a pairwise covering design, `_covering_rows`); later cases are independent.
    Batch and heads are drawn from 1..max_batch and 1..max_heads (1 and 1 at L = 8C+5)."""
    op, dtypes, chunk_sizes, dims, regimes, state_dtype = _validated(
        op, layout, dtypes, chunk_sizes, head_dims, regimes, scale, state_dtype, None, max_cases, max_heads,
        max_batch)
    domains = attribute_domains(op, dtypes, chunk_sizes, dims, regimes, scale, backward, varlen, initial_state)
    names = list(domains)
    design = _covering_rows([len(domains[n]) for n in names], int(max_cases),
                            np.random.default_rng([int(seed), 1]))
    rng = np.random.default_rng([int(seed), 2])  # sizes within a class, batch, heads, varlen lengths
    cases = []
    for i, row in enumerate(design):
        a = {name: domains[name][index] for name, index in zip(names, row)}
        C = a["chunk_size"]
        L = _length_of(a["length"], C, rng)
        if dims is None:
            K = int(rng.choice(HEAD_DIM_CLASSES[a["key_dim"]]))
            V = int(rng.choice(HEAD_DIM_CLASSES[a["value_dim"]]))
        else:
            K, V = a["head_dims"]
        B, H = int(rng.integers(1, max_batch + 1)), int(rng.integers(1, max_heads + 1))
        if a["length"] == "8C+5":  # many chunks: state growth, a 16-bit running state; one sequence-head
            B, H = 1, 1
        if a["varlen"]:
            lengths = [0, L, 1, int(rng.integers(2, C + 2))]
            rng.shuffle(lengths)
            lengths, B = tuple(int(x) for x in lengths), 1
        else:
            lengths = (L,)
        parts = [a[n] for n in ("keys", "beta", "gates") if n in a and a[n] != "normal"]
        mode = a["scale"]
        value = _random_scale(rng) if mode == "random" else (float(scale) if mode == "fixed" else 1.0)
        cases.append(Case(op=op, layout=layout, dtype=a["dtype"], chunk_size=int(C), batch=B, heads=H,
                          lengths=lengths, varlen=bool(a["varlen"]), key_dim=K, value_dim=V, h0=bool(a["h0"]),
                          backward=a["gradients"] != "forward", dht=a["gradients"] == "backward+dht",
                          regime="+".join(parts) or "normal", values="random", seed=int(seed) * 1000 + i,
                          scale=value, qk_l2norm=bool(qk_l2norm), scale_mode=mode, state_dtype=state_dtype,
                          length_class=a["length"]))
    return cases


# ---------------------------------------------------------------------------------------------
# Shrinking

def _smaller(n, floor, allowed=None):
    """Candidate sizes below n, smallest first."""
    if allowed is not None:
        return sorted({a for a in allowed if floor <= a < n})
    return sorted({x for x in (floor, floor + 1, 2, 3, n // 2, n - 1) if floor <= x < n})


def _shorter(n, C, floor):
    """Lengths below n to try, shortest first: a few tokens, the chunk boundaries, and n less 1/2,
    1/4, 1/8, 1/16 of itself (a bug that needs many tokens shrinks in a few steps, not n)."""
    fractions = {n // 2, n - n // 4, n - n // 8, n - n // 16, n - 1}
    return sorted(m for m in {0, 1, 2, 3, C - 1, C, C + 1} | fractions if floor <= m < n)


def simplifications(case, allowed_dims=None, chunk_sizes=None, scale_drawn=True):
    """Simpler neighbours of a case, most drastic first: fewer tokens, fewer sequences, no varlen,
    fewer heads and batch, a smaller chunk size among `chunk_sizes`, smaller dims, no h0 or dht,
    forward only, scale 1 (then K^-1/2; only when the scale is drawn), fewer regimes, simple values."""
    def r(c, **changes):
        if "lengths" in changes or "varlen" in changes:
            changes["length_class"] = None
        return dataclasses.replace(c, **changes)

    C = case.chunk_size
    if case.varlen:
        for i in range(len(case.lengths)):
            if len(case.lengths) > 1:
                yield r(case, lengths=case.lengths[:i] + case.lengths[i + 1:])
        longest = max(case.lengths)
        if longest > 0:
            yield r(case, varlen=False, lengths=(longest,), batch=1)
        for i, n in enumerate(case.lengths):
            for m in _shorter(n, C, 0):
                yield r(case, lengths=case.lengths[:i] + (m,) + case.lengths[i + 1:])
    else:
        n = case.lengths[0]
        for m in _shorter(n, C, 1):
            yield r(case, lengths=(m,))
        for b in _smaller(case.batch, 1):
            yield r(case, batch=b)
    for h in _smaller(case.heads, 1):
        yield r(case, heads=h)
    for c in sorted(x for x in (chunk_sizes or ()) if x < C):
        yield r(case, chunk_size=c)
    keys = None if allowed_dims is None else [d[0] for d in allowed_dims]
    values = None if allowed_dims is None else [d[1] for d in allowed_dims]
    if allowed_dims is not None and not all(d[0] == d[1] for d in allowed_dims):
        for K, V in sorted(set(allowed_dims)):
            if K * V < case.key_dim * case.value_dim:
                yield r(case, key_dim=K, value_dim=V)
    else:
        for K in _smaller(case.key_dim, 1, keys):
            yield r(case, key_dim=K) if allowed_dims is None else r(case, key_dim=K, value_dim=K)
        if allowed_dims is None:
            for V in _smaller(case.value_dim, 1, values):
                yield r(case, value_dim=V)
    if case.h0:
        yield r(case, h0=False)
    if case.backward and case.dht:
        yield r(case, dht=False)
    if case.backward:
        yield r(case, backward=False, dht=False)
    if scale_drawn and case.scale_mode in ("random", "default", "inv_sqrt_k"):
        yield r(case, scale_mode="one", scale=1.0)
        if case.scale_mode != "inv_sqrt_k":
            yield r(case, scale_mode="inv_sqrt_k", scale=1.0)
    regimes = case.regimes
    if len(regimes) > 1:
        for drop in sorted(regimes):
            yield r(case, regime="+".join(sorted(regimes - {drop})))
    if regimes:
        yield r(case, regime="normal")
    if case.values != "simple":
        yield r(case, values="simple")


def _same_failure(first, other):
    """Whether `other` fails the way `first` does (shrinking keeps to one failure: a disagreement
    does not shrink into a case the kernel refuses, nor one exception into another)."""
    if first.status == "disagree":
        return other.status == "disagree"
    if first.status != "error" or other.status != "error" or first.error_kind != other.error_kind:
        return False
    if first.error_kind == "raised":
        return first.error.split(":")[0] == other.error.split(":")[0]
    return True


_MARGINAL_RETRIES = 2


def _marginal(failure):
    """A disagreement within a factor 4 of its bound: the same shape with other values may pass, so
    a simpler shape that passes is tried with _MARGINAL_RETRIES other draws of its values."""
    return failure.status == "disagree" and failure.worst()[1] < 4


def _shrink(fn, failure, max_steps, tf32, allowed_dims, log, expect, deadline, threads, chunk_sizes, scale_drawn):
    """(smallest failing CaseResult, kernel calls made, what stopped it: None when no simpler
    neighbour fails, "max_shrink_steps" or "time budget")."""
    steps = 0
    improved = True
    while improved:
        improved = False
        for candidate in simplifications(failure.case, allowed_dims, chunk_sizes, scale_drawn):
            if steps >= max_steps:
                return failure, steps, "max_shrink_steps"
            if deadline is not None and time.perf_counter() > deadline:
                return failure, steps, "time budget"
            steps += 1
            result = run_case(fn, candidate, tf32=tf32, expect=expect, threads=threads)
            for retry in range(1, _MARGINAL_RETRIES + 1):
                if _same_failure(failure, result):
                    break
                if steps >= max_steps or (deadline is not None and time.perf_counter() > deadline):
                    break
                steps += 1
                result = run_case(fn, dataclasses.replace(candidate, seed=candidate.seed + 7919 * retry), tf32=tf32,
                                  expect=expect, threads=threads)
            if _same_failure(failure, result):
                failure, improved = result, True
                if log:
                    log(f"  shrunk to: {result.case.describe()}")
                break
    return failure, steps, None


def shrink(fn, failure, max_steps=400, tf32=False, allowed_dims=None, log=None, expect=None, time_budget_s=None,
           threads=0, chunk_sizes=None, scale_drawn=True):
    """Greedy: take the first simpler neighbour that fails the same way, until none does (or
    max_steps kernel calls, or time_budget_s seconds). Returns (smallest failing CaseResult, kernel
    calls made)."""
    deadline = None if time_budget_s is None else time.perf_counter() + time_budget_s
    failure, steps, _ = _shrink(fn, failure, max_steps, tf32, allowed_dims, log, expect, deadline, threads,
                                chunk_sizes, scale_drawn)
    return failure, steps


# ---------------------------------------------------------------------------------------------
# The report

def _norm_label(row, op):
    """How a verdict row's error and bound are measured: an entry, a row's 2-norm, or the whole
    state's Frobenius norm (the state bounds of the delta rules, verify/judge.cpp)."""
    norm = row.get("norm")
    if norm in ("frobenius", "whole"):
        return "‖·‖F"
    if norm == "rowwise":
        return "‖·‖F" if op != "linear" and row["tensor"] in ("ht", "dh0") else "row‖·‖₂"
    return "entry"


_SHORT_REGIMES = {"keys_unnormalized": "k-unnorm", "beta_small": "β≈0", "beta_one": "β≈1",
                  "gates_very_negative": "g≪0"}


def _g(x):
    return "-" if x is None else ("nan" if isinstance(x, float) and math.isnan(x) else f"{x:.3g}")


class Report:
    """What check_kernel found: ``.passed``, ``.cases`` (CaseResult per case), ``.counts`` (agree,
    disagree, inconclusive, error), ``.counterexample`` (the shrunk failing CaseResult, with
    ``.inputs``), ``.first_failure``, ``.coverage`` (pairs of attribute values covered, total),
    ``.cases_not_run`` and ``.stopped_by``, ``.shrink_stopped_by``; prints as a table."""

    def __init__(self, kernel_name, settings, cases, counterexample=None, first_failure=None, shrink_steps=0,
                 cases_not_run=0, stopped_by=None, shrink_stopped_by=None, coverage=None, seconds=None,
                 hints=()):
        self.kernel_name = kernel_name
        self.settings = settings
        self.cases = cases
        self.counterexample = counterexample
        self.first_failure = first_failure
        self.shrink_steps = shrink_steps
        self.cases_not_run = cases_not_run
        self.stopped_by = stopped_by              # None, "time budget" or "first failure"
        self.shrink_stopped_by = shrink_stopped_by  # None, "time budget", "max_shrink_steps", "calling convention"
        self.coverage = coverage                  # (covered, total, missing) over the cases run
        self.seconds = seconds
        self.hints = list(hints)

    @property
    def counts(self):
        return {s: sum(c.status == s for c in self.cases) for s in STATUSES}

    @property
    def passed(self):
        """No case disagreed or erred, and at least one agreed (inconclusive cases neither pass nor fail)."""
        return not self.failures and any(c.passed for c in self.cases)

    @property
    def failures(self):
        return [c for c in self.cases if c.failed]

    @property
    def inconclusive(self):
        return [c for c in self.cases if c.status == "inconclusive"]

    def rows(self):
        """One dict per case: description, shape, dtype, status, the worst verdict row (tensor, error
        and bound measured the same way, norm, err/bound)."""
        out = []
        for i, c in enumerate(self.cases):
            row = c.worst_row()
            tensor, ratio = c.worst()
            out.append({"case": i, "description": c.case.describe(), "dtype": c.case.dtype,
                        "chunk_size": c.case.chunk_size, "lengths": list(c.case.lengths), "varlen": c.case.varlen,
                        "heads": c.case.heads, "batch": c.case.batch, "key_dim": c.case.key_dim,
                        "value_dim": c.case.value_dim, "scale": c.case.describe_scale(), "worst": tensor,
                        "norm": None if row is None else _norm_label(row, c.case.op),
                        "worst_error": None if row is None else row["error"],
                        "worst_bound": None if row is None else row["bound"], "ratio": ratio,
                        "status": c.status, "passed": c.passed, "error": c.error, "reasons": list(c.reasons),
                        "verdict_rows": [{k: r.get(k) for k in ("tensor", "error", "bound", "ratio", "index",
                                                                "agrees", "norm", "max_abs", "rms")}
                                         for r in (c.verdict.comparisons if c.verdict else [])]})
        return out

    def _summary(self):
        n = self.counts
        text = (f"{n['agree']} agree, {n['disagree']} disagree, {n['inconclusive']} inconclusive, "
                f"{n['error']} errors of {len(self.cases)} cases run")
        if self.cases_not_run:
            text += f"; {self.cases_not_run} not run ({self.stopped_by})"
        return text

    def verdict_table(self, result):
        """A case's verdict, each tensor's error measured as its bound is stated."""
        lines = [f"  {'tensor':7} {'measured as':11} {'error':>10} {'bound':>10} {'err/bound':>10}  "
                 f"{'worst at':22} {'verdict':9} {'max|Δ| entry':>12} {'rms':>10}"]
        for r in result.verdict.comparisons:
            ratio = "non-finite" if not r["finite"] else _g(_ratio(r))
            status = "INCONCL." if _row_inconclusive(r) else ("agree" if r["agrees"] else "DISAGREE")
            where = "(" + ", ".join(str(x) for x in (r.get("index") or [])) + ")"
            lines.append(f"  {r['tensor']:7} {_norm_label(r, result.case.op):11} {_g(r['error']):>10} "
                         f"{_g(r['bound']):>10} {ratio:>10}  {where[:22]:22} {status:9} {_g(r.get('max_abs')):>12} "
                         f"{_g(r.get('rms')):>10}")
        return "\n".join(lines)

    def __str__(self):
        lines = [f"check_kernel({self.kernel_name}): {'PASSED' if self.passed else 'FAILED'} — {self._summary()}"]
        lines.append(f"  {'#':>3} {'dtype':5} {'C':>3} {'shape':24} {'DK':>4} {'DV':>4} {'scale':12} "
                     f"{'regime':17} {'inputs':10} {'worst':6} {'measured':8} {'error':>9} {'bound':>9} "
                     f"{'err/bnd':>8}  verdict")
        for i, c in enumerate(self.cases):
            k = c.case
            shape = f"varlen{list(k.lengths)}xH{k.heads}" if k.varlen else f"B{k.batch}xH{k.heads}xL{k.lengths[0]}"
            row = c.worst_row()
            tensor, ratio = c.worst()
            regime = "+".join(_SHORT_REGIMES.get(r, r) for r in sorted(k.regimes)) or "normal"
            flags = " ".join(f for f, on in (("h0", k.h0), ("bwd", k.backward), ("dht", k.dht and k.backward)) if on)
            verdict = {"agree": "agree", "disagree": "DISAGREE", "inconclusive": "inconclusive",
                       "error": "ERROR"}[c.status]
            lines.append(f"  {i:>3} {k.dtype:5} {k.chunk_size:>3} {shape[:24]:24} {k.key_dim:>4} {k.value_dim:>4} "
                         f"{k.describe_scale()[:12]:12} {regime[:17]:17} {flags or '-':10} {str(tensor or '-'):6} "
                         f"{'-' if row is None else _norm_label(row, k.op):8} "
                         f"{_g(None if row is None else row['error']):>9} "
                         f"{_g(None if row is None else row['bound']):>9} {ratio:>8.3g}  {verdict}"
                         + (f"  ({c.error})" if c.error else ""))
        if self.coverage is not None:  # below the table: line 1 stays its header
            lines.append(f"pairs of attribute values covered by the cases run: {self.coverage[0]}/{self.coverage[1]}")
        if self.inconclusive:
            lines += ["", "inconclusive (outside a bound's premise):"]
            for c in self.inconclusive:
                lines.append(f"  #{self.cases.index(c)} {c.case.describe()}")
                lines += [f"    {reason}" for reason in c.reasons]
        if self.cases_not_run:
            lines += ["", f"{self.cases_not_run} of {self.cases_not_run + len(self.cases)} cases not run: "
                          f"{self.stopped_by}" + (f" of {self.settings.get('time_budget_s')} s spent"
                                                  if self.stopped_by == "time budget" else "")]
        errors = [c for c in self.cases if c.status == "error" and c.traceback]
        if errors:
            first = errors[0]
            lines += ["", f"the kernel's error in case #{self.cases.index(first)} ({first.error_kind}):",
                      first.traceback.rstrip()]
        lines += [""] + self.hints if self.hints else []
        if self.counterexample is not None:
            cx = self.counterexample
            why = {"calling convention": "a calling-convention error is not shrunk"}.get(
                self.shrink_stopped_by, f"shrinking stopped by {self.shrink_stopped_by}")
            if self.shrink_steps == 0 and (self.shrink_stopped_by or cx is self.first_failure):
                shrunk = "not shrunk" + (f": {why}" if self.shrink_stopped_by else "")
            else:
                shrunk = f"{self.shrink_steps} shrink steps" + (
                    f"; {why}, a smaller case may fail too" if self.shrink_stopped_by else "")
            lines += ["", f"smallest failing case ({shrunk}): {cx.case.describe()}"]
            if cx.error:
                lines.append(f"  {cx.error}")
            if cx.verdict is not None:
                lines.append(self.verdict_table(cx))
        return "\n".join(lines)

    def to_json(self):
        cx = self.counterexample
        return {"kernel": self.kernel_name, "settings": self.settings, "passed": self.passed, "counts": self.counts,
                "coverage": None if self.coverage is None else {
                    "covered": self.coverage[0], "total": self.coverage[1],
                    "missing": [[list(a), list(b)] for a, b in self.coverage[2]]},
                "cases_not_run": self.cases_not_run, "stopped_by": self.stopped_by,
                "shrink_stopped_by": self.shrink_stopped_by, "seconds": self.seconds, "hints": self.hints,
                "cases": [c.to_json() for c in self.cases],
                "counterexample": None if cx is None else {
                    **cx.to_json(),
                    "inputs": {k: (np.asarray(v, dtype=np.float64).tolist() if v is not None else None)
                               for k, v in inputs_of(cx.case).items()}},
                "first_failure": None if self.first_failure is None else self.first_failure.to_json(),
                "shrink_steps": self.shrink_steps}

    def dumps(self, **kw):
        return json.dumps(self.to_json(), default=str, **kw)


# ---------------------------------------------------------------------------------------------
# Progress

class _Progress:
    """One line per case on a terminal; once a run is long (an estimated 20 s or more), a bar with
    an ETA under the lines. Quiet when stderr is not a terminal or under pytest, unless forced."""

    def __init__(self, total, enabled, log):
        self.total, self.enabled, self.log = total, enabled, log
        self.stream = sys.stderr
        self.started = time.perf_counter()
        self.bar_shown = False

    def _clear_bar(self):
        if self.bar_shown:
            self.stream.write("\r\033[K")
            self.bar_shown = False

    def line(self, text):
        if self.log:
            self.log(text)
        if self.enabled:
            self._clear_bar()
            self.stream.write(text + "\n")
            self.stream.flush()

    def case(self, done, text):
        self.line(text)
        if not self.enabled or done >= self.total:
            return
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done * (self.total - done)
        if elapsed + eta >= 20:
            width = 30
            filled = int(width * done / self.total)
            self.stream.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} cases, "
                              f"{elapsed:.0f} s, ETA {eta:.0f} s")
            self.stream.flush()
            self.bar_shown = True

    def close(self):
        if self.enabled:
            self._clear_bar()
            self.stream.flush()


def _progress_wanted(progress):
    if progress is not None:
        return bool(progress)
    return "PYTEST_CURRENT_TEST" not in os.environ and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def _hints(results):
    """Lines for the report where errors have one evident cause."""
    convention = [r for r in results if r.error_kind == "calling convention"]
    if not convention:
        return []
    default = [r for r in results if r.case.scale_mode == "default"]
    if default and all(r.case.scale_mode == "default" for r in convention) and \
            all(r.error_kind == "calling convention" for r in default):
        return [f"the kernel raised TypeError in every case that gave it scale=None ({len(default)}) and in no "
                "other: it does not take None, which fla's functions read as their default K^-1/2. Accept None "
                "(as K ** -0.5), or pass check_kernel a fixed scale=<number> to draw no default-scale cases."]
    return [f"{len(convention)} cases raised TypeError (listed as calling convention, not shrunk): the kernel's "
            "signature or the types it expects do not fit check_kernel's (see fn's documentation in "
            "check_kernel)."]


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
            counterexample, steps, shrink_stopped_by = _shrink(
                fn, first, max_shrink_steps, tf32, dims, progress.line, expect, deadline, threads, chunk_list,
                scale == DRAWN)
            if shrink_stopped_by:
                progress.line(f"shrinking stopped after {steps} steps: {shrink_stopped_by}")
        counterexample.inputs = inputs_of(counterexample.case)
    progress.close()
    coverage = pair_coverage([r.case for r in results], domains, dims)
    return Report(name or getattr(fn, "__name__", "kernel"), settings, results, counterexample, first, steps,
                  cases_not_run=not_run, stopped_by=stopped_by, shrink_stopped_by=shrink_stopped_by,
                  coverage=coverage, seconds=time.perf_counter() - started, hints=_hints(results))
