// Test-only: the DeltaNet / Gated DeltaNet kernels one stage at a time, with their intermediates
// written where the caller gives them (cuda/delta_rule_launch.h), for the stage checks
// (kernel_checks/delta_rule_stages.hpp, delta_rule_backward_stages.hpp) and the per-stage benchmarks. Not what
// a user calls: cuda/delta_rule.h's forward, backward and decode.
#pragma once

#include "cuda/delta_rule_backward_tensor_core.h"
#include "cuda/delta_rule_launch.h"

#include <cstddef>

namespace deltaproof::cuda::delta_rule::testing {

// Workspace bytes for the intermediates left null; validation as the public entry points', plus every
// given intermediate a device pointer apart from every other tensor.
std::size_t workspace_bytes(const ForwardStageParams& p);
std::size_t workspace_bytes(const BackwardStageParams& p);
void validate(const ForwardStageParams& p);
void validate(const BackwardStageParams& p);

// The forward: both kernels, or one (wy_prepare writes W and U, chunk_scan reads them: both need the
// same w and u, given, or the same workspace).
void forward(const ForwardStageParams& p, cudaStream_t stream = nullptr);
void wy_prepare(const ForwardStageParams& p, cudaStream_t stream = nullptr);
void chunk_scan(const ForwardStageParams& p, cudaStream_t stream = nullptr);
// Whether chunk_scan takes the register scan (its S enters the tensor cores as a hi + lo pair) rather than the
// fallback scan (S rounded once): the stage checks bound each by its own arithmetic.
bool uses_register_scan(const ForwardStageParams& p);

// The backward: all four kernels, or one; each reads what the earlier ones wrote into the same
// intermediates (or workspace).
void backward(const BackwardStageParams& p, cudaStream_t stream = nullptr);
void backward_prepare(const BackwardStageParams& p, cudaStream_t stream = nullptr);          // 1
void backward_state_scan(const BackwardStageParams& p, cudaStream_t stream = nullptr);       // 2
void backward_gradient_scan(const BackwardStageParams& p, cudaStream_t stream = nullptr);    // 3
void backward_chunk_gradients(const BackwardStageParams& p, cudaStream_t stream = nullptr);  // 4

// The per-stage entries above are the fp32 FMA kernels' whatever the dtype; backward() takes the
// tensor-core path where tensor_core_backward_applies. Its kernels one at a time (per-stage timing):
void backward_tensor_core_stage(const BackwardStageParams& p, TensorCoreStage stage, cudaStream_t stream = nullptr);

// Stages 1 and 2 alone: the backward's own forward (output and final_state must be given; the gradient
// outputs and d_output are not read). For fp64 inputs this is the fp64 forward whose central
// differences the fp64 backward is checked against.
void backward_forward(const BackwardStageParams& p, cudaStream_t stream = nullptr);

}  // namespace deltaproof::cuda::delta_rule::testing
