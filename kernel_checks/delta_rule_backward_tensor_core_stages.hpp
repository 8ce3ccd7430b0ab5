// Stage checks of the tensor-core DeltaNet / Gated DeltaNet backward (the bounds of its arithmetic:
// kernel_checks/delta_rule_backward_tensor_core_stages.cpp). check_backward_stages calls this for a result that ran there.
#pragma once

#include "kernel_checks/delta_rule_backward_stages.hpp"

#include <vector>

namespace deltaproof::verify::delta_rule {

std::vector<Comparison> check_backward_stages_tensor_core(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                                   const BackwardResult& r);

}  // namespace deltaproof::verify::delta_rule
