// DeltaNet and Gated DeltaNet on the GPU: host API (no Eigen, no Boost; nvcc compiles it).
//
//   DeltaNet        S_t = S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,          o_t = S_t q_t
//   Gated DeltaNet  S_t = α_t S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,  α_t = exp(g_t)
//
// Three launchers, each validating every argument before anything runs (the API shape of
// linear_attention.h):
//   forward   — the chunkwise WY form, two kernels (below), S_0 in and S_L out
//   backward  — the gradients of <dO, O> + <dS_L, S_L> with respect to q, k, v, β, g and S_0
//   decode    — the token recurrence over T new tokens, state in and out
// Tensors are [B, H, rows, cols] with the column stride 1 and explicit batch/head/row strides in
// elements (cuda/layout.hpp's Strides; set_contiguous_strides fills them for packed tensors; fla's
// [B, T, H, D] is {T·H·D, D, H·D}). β, g and their gradients are per-token vectors [B, H, L], i.e.
// [B, H, L, 1]: their `row` stride is the token stride. q, k, v, β, the output and the gradients dq,
// dk, dv, dβ share one dtype; log-gates g = ln α and states are in the accumulation type (fp32; fp64
// for the backward's fp64 inputs). No implicit scale: q is used as given. Bad arguments throw
// std::invalid_argument naming the argument (nothing launched, no output touched); CUDA failures throw
// cuda::CudaError carrying the kernel's name.
//
// Memory: no output may share a byte with any other tensor, input or output (validate compares the
// address ranges the strides imply and names both tensors); the one exception is decode's state
// updated in place, initial_state == final_state with equal strides. The workspace (forward: W and U;
// backward: its intermediates) is workspace_bytes(p) bytes of device memory, 256-byte aligned.
// Training: a forward given `saved` keeps there what the backward's first two kernels compute (T, W, U, S_[c]
// and V̄: it runs the backward's state pass and forms its output from S_[c] and V̄, below); a backward given
// that buffer skips those kernels and computes the same bits. The training forward's output is held to its own
// bound (S_[c] rounded once, V̄ as a pair), not to the inference forward's bits. The workspace sizes do not
// depend on saved.
//
// Inputs are computed with, not refused (no check reads them), as the oracle takes any real β and g
// (bad_inputs_gpu_test.cpp states each case below as a test):
//   * β outside [0, 1]: computed (β > 1 or β < 0 make I − β k kᵀ expand); g > 0 (α > 1, the state
//     grows): computed. α ≤ 0 cannot be given: the kernels take g = ln α. g = −∞ (α = 0, a reset) is
//     taken by decode as α = 0, while the chunkwise forward meets −∞ − (−∞) = NaN in its in-chunk
//     decays and treats it as a NaN (below); start a new sequence to reset a state there.
//   * NaN and ±Inf are IEEE numbers like any other, and in the forward (training or not) and decode they go where the
//     recurrence carries them. A NaN or Inf in q_t reaches o_t alone: every entry of o_t is then NaN or
//     ±Inf, every other output and the states bit for bit those without it. A NaN in k_t, β_t or g_t
//     makes S_t and every later state NaN, hence every entry of o_s for s ≥ t and of the final state;
//     a NaN in v_t[r] does the same to value row r alone (row r of the states, column r of o_s for
//     s ≥ t; every other entry bit for bit unchanged). Outputs of tokens before t's 16-token tile are
//     bit for bit unchanged; those between the tile's start and t may be NaN too: the chunkwise kernels
//     multiply masked-out zeros by the tile's values, and 0 · NaN = NaN. Decode runs the recurrence
//     token by token: o_s for s < t is unchanged.
//   * The backward computes them by the same arithmetic; which gradients NaN and Inf reach is not stated.
// fp16 and bf16 outputs round once; an exact output past the dtype's range becomes ±Inf (IEEE overflow).
//
// The chunkwise forward is two kernels:
//   1. wy_prepare (one block per chunk): A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ), its inverse T by
//      16×16 forward substitution merged 16→32→64, W = T diag(β γ) K and U = T diag(β) V.
//   2. chunk_scan (one block per head and DV slice, sequential over chunks): V̄ = U − W S_[c]ᵀ,
//      O = diag(γ) Q S_[c]ᵀ + (Q Kᵀ ⊙ Γ ⊙ M) V̄, S_[c+1] = γ_C S_[c] + (diag(γ_C/γ) V̄)ᵀ K.
//      The register scan (16-bit inputs, DK ≤ 128, DK and DV multiples of 8) keeps the fp32 state slice
//      in registers on raw mma.sync and copies q and k rows with 16-byte cp.async: it runs where q and k
//      are 16-byte aligned with every stride a multiple of 8 elements and the output is 4-byte aligned
//      with even strides. Every other input takes the one fallback, the state in shared memory
//      (delta_rule_forward_kernels.cuh); its results differ from the register scan's within the bounds.
//   2′. A training forward (saved; bf16 inputs the register scan takes) runs instead the tensor-core backward's
//      state pass (W, U, S and V̄ to ≈ 16 bits; S_[c] rounded once and V̄'s pair kept in saved) and then
//      chunk_output_kernel, one block per chunk: O = diag(γ) Q Ŝ_[c]ᵀ + P (V̄_hi + V̄_lo).
// For DeltaNet γ ≡ 1 (no log-gates), and the gated kernels with g = 0 compute bit for bit the
// same thing. γ_i = exp(G_i), G_i = Σ_{t ≤ i in the chunk} g_t; Γ_ij = exp(G_i − G_j) for i ≥ j.
//
// The backward: bf16 inputs with DK, DV ≤ 128 and multiples of 8 take the tensor-core backward
// (delta_rule_backward_tensor_core.cu: the forward's prepare and register scan in their backward modes, then a
// gradient scan and the chunk-gradient kernel, operands as hi + lo pairs or rounded once by a fixed precision
// plan). Every other input takes four fp32 FMA kernels (delta_rule_backward.cu), each a straight transcription
// of reference/{delta_rule,gated_delta_rule}.hpp's chunk_backward (design and figures of both:
// docs/kernels/delta_rule.md):
//   1. prepare (one block per chunk): G_i, A, T = A⁻¹ (forward substitution), W, U, P = Q Kᵀ ⊙ D ⊙ M.
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
// The per-stage entry points and the intermediates between the stages are test seams:
// cuda/testing/delta_rule_stages.h.
#pragma once

#include "cuda/check.hpp"
#include "cuda/layout.hpp"
#include "cuda/types.hpp"

#include <cuda_runtime.h>

#include <cstddef>

namespace deltaproof::cuda::delta_rule {

using cuda::accumulator_dtype;  // of states and log-gates too: fp64 for the backward's fp64 inputs, else fp32
using cuda::contiguous;
using cuda::Strides;

struct ForwardParams {
  DType dtype = DType::bf16;  // q, k, v, beta, output: fp32, bf16 or fp16
  int batch = 0, heads = 0, length = 0, key_dim = 0, value_dim = 0, chunk_size = 64;  // C: 16, 32 or 64
  const void* q = nullptr;     // [B, H, L, DK]
  const void* k = nullptr;     // [B, H, L, DK]
  const void* v = nullptr;     // [B, H, L, DV]
  const void* beta = nullptr;  // [B, H, L]
  const float* log_gate = nullptr;  // [B, H, L] fp32: g_t = ln α_t; null: DeltaNet (α ≡ 1)
  void* output = nullptr;           // [B, H, L, DV]
  Strides q_strides, k_strides, v_strides, beta_strides, log_gate_strides, output_strides;
  const float* initial_state = nullptr;  // [B, H, DV, DK] fp32; null: S_0 = 0
  float* final_state = nullptr;          // [B, H, DV, DK] fp32, required
  Strides initial_state_strides, final_state_strides;
  void* workspace = nullptr;  // workspace_bytes(p) bytes: W and U between the two kernels
  // Training: saved_bytes(p) bytes (256-byte aligned) where the forward also keeps what the backward would
  // recompute (its first two kernels' T = A⁻¹, W, U, S_[c] and V̄), for BackwardParams::saved; null: nothing kept.
  void* saved = nullptr;
  // Each sequence walked as `segments` runs of ceil(L / segments) tokens at once (docs/context_parallel.md; the
  // last run the remainder, none empty): each run's transition P and state summary X (the register scan's state
  // chain, from I and from 0), the states entering the runs (S_in(r + 1) = S_in(r) P_r + X_r from S_0), then each
  // run from its incoming state. 0 chooses from B·H, L and the GPU's SM count (one run unless the sequences leave
  // half the GPU idle); 1 is one walk. More than one needs the register scan's inputs (16-bit, DK ≤ 128, DK and DV
  // multiples of 8, its alignments) and saved null; where they do not hold, 0 means 1. H·segments ≤ 65535.
  // The runs' states from the stream's memory pool, B·H·((R − 1)·(2·DV + DK) + DV)·DK + H·R·DV·DK floats; their
  // W, U and scores in the workspace (from the pool too where runs not of whole chunks need more than
  // workspace_bytes). 0 prefers runs that divide L's chunks evenly: they are walked in one launch.
  int segments = 0;
};

struct BackwardParams {
  DType dtype = DType::bf16;  // q, k, v, beta, d_output, dq, dk, dv, d_beta: fp32, fp64, bf16 or fp16
  int batch = 0, heads = 0, length = 0, key_dim = 0, value_dim = 0, chunk_size = 64;
  const void* q = nullptr;         // [B, H, L, DK]
  const void* k = nullptr;         // [B, H, L, DK]
  const void* v = nullptr;         // [B, H, L, DV]
  const void* beta = nullptr;      // [B, H, L]
  const void* log_gate = nullptr;  // [B, H, L] accumulation type; null: DeltaNet
  const void* d_output = nullptr;  // [B, H, L, DV]: dO
  void* dq = nullptr;              // [B, H, L, DK]
  void* dk = nullptr;              // [B, H, L, DK]
  void* dv = nullptr;              // [B, H, L, DV]
  void* d_beta = nullptr;          // [B, H, L]
  void* d_log_gate = nullptr;      // [B, H, L] accumulation type: dg; required with log_gate, null without
  Strides q_strides, k_strides, v_strides, beta_strides, log_gate_strides, d_output_strides;
  Strides dq_strides, dk_strides, dv_strides, d_beta_strides, d_log_gate_strides;
  const void* initial_state = nullptr;  // [B, H, DV, DK] accumulation type; null: S_0 = 0
  const void* d_final_state = nullptr;  // [B, H, DV, DK] accumulation type: dS_L; null: dS_L = 0
  void* d_initial_state = nullptr;      // [B, H, DV, DK] accumulation type: dS_0; null: not written
  Strides initial_state_strides, d_final_state_strides, d_initial_state_strides;
  void* workspace = nullptr;  // workspace_bytes(p) bytes (the intermediates between the kernels)
  // A training forward's ForwardParams::saved on these same q, k, β, g, v, S_0 and C: the tensor-core backward then
  // skips its first two kernels (what it reads is bit for bit what they write). Not checked against the
  // inputs: a stale buffer gives wrong gradients. The fp32 FMA kernels (inputs off the tensor-core path) do
  // not read it. null: recomputed.
  const void* saved = nullptr;
};

struct DecodeParams {
  DType dtype = DType::bf16;  // q, k, v, beta, output: fp32, bf16 or fp16
  int batch = 0, heads = 0, tokens = 1, key_dim = 0, value_dim = 0;
  const void* q = nullptr;          // [B, H, T, DK]
  const void* k = nullptr;          // [B, H, T, DK]
  const void* v = nullptr;          // [B, H, T, DV]
  const void* beta = nullptr;       // [B, H, T]
  const float* log_gate = nullptr;  // [B, H, T] fp32; null: DeltaNet
  void* output = nullptr;           // [B, H, T, DV]
  Strides q_strides, k_strides, v_strides, beta_strides, log_gate_strides, output_strides;
  const float* initial_state = nullptr;  // [B, H, DV, DK] fp32; null: S_0 = 0; may equal final_state (in place)
  float* final_state = nullptr;          // [B, H, DV, DK] fp32, required
  Strides initial_state_strides, final_state_strides;
};

// Packed strides for every tensor of a params struct (the common case).
void set_contiguous_strides(ForwardParams& p);
void set_contiguous_strides(BackwardParams& p);
void set_contiguous_strides(DecodeParams& p);

// Bytes of workspace the launch needs (0: none). Throws std::invalid_argument on bad sizes, like validate.
std::size_t workspace_bytes(const ForwardParams& p);
std::size_t workspace_bytes(const BackwardParams& p);

// Bytes of ForwardParams::saved: T in fp32, W and U as bf16 hi + lo pairs, S_[c] in bf16, V̄ as a bf16 pair
// (bf16 with DK, DV <= 128 and multiples of 8, the tensor-core backward's sizes); 0 for every other input, where
// saved must be null.
std::size_t saved_bytes(const ForwardParams& p);

// Validation alone (what the launchers call first); throws std::invalid_argument.
void validate(const ForwardParams& p);
void validate(const BackwardParams& p);
void validate(const DecodeParams& p);

void forward(const ForwardParams& p, cudaStream_t stream = nullptr);
void backward(const BackwardParams& p, cudaStream_t stream = nullptr);
void decode(const DecodeParams& p, cudaStream_t stream = nullptr);

}  // namespace deltaproof::cuda::delta_rule
