// Linear attention kernels (cuda/linear_attention.h) against the exact oracle
// (reference/linear_attention.hpp), on the exact values of the kernels' rounded inputs: the cases,
// the kernel runs, the bound chosen for each tensor (kernel_checks/linear_attention_kernel_bound.hpp) and
// the comparisons, each one verify::Comparison row per (tensor, batch, head). Written once for
// property_tests/linear_attention_gpu_test.cpp and `deltaproof verify|gradcheck --impl cuda`.
//
// The bound is elementwise: a row disagrees when any one entry of that head exceeds it; the row
// carries the worst entry, its error and bound, and max and RMS error over the head.
#pragma once

#include "cuda/linear_attention.h"
#include "reference/linear_attention.hpp"
#include "verify/comparison.hpp"
#include "kernel_checks/device_tensors.hpp"
#include "kernel_checks/linear_attention_kernel_bound.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace deltaproof::verify::linear_attention {

using cuda::DType;
using ref::Tensor4;

// A problem for deltaproof's own CUDA kernels: [B, H, L, DK | DV], chunk size, S_0, input dtype.
struct CudaShape {
  Index batch = 1, heads = 1, length = 1, key_dim = 1, value_dim = 1, chunk_size = 16;
  bool with_initial_state = false;
  DType dtype = DType::f32;
};
std::ostream& operator<<(std::ostream& os, const CudaShape& s);
std::string describe(const CudaShape& s);

// Inputs before rounding: q, k, v, S_0, and the cotangents dO, dS_L of the backward (S_0 and dS_L
// present together).
struct CudaCase {
  CudaShape shape;
  ref::linear_attention::BatchInputs<Exact> inputs;
  ref::linear_attention::BatchCotangents<Exact> cotangents;
};
std::ostream& operator<<(std::ostream& os, const CudaCase& c);

// Entries n/64 with |n| <= 512 drawn from `seed`: up to 10 significant bits, so bf16 rounds some of
// them (fp16, fp32, fp64 hold them exactly) and the exact values of the rounded inputs differ from
// the draw.
CudaCase make_case(const CudaShape& s, std::uint64_t seed);

// Device copies of a case rounded to its dtype (S_0 and dS_L to the kernels' state dtype), and the
// exact values of those rounded numbers: the oracle's inputs.
struct DeviceInputs {
  Uploaded q, k, v, d_output;
  std::optional<Uploaded> initial_state, d_final_state;
  ref::linear_attention::BatchInputs<Exact> exact;
  ref::linear_attention::BatchCotangents<Exact> exact_cot;
};
DeviceInputs upload_case(const CudaCase& c);

// The entry points a check runs: the product's by default; the planted-bug tests pass kernels broken
// on purpose (cuda/testing/linear_attention_planted.h).
struct Kernels {
  std::function<void(const cuda::linear_attention::ForwardParams&)> forward = [](const auto& p) {
    cuda::linear_attention::forward(p);
  };
  std::function<void(const cuda::linear_attention::BackwardParams&)> backward = [](const auto& p) {
    cuda::linear_attention::backward(p);
  };
  std::function<void(const cuda::linear_attention::DecodeParams&)> decode = [](const auto& p) {
    cuda::linear_attention::decode(p);
  };
};

struct KernelForward {
  Tensor4<Exact> output, final_state, boundary_states;  // boundary: [B, H, N·DV, DK]
};
// The chunkwise forward at `chunk_size` (boundary states read back when asked).
KernelForward run_forward(const CudaShape& s, const DeviceInputs& in, Index chunk_size, bool with_boundary = true,
                          const Kernels& kernels = {});
// The chunkwise backward for the case's cotangents: dq, dk, dv, dS_0.
ref::linear_attention::BatchGradients<Exact> run_backward(const CudaShape& s, const DeviceInputs& in, const Kernels& kernels = {});
// Decode of the given tokens from a device state (null: S_0 = 0), written in place to `state`.
Tensor4<Exact> run_decode(DType dtype, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                          const void* initial_state, DeviceTensor& state, const Kernels& kernels = {});

// The bound's constants for this shape: outputs and gradients (is_state false, rounded once more to
// a bf16/fp16 output) or states (kept in the accumulation type). depth_length / depth_chunk replace
// L and C in the rounding depth where they are given (decode: C = 1).
KernelPrecision precision_of(const CudaShape& s, bool is_state, Index depth_length = -1, Index depth_chunk = -1);
// kernel_bound(magnitude, exact, p), times `copies` (two runs each within it of the same value).
Matrix<Exact> bound_of(const Matrix<Exact>& magnitude, const Matrix<Exact>& exact, const KernelPrecision& p, int copies = 1);

// Chunkwise forward vs the oracle: rows "output", "final state" per head, and (with_boundary)
// "boundary state" per head and chunk c (S_[c]; the final-state magnitude bounds every S_[c]).
std::vector<Comparison> check_forward(const CudaCase& c, bool with_boundary = true, const Kernels& kernels = {});
// Chunkwise backward vs the oracle's on the same inputs: rows "dq", "dk", "dv", "dS_0" per head.
std::vector<Comparison> check_backward(const CudaCase& c, const Kernels& kernels = {});
// The verdicts of check_forward and check_backward on kernel results obtained elsewhere (the CPU emulation):
// the exact inputs are the exact values of the kernels' rounded inputs.
std::vector<Comparison> judge_forward(const CudaShape& s, const ref::linear_attention::BatchInputs<Exact>& exact_inputs,
                                      const KernelForward& kernel, bool with_boundary);
std::vector<Comparison> judge_backward(const CudaShape& s, const ref::linear_attention::BatchInputs<Exact>& exact_inputs,
                                       const ref::linear_attention::BatchCotangents<Exact>& exact_cotangents,
                                       const ref::linear_attention::BatchGradients<Exact>& gradients);
// C = 16, 32, 64 agree with each other: |o_C − o_C'| <= bound_C + bound_C' (both within their bound
// of the same exact value). Rows "output C=x vs C=y", "final state C=x vs C=y" per head.
std::vector<Comparison> check_chunk_sizes_agree(const CudaCase& c);
// Decode of all L tokens from S_0 (or zero) vs the token recurrence: "decode output", "decode final state".
std::vector<Comparison> check_decode(const CudaCase& c, const Kernels& kernels = {});
// check_decode's verdict on results already in hand (the CPU emulation's): the decode of all L tokens
// of `exact_inputs` (the exact values of the rounded inputs, S_0 among them when given).
std::vector<Comparison> judge_decode(const CudaShape& s, const ref::linear_attention::BatchInputs<Exact>& exact_inputs,
                                     const Tensor4<Exact>& output, const Tensor4<Exact>& final_state);
// Chunkwise prefill of the first `prefill` tokens, then decode of the rest in place on its state,
// against one chunkwise pass over all L tokens, within twice the bound (the decode's chains continue
// the prefill's and stay within depth m(L, C)).
std::vector<Comparison> check_decode_after_prefill(const CudaCase& c, Index prefill);

// Directional central difference of the fp64 kernels' own forward against their fp64 backward, along
// `direction` (same shapes as the inputs; zero tensors leave that input fixed). The pairing
// P(x) = <dO, o(x)> + <dS_L, S_L(x)> is a cubic in t along x + t·u, so with h = 2⁻⁶
//   (P(x+hu) − P(x−hu)) / 2h = P'(0) + h²/6·P'''(0)
// exactly; that truncation is computed over ℚ with the oracle. The kernel may differ from exact
// arithmetic by its bound at each point (over 2h) and in each gradient entry (times |u|).
struct DirectionalCheck {
  double central_difference = 0, backward = 0, truncation = 0;
  Comparison row;  // error = |central difference − backward|, bound = what the roundings allow
};
DirectionalCheck check_directional_derivative(const CudaCase& c, const ref::linear_attention::BatchInputs<Exact>& direction,
                                              const std::string& name = "directional derivative",
                                              const Kernels& kernels = {});

}  // namespace deltaproof::verify::linear_attention
