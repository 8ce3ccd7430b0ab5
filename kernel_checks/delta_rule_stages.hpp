// DeltaNet / Gated DeltaNet kernels (cuda/delta_rule.h) against the oracle, stage by stage: the
// cases, the kernel runs with every intermediate read back exactly, and the stage checks with
// their derived bounds, each stage of each (batch, head, chunk) one verify::Comparison row. Shared by
// property_tests/delta_rule_gpu_test.cpp and `deltaproof verify --impl cuda --op delta|gated-delta`.
// Every stage is compared with the oracle's formula for that stage evaluated in 100-digit MPFR
// (High: exact ℚ would be as good but slower; the decays exp(G_i − G_j) of Gated DeltaNet are
// irrational anyway, and 1e-100 is far inside every bound below) on the
// exact values of that stage's inputs as the kernel saw them: the rounded inputs for A, the
// kernel's own A for T, its own T for W and U, its own W, U and S_[c] for V̄, and so on. Each
// stage then carries only its own rounding error, and its bound is derived from the operations
// the kernel performs (the design page's numerical policy):
//
//   Every stage is a straight-line program of +, −, × (the unit-diagonal inverse needs no
//   division), so |computed − exact| <= γ_m(u) · (the same program run on |inputs| with every
//   − turned into +), where m is the longest chain of roundings from an input to the result
//   (Higham, §3.1). Roundings of different sizes compose as Π(1 + γ_{m_i}(u_i)) − 1:
//     u_acc = 2⁻²³  fp32 accumulation (tensor cores may truncate instead of round: 2u),
//     u_op          rounding of an MMA operand to the input dtype (0 for fp32 inputs: plain FMA),
//     u_out         rounding of a stored result to the input dtype,
//     η             absolute error of an operand that lands among fp16 subnormals (2⁻²⁵),
//     ε_D           relative error of a kernel decay exp(Ĝ_i − Ĝ_j) (fp32 cumulative sums, exp2f of
//                   the exponent times log2 e, within 2 ulp), zero for DeltaNet where every exponent is 0.
//
// End to end across chunk sizes the kernel's output and final state are judged by verify::judge at the case's
// dtype and chunk size (judge_forward): the derived bounds of the WY chunkwise algorithm with its premises, so
// a case outside them is inconclusive, never a disagreement. Decode after prefill and the accuracy inputs
// compare with a float64 token recurrence normwise, thresholds in units of u_op (compare_end_to_end): a
// threshold relative to the result, which a state that the recurrence erases (DK = 1, β‖k‖² near 1) can
// shrink below the errors made before the erase.
#pragma once

#include "cuda/delta_rule.h"
#include "cuda/testing/delta_rule_stages.h"
#include "reference/scalar.hpp"
#include "verify/comparison.hpp"
#include "kernel_checks/device_tensors.hpp"

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace deltaproof::verify::delta_rule {

using cuda::DType;
using ref::Exact;
using ref::High;
using ref::Index;
using ref::Matrix;
using ref::Tensor4;
using ref::Vector;

struct DeltaCase {
  Index batch = 1, heads = 1, length = 1, key_dim = 1, value_dim = 1, chunk = 64;
  DType dtype = DType::bf16;
  bool with_initial_state = false, gated = false;
  std::uint64_t seed = 0;
  int key_shift = -1;       // keys n / 2^(3 + key_shift), |n| <= 8; −1: chosen so that ‖k‖² <= 1
  double gate_step = 1.0 / 16;  // log-gates g = −m · gate_step, m in 0..16 (a power of two: exact in fp32)
  bool zero_gates = false;      // g = 0 exactly (Gated DeltaNet must then equal DeltaNet bit for bit)
};

// Exact values of every input (already representable in the dtype, so rounding leaves them).
struct HostInputs {
  Tensor4<Exact> q, k, v, beta, log_gate, initial_state;  // log_gate [B, H, L, 1] in fp32 values
};

struct DeviceInputs {
  Uploaded q, k, v, beta, log_gate, initial_state;
};

// How a forward result was computed: the fallback scan (S rounded once to the dtype as an operand), the
// register scan (S as a hi + lo pair), or the tensor-core backward's state pass (W, U stored as pairs and fed
// as pairs with S and the update's V̄; the output, when the result has it, the training forward's: S_[c] rounded
// once, V̄ as its pair; the final state only when asked: rows the result lacks are left out). The exact
// oracle's intermediates pass every one of these bounds.
enum class ScanArithmetic { fallback_scan, register_scan, state_pass };

// What the forward writes, read back exactly.
struct ForwardResult {
  Tensor4<Exact> output, final_state, w, u, v_new, a, t, boundary;  // a, t [B, H, N·C, C]; boundary [B, H, N·DV, DK]
  ScanArithmetic arithmetic = ScanArithmetic::fallback_scan;
};

struct ForwardBuffers {
  DeviceTensor output, final_state, w, u, scores, v_new, a, t, boundary;
};

struct Units {
  double op, out, eta;
};

struct DoubleForward {
  std::vector<Matrix<double>> output, final_state;  // per head
};

struct DecodeResult {
  Tensor4<Exact> output, final_state;
};

constexpr double u_acc = 0x1p-23;

constexpr double u32 = 0x1p-24;

std::ostream& operator<<(std::ostream& os, const DeltaCase& c);
std::string describe(const DeltaCase& c);

// Entries drawn from c.seed: q, v, S_0 = n/4 (|n| <= 8); keys n/2^(3+shift); β = p/8; g = −m·gate_step.
HostInputs make_inputs(const DeltaCase& c);
// The accuracy inputs of the design page's targets: q ~ N(0,1)/√D, k = normalize(N(0,1)), v ~ N(0,1), β = sigmoid(N(0,1)),
// g = logsigmoid(N(0,1) + 3), each rounded to the dtype (g to fp32).
HostInputs design_inputs(const DeltaCase& c);

DeviceInputs upload_inputs(const DeltaCase& c, const HostInputs& in);
ForwardBuffers allocate_forward(const DeltaCase& c, bool intermediates);
// Every intermediate that `f` holds is given (the workspace holds none); strides packed.
cuda::delta_rule::ForwardStageParams forward_params(const DeltaCase& c, const DeviceInputs& d, ForwardBuffers& f);
ForwardResult read_back(const ForwardBuffers& f, bool intermediates);
ForwardResult run_forward(const DeltaCase& c, const HostInputs& in, bool intermediates = true);

Units units_of(DType d);
// Every stage of every head and chunk against the oracle within its bound: one row per
// (stage, batch, head, chunk), the stage name in `tensor` ("A", "T", "T16.0", "W", "U", "Vbar",
// "S_0", "S_next", "final_state", "O"); the worst entry's (row, column) within the chunk's block.
// The bounds follow the arithmetic the result came from (ForwardResult::arithmetic).
std::vector<Comparison> check_stages(const DeltaCase& c, const HostInputs& in, const ForwardResult& r);
// The exact (ℚ; 100-digit for gated) oracle's intermediates laid out as the kernel writes them.
ForwardResult oracle_as_kernel(const DeltaCase& c, const HostInputs& in);

DoubleForward double_oracle(const DeltaCase& c, const HostInputs& in);
double relative_l2_all(const std::vector<Matrix<double>>& candidate, const std::vector<Matrix<double>>& reference);
std::vector<Matrix<double>> heads_of(const ref::Tensor4<ref::Exact>& t);
// Token-wise normwise agreement of per-head matrices (verify/matrix_comparison.hpp's
// compare_rows_normwise with the case's head count): one rowwise row, the worst token.
Comparison compare_end_to_end(const std::string& tensor, const DeltaCase& c, const std::vector<Matrix<double>>& candidate,
                              const std::vector<Matrix<double>>& reference, double tau);
double end_to_end_tau(DType d);
// The kernel's output (in the input dtype) and final state (fp32) judged by verify::judge against the oracle on
// the same inputs: bounds derived for 16-bit (or fp32) operands, fp32 sums and an fp32 state in the WY chunkwise
// form at the case's chunk size (verify/kernel_model.hpp, proofs/kernel_error_bounds.md), three-valued.
Verdict judge_forward(const DeltaCase& c, const HostInputs& in, const Tensor4<Exact>& output, const Tensor4<Exact>& final_state);

DecodeResult run_decode(const DeltaCase& c, const HostInputs& in, const std::optional<ref::Tensor4<ref::Exact>>& state);
// "decode O" and "decode S" of every (batch, head) against the exact recurrence within its bound.
std::vector<Comparison> check_decode(const DeltaCase& c, const HostInputs& in, const DecodeResult& r,
                                     const std::optional<ref::Tensor4<ref::Exact>>& state);

}  // namespace deltaproof::verify::delta_rule
