// How far the CUDA kernels (cuda/linear_attention.cu) may be from the exact oracle: the rounding
// bound the GPU tests and `deltaproof verify --impl cuda` check, derived once here. It describes a
// kernel, not the oracle, so it lives in verify/ (namespace verify::linear_attention).
//
// 1. Inputs. Each input is rounded to the kernel dtype once, on the host; the oracle runs on the
//    exact values of those rounded numbers, so input rounding costs nothing.
// 2. Accumulation. Every entry of o, S_L and of each gradient is a sum of products of inputs
//    (coefficients +1); its magnitude Σ|terms| is the same form on |inputs|
//    (forward_magnitude, backward_magnitude). The kernels accumulate in fp32 (fp64 for fp64
//    inputs) along chains no longer than
//        m = L + ceil(L/C) + DK + DV + C + 8:
//    the state adds L token products (one FMA each) and N chunk joins; an output then adds one dot
//    product of length DK (DV in the dQ/dK passes) with the state and at most C masked scores,
//    each score itself a dot product of that length; decode's warp butterfly adds 5 levels (< 8).
//    Hence |computed − exact| <= γ_m(u)·magnitude (Higham, Thm 3.1), u = 2⁻²⁴ (2⁻⁵³ for fp64).
//    Tensor-core pass (bf16): products of bf16 are exact in fp32, but the sums are aligned and
//    truncated rather than rounded (Fasi, Higham, Mikaitis, Pranesh, PeerJ CS 2021): relative error
//    < 2⁻²³ per addition, so u = 2⁻²³ there. The fp32 operands S and P enter as hi + lo bf16 pairs,
//    exact to a relative 2⁻¹⁶ (|x − hi| <= 2⁻⁸|x|, |x − hi − lo| <= 2⁻⁸|x − hi|), adding
//    2⁻¹⁶·(1 + γ_m)·magnitude.
// 3. Output rounding. A bf16 (fp16) output is the accumulated value rounded once more:
//    + u_out·(|exact| + accumulation bound), u_out = 2⁻⁸ (2⁻¹¹); fp32/fp64 outputs and every state
//    (kept in the accumulation type) have no such step.
#pragma once

#include "reference/scalar.hpp"

#include <cmath>

namespace deltaproof::verify::linear_attention {

using ref::Exact;
using ref::gamma;
using ref::Index;
using ref::Matrix;

inline Index kernel_rounding_depth(Index length, Index chunk_size, Index key_dim, Index value_dim) {
  return length + (length + chunk_size - 1) / chunk_size + key_dim + value_dim + chunk_size + 8;
}

struct KernelPrecision {
  double accumulation = 0;  // c: |accumulated − exact| <= c·magnitude
  double output = 0;        // u_out of the output dtype (0 for fp32/fp64 outputs and for states)
};

// accumulate_fp64: fp64 inputs (fp64 accumulation); tensor_cores: the bf16 hi/lo pass;
// output_roundoff: unit roundoff of the stored value's type (0 when it is the accumulator type).
inline KernelPrecision kernel_precision(Index depth, bool accumulate_fp64, bool tensor_cores, double output_roundoff) {
  KernelPrecision p;
  if (tensor_cores) {
    const double g = gamma(depth, std::ldexp(1.0, -23));
    p.accumulation = g + std::ldexp(1.0, -16) * (1 + g);
  } else {
    p.accumulation = gamma(depth, accumulate_fp64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24));
  }
  p.output = output_roundoff;
  return p;
}

// Elementwise bound: c·magnitude + u_out·(|exact| + c·magnitude), all in Exact.
inline Matrix<Exact> kernel_bound(const Matrix<Exact>& magnitude, const Matrix<Exact>& exact, const KernelPrecision& p) {
  const Exact c(p.accumulation), u(p.output);  // exact images of the two doubles
  const Matrix<Exact> accumulated = magnitude * c;
  return accumulated + (exact.cwiseAbs() + accumulated) * u;
}

}  // namespace deltaproof::verify::linear_attention
