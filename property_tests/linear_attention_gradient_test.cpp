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

// Central differences in High (100 digits) with step h = 1e-20. L(x + t·u) is a cubic in t,
// so the truncation error is h²/6·|L'''| ≈ 1e-41·|L'''| and rounding about 1e-100·|L|/h = 1e-80·|L|:
// both far below the 1e-25 relative tolerance the test asserts.
RC_GTEST_PROP(LinearAttentionGradients, BackwardMatchesCentralDifferencesInHigh, ()) {
  const auto c = *gen_linear_attention_case({.max_length = 40, .max_dim = 10});
  const auto x = ref::params_cast<High>(params_of(c.inputs));
  const auto u = ref::params_cast<High>(*gen_direction(params_of(c.inputs)));
  const High step("1e-20");
  const la::Inputs<High> in = inputs_of(x);
  const la::Cotangents<High> cot = la::cast<High>(c.cotangents);
  for (Form form : {Form::parallel, Form::recurrent, Form::chunkwise}) {
    const High fd = ref::central_difference(la::loss_of(form, c.shape.chunk_size, c.cotangents), x, u, step);
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
    const High error = abs(fd - analytic);
    const bool agrees = scale == 0 ? error == 0 : error / scale < High("1e-25");
    if (!agrees) RC_FAIL("central difference vs analytic: relative error " + (error / scale).str(5));
    RC_ASSERT(agrees);
  }
}

}  // namespace
}  // namespace deltaproof::testing
