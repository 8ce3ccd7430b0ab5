"""What a case of check_kernel is: the attributes it is drawn over (op, layout, regimes, length
classes, scale modes, head-dim classes), the Case dataclass, and the inputs a case gives a kernel,
rounded to its dtype and a pure function of the case's fields."""
import dataclasses
import math

import numpy as np

from .dtypes import round_to
from .verdict import tensor_dtype

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


def _canonical_op(op):
    name = str(op).replace("_", "-")
    if name not in OPS:
        raise ValueError(f"op: expected one of {OPS} (got {op!r})")
    return name


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

