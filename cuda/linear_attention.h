// Additive linear attention on the GPU: host API (no Eigen, no Boost; nvcc compiles it).
//
//   S_t = S_{t-1} + v_t k_tᵀ,   o_t = S_t q_t,   S ∈ R^{DV×DK} (value-by-key)
//
// Three launchers, each validating every argument before anything runs:
//   decode    — the token recurrence over T new tokens, state in and out (fp32, fp64 for fp64)
//   forward   — chunkwise form (Equation 4 of the derivation: proofs/linear_attention.md), optionally exposing the boundary states S_[c]
//   backward  — dQ, dK, dV, dS_0 from dO and an optional incoming dS_L
// Tensors are [B, H, rows, cols] with the column stride 1 and explicit batch/head/row strides
// in elements (cuda/layout.hpp's Strides, in any order that keeps entries apart; `contiguous(...)`
// fills them for a packed tensor). Inputs, outputs and gradients share one dtype; states are always in
// the accumulation type (fp64 for fp64 inputs, else fp32). Bad arguments throw std::invalid_argument
// naming the argument (nothing is launched, no output touched); CUDA failures throw cuda::CudaError
// carrying the kernel's name. The same API shape as delta_rule.h.
//
// Memory: no output may share a byte with any other tensor, input or output (validate compares the
// address ranges the strides imply and names both tensors); the one exception is decode's state
// updated in place, initial_state == final_state with equal strides.
//
// NaN and ±Inf inputs are computed with, not refused (IEEE arithmetic, no check reads them), and in
// the forward and decode they go where the recurrence carries them (bad_inputs_gpu_test.cpp):
//   * a NaN or Inf in q_t reaches o_t alone: every entry of o_t is then NaN or ±Inf, every other output
//     and the states are bit for bit those without it;
//   * a NaN in k_t[d] makes column d of every later state NaN, hence every entry of o_s for s ≥ t;
//     a NaN in v_t[r] makes row r of every later state NaN and column r of o_s for s ≥ t, every
//     other entry bit for bit unchanged;
//   * outputs of tokens before t's 16-token tile are bit for bit unchanged; those between the tile's
//     start and t may be NaN too (the tensor-core pass multiplies masked-out zeros by the tile's
//     values, 0 · NaN = NaN). Decode runs token by token: o_s for s < t is unchanged.
// The backward propagates them by the same arithmetic; which gradients they reach is not stated.
//
// Range: the state is a sum over all tokens with no decay, so it grows without bound (≈ √L for
// zero-mean inputs, ∝ L for same-signed ones). States stay fp32; an output entry is rounded once to
// the dtype, and where its exact value passes the dtype's range that rounding gives ±Inf (IEEE
// overflow) rather than a finite wrong number — for fp16, |o| ≥ 65520
// (measured on the H200 by LongSequenceGpu.LinearAttentionFp16OverflowsWhereTheExactOutputLeavesTheRange:
// o_t = t + 1 is exact up to t + 1 = 65504 and Inf from 65520 on, 0 NaN). Since
// |o_t| ≤ Σ_{s ≤ t} |q_t·k_s| |v_s|_∞, unit-norm q, k and |v| ≤ 1 cannot overflow fp16 before
// L = 65520; bf16's range (3.4e38) is not reached in practice. Check outputs for Inf when fp16 runs
// long sequences of same-signed features.
#pragma once

#include "cuda/check.hpp"
#include "cuda/layout.hpp"
#include "cuda/types.hpp"

#include <cstdint>

namespace deltaproof::cuda::linear_attention {

using cuda::contiguous;
using cuda::max_head_dim;
using cuda::Strides;
using cuda::supported_chunk_sizes;

// The dtype of states for inputs of `dtype`: fp64 for fp64, fp32 otherwise.
inline DType state_dtype(DType dtype) { return accumulator_dtype(dtype); }

struct ForwardParams {
  DType dtype = DType::bf16;  // q, k, v, output
  int batch = 0, heads = 0, length = 0, key_dim = 0, value_dim = 0, chunk_size = 64;
  const void* q = nullptr;  // [B, H, L, DK]
  const void* k = nullptr;  // [B, H, L, DK]
  const void* v = nullptr;  // [B, H, L, DV]
  void* output = nullptr;   // [B, H, L, DV]
  Strides q_strides, k_strides, v_strides, output_strides;
  const void* initial_state = nullptr;  // [B, H, DV, DK] state dtype; null means S_0 = 0
  void* final_state = nullptr;          // [B, H, DV, DK] state dtype; null: not written
  Strides initial_state_strides, final_state_strides;
  // [B, H, N, DV, DK] packed, state dtype, N = ceil(L / C): S_[c] before chunk c. Null: not written
  // (it exists for tests; it costs a write of every state).
  void* boundary_states = nullptr;
  // Each sequence walked as `segments` runs of ceil(L / segments) tokens at once (docs/context_parallel.md):
  // the runs' sums Σ v kᵀ, their exclusive scan from S_0, then each run from its incoming state. 0 chooses
  // from B·H, L and the GPU's SM count (one run unless the sequences leave half the GPU idle); 1 is one
  // walk per sequence. Needs boundary_states null (0 then means 1); B·H·segments ≤ 65535. The runs'
  // states (2·B·H·segments·DV·DK of the state dtype) come from the stream's memory pool.
  int segments = 0;
};

struct BackwardParams {
  DType dtype = DType::bf16;  // q, k, v, d_output, dq, dk, dv
  int batch = 0, heads = 0, length = 0, key_dim = 0, value_dim = 0, chunk_size = 64;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* d_output = nullptr;  // [B, H, L, DV]
  void* dq = nullptr;              // [B, H, L, DK]
  void* dk = nullptr;              // [B, H, L, DK]
  void* dv = nullptr;              // [B, H, L, DV]
  Strides q_strides, k_strides, v_strides, d_output_strides, dq_strides, dk_strides, dv_strides;
  const void* initial_state = nullptr;    // [B, H, DV, DK]; null means S_0 = 0
  const void* d_final_state = nullptr;    // [B, H, DV, DK]; null means dS_L = 0
  void* d_initial_state = nullptr;        // [B, H, DV, DK]; null: not written
  Strides initial_state_strides, d_final_state_strides, d_initial_state_strides;
  // As ForwardParams::segments, for each of the three passes (the dK and dV passes, which walk from the end,
  // scan the runs' sums from the end; on tensor cores they then run as two scans, not one fused scan).
  int segments = 0;
};

struct DecodeParams {
  DType dtype = DType::bf16;  // q, k, v, output
  int batch = 0, heads = 0, tokens = 1, key_dim = 0, value_dim = 0;
  const void* q = nullptr;  // [B, H, T, DK]
  const void* k = nullptr;  // [B, H, T, DK]
  const void* v = nullptr;  // [B, H, T, DV]
  void* output = nullptr;   // [B, H, T, DV]
  Strides q_strides, k_strides, v_strides, output_strides;
  const void* initial_state = nullptr;  // [B, H, DV, DK]; null means S_0 = 0; may equal final_state (in place)
  void* final_state = nullptr;          // [B, H, DV, DK], required
  Strides initial_state_strides, final_state_strides;
};

// Whether the chunkwise passes of these inputs run on tensor cores (bf16 with both head dims
// <= 128) rather than the generic CUDA-core kernel; tests choose their rounding bound by it.
bool uses_tensor_cores(DType dtype, int key_dim, int value_dim);

// Packed strides for every tensor of a params struct (the common case).
void set_contiguous_strides(ForwardParams& p);
void set_contiguous_strides(BackwardParams& p);
void set_contiguous_strides(DecodeParams& p);

// Validation alone (what the launchers call first); throws std::invalid_argument.
void validate(const ForwardParams& p);
void validate(const BackwardParams& p);
void validate(const DecodeParams& p);

void forward(const ForwardParams& p, cudaStream_t stream = nullptr);
void backward(const BackwardParams& p, cudaStream_t stream = nullptr);
void decode(const DecodeParams& p, cudaStream_t stream = nullptr);

}  // namespace deltaproof::cuda::linear_attention
