"""check_kernel: a property-based driver that brings any kernel of the family to the oracle.

It draws cases over shapes and regimes (lengths around the chunk size, odd head dims, varlen batches
with empty and one-token sequences, h0 present or absent, unnormalised keys, β near 0 and 1, very
negative gates, long sequences), rounds every input to the kernel's dtype, calls the kernel, judges
what it returns with verify::judge, and shrinks a failure greedily to the smallest failing case.
"""
import dataclasses
import json
import math
import time
import traceback

import numpy as np

from .dtypes import canonical, round_to
from .verdict import judge, tensor_dtype

OPS = ("linear", "delta", "gated-delta")
REGIMES = ("normal", "keys_unnormalized", "beta_small", "beta_one", "gates_very_negative", "long")
DEFAULT_HEAD_DIMS = (1, 15, 16, 60, 64, 100, 128, 256)
_FORWARD = ("o", "ht")


def _canonical_op(op):
    op = op.replace("_", "-")
    if op not in OPS:
        raise ValueError(f"op: expected one of {OPS} (got {op!r})")
    return op


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
    regime: str
    values: str            # "random" or "simple" (small dyadic numbers)
    seed: int
    scale: float = 1.0
    qk_l2norm: bool = False

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

    def describe(self):
        shape = (f"varlen{list(self.lengths)} H={self.heads}" if self.varlen
                 else f"B={self.batch} H={self.heads} L={self.lengths[0]}")
        extra = [x for x, on in (("h0", self.h0), ("bwd", self.backward), ("dht", self.backward and self.dht),
                                 ("l2norm", self.qk_l2norm)) if on]
        return (f"{self.op} {self.dtype} C={self.chunk_size} {shape} DK={self.key_dim} DV={self.value_dim} "
                f"{self.regime}/{self.values} {' '.join(extra)} seed={self.seed}").strip()

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

    def draw(shape, spread=1.0):
        if simple:
            return rng.integers(-2, 3, size=shape) / 2.0
        return rng.standard_normal(shape) * spread

    q = draw((B, T, H, K), 1 / math.sqrt(K))
    if case.op != "linear" and case.regime != "keys_unnormalized" and not simple:
        k = _normalise_rows(rng.standard_normal((B, T, H, K)))
    elif case.regime == "keys_unnormalized" and not simple:
        k = rng.standard_normal((B, T, H, K)) * (1.5 / math.sqrt(K))
    else:
        k = draw((B, T, H, K), 1 / math.sqrt(K))
    v = draw((B, T, H, V))
    out = {}
    if case.op != "linear":
        if simple:
            beta = np.full((B, T, H), 0.5)
        elif case.regime == "beta_small":
            beta = rng.uniform(0, 1e-3, (B, T, H))
        elif case.regime == "beta_one":
            beta = np.where(rng.uniform(size=(B, T, H)) < 0.5, 1.0, 1.0 - 2.0 ** -8)
        else:
            beta = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
        out["beta"] = beta
    if case.op == "gated-delta":
        if simple:
            g = np.full((B, T, H), -0.25)
        elif case.regime == "gates_very_negative":
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
    """What `fn` receives: the tensors of `inputs_of` plus the case's settings."""
    args = inputs_of(case)
    args.update(op=case.op, layout=case.layout, dtype=case.dtype, scale=case.scale, chunk_size=case.chunk_size,
                qk_l2norm=case.qk_l2norm)
    return args


# ---------------------------------------------------------------------------------------------
# Running and judging one case

@dataclasses.dataclass
class CaseResult:
    case: Case
    passed: bool
    verdict: object = None     # Verdict, when the kernel returned judgeable outputs
    error: str = None          # the kernel raised, returned too little, or returned malformed tensors
    seconds: float = 0.0

    def worst(self):
        """(tensor, err/bound) of the worst comparison, or (None, nan)."""
        if self.verdict is None or not self.verdict.comparisons:
            return None, float("nan")
        rows = self.verdict.comparisons
        bad = [c for c in rows if not c["finite"]]
        if bad:
            return bad[0]["tensor"], float("inf")
        c = max(rows, key=lambda c: c["ratio"] if c["ratio"] is not None else -1)
        return c["tensor"], c["ratio"]

    def to_json(self):
        return {"case": self.case.to_json(), "description": self.case.describe(), "passed": self.passed,
                "verdict": self.verdict.to_json() if self.verdict is not None else None, "error": self.error,
                "seconds": self.seconds}


def _expected_outputs(case, expect=None):
    if expect is not None:
        return [n for n in expect if case.backward or n in _FORWARD]
    names = ["o", "ht"]
    if case.backward:
        names += ["dq", "dk", "dv"]
        names += {"linear": [], "delta": ["dbeta"], "gated-delta": ["dbeta", "dg"]}[case.op]
        names += ["dh0"] if case.h0 else []
    return names


def run_case(fn, case, tf32=False, threads=0, expect=None):
    """Calls fn on the case's inputs and judges what it returns (`expect`: the output names the
    kernel must return; default o, ht and, for backward cases, every gradient)."""
    start = time.perf_counter()
    args = kernel_arguments(case)
    try:
        returned = fn(dict(args))
    except Exception as e:  # a kernel that raises fails the case; the message is the evidence
        return CaseResult(case, False, error=f"kernel raised {type(e).__name__}: {e}",
                          seconds=time.perf_counter() - start)
    returned = {k: v for k, v in dict(returned or {}).items() if v is not None}
    expected = _expected_outputs(case, expect)
    missing = [n for n in expected if n not in returned]
    outputs = {k: v for k, v in returned.items() if k in expected}
    tensors = {k: v for k, v in args.items() if k in ("q", "k", "v", "beta", "g", "h0", "do", "dht")}
    try:
        verdict = judge(case.op, tensors, outputs, layout=case.layout, dtype=case.dtype, scale=case.scale,
                        cu_seqlens=case.cu_seqlens, qk_l2norm=case.qk_l2norm, tf32=tf32, threads=threads)
    except (ValueError, TypeError) as e:  # malformed outputs (shape, names): the kernel's fault
        return CaseResult(case, False, error=f"outputs rejected: {e}", seconds=time.perf_counter() - start)
    error = f"missing outputs: {', '.join(missing)}" if missing else None
    return CaseResult(case, verdict.agrees and not missing, verdict, error, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# Drawing cases

def _dims(head_dims):
    return [(d, d) if isinstance(d, int) else tuple(d) for d in head_dims]


def draw_cases(op, layout="blhd", dtypes=("bf16", "fp32"), chunk_sizes=(16, 32, 64), max_cases=40, seed=0,
               backward=True, varlen=True, head_dims=None, regimes=None, scale=1.0, qk_l2norm=False,
               max_heads=3, max_batch=2, initial_state=True):
    """The cases check_kernel runs, in order. Every length class L ∈ {1, 2, C−1, C, C+1, 3..8, 2C+3}
    comes round once per len(length classes) cases; regimes, dtypes and chunk sizes rotate."""
    op = _canonical_op(op)
    dtypes = [canonical(d) for d in dtypes]
    rng = np.random.default_rng(seed)
    independent = head_dims is None  # default: DK and DV drawn independently
    dims = _dims(head_dims or DEFAULT_HEAD_DIMS)
    if regimes is None:
        regimes = [r for r in REGIMES if not (op == "linear" and r in ("beta_small", "beta_one", "gates_very_negative"))
                   and not (op == "delta" and r == "gates_very_negative")]
    cases = []
    for i in range(max_cases):
        dtype = dtypes[i % len(dtypes)]
        C = chunk_sizes[(i // len(dtypes)) % len(chunk_sizes)]
        regime = regimes[(i // 2) % len(regimes)] if i else "normal"
        length_classes = [1, 2, C - 1, C, C + 1, int(rng.integers(3, 9)), 2 * C + 3]
        L = max(1, length_classes[i % len(length_classes)])
        if independent:
            K, V = int(rng.choice([d[0] for d in dims])), int(rng.choice([d[1] for d in dims]))
        else:
            K, V = dims[int(rng.integers(len(dims)))]
        B, H = int(rng.integers(1, max_batch + 1)), int(rng.integers(1, max_heads + 1))
        is_varlen = bool(varlen) and i % 3 == 2
        if regime == "long":  # state growth over many tokens, in fp16 when the kernel takes it
            dtype = "fp16" if "fp16" in dtypes else dtype
            L, B, H, is_varlen = 8 * C + 5, 1, 1, False
            K, V = (64, 64) if independent else dims[int(rng.integers(len(dims)))]
        if is_varlen:  # an empty and a one-token sequence around the drawn length
            lengths = [0, L, 1, int(rng.integers(2, C + 2))]
            rng.shuffle(lengths)
            lengths, B = tuple(int(x) for x in lengths), 1
        else:
            lengths = (L,)
        cases.append(Case(op=op, layout=layout, dtype=dtype, chunk_size=int(C), batch=B, heads=H, lengths=lengths,
                          varlen=is_varlen, key_dim=K, value_dim=V, h0=bool(initial_state) and i % 2 == 0,
                          backward=bool(backward),
                          dht=i % 4 < 2, regime=regime, values="random", seed=int(seed) * 1000 + i, scale=scale,
                          qk_l2norm=qk_l2norm))
    return cases


# ---------------------------------------------------------------------------------------------
# Shrinking

def _smaller(n, floor, allowed=None):
    """Candidate sizes below n, smallest first."""
    if allowed is not None:
        return sorted({a for a in allowed if floor <= a < n})
    return sorted({x for x in (floor, floor + 1, 2, 3, n // 2, n - 1) if floor <= x < n})


def simplifications(case, allowed_dims=None):
    """Simpler neighbours of a case, most drastic first: fewer tokens, fewer sequences, no varlen,
    fewer heads and batch, smaller dims, no h0 or dht, forward only, plain regime, simple values."""
    r = dataclasses.replace
    C = case.chunk_size
    if case.varlen:
        for i in range(len(case.lengths)):
            if len(case.lengths) > 1:
                yield r(case, lengths=case.lengths[:i] + case.lengths[i + 1:])
        longest = max(case.lengths)
        if longest > 0:
            yield r(case, varlen=False, lengths=(longest,), batch=1)
        for i, n in enumerate(case.lengths):
            for m in sorted({0, 1, 2, n // 2, n - 1} | {x for x in (C - 1, C, C + 1) if x < n}):
                if 0 <= m < n:
                    yield r(case, lengths=case.lengths[:i] + (m,) + case.lengths[i + 1:])
    else:
        n = case.lengths[0]
        for m in sorted({1, 2, 3, n // 2, n - 1} | {x for x in (C - 1, C, C + 1) if x < n}):
            if 1 <= m < n:
                yield r(case, lengths=(m,))
        for b in _smaller(case.batch, 1):
            yield r(case, batch=b)
    for h in _smaller(case.heads, 1):
        yield r(case, heads=h)
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
        yield r(case, backward=False)
    if case.regime != "normal":
        yield r(case, regime="normal")
    if case.values != "simple":
        yield r(case, values="simple")


def shrink(fn, failure, max_steps=200, tf32=False, allowed_dims=None, log=None, expect=None):
    """Greedy: take the first simpler neighbour that still fails, until none does (or max_steps
    kernel calls). Returns (smallest failing CaseResult, kernel calls made)."""
    steps = 0
    improved = True
    while improved and steps < max_steps:
        improved = False
        for candidate in simplifications(failure.case, allowed_dims):
            if steps >= max_steps:
                break
            steps += 1
            result = run_case(fn, candidate, tf32=tf32, expect=expect)
            if not result.passed:
                failure, improved = result, True
                if log:
                    log(f"  shrunk to: {candidate.describe()}")
                break
    return failure, steps


# ---------------------------------------------------------------------------------------------
# The report

class Report:
    """What check_kernel found: ``.passed``, ``.cases`` (CaseResult per case), ``.counterexample``
    (the shrunk failing CaseResult, with ``.inputs``), ``.first_failure``; prints as a table."""

    def __init__(self, kernel_name, settings, cases, counterexample=None, first_failure=None, shrink_steps=0):
        self.kernel_name = kernel_name
        self.settings = settings
        self.cases = cases
        self.counterexample = counterexample
        self.first_failure = first_failure
        self.shrink_steps = shrink_steps

    @property
    def passed(self):
        return all(c.passed for c in self.cases)

    @property
    def failures(self):
        return [c for c in self.cases if not c.passed]

    def rows(self):
        """One dict per case: description, shape, dtype, worst tensor, err/bound, verdict."""
        out = []
        for i, c in enumerate(self.cases):
            tensor, ratio = c.worst()
            out.append({"case": i, "description": c.case.describe(), "dtype": c.case.dtype,
                        "chunk_size": c.case.chunk_size, "lengths": list(c.case.lengths), "varlen": c.case.varlen,
                        "heads": c.case.heads, "batch": c.case.batch, "key_dim": c.case.key_dim,
                        "value_dim": c.case.value_dim, "worst": tensor, "ratio": ratio, "passed": c.passed,
                        "error": c.error,
                        "verdict_rows": [{k: r[k] for k in ("tensor", "error", "bound", "ratio", "index", "agrees")}
                                         for r in (c.verdict.comparisons if c.verdict else [])]})
        return out

    def __str__(self):
        lines = [f"check_kernel({self.kernel_name}): {'PASSED' if self.passed else 'FAILED'} — "
                 f"{len(self.cases) - len(self.failures)}/{len(self.cases)} cases agree",
                 f"  {'#':>3} {'dtype':5} {'C':>3} {'shape':26} {'DK':>4} {'DV':>4} {'regime':20} "
                 f"{'worst':6} {'err/bound':>10}  verdict"]
        for i, c in enumerate(self.cases):
            k = c.case
            shape = f"varlen{list(k.lengths)}xH{k.heads}" if k.varlen else f"B{k.batch}xH{k.heads}xL{k.lengths[0]}"
            tensor, ratio = c.worst()
            verdict = "agree" if c.passed else ("ERROR" if c.verdict is None else "DISAGREE")
            lines.append(f"  {i:>3} {k.dtype:5} {k.chunk_size:>3} {shape[:26]:26} {k.key_dim:>4} {k.value_dim:>4} "
                         f"{(k.regime + ('+h0' if k.h0 else ''))[:20]:20} {str(tensor or '-'):6} "
                         f"{ratio:>10.3g}  {verdict}" + (f"  ({c.error})" if c.error else ""))
        if self.counterexample is not None:
            cx = self.counterexample
            lines += ["", f"smallest failing case ({self.shrink_steps} shrink steps): {cx.case.describe()}"]
            if cx.error:
                lines.append(f"  {cx.error}")
            if cx.verdict is not None:
                lines.append(str(cx.verdict).rstrip())
        return "\n".join(lines)

    def to_json(self):
        cx = self.counterexample
        return {"kernel": self.kernel_name, "settings": self.settings, "passed": self.passed,
                "cases": [c.to_json() for c in self.cases],
                "counterexample": None if cx is None else {
                    **cx.to_json(),
                    "inputs": {k: (np.asarray(v, dtype=np.float64).tolist() if v is not None else None)
                               for k, v in inputs_of(cx.case).items()}},
                "first_failure": None if self.first_failure is None else self.first_failure.to_json(),
                "shrink_steps": self.shrink_steps}

    def dumps(self, **kw):
        return json.dumps(self.to_json(), **kw)


def check_kernel(fn, op="linear", layout="blhd", dtypes=("bf16", "fp32"), chunk_sizes=(16, 32, 64), max_cases=40,
                 seed=0, backward=True, varlen=True, tf32=False, head_dims=None, regimes=None, scale=1.0,
                 qk_l2norm=False, shrink_failures=True, max_shrink_steps=200, stop_on_failure=False, log=None,
                 name=None, initial_state=True, expect=None, time_budget_s=None):
    """Runs fn on drawn cases and judges each with verify::judge; shrinks the first failure.

    fn(inputs) -> dict: inputs holds numpy arrays q, k, v (beta for delta ops, g log-gates for
    gated-delta, h0 when given, do and dht when gradients are asked for) in `layout`, rounded to
    inputs["dtype"] (bf16 values in float32 arrays; g, h0, dht fp32), plus cu_seqlens (int64 array
    or None), scale, chunk_size, op, layout, dtype, qk_l2norm. It returns o, ht and, when inputs hold
    do, dq, dk, dv (dbeta, dg) and dh0 (when h0 was given); numpy arrays or torch tensors.
    head_dims: ints (DK = DV = d) or (DK, DV) pairs; default draws DK and DV from 1 … 256.
    log: a callable given one line per case (progress). initial_state=False: never give h0 (for
    kernels without one). expect: the outputs the kernel returns (default o, ht and every gradient).
    time_budget_s: stop drawing cases (and shrinking) once this much wall time has gone.
    """
    started = time.perf_counter()
    over_budget = lambda: time_budget_s is not None and time.perf_counter() - started > time_budget_s
    dims = None if head_dims is None else _dims(head_dims)
    cases = draw_cases(op, layout, dtypes, chunk_sizes, max_cases, seed, backward, varlen, head_dims, regimes,
                       scale, qk_l2norm, initial_state=initial_state)
    settings = {"op": _canonical_op(op), "layout": layout, "dtypes": list(dtypes), "chunk_sizes": list(chunk_sizes),
                "max_cases": max_cases, "seed": seed, "backward": backward, "varlen": varlen, "tf32": tf32,
                "head_dims": None if dims is None else [list(d) for d in dims], "scale": scale,
                "qk_l2norm": qk_l2norm, "initial_state": initial_state, "expect": expect}
    results = []
    for i, case in enumerate(cases):
        result = run_case(fn, case, tf32=tf32, expect=expect)
        results.append(result)
        if log:
            tensor, ratio = result.worst()
            log(f"[{i + 1}/{len(cases)}] {case.describe()}: {'agree' if result.passed else 'FAIL'} "
                f"worst {tensor} err/bound {ratio:.3g} ({result.seconds:.1f} s)"
                + (f" — {result.error}" if result.error else ""))
        if stop_on_failure and not result.passed:
            break
        if over_budget():
            if log:
                log(f"time budget of {time_budget_s:.0f} s spent: {len(cases) - i - 1} cases not run")
            break
    failures = [r for r in results if not r.passed]
    counterexample, first, steps = None, None, 0
    if failures:
        first = failures[0]
        counterexample = first
        if shrink_failures and not over_budget():
            counterexample, steps = shrink(fn, first, max_shrink_steps, tf32, dims, log, expect)
        counterexample.inputs = inputs_of(counterexample.case)
    return Report(name or getattr(fn, "__name__", "kernel"), settings, results, counterexample, first, steps)
