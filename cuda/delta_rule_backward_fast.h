// The tensor-core DeltaNet / Gated DeltaNet backward (cuda/delta_rule_backward_fast.cu), behind
// delta_rule_backward: internal to cuda/ and to the tests that read its intermediates.
#pragma once

#include "cuda/delta_rule.h"

#include <cstddef>

namespace deltaproof::cuda {

// Whether delta_rule_backward takes the tensor-core path for these arguments: bf16 inputs, DK and DV
// at most 128 and multiples of 8, q, k, v, dO 16-byte aligned and dq, dk, dv 4-byte aligned. Every
// other input takes the fp32 FMA kernels (delta_rule_backward.cu), which also serve fp64.
bool delta_rule_backward_uses_tensor_cores(const DeltaRuleBackwardParams& params);

// Its workspace (the intermediates left null; W and U always, as bf16 hi + lo pairs).
std::size_t delta_rule_backward_fast_workspace_bytes(const DeltaRuleBackwardParams& params);

// All four stages; arguments already validated.
void delta_rule_backward_fast(const DeltaRuleBackwardParams& params);

// One stage alone (per-stage timing): it reads what the earlier stages left in the same workspace.
enum class FastBackwardStage { prepare, state_pass, gradient_scan, chunk_gradients };
void delta_rule_backward_fast_stage(const DeltaRuleBackwardParams& params, FastBackwardStage stage);

}  // namespace deltaproof::cuda
