// DeltaNet / Gated DeltaNet backward kernel (cuda/delta_rule.h: delta_rule_backward) against the
// oracle, stage by stage, in the pattern of kernel_checks/delta_rule_stages.hpp: each stage of each
// (batch, head, chunk) is recomputed by the oracle (exact ℚ for DeltaNet, 100-digit MPFR for Gated
// DeltaNet, whose decays exp(G_e − G_s) are irrational) from the exact values the kernel's loop for
// that stage read — the rounded inputs, the kernel's own gate sums Ĝ, its own T̂, Ŝ_[c], V̄̂,
// Ĝ_[c+1], dŴ, Ê — and compared within a bound derived from that loop (the design page's numerical policy).
//
// The bound of a stage: every kernel loop is a straight-line program of +, −, × (and exp of a gate
// difference), so |computed − exact| <= ρ · (the same program on |inputs| with every − turned into
// +), ρ = (1 + γ_m(u))(1 + ε_D)^k − 1 (Higham §3.1), where
//   u    2⁻²⁴ (fp32 FMA, round to nearest; no operand is rounded to the input dtype) or 2⁻⁵³ (fp64),
//   m    the longest chain of roundings from an input of the stage to the result, counted from the
//        kernel's loop shapes (cuda/delta_rule_backward.cu's header): an m-term sequential FMA sum
//        is m roundings, a warp's row · row dot product of length D is ⌈D/32⌉ + 5,
//   ε_D  relative error of one kernel decay exp(Ĝ_e − Ĝ_s): the subtraction rounded (relative u of
//        |Ĝ_e − Ĝ_s|, so a factor e^{uΔ}) times expf's 2 ulp (exp's 1 ulp for fp64); 0 for DeltaNet,
//        where every decay is exp(0) = 1 exactly, and k the most decays in one monomial (0 or 1).
// Gradients stored in the input dtype add u_out|x| + η (η: half the dtype's smallest subnormal);
// every bound carries the forward stages' underflow floor 2⁻¹¹⁰ · max(magnitude) (2⁻¹⁰⁰⁰ for fp64).
// Rows are named by stage: G, A, T, P, W, U, S_0, Vbar, S_next, final_state, O (forward recompute),
// dS_L, dVbar, dS_prev, dS_0, dW, dA, dq, dk, dv, dbeta, dG, dg (the last two gated only).
//
// The reference (reference/delta_rule.hpp, gated_delta_rule.hpp) exposes the chunkwise backward's
// gradients but not its intermediates (dV̄, G_[c], dW, E = dA, dG): those are computed here from
// the same equations (its chunk_backward), and the chain is checked == (ℚ) against its
// chunkwise_backward's gradients by the device-free tests.
#pragma once

#include "cuda/delta_rule.h"
#include "cuda/testing/delta_rule_stages.h"
#include "reference/scalar.hpp"
#include "verify/comparison.hpp"
#include "kernel_checks/delta_rule_stages.hpp"
#include "kernel_checks/device_tensors.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deltaproof::verify::delta_rule {

// The accumulation (and state, log-gate) dtype of the backward: fp64 for fp64 inputs, else fp32.
using cuda::accumulator_dtype;

// The cotangents of L = <dO, O> + <dS_L, S_L>.
struct Cotangents {
  Tensor4<Exact> d_output;                      // [B, H, L, DV], exact in every dtype
  std::optional<Tensor4<Exact>> d_final_state;  // [B, H, DV, DK]; absent: dS_L = 0
};
// dO and dS_L = n/4 (|n| <= 8) drawn from c.seed + 1.
Cotangents make_cotangents(const DeltaCase& c, bool with_final_state_gradient = true);
// S_0 and dS_L made non-negative and dO zero: with zero gates <dS_L, S_0> then enters the last token's dG whole
// (drawn signs let it cancel far below its own magnitude, where a lost part of its reduction hides).
void make_state_inner_product_dominant(HostInputs& in, Cotangents& cot);

// What the backward writes, read back exactly. Per-token vectors are [B, H, L, 1]; C×C blocks
// [B, H, N·C, C]; states [B, H, N·DV, DK]. A tensor with no entries was not asked for.
struct BackwardResult {
  Tensor4<Exact> dq, dk, dv, d_beta, d_log_gate, d_initial_state;  // d_log_gate: gated only
  Tensor4<Exact> gate_sums, a, t, scores, w, u, boundary, v_new, d_v_new, state_gradients, d_w, e, d_gate_sums;
  // The forward recomputed by stage 2; the tensor-core path recomputes no output, and its stage checks take the
  // training forward's (formed from the same S_[c] and V̄) where a caller attaches it.
  Tensor4<Exact> output, final_state;
  bool tensor_cores = false;  // run by the tensor-core backward (its own stage bounds; no scores)
};

// Device inputs of the backward: q, k, v, β, dO in the dtype; g, S_0, dS_L in the accumulation dtype.
struct BackwardDeviceInputs {
  Uploaded q, k, v, beta, log_gate, initial_state, d_output, d_final_state;
};
struct BackwardBuffers {
  DeviceTensor dq, dk, dv, d_beta, d_log_gate, d_initial_state;
  DeviceTensor gate_sums, a, t, scores, w, u, boundary, v_new, d_v_new, state_gradients, d_w, e, d_gate_sums;
  DeviceTensor output, final_state;
  DeviceBuffer workspace;
};
BackwardDeviceInputs upload_backward_inputs(const DeltaCase& c, const HostInputs& in, const Cotangents& cot);
// intermediates: every intermediate in its own buffer (else the workspace holds them); forward:
// also the recomputed output and final state.
BackwardBuffers allocate_backward(const DeltaCase& c, bool intermediates, bool forward = false);
// The intermediates `f` holds are given, the others in f.workspace (grown to fit); strides packed.
cuda::delta_rule::BackwardStageParams backward_params(const DeltaCase& c, const BackwardDeviceInputs& d, BackwardBuffers& f);
BackwardResult read_back(const DeltaCase& c, const BackwardBuffers& f);
BackwardResult run_backward(const DeltaCase& c, const HostInputs& in, const Cotangents& cot, bool intermediates = true);
// The backward's own forward (stages 1 and 2): output and final_state.
BackwardResult run_backward_forward(const DeltaCase& c, const HostInputs& in);

// Every backward stage of every (batch, head, chunk) within its bound: one row per (stage, batch,
// head, chunk); stages whose tensors the result lacks are left out.
std::vector<Comparison> check_backward_stages(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                              const BackwardResult& r);
// The exact (ℚ; 100-digit for gated) oracle's backward, intermediates and all, laid out as the
// kernel writes them (no device needed): the stage checks must accept it, and reject it once a
// planted bug changes what it holds.
BackwardResult oracle_backward_as_kernel(const DeltaCase& c, const HostInputs& in, const Cotangents& cot);

// The reference's chunkwise backward (reference/: ℚ for DeltaNet; the 100-digit log-gate path for
// Gated DeltaNet, carried over to ℚ): dq, dk, dv, d_beta, d_log_gate, d_initial_state.
BackwardResult reference_gradients(const DeltaCase& c, const HostInputs& in, const Cotangents& cot);

// float64 token-recurrence gradients (the accuracy baseline of the design page), per head, with `magnitude`: the same
// recurrence on |inputs| with every − turned into + (each gradient's sum of the absolute values of its terms,
// up to float64 rounding), the scale of what accumulation can leave where a gradient cancels.
struct GradientTensors {
  std::vector<Matrix<double>> dq, dk, dv, d_beta, d_log_gate, d_initial_state;
};
struct DoubleGradients : GradientTensors {
  GradientTensors magnitude;  // empty where the gradients came from a kernel
};
DoubleGradients double_gradients(const DeltaCase& c, const HostInputs& in, const Cotangents& cot);
// Token-wise normwise agreement of every gradient with `reference` (rows "dq", "dk", "dv", "dbeta",
// "dg", "dS_0"), threshold tau in units of the dtype's precision as compare_end_to_end's; given double_gradients'
// `magnitudes`, plus what accumulation alone can leave: (L + C + DK + DV + 16) u_acc times the token's
// magnitude norm plus the head's RMS of it.
std::vector<Comparison> compare_gradients_end_to_end(const DeltaCase& c, const BackwardResult& r,
                                                     const GradientTensors& reference, double tau,
                                                     const GradientTensors* magnitudes = nullptr);
double gradient_tau(DType d);
// Relative L2 of each gradient against `reference` ("dq", "dk", "dv", "dbeta", "dg", "dS_0").
std::vector<std::pair<std::string, double>> gradient_relative_l2(const DeltaCase& c, const BackwardResult& r,
                                                                 const GradientTensors& reference);

// The fp64 kernels' directional derivative check along u (one input tensor, the others fixed):
// central difference of the backward's own fp64 forward, (P̂(x+hu) − P̂(x−hu))/2h with h = 2⁻⁶ and
// P = <dO, O> + <dS_L, S_L>, against <∇̂, u> from the fp64 backward. The exact gap between the two,
// (P(x+hu) − P(x−hu))/2h − <∇P, u> (truncation, nonzero: P is not quadratic), is computed by the
// oracle; what remains may only be the kernels' rounding, allowed as a stated 2⁻³⁶ relative (2¹⁷
// u64: the forward and backward chains are not bounded end to end, as compare_end_to_end's
// thresholds are not) of the scales Σ|dO||O| + Σ|dS_L||S_L| (over 2h) and Σ|u||∇|.
// `tensor`: "q", "k", "v", "beta", "g" (gated), "S_0" (with_initial_state).
struct DirectionalCheck {
  double central_difference = 0, backward = 0, exact_gap = 0;
  Comparison row;  // error = |(central difference − backward) − exact gap|, bound = the allowance
};
DirectionalCheck check_directional_derivative(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                              const std::string& tensor, std::uint64_t direction_seed);
// The same check on any runner of the kernels (the device's above; the CPU emulation's in its test):
// `forward` returns output and final_state, `backward` the gradients, both for fp64 cases.
using ForwardRunner = std::function<BackwardResult(const DeltaCase&, const HostInputs&)>;
using BackwardRunner = std::function<BackwardResult(const DeltaCase&, const HostInputs&, const Cotangents&)>;
DirectionalCheck check_directional_derivative(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                              const std::string& tensor, std::uint64_t direction_seed,
                                              const ForwardRunner& forward, const BackwardRunner& backward);

}  // namespace deltaproof::verify::delta_rule
