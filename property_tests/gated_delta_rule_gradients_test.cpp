// Gated DeltaNet backward: chunkwise through the gated WY form, token recurrence, exact dual
// directional derivatives, central differences in High; the log-gate backward gives dL/dg.
#include "property_tests/delta_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

constexpr ShapeLimits kBackward{.max_length = 80, .max_dim = 20, .max_chunk = 64};
constexpr ShapeLimits kDual{.max_length = 32, .max_dim = 12, .max_chunk = 32};
constexpr ShapeLimits kHigh{.max_length = 20, .max_dim = 8, .max_chunk = 20};

DELTAPROOF_DELTA_GRADIENT_PROPERTIES(GatedDeltaRuleGradients, gen_gated_delta_case, kBackward, kDual, kHigh)

// The log-gate backward (High): dL/dg_t = α_t dL/dα_t against the exact gradient, and against
// central differences in g, both below 1e-25 relative.
RC_GTEST_PROP(GatedDeltaRuleGradients, LogGateBackwardGivesDg, ()) {
  const auto c = *gen_gated_delta_case(kHigh);
  const auto exact = gd::chunkwise_backward(c.inputs, c.cotangents, c.shape.chunk_size);
  gd::LogGateInputs<High> in{ref::matrix_cast<High>(c.inputs.q), ref::matrix_cast<High>(c.inputs.k),
                             ref::matrix_cast<High>(c.inputs.v), ref::matrix_cast<High>(Matrix<Exact>(c.inputs.beta)).col(0),
                             Vector<High>(c.shape.length), std::nullopt};
  if (c.inputs.initial_state) in.initial_state = ref::matrix_cast<High>(*c.inputs.initial_state);
  for (Index t = 0; t < c.shape.length; ++t) in.log_gate(t) = log(High(c.inputs.alpha(t)));
  dr::Cotangents<High> cot{ref::matrix_cast<High>(c.cotangents.d_output), std::nullopt};
  if (c.cotangents.d_final_state) cot.d_final_state = ref::matrix_cast<High>(*c.cotangents.d_final_state);
  const auto logs = gd::chunkwise_log_gate_backward(in, cot, c.shape.chunk_size);
  const Vector<Exact> dg_exact = c.inputs.alpha.cwiseProduct(exact.d_alpha);
  for (Index t = 0; t < c.shape.length; ++t) {
    const High want(dg_exact(t));
    const High err = abs(logs.d_alpha(t) - want) / std::max(High(1), High(abs(want)));
    if (!(err < High("1e-25"))) RC_FAIL("dg_" + std::to_string(t) + ": relative error " + err.str(5));
  }
  // d/dε L(g + ε e_t) by central differences through the log-gate chunkwise form.
  const Index t = *rc::gen::inRange<Index>(0, c.shape.length);
  const High step("1e-30");
  auto loss = [&](const High& shift) {
    gd::LogGateInputs<High> moved = in;
    moved.log_gate(t) += shift;
    const auto f = gd::chunkwise_log_gate(moved, c.shape.chunk_size);
    High sum = f.output.cwiseProduct(cot.d_output).sum();
    if (cot.d_final_state) sum += f.final_state.cwiseProduct(*cot.d_final_state).sum();
    return sum;
  };
  const High numeric = (loss(step) - loss(-step)) / (2 * step);
  const High err = abs(numeric - logs.d_alpha(t)) / std::max(High(1), High(abs(logs.d_alpha(t))));
  if (!(err < High("1e-25"))) RC_FAIL("dg by central differences: relative error " + err.str(5));
}

}  // namespace
}  // namespace deltaproof::testing
