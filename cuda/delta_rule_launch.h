// What the DeltaNet kernels read (launcher and kernel code, not the user's API): the user's params
// plus the intermediates passed between the kernels of one launch. An intermediate that is given is
// written there (the stage tests read it back: cuda/testing/delta_rule_stages.h); one left null is
// carved out of the workspace where the next kernel needs it, or not written at all.
// Intermediates are packed, never strided.
#pragma once

#include "cuda/delta_rule.h"

namespace deltaproof::cuda::delta_rule {

// N = ceil(L / C); C×C blocks past a partial chunk hold the identity (A, T) or zeros.
struct ForwardIntermediates {
  void* w = nullptr;                 // [B, H, L, DK] dtype: W = T diag(β γ) K, read by the scan
  void* u = nullptr;                 // [B, H, L, DV] dtype: U = T diag(β) V, read by the scan
  // The residuals of W's and U's roundings (16-bit inputs; x = w + w_lo to about 16 bits for bf16): asked for by
  // the tensor-core backward, whose own forward reads W and U as these pairs (cuda/delta_rule_backward_tensor_core.cu).
  void* w_lo = nullptr;              // [B, H, L, DK] dtype
  void* u_lo = nullptr;              // [B, H, L, DV] dtype
  // The register scan's masked scores P = Q Kᵀ ⊙ Γ ⊙ M, rounded once to the dtype, formed by the prepare
  // (16-bit inputs taking the register scan; the 16 × 16 tiles above the diagonal are not written).
  void* scores = nullptr;            // [B, H, N, C, C] dtype
  float* wy_system = nullptr;        // [B, H, N, C, C] fp32: A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ)
  float* wy_inverse = nullptr;       // [B, H, N, C, C] fp32: T = A⁻¹
  float* v_new = nullptr;            // [B, H, L, DV] fp32: V̄ = U − W S_[c]ᵀ
  float* boundary_states = nullptr;  // [B, H, N, DV, DK] fp32: S_[c], the state before chunk c
  // Over R segments (ForwardParams::segments; cuda/delta_rule_segments.cuh), n = R − 1 summarised runs:
  float* segment_states = nullptr;       // [B, n, H, DV, DK] fp32: X_r, run r's state from S = 0
  float* segment_transitions = nullptr;  // [B, n, H, DK, DK] fp32: P_r, run r's transition
  float* segment_incoming = nullptr;     // [B, n + 1, H, DV, DK] fp32: S_in(r), the state entering run r
};
struct ForwardStageParams : ForwardParams, ForwardIntermediates {};

// "acc" is the accumulation type (fp64 for fp64 inputs, else fp32).
struct BackwardIntermediates {
  // Read by a later kernel: given or in the workspace.
  void* gate_sums = nullptr;        // [B, H, L] acc: G_i = Σ_{t ≤ i in its chunk} g_t (zero for DeltaNet)
  void* wy_inverse = nullptr;       // [B, H, N, C, C] acc: T = A⁻¹
  void* w = nullptr;                // [B, H, L, DK] acc: W = T diag(β γ) K
  void* u = nullptr;                // [B, H, L, DV] acc: U = T diag(β) V
  void* scores = nullptr;           // [B, H, N, C, C] acc: P = Q Kᵀ ⊙ D on and below the diagonal, 0 above
  void* boundary_states = nullptr;  // [B, H, N, DV, DK] acc: S_[c]
  void* v_new = nullptr;            // [B, H, L, DV] acc: V̄ = U − W S_[c]ᵀ
  void* d_v_new = nullptr;          // [B, H, L, DV] acc: dV̄ (= dU)
  void* state_gradients = nullptr;  // [B, H, N, DV, DK] acc: G_[c+1] = dL/dS_[c+1], entry N−1 is dS_L
  void* d_w = nullptr;              // [B, H, L, DK] acc: dW = −dV̄ S_[c]
  // Written only when given (nothing later reads them).
  void* wy_system = nullptr;           // [B, H, N, C, C] acc: A = I + strictly_lower(diag(β) (K Kᵀ ⊙ D))
  void* wy_system_adjoint = nullptr;   // [B, H, N, C, C] acc: E = dL/dA = strictly_lower(−Tᵀ dT Tᵀ)
  void* gate_sum_gradients = nullptr;  // [B, H, L] acc: dL/dG_i
  // The forward recomputed by the state scan (null: not written); with fp64 inputs an fp64 forward.
  void* output = nullptr;       // [B, H, L, DV] dtype: O = diag(γ) Q S_[c]ᵀ + P V̄
  void* final_state = nullptr;  // [B, H, DV, DK] acc: S_L
  // The tensor-core path's stage 4 runs persistent blocks that take (chunk, head) items in turn; ≤ 0: as many as
  // the device holds at once. The tests set a few, so that one block takes many items (the results must not move).
  int chunk_gradient_blocks = 0;
};
struct BackwardStageParams : BackwardParams, BackwardIntermediates {};

}  // namespace deltaproof::cuda::delta_rule
