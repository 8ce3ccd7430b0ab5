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

// The differentiable inputs (q, k, v and S_0 when given) as a named list, and back.
template <class Scalar>
ref::Params<Scalar> params_of(const la::Inputs<Scalar>& in) {
  ref::Params<Scalar> p{{"q", in.q}, {"k", in.k}, {"v", in.v}};
  if (in.initial_state) p.push_back({"S_0", *in.initial_state});
  return p;
}
template <class Scalar>
la::Inputs<Scalar> inputs_of(const ref::Params<Scalar>& p) {
  la::Inputs<Scalar> in{p.at(0).value, p.at(1).value, p.at(2).value, std::nullopt};
  if (p.size() > 3) in.initial_state = p[3].value;
  return in;
}
template <class Scalar>
ref::Params<Scalar> params_of(const la::Gradients<Scalar>& g, bool with_initial_state) {
  ref::Params<Scalar> p{{"q", g.dq}, {"k", g.dk}, {"v", g.dv}};
  if (with_initial_state) p.push_back({"S_0", g.d_initial_state});
  return p;
}

}  // namespace deltaproof::testing
