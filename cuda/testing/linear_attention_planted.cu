// The planted-bug policies of cuda/linear_attention_passes.cuh and their instantiations: compiled
// into the test-only target alone. Each mutant changes one seam of Faithful.
#include "cuda/testing/linear_attention_planted.h"

#include "cuda/linear_attention_kernels.cuh"

namespace deltaproof::cuda::linear_attention::testing {
namespace {

struct StrictCausalMask : Faithful {
  __device__ __forceinline__ static constexpr bool in_causal_mask(int i, int j) { return j < i; }
};
struct DroppedPartialChunk : Faithful {
  static constexpr bool keeps_partial_chunk = false;
};
struct LostInitialState : Faithful {
  static constexpr bool reads_initial_state = false;
};
struct SingleBf16Operands : Faithful {
  static constexpr bool splits_operands = false;
};
struct DecodeReadsStaleState : Faithful {
  static constexpr bool decode_reads_updated_state = false;
};

}  // namespace

// The passes serve the forward and the backward; decode has its own kernel. Where the bug is in
// none of an entry point's kernels, the product's faithful entry point runs.
void forward(PlantedBug bug, const ForwardParams& p, cudaStream_t stream) {
  if (bug == PlantedBug::decode_reads_stale_state) return linear_attention::forward(p, stream);
  validate(p);
  switch (bug) {
    case PlantedBug::strict_causal_mask: return launch_forward<StrictCausalMask>(p, stream);
    case PlantedBug::dropped_partial_chunk: return launch_forward<DroppedPartialChunk>(p, stream);
    case PlantedBug::lost_initial_state: return launch_forward<LostInitialState>(p, stream);
    case PlantedBug::single_bf16_operands: return launch_forward<SingleBf16Operands>(p, stream);
    case PlantedBug::decode_reads_stale_state: break;
  }
}

void backward(PlantedBug bug, const BackwardParams& p, cudaStream_t stream) {
  if (bug == PlantedBug::decode_reads_stale_state) return linear_attention::backward(p, stream);
  validate(p);
  switch (bug) {
    case PlantedBug::strict_causal_mask: return launch_backward<StrictCausalMask>(p, stream);
    case PlantedBug::dropped_partial_chunk: return launch_backward<DroppedPartialChunk>(p, stream);
    case PlantedBug::lost_initial_state: return launch_backward<LostInitialState>(p, stream);
    case PlantedBug::single_bf16_operands: return launch_backward<SingleBf16Operands>(p, stream);
    case PlantedBug::decode_reads_stale_state: break;
  }
}

void decode(PlantedBug bug, const DecodeParams& p, cudaStream_t stream) {
  if (bug != PlantedBug::lost_initial_state && bug != PlantedBug::decode_reads_stale_state)
    return linear_attention::decode(p, stream);
  validate(p);
  if (bug == PlantedBug::lost_initial_state) launch_decode<LostInitialState>(p, stream);
  else launch_decode<DecodeReadsStaleState>(p, stream);
}

}  // namespace deltaproof::cuda::linear_attention::testing
