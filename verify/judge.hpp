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
  unsigned threads = 0;  // 0: every core
};

// The oracle's outputs (o, ht; gradients when the case has d_o) in the case's layout, in double.
KernelResult oracle(const KernelCase& c, unsigned threads = 0);

// Judges every tensor present in `candidate`. Throws std::invalid_argument for inconsistent shapes.
Verdict judge(const KernelCase& c, const KernelResult& candidate, const JudgeOptions& options = {});

}  // namespace deltaproof::verify
