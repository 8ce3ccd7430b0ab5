// Linear attention gradients: each backward path against (i) the exact directional derivative
// over ℚ (dual numbers) and (ii) central finite differences in High.
#include "property_tests/linear_attention_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>


namespace deltaproof::testing {
namespace {

using ref::High;

using la::Form;
using la::params_of;
using la::inputs_of;

rc::Gen<ref::Params<Exact>> gen_direction(const ref::Params<Exact>& like) {
  std::vector<rc::Gen<Matrix<Exact>>> parts;
  for (const auto& p : like) parts.push_back(gen_matrix(p.value.rows(), p.value.cols()));
  return rc::gen::map(rc::gen::tuple(rc::gen::exec([parts] {
                        ref::Params<Exact> u;
                        for (size_t i = 0; i < parts.size(); ++i) u.push_back({"u", *parts[i]});
                        return u;
                      })),
                      [](const std::tuple<ref::Params<Exact>>& t) { return std::get<0>(t); });
}

// ∇L·u from each backward path equals the exact derivative of t ↦ L(x + t·u) at 0.
RC_GTEST_PROP(LinearAttentionGradients, BackwardEqualsExactDirectionalDerivative, ()) {
  const auto c = *gen_linear_attention_case({.max_length = 80, .max_dim = 16});
  const auto x = params_of(c.inputs);
  const auto u = *gen_direction(x);
  for (Form form : {Form::parallel, Form::recurrent, Form::chunkwise}) {
    const Exact exact = ref::exact_directional_derivative(la::loss_of(form, c.shape.chunk_size, c.cotangents), x, u);
    const auto grads = params_of(la::backward(form, c.inputs, c.cotangents, c.shape.chunk_size),
                                 c.inputs.initial_state.has_value());
    const Exact analytic = ref::inner(grads, u);
    RC_ASSERT(analytic == exact);
  }
}

// Central differences in High (100 digits) with step h = 1e-20. L(x + t·u) is a cubic in t, so the central
// difference is ∇L·u + d·h² exactly, d = <dO, o(u)>: the output of the direction itself with no h0 (every other
// term of L has degree ≤ 2 in t). That truncation is subtracted; what remains is rounding, about
// 1e-100·|L|/h = 1e-80·|L|. Asserted: 1e-25 relative to |∇L·u| (or to Σ|∇L||u| where ∇L·u vanishes), plus
// 1e-75 of |L| and |d| for the rounding (all exact zeros: exactly zero).
RC_GTEST_PROP(LinearAttentionGradients, BackwardMatchesCentralDifferencesInHigh, ()) {
  const auto c = *gen_linear_attention_case({.max_length = 40, .max_dim = 10});
  const auto x = ref::params_cast<High>(params_of(c.inputs));
  const auto u = ref::params_cast<High>(*gen_direction(params_of(c.inputs)));
  const High step("1e-20");
  const la::Inputs<High> in = inputs_of(x);
  const la::Cotangents<High> cot = la::cast<High>(c.cotangents);
  la::Inputs<High> direction = inputs_of(u);
  direction.initial_state.reset();
  const la::Cotangents<High> output_only{cot.d_output, std::nullopt};
  for (Form form : {Form::parallel, Form::recurrent, Form::chunkwise}) {
    const auto loss = la::loss_of(form, c.shape.chunk_size, c.cotangents);
    const High fd = ref::central_difference(loss, x, u, step);
    const High cubic = la::pairing(la::forward(form, direction, c.shape.chunk_size), output_only);
    const auto grads = params_of(la::backward(form, in, cot, c.shape.chunk_size), in.initial_state.has_value());
    const High analytic = ref::inner(grads, u);
    // Relative to |∇L·u|, or to Σ|∇L||u| when ∇L·u happens to vanish.
    High scale = abs(analytic);
    if (scale == 0) {
      auto abs_grads = grads, abs_u = u;
      for (auto& p : abs_grads) p.value = p.value.cwiseAbs();
      for (auto& p : abs_u) p.value = p.value.cwiseAbs();
      scale = ref::inner(abs_grads, abs_u);
    }
    const High error = abs(fd - cubic * step * step - analytic);
    const bool agrees = error <= High("1e-25") * scale + High("1e-75") * (abs(loss(x)) + abs(cubic));
    if (!agrees) RC_FAIL("central difference vs analytic: error " + error.str(5) + " against |∇L·u| or Σ|∇L||u| " + scale.str(5));
    RC_ASSERT(agrees);
  }
}

}  // namespace
}  // namespace deltaproof::testing
