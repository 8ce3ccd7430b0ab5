// The tensor-core DeltaNet / Gated DeltaNet backward (cuda/delta_rule_backward_tensor_core.cu), behind
// delta_rule::backward: internal to cuda/ and to the test seams (cuda/testing/delta_rule_stages.h).
#pragma once

#include "cuda/delta_rule_launch.h"

#include <cstddef>

namespace deltaproof::cuda::delta_rule {

// Whether backward() takes the tensor-core path for these arguments: bf16 inputs, DK and DV at most 128 and
// multiples of 8, rows of q, k, v and dO 16-byte aligned (pointer aligned, every stride a multiple of 8
// elements: cp.async), dq, dk and dv stored in 4-byte pairs (aligned, even strides), a given wy_inverse
// 16-byte aligned. Every other input takes the fp32 FMA kernels (delta_rule_backward.cu), which serve fp64.
bool tensor_core_backward_applies(const BackwardParams& p);
// Its conditions on the sizes alone: the inputs for which a training forward keeps anything (saved_bytes > 0).
bool tensor_core_backward_shape(DType dtype, int key_dim, int value_dim);

// What a training forward keeps for it (ForwardParams::saved, BackwardParams::saved): exactly what its first two
// kernels would write (the training forward runs them: its output is formed from S_[c] and V̄), carved in this
// fixed order at 256-byte boundaries.
struct SavedTensors {
  float* wy_inverse;  // [B, H, N, C, C] fp32 T = A⁻¹
  void *w, *w_lo;     // [B, H, L, DK] bf16: W rounded and its residual
  void *u, *u_lo;     // [B, H, L, DV] bf16
  void* s;            // [B, H, N, DV, DK] bf16: S_[c] rounded once
  void *v_hi, *v_lo;  // [B, H, L, DV] bf16: V̄ = v_hi + v_lo
};
// Carved out of `saved` (null: sizing only); *bytes, when not null, receives the size.
SavedTensors saved_tensors(void* saved, int batch, int heads, int length, int key_dim, int value_dim, int chunk,
                           std::size_t* bytes);
// Its size; 0 where tensor_core_backward_shape fails (nothing is kept).
std::size_t saved_tensor_bytes(DType dtype, int batch, int heads, int length, int key_dim, int value_dim, int chunk);

// Its workspace: W, U and the pairs between its kernels always (also with saved, so that the size does not
// depend on it); T where the caller left it null.
std::size_t tensor_core_backward_workspace_bytes(const BackwardStageParams& p);

// Its four kernels, from `first` to `last` (arguments already validated); each reads what the earlier ones
// wrote into the same workspace. With p.saved the first two do not run: T, W, U, S_[c] and V̄ are read from there.
enum class TensorCoreStage { prepare, state_pass, gradient_scan, chunk_gradients };
void tensor_core_backward(const BackwardStageParams& p, TensorCoreStage first, TensorCoreStage last, cudaStream_t stream);

}  // namespace deltaproof::cuda::delta_rule
