// Stage checks of the tensor-core DeltaNet / Gated DeltaNet backward (the bounds of its arithmetic:
// verify/delta_rule_backward_fast_stages.cpp). check_backward_stages calls this for a result that ran there.
#pragma once

#include "verify/delta_rule_backward_stages.hpp"

#include <vector>

namespace deltaproof::verify::delta_rule {

std::vector<Comparison> check_backward_stages_fast(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                                   const BackwardResult& r);

}  // namespace deltaproof::verify::delta_rule
