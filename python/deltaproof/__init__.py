"""deltaproof: the exact oracle of the linear-attention family and a verdict for any kernel.

    import deltaproof
    deltaproof.linear_attention.chunkwise(q, k, v, 16, scalar="exact")   # oracle forms, one head
    deltaproof.judge("delta", inputs, outputs, layout="blhd", dtype="bf16") # verify::judge
    report = deltaproof.check_kernel(fn, op="gated-delta")                  # property-based driver
    print(report); report.to_json()

Forms: deltaproof.linear_attention, deltaproof.delta_rule, deltaproof.gated_delta_rule,
deltaproof.ttt, deltaproof.lact (each function's docstring quotes its equation). Kernels for
check_kernel: any fn(dict) returning a dict or fla's tuple (o, ht, gradients…);
deltaproof.torch_kernel wraps a PyTorch (fla-style) forward function; deltaproof.reference_kernel
is the oracle itself as a kernel.
"""
from . import _backend  # noqa: F401  (_core, or the C judge where _core does not import)
from ._version import __version__
from . import delta_rule, gated_delta_rule, lact, linear_attention, ttt
from .check import Case, CaseResult, Report, check_kernel, draw_cases, inputs_of, run_case, shrink
from .dtypes import round_to, round_to_bf16
from .kernels import reference_kernel
from .torch_adapter import torch_kernel
from .verdict import Verdict, judge, oracle

__all__ = ["__version__", "linear_attention", "delta_rule", "gated_delta_rule", "ttt", "lact", "judge", "oracle", "Verdict",
           "check_kernel", "Report", "Case", "CaseResult", "draw_cases", "inputs_of", "run_case", "shrink", "reference_kernel",
           "torch_kernel", "round_to", "round_to_bf16"]
