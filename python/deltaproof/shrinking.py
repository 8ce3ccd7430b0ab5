"""Shrinking a failing case: its simpler neighbours (`simplifications`), what counts as the same
failure, and the greedy search (`greedy_shrink`) over a `run(case) -> CaseResult` it is given
(`check.shrink` and check_kernel run the kernel through `check.run_case`)."""
import dataclasses
import time


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


def greedy_shrink(run, failure, max_steps, allowed_dims, log, deadline, chunk_sizes, scale_drawn):
    """(smallest failing CaseResult, cases run, what stopped it: None when no simpler neighbour
    fails, "max_shrink_steps" or "time budget"). Takes the first simpler neighbour that fails the
    way `failure` does, until none does; `run(case)` runs and judges one case."""
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
            result = run(candidate)
            for retry in range(1, _MARGINAL_RETRIES + 1):
                if _same_failure(failure, result):
                    break
                if steps >= max_steps or (deadline is not None and time.perf_counter() > deadline):
                    break
                steps += 1
                result = run(dataclasses.replace(candidate, seed=candidate.seed + 7919 * retry))
            if _same_failure(failure, result):
                failure, improved = result, True
                if log:
                    log(f"  shrunk to: {result.case.describe()}")
                break
    return failure, steps, None
