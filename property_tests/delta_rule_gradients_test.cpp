// DeltaNet backward: the chunkwise backward through the WY form, the token-recurrence backward,
// exact directional derivatives (dual numbers over ℚ) and central differences in High agree.
#include "property_tests/delta_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

constexpr ShapeLimits kBackward{.max_length = 64, .max_dim = 16, .max_chunk = 64};
constexpr ShapeLimits kDual{.max_length = 40, .max_dim = 12, .max_chunk = 40};
constexpr ShapeLimits kHigh{.max_length = 24, .max_dim = 8, .max_chunk = 24};

RC_GTEST_PROP(DeltaRuleGradients, BackwardPathsEqualOverRationals, ()) {
  const auto c = *gen_delta_case(kBackward);
  check_delta_backward_paths_agree(c, *gen_solve(), *gen_base_block());
}

RC_GTEST_PROP(DeltaRuleGradients, ExactDirectionalDerivative, ()) {
  const auto c = *gen_delta_case(kDual);
  check_delta_exact_directional_derivative(c, *gen_direction(delta_params(c.inputs)));
}

RC_GTEST_PROP(DeltaRuleGradients, CentralDifferencesInHighBelow1e25, ()) {
  const auto c = *gen_delta_case(kHigh);
  check_delta_finite_differences(c, *gen_direction(delta_params(c.inputs)));
}

// Every partial derivative on its own (tiny shapes: two High evaluations per entry).
RC_GTEST_PROP(DeltaRuleGradients, EveryPartialByCentralDifferences, ()) {
  const auto c = *gen_delta_case({.max_length = 5, .max_dim = 3, .max_chunk = 4});
  const auto analytic = delta_params(dr::chunkwise_backward(c.inputs, c.cotangents, c.shape.chunk_size),
                                     c.inputs.initial_state.has_value());
  const auto numeric = ref::central_difference_gradient(
      [&](const ref::Params<High>& p) { return pairing(c.cotangents, dr::token_recurrence(delta_inputs(p))); },
      ref::params_cast<High>(delta_params(c.inputs)), High("1e-30"));
  for (size_t p = 0; p < numeric.size(); ++p)
    for (Index i = 0; i < numeric[p].value.rows(); ++i)
      for (Index j = 0; j < numeric[p].value.cols(); ++j) {
        const High exact(analytic[p].value(i, j));
        const High err = abs(numeric[p].value(i, j) - exact) / std::max(High(1), High(abs(exact)));
        if (!(err < High("1e-25")))
          RC_FAIL("d" + numeric[p].name + "(" + std::to_string(i) + ", " + std::to_string(j) + "): relative error " + err.str(5));
      }
}

RC_GTEST_PROP(DeltaRuleGradients, BatchedBackwardEqualsPerHead, ()) {
  const Index batch = *rc::gen::inRange<Index>(1, 3), heads = *rc::gen::inRange<Index>(1, 3);
  const Shape s = *gen_shape({.max_length = 12, .max_dim = 6});
  dr::BatchInputs<Exact> in{ref::Tensor4<Exact>(batch, heads, s.length, s.key_dim),
                            ref::Tensor4<Exact>(batch, heads, s.length, s.key_dim),
                            ref::Tensor4<Exact>(batch, heads, s.length, s.value_dim),
                            ref::Tensor4<Exact>(batch, heads, s.length, 1), std::nullopt};
  dr::BatchCotangents<Exact> cot{ref::Tensor4<Exact>(batch, heads, s.length, s.value_dim), std::nullopt};
  ref::for_each_head(batch, heads, [&](Index b, Index h) {
    in.q.set_head(b, h, *gen_matrix(s.length, s.key_dim));
    in.k.set_head(b, h, *gen_matrix(s.length, s.key_dim));
    in.v.set_head(b, h, *gen_matrix(s.length, s.value_dim));
    in.beta.set_head(b, h, Matrix<Exact>(*gen_gates(s.length, GateRegime::mixed)));
    cot.d_output.set_head(b, h, *gen_matrix(s.length, s.value_dim));
  });
  const auto out = dr::batched_backward(in, cot, [&](const dr::Inputs<Exact>& x, const dr::Cotangents<Exact>& d) {
    return dr::chunkwise_backward(x, d, s.chunk_size);
  });
  ref::for_each_head(batch, heads, [&](Index b, Index h) {
    const auto one = dr::token_recurrence_backward(in.head(b, h), cot.head(b, h));
    require_equal("batched dq", out.dq.head(b, h), one.dq);
    require_equal("batched dk", out.dk.head(b, h), one.dk);
    require_equal("batched dv", out.dv.head(b, h), one.dv);
    require_equal("batched dbeta", out.d_beta.head(b, h), Matrix<Exact>(one.d_beta));
    require_equal("batched dS_0", out.d_initial_state.head(b, h), one.d_initial_state);
  });
}

}  // namespace
}  // namespace deltaproof::testing
