"""Drawing check_kernel's cases: the attributes a case is drawn over and their values
(`attribute_domains`), a pairwise covering design over them (`_covering_rows`), the cases built
from its rows (`draw_validated`, behind `check.draw_cases`), and the pairs of values a set of cases
covers (`pair_coverage`). Everything is drawn from generators seeded by `seed` alone."""
import math

import numpy as np

from .cases import (DRAWN, GRADIENT_MODES, HEAD_DIM_CLASSES, LENGTH_CLASSES, REGIMES, SCALE_MODES, Case,
                    _canonical_op)
from .dtypes import canonical


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


def draw_validated(op, layout, dtypes, chunk_sizes, max_cases, seed, backward, varlen, dims, regimes, scale,
                   qk_l2norm, max_heads, max_batch, initial_state, state_dtype):
    """The cases of `check.draw_cases` for arguments `check._validated` returned (op canonical,
    dims as (DK, DV) pairs or None, state_dtype None or 16-bit): attribute values from the covering
    design (generator [seed, 1]), then sizes within a class, batch, heads, varlen lengths and random
    scales from a second generator ([seed, 2])."""
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

