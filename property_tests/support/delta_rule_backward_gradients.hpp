// A backward run's gradients judged end to end against the float64 token recurrence on the same inputs,
// as the GPU suite and both backward emulation suites judge them: within gradient_tau, and by relative L2
// against the design page's accuracy targets. One place, so that the emulated and the device runs are
// held to the same verdict. A `run` is the suite's backward: (case, inputs, cotangents) -> BackwardResult.
#pragma once

#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <iostream>
#include <utility>

namespace deltaproof::testing {

// `run` on the case's inputs and cotangents: every gradient within gradient_tau of the float64 recurrence's
// (a GoogleTest failure per row outside).
template <class Run>
void expect_gradients_agree_with_float64(const verify::delta_rule::DeltaCase& c, Run&& run) {
  namespace vd = verify::delta_rule;
  const vd::HostInputs in = vd::make_inputs(c);
  const vd::Cotangents cot = vd::make_cotangents(c);
  const vd::BackwardResult r = run(c, in, cot);
  for (const verify::Comparison& row : vd::compare_gradients_end_to_end(c, r, vd::double_gradients(c, in, cot), vd::gradient_tau(c.dtype)))
    EXPECT_TRUE(row.agrees()) << vd::describe(c) << ": " << verify::describe(row);
}

// Each gradient's relative L2 against the float64 recurrence printed (" dq 0.0012 dk ...") and held to `target`.
inline void expect_gradient_relative_l2_within(const verify::delta_rule::DeltaCase& c, const verify::delta_rule::HostInputs& in,
                                               const verify::delta_rule::Cotangents& cot,
                                               const verify::delta_rule::BackwardResult& r, double target) {
  namespace vd = verify::delta_rule;
  for (const auto& [name, err] : vd::gradient_relative_l2(c, r, vd::double_gradients(c, in, cot))) {
    std::cout << " " << name << " " << err;
    EXPECT_LE(err, target) << name;
  }
}

// `run` on the design page's accuracy inputs (design_inputs, make_cotangents), its gradients held to `target` as
// above; the inputs and the result are returned for what a suite checks beyond the gradients.
template <class Run>
std::pair<verify::delta_rule::HostInputs, verify::delta_rule::BackwardResult> expect_design_input_accuracy(
    const verify::delta_rule::DeltaCase& c, double target, Run&& run) {
  namespace vd = verify::delta_rule;
  vd::HostInputs in = vd::design_inputs(c);
  const vd::Cotangents cot = vd::make_cotangents(c);
  vd::BackwardResult r = run(c, in, cot);
  expect_gradient_relative_l2_within(c, in, cot, r, target);
  return {std::move(in), std::move(r)};
}

}  // namespace deltaproof::testing
