// DeltaNet and Gated DeltaNet kernels: chunkwise WY forward and recurrent decode.
//
//   DeltaNet        S_t = S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,          o_t = S_t q_t
//   Gated DeltaNet  S_t = α_t S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,  α_t = exp(g_t)
//
// Host API only (no Eigen, no Boost). Layouts as DESIGN.md: q, k [B, H, L, DK]; v, o
// [B, H, L, DV]; β [B, H, L] in the input dtype; log-gates g [B, H, L] in fp32; states
// [B, H, DV, DK] in fp32. Chunk-level intermediates are [B, H, N, ...] with N = ceil(L / C).
//
// The chunkwise forward is two kernels:
//   1. wy_prepare (one block per chunk): A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ), its inverse T by
//      16×16 forward substitution merged 16→32→64, W = T diag(β γ) K and U = T diag(β) V.
//   2. chunk_scan (one block per head and DV slice, sequential over chunks): V̄ = U − W S_[c]ᵀ,
//      O = diag(γ) Q S_[c]ᵀ + (Q Kᵀ ⊙ Γ ⊙ M) V̄, S_[c+1] = γ_C S_[c] + (diag(γ_C/γ) V̄)ᵀ K.
//      Default (v4): raw mma.sync with the fp32 state slice in registers (see `pipeline`).
// For DeltaNet γ ≡ 1 (no log-gates), and the gated kernels with g = 0 compute bit for bit the
// same thing. γ_i = exp(G_i), G_i = Σ_{t ≤ i in the chunk} g_t; Γ_ij = exp(G_i − G_j) for i ≥ j.
#pragma once

#include "cuda/types.hpp"

#include <cuda_runtime.h>

#include <cstddef>

namespace deltaproof::cuda {

// Flat parameters of the chunkwise forward (flash-attention's params-struct style). Every
// tensor is contiguous in the layout given; optional pointers may be null.
struct DeltaRuleForwardParams {
  DType dtype = DType::bf16;  // of q, k, v, beta, output, w, u
  int batch = 0, heads = 0, length = 0, key_dim = 0, value_dim = 0;
  int chunk_size = 64;  // 16, 32 or 64

  const void* q = nullptr;     // [B, H, L, DK]
  const void* k = nullptr;     // [B, H, L, DK]
  const void* v = nullptr;     // [B, H, L, DV]
  const void* beta = nullptr;  // [B, H, L]
  const float* log_gate = nullptr;       // [B, H, L] fp32 g_t = ln α_t; null: DeltaNet (α ≡ 1)
  const float* initial_state = nullptr;  // [B, H, DV, DK] fp32; null: S_0 = 0

  void* output = nullptr;       // [B, H, L, DV] dtype
  float* final_state = nullptr;  // [B, H, DV, DK] fp32 (required)
  void* w = nullptr;             // [B, H, L, DK] dtype: W, written by stage 1, read by stage 2 (required)
  void* u = nullptr;             // [B, H, L, DV] dtype: U, likewise (required)

  // Optional intermediates for stage tests (null: not written).
  float* wy_system = nullptr;        // [B, H, N, C, C] fp32: A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ)
  float* wy_inverse = nullptr;       // [B, H, N, C, C] fp32: T = A⁻¹ (rows past a partial chunk: identity)
  float* v_new = nullptr;            // [B, H, L, DV] fp32: V̄ = U − W S_[c]ᵀ
  float* boundary_states = nullptr;  // [B, H, N, DV, DK] fp32: S_[c], the state before chunk c

  // Columns of S (value rows) per block of the state scan: 16, 32 or 64 (bf16/fp16); 0 picks
  // the default (64); halved while the scan's shared memory would not fit (DK = 256). fp32
  // inputs always use 16 (shared memory). A tuning knob only: each column's
  // arithmetic is the same whatever the slice, so results are equal bit for bit (tested).
  int value_slice = 0;
  // Scan version: 0 default (v4), 1 = v1 (direct loads), 2 = v2 (next chunk prefetched into
  // registers), 3 = v3 (v2 without the output, then a parallel output kernel over all chunks;
  // needs state_operands and v_new_operands), 4 = v4 (raw mma.sync, the state in registers, S fed
  // to the tensor cores as a hi + lo pair; always 64 value columns per block, value_slice is not
  // used). v2 and v3 need 16-bit inputs with DK, DV multiples of 8, else v1 runs; v4 also needs
  // DK <= 128 and 16-byte aligned q, k, w, u, else v2 (or v1) runs. v1, v2 and v3 give the same
  // bits (tested); v4 rounds S differently (hi + lo instead of one rounding), so its bits differ
  // from theirs, but are the same whatever the value slice and from run to run (tested).
  int pipeline = 0;
  void* state_operands = nullptr;  // [B, H, N, DV, DK] dtype: S_[c] rounded to the dtype (v3 workspace)
  void* v_new_operands = nullptr;  // [B, H, L, DV] dtype: V̄ rounded to the dtype (v3 workspace)

  cudaStream_t stream = nullptr;
};

// Runs both stages. Throws std::invalid_argument (naming the argument, nothing launched) on a
// bad argument and CudaError (with the kernel's name) when a launch fails.
void delta_rule_forward(const DeltaRuleForwardParams& params);

// The two stages one at a time (delta_rule_forward calls both), for per-stage timing.
void delta_rule_wy_prepare(const DeltaRuleForwardParams& params);
void delta_rule_chunk_scan(const DeltaRuleForwardParams& params);
void delta_rule_chunk_output(const DeltaRuleForwardParams& params);  // v3 only; nothing otherwise

// Recurrent decode: T new tokens from a given (or zero) state, the state kept in fp32.
struct DeltaRuleDecodeParams {
  DType dtype = DType::bf16;  // of q, k, v, beta, output
  int batch = 0, heads = 0, tokens = 0, key_dim = 0, value_dim = 0;

  const void* q = nullptr;     // [B, H, T, DK]
  const void* k = nullptr;     // [B, H, T, DK]
  const void* v = nullptr;     // [B, H, T, DV]
  const void* beta = nullptr;  // [B, H, T]
  const float* log_gate = nullptr;       // [B, H, T] fp32; null: DeltaNet
  const float* initial_state = nullptr;  // [B, H, DV, DK] fp32; null: zero; may equal final_state (in place)

  void* output = nullptr;        // [B, H, T, DV] dtype
  float* final_state = nullptr;  // [B, H, DV, DK] fp32

  cudaStream_t stream = nullptr;
};

void delta_rule_decode(const DeltaRuleDecodeParams& params);

// Number of chunks N = ceil(L / C).
inline int chunk_count(int length, int chunk_size) { return (length + chunk_size - 1) / chunk_size; }

}  // namespace deltaproof::cuda
