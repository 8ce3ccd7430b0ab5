// Random linear-attention problems over ℚ: inputs and cotangents of a generated shape.
#pragma once

#include "property_tests/support/generators.hpp"
#include "reference/gradcheck.hpp"
#include "reference/linear_attention.hpp"

#include <ostream>

namespace deltaproof::testing {

namespace la = ref::linear_attention;

struct LinearAttentionCase {
  Shape shape;
  la::Inputs<Exact> inputs;
  la::Cotangents<Exact> cotangents;  // d_output always; d_final_state when S_0 is given
};
std::ostream& operator<<(std::ostream& os, const LinearAttentionCase& c);

rc::Gen<LinearAttentionCase> gen_linear_attention_case(ShapeLimits limits = {}, Entries entries = Entries::coarse);

}  // namespace deltaproof::testing
