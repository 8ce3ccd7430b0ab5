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
//      The fast path (16-bit inputs, DK ≤ 128, DK and DV multiples of 8, 16-byte aligned rows) keeps the
//      fp32 state slice in registers on raw mma.sync; every other input takes the one fallback, the state
//      in shared memory (cuda/delta_rule_forward_kernels.cuh).
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

  // Optional: the residuals of W's and U's roundings, stored in the dtype (x = w + w_lo to about 16 bits
  // for bf16; 16-bit inputs only). The backward's own forward asks for them.
  void* w_lo = nullptr;  // [B, H, L, DK] dtype
  void* u_lo = nullptr;  // [B, H, L, DV] dtype

  // Optional intermediates for stage tests (null: not written).
  float* wy_system = nullptr;        // [B, H, N, C, C] fp32: A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ)
  float* wy_inverse = nullptr;       // [B, H, N, C, C] fp32: T = A⁻¹ (rows past a partial chunk: identity)
  float* v_new = nullptr;            // [B, H, L, DV] fp32: V̄ = U − W S_[c]ᵀ
  float* boundary_states = nullptr;  // [B, H, N, DV, DK] fp32: S_[c], the state before chunk c

  cudaStream_t stream = nullptr;
};

// Runs both stages. Throws std::invalid_argument (naming the argument, nothing launched) on a
// bad argument and CudaError (with the kernel's name) when a launch fails.
void delta_rule_forward(const DeltaRuleForwardParams& params);

// The two stages one at a time (delta_rule_forward calls both), for per-stage timing.
void delta_rule_wy_prepare(const DeltaRuleForwardParams& params);
void delta_rule_chunk_scan(const DeltaRuleForwardParams& params);

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

// ---------------------------------------------------------------------------------------
// Backward of the chunkwise form (cuda/delta_rule_backward.cu; design and status in NOTES_delta.md).
//
// Gradients of L = <dO, O> + <dS_L, S_L> with respect to q, k, v, β, g and S_0. Four kernels, each
// a straight transcription of reference/{delta_rule,gated_delta_rule}.hpp's chunk_backward:
//   1. prepare (one block per chunk): G_i = Σ_{t ≤ i in the chunk} g_t, A, T = A⁻¹ (forward
//      substitution), W = T diag(βγ) K, U = T diag(β) V, P = Q Kᵀ ⊙ D ⊙ M.
//   2. state scan (one block per head and 16 value rows, chunks in order): S_[c], V̄ = U − W S_[c]ᵀ.
//   3. gradient scan (the same blocks, chunks in reverse): G_[c+1] = dL/dS_[c+1] from G_[N] = dS_L,
//      dV̄ = Pᵀ dO + diag(λ) K G_[c+1]ᵀ, G_[c] = γ_C G_[c+1] + dOᵀ diag(γ) Q − dV̄ᵀ W.
//   4. chunk gradients (one block per chunk): dW = −dV̄ S_[c], E = strictly_lower(−Tᵀ dT Tᵀ) with
//      dT = dV̄ (diag(β) V)ᵀ + dW (diag(βγ) K)ᵀ, then dq, dk, dv, dβ, the gate-sum gradients dG_i
//      and dg_j = Σ_{i ≥ j in the chunk} dG_i.
// Every product is a plain FMA loop in the accumulation type (fp32, or fp64 for fp64 inputs): no
// operand is rounded to the input dtype, only the gradients dq, dk, dv, dβ when they are stored.
// Every sum runs in a fixed order (no atomics): repeated runs give the same bits. g = 0 runs the
// same arithmetic as DeltaNet (every decay is exp(0) = 1), so its gradients are DeltaNet's bit for bit.
//
// "acc" below is the accumulation type: fp64 for dtype fp64, fp32 otherwise.
struct DeltaRuleBackwardParams {
  DType dtype = DType::bf16;  // of q, k, v, beta, d_output and of dq, dk, dv, d_beta (fp64 allowed)
  int batch = 0, heads = 0, length = 0, key_dim = 0, value_dim = 0;
  int chunk_size = 64;  // 16, 32 or 64

  const void* q = nullptr;              // [B, H, L, DK] dtype
  const void* k = nullptr;              // [B, H, L, DK] dtype
  const void* v = nullptr;              // [B, H, L, DV] dtype
  const void* beta = nullptr;           // [B, H, L] dtype
  const void* log_gate = nullptr;       // [B, H, L] acc: g_t = ln α_t; null: DeltaNet
  const void* initial_state = nullptr;  // [B, H, DV, DK] acc; null: S_0 = 0
  const void* d_output = nullptr;       // [B, H, L, DV] dtype: dO
  const void* d_final_state = nullptr;  // [B, H, DV, DK] acc: dS_L; null: dS_L = 0

  void* dq = nullptr;               // [B, H, L, DK] dtype
  void* dk = nullptr;               // [B, H, L, DK] dtype
  void* dv = nullptr;               // [B, H, L, DV] dtype
  void* d_beta = nullptr;           // [B, H, L] dtype
  void* d_log_gate = nullptr;       // [B, H, L] acc: dg; required with log_gate, null without
  void* d_initial_state = nullptr;  // [B, H, DV, DK] acc: dS_0; null: not written

  // Workspace of delta_rule_backward_workspace_bytes(params) bytes (256-byte aligned), holding the
  // intermediates below that are left null; may be null when that size is 0.
  void* workspace = nullptr;

  // Intermediates, all acc, N = ceil(L / C), C×C blocks with the identity (A, T) or zeros past a
  // partial chunk. Given: written there (for stage tests); null: kept in the workspace.
  void* gate_sums = nullptr;        // [B, H, L]: G_i = Σ_{t ≤ i in its chunk} g_t (zero for DeltaNet)
  void* wy_inverse = nullptr;       // [B, H, N, C, C]: T = A⁻¹
  void* w = nullptr;                // [B, H, L, DK]: W = T diag(β γ) K
  void* u = nullptr;                // [B, H, L, DV]: U = T diag(β) V
  void* scores = nullptr;           // [B, H, N, C, C]: P = Q Kᵀ ⊙ D on and below the diagonal, 0 above
  void* boundary_states = nullptr;  // [B, H, N, DV, DK]: S_[c], the state before chunk c
  void* v_new = nullptr;            // [B, H, L, DV]: V̄ = U − W S_[c]ᵀ
  void* d_v_new = nullptr;          // [B, H, L, DV]: dV̄ (= dU)
  void* state_gradients = nullptr;  // [B, H, N, DV, DK]: G_[c+1] = dL/dS_[c+1], entry N−1 is dS_L
  void* d_w = nullptr;              // [B, H, L, DK]: dW = −dV̄ S_[c]
  // Written only when given (nothing later reads them).
  void* wy_system = nullptr;           // [B, H, N, C, C]: A = I + strictly_lower(diag(β) (K Kᵀ ⊙ D))
  void* wy_system_adjoint = nullptr;   // [B, H, N, C, C]: E = dL/dA = strictly_lower(−Tᵀ dT Tᵀ)
  void* gate_sum_gradients = nullptr;  // [B, H, L]: dL/dG_i
  // The forward recomputed by stage 2 (null: not written): with fp64 inputs an fp64 forward.
  void* output = nullptr;       // [B, H, L, DV] dtype: O = diag(γ) Q S_[c]ᵀ + P V̄
  void* final_state = nullptr;  // [B, H, DV, DK] acc: S_L

  cudaStream_t stream = nullptr;
};

// Bytes of workspace for these params (the intermediates left null). Throws std::invalid_argument
// on bad sizes, like validate.
std::size_t delta_rule_backward_workspace_bytes(const DeltaRuleBackwardParams& params);

// Every argument, before any launch: sizes, chunk size, dtype and missing pointers first (no CUDA
// call, so these fail the same with or without a device), then device pointers and alignment.
// Throws std::invalid_argument naming the argument.
void validate(const DeltaRuleBackwardParams& params);

// All four stages. CudaError (with the kernel's name) when a launch fails.
void delta_rule_backward(const DeltaRuleBackwardParams& params);

// The stages one at a time (delta_rule_backward runs 1–4), for per-stage timing; each reads what
// the previous ones wrote into the same intermediates.
void delta_rule_backward_prepare(const DeltaRuleBackwardParams& params);         // 1
void delta_rule_backward_state_scan(const DeltaRuleBackwardParams& params);      // 2
void delta_rule_backward_gradient_scan(const DeltaRuleBackwardParams& params);   // 3
void delta_rule_backward_chunk_gradients(const DeltaRuleBackwardParams& params);  // 4

// Stages 1 and 2 alone: the backward's own forward (output and final_state must be given; the
// gradient outputs and d_output are not read). For fp64 inputs this is the fp64 forward whose
// central differences the fp64 backward is checked against.
void delta_rule_backward_forward(const DeltaRuleBackwardParams& params);

// Number of chunks N = ceil(L / C).
inline int chunk_count(int length, int chunk_size) { return (length + chunk_size - 1) / chunk_size; }

}  // namespace deltaproof::cuda
