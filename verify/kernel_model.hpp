// How far a kernel we did not write may be from the exact oracle: the model behind every bound of
// verify::judge. A black-box kernel's algorithm is unknown, so the bound is derived from a stated
// model of what such a kernel does, and calibrated on real kernels (ours and the public library's,
// bench/results/peers). The derivations, with the premises each bound rests on and what the judge
// says where a case breaks one (inconclusive, never disagree): proofs/kernel_error_bounds.md.
//
// 1. Inputs. The oracle runs on the exact values of the inputs the kernel was given (doubles hold
//    every bf16, fp16 and fp32 value exactly), so input rounding costs nothing.
// 2. Operands. Along any path from an input to an output the kernel rounds at most r intermediates
//    to its operand precision u_op (the input dtype, or TF32 for Triton's fp32 tl.dot): scale·q,
//    the state read as an operand, the score / WY / V̄ matrices fed back into the tensor cores.
//    r = 3, plus one for q/k normalised inside the kernel (the WY products: five, judge_wy.cpp).
//    TF32 is a truncation, not a rounding: Triton's tl.dot on fp32 passes the fp32 bits to the
//    tensor cores, which ignore the low 13 mantissa bits, so |δ| < 2⁻¹⁰, twice a rounding's 2⁻¹¹.
//    Measured: fla's chunk_linear_attn and the derivation's linear_chunk in fp32, L = 1, ht = kᵀv
//    exceeded a 2⁻¹¹ bound by 1.03–1.14× (the truncation's worst case is 4/3×), bench/results/peers.
//    Below a dtype's normal range a rounding is off by η absolutely (fp16 2⁻²⁵, bf16 2⁻¹³⁴).
// 3. Accumulation in fp32 (fp64 for fp64 inputs) over chains of at most m additions, sums on
//    tensor cores truncated rather than rounded (u_acc = 2⁻²³; 2⁻⁵² for fp64).
//    Per step: ε = (1 + u_op)^r (1 + γ_m(u_acc)) − 1 (Higham, Lemma 3.3 and Thm 3.1).
// 4. The running state between chunks is fp32 (fp64 for fp64 kernels) unless the kernel declares a
//    16-bit one (JudgeOptions::state_dtype), which is then rounded at every chunk boundary.
// 5. Output. A stored result is rounded once more to its own dtype: + u_out·(|y| + bound) + η.
//
// Linear attention: every output and gradient entry is a sum of products of inputs, so
//   |ŷ − y| ≤ ε·M + u_out·(|y| + ε·M),  M = the same form on |inputs| (elementwise, rigorous),
//   m = L + ⌈L/16⌉ + DK + DV + 64 + 8 (the longest chain for any chunk size up to 64).
// That is the gradients' bound. The forward's keeps the running state to its own arithmetic (the
// fp32-state contract, proofs/kernel_error_bounds.md §6): the state is a sum of products of inputs,
// which 16-bit operands multiply exactly, so no operand rounding reaches it (state_roundings: 0; one
// for keys normalised in the kernel, two for TF32's truncated k and v) and its error is
// ε_S·M, ε_S = (1 + u_op)^{r_S}(1 + γ_{m_S}(u_acc)) − 1, m_S = L + ⌈L/16⌉ + 8 (+ DK normalising).
// Operand roundings act on the values a chunk kernel rounds (scale·q, the state S_[c] it reads, the
// scores), i.e. on A = |q_t|(|S_w| + Σ_{s=w..t} |v_s||k_s|ᵀ)ᵀ over the window a chunk holding t can
// start in, not on M: o's bound is ε_o·A + (1 + ε_o)·ε_S·M, ε_o with the remaining chain
// m_o = DK + DV + 64. A declared 16-bit state adds its roundings at every chunk boundary.
// DeltaNet / Gated DeltaNet: the same form on |inputs| grows like 2^L (the erase term), so the
// bound is normwise, row by row (a token's vector; a state as one Frobenius row). Two algorithms
// are covered and the bound is the larger of theirs:
//  - the token recurrence (a kernel that steps token by token): the state's error is propagated
//    through S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ:
//      e_t = ρ_t e_{t−1} + ε·m_t,  ρ_t = α_t max(1, |1 − β_t‖k_t‖²|)  (the transition's 2-norm),
//      m_t = α_t‖S_{t−1}‖(1 + β_t‖k_t‖²) + β_t‖v_t‖‖k_t‖  (+ the decay's own error for gated),
//    and likewise backwards for the state cotangent G_t;
//  - the WY chunkwise algorithm with chunks of 16, 32 or 64 tokens from each sequence's start (or
//    the chunk size the kernel declares): within a chunk the rounding errors of V̄_i reach the state
//    as δV̄_i k_iᵀ, NOT through the transitions of the chunk's later tokens (the WY form realises
//    those by cancellation between terms, whose errors do not cancel), sized by the WY products
//    |T| (|βV| + |βγK| |S_[c]|ᵀ) and the fp32 solve's γ_D |T||I + A||T|; from the chunk's end on,
//    through the exact transitions (judge_wy.cpp).
// A chunk kernel touches, for token t, the states and writes of up to 64 neighbouring tokens, so
// local terms use window magnitudes over ±64 tokens: the largest state a chunk containing t can
// start from, plus the norms of the chunk's writes before t (reads after t, for the cotangent).
// Over long sequences rounding errors that are independent and mean-zero add in quadrature:
// Pinelis' inequality for sums of bounded independent vectors gives
//   ‖Σ δ_s‖ ≤ λ·sqrt(Σ ‖δ_s‖²) except with probability 2·exp(−λ²/2);  λ = 8 (≤ 2.6e-14 per bound).
// The propagated errors are carried as second-moment proxies of the independent entrywise
// roundings: key side C_t (DK × DK, exact through the transitions) for E_t x, and value side v_t
// (a diagonal, through ‖transition‖²) for E_tᵀ x (dq = S_tᵀ do, and the F_tᵀ u_t, E_{t−1}ᵀ G_t k_t
// terms of dk); where both apply, the smaller, and never below the WY form's.
// Premises a case can break (the row is then inconclusive where its error exceeds the bound): the
// fp32 solve of T a first-order perturbation (γ_D(u32)·‖|T||I + A|‖∞ ≤ 1/2), the WY products and the
// exact outputs within their dtype's range.
#pragma once

#include "verify/kernel_case.hpp"

#include <cmath>

namespace deltaproof::verify {

struct KernelModel {
  double u_op = 0;      // operand precision
  double u_acc = 0;     // accumulation (truncating tensor cores: 2u)
  int roundings = 3;    // r
  double lambda = 8.0;  // probabilistic multiplier for sums over tokens (delta family)
  static constexpr long window = 64;  // largest chunk a kernel may use

  // Operand roundings on the way to linear attention's running state (see above).
  int state_roundings = 0;

  // ε for chains of m additions.
  double step(long m) const { return step(m, roundings); }
  // The same with r operand roundings.
  double step(long m, int r) const {
    const double g = m * u_acc / (1 - m * u_acc);
    return std::pow(1 + u_op, r) * (1 + g) - 1;
  }
};

inline KernelModel kernel_model(DType input, bool tf32_operands, bool normalises_qk) {
  KernelModel model;
  const bool fp64 = input == DType::f64;
  model.u_op = (tf32_operands && input == DType::f32) ? 0x1p-10 : unit_roundoff(input);  // truncation
  model.u_acc = fp64 ? 0x1p-52 : 0x1p-23;
  model.roundings = 3 + (normalises_qk ? 1 : 0);
  // 16-bit products are exact in fp32; an fp32 or fp64 product's own rounding (u) fits in the chain's
  // u_acc = 2u; TF32 truncates both k and v.
  model.state_roundings = (tf32_operands && input == DType::f32 ? 2 : 0) + (normalises_qk ? 1 : 0);
  return model;
}

// The double oracle itself, in the same model: no operand rounding, u = 2⁻⁵³, exact ops counted.
// What it runs (verify/judge.cpp): linear attention's chunkwise form in 64-token matrix products,
// with its |inputs| magnitudes in the same loop (their own rounding, a factor ≤ 1/(1 − γ), carried);
// the delta family's token recurrence and reverse sweep, one pass per state-sized matrix per token,
// the bounds' covariances carried in the same passes. Its bound is γ_m times the kernel's
// magnitudes (linear) or its per-step error added to the kernel's in the same propagation (delta);
// its share of the kernel's bound is reported, and a unit whose share exceeds 1 % (fp64 kernels)
// takes its truth from reference/ in High instead.
inline KernelModel double_oracle_model() {
  KernelModel model;
  model.u_op = 0;
  model.u_acc = 0x1p-53;
  model.roundings = 0;
  return model;
}

}  // namespace deltaproof::verify
