// Test-only: the linear attention kernels with one bug planted on purpose (the design page's numerical
// policy), so that a suite can prove it fails on a broken kernel. Built into the test-only target
// deltaproof_cuda_testing, never into the product library (which instantiates the faithful kernels
// alone: cuda/linear_attention_passes.cuh's Faithful policy).
#pragma once

#include "cuda/linear_attention.h"

namespace deltaproof::cuda::linear_attention::testing {

enum class PlantedBug {
  strict_causal_mask,        // scores keep j < i only: the diagonal token is dropped
  dropped_partial_chunk,     // the last chunk is skipped when L % C != 0
  lost_initial_state,        // S_0 (and, in the backward, dS_L) read as zero
  single_bf16_operands,      // tensor-core pass feeds S and P as one bf16 each (no lo part)
  decode_reads_stale_state,  // decode outputs S_{t-1} q_t instead of S_t q_t
};

// The public entry points with `bug` planted in their kernels (validation as the product's); an
// entry point whose kernels the bug does not touch runs the faithful ones.
void forward(PlantedBug bug, const ForwardParams& p, cudaStream_t stream = nullptr);
void backward(PlantedBug bug, const BackwardParams& p, cudaStream_t stream = nullptr);
void decode(PlantedBug bug, const DecodeParams& p, cudaStream_t stream = nullptr);

}  // namespace deltaproof::cuda::linear_attention::testing
