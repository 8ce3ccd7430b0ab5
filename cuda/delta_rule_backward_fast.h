// The tensor-core DeltaNet / Gated DeltaNet backward (cuda/delta_rule_backward_fast.cu), behind
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

// Its workspace: W, U and the pairs between its kernels always; T where the caller left it null.
std::size_t tensor_core_backward_workspace_bytes(const BackwardStageParams& p);

// Its four kernels, from `first` to `last` (arguments already validated); each reads what the earlier ones
// wrote into the same workspace.
enum class TensorCoreStage { prepare, state_pass, gradient_scan, chunk_gradients };
void tensor_core_backward(const BackwardStageParams& p, TensorCoreStage first, TensorCoreStage last, cudaStream_t stream);

}  // namespace deltaproof::cuda::delta_rule
