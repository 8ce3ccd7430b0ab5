// The verdict on any kernel of the family: the oracle evaluated on the exact values of the inputs a
// kernel was given, and every tensor it produced compared within a bound derived from a stated
// model of how such a kernel rounds (see kernel_model.hpp). One row per tensor, as fields.
#pragma once

#include "verify/comparison.hpp"
#include "verify/kernel_case.hpp"

#include <optional>

namespace deltaproof::verify {

struct JudgeOptions {
  // Precision of the operands the kernel multiplies. Default: the input dtype. Triton's tl.dot on
  // fp32 inputs multiplies in TF32 unless told otherwise (fla does not), so fp32 kernels written in
  // Triton are judged with operands = tf32, truncated (|δ| < 2⁻¹⁰; kernel_model.hpp).
  bool tf32_operands = false;
  unsigned threads = 0;  // 0: reference/parallel.hpp's thread count (every core unless set)
  // The dtype of the running state between chunks (and of its cotangent). Default: fp32 for 16-bit
  // and fp32 kernels (fla's), fp64 for fp64. A kernel that keeps a bf16 or fp16 state declares it and is
  // judged with that state rounded at every chunk boundary; one that does not is held to fp32, so a
  // 16-bit state accumulation shows as a disagreement.
  std::optional<DType> state_dtype;
  // The kernel's chunk size for the WY bounds of the delta family (kernel_model.hpp); 0: unknown,
  // every chunk of 16, 32 and 64 tokens from the sequence's start is covered.
  long chunk_size = 0;
};

// The oracle's outputs (o, ht; gradients when the case has d_o) in the case's layout, in double.
KernelResult oracle(const KernelCase& c, unsigned threads = 0);

// Judges every tensor present in `candidate`: each row agrees, disagrees, or is inconclusive where the
// inputs lie outside a premise of its bound (comparison.hpp). Throws std::invalid_argument for
// inconsistent shapes or options.
Verdict judge(const KernelCase& c, const KernelResult& candidate, const JudgeOptions& options = {});

}  // namespace deltaproof::verify
