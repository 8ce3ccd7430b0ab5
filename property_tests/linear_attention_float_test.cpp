// Linear attention in double and float against the exact oracle on the same inputs.
//
// Inputs are dyadic (n/4), so float and double hold them exactly and the exact oracle sees the
// very values the float form sees. The bound is the one derived in linear_attention.hpp:
//   |computed − exact| <= γ_m(u) · form(|inputs|) elementwise, m = L + DK + DV + 4,
// valid for every form and every summation order (Higham, Thm 3.1). The observed err/bound ratio
// is printed so the bound's slack is on record (calibration, the design page's numerical policy).
#include "property_tests/linear_attention_properties.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

namespace deltaproof::testing {
namespace {

template <class Scalar>
Matrix<Exact> scaled(const Matrix<Exact>& magnitude, const LinearAttentionCase& c) {
  const double g = ref::gamma(la::rounding_depth(c.shape.length, c.shape.key_dim, c.shape.value_dim),
                              ref::unit_roundoff<Scalar>());
  return magnitude * Exact(g);
}

// Largest err/bound seen in this process, per scalar type: the calibration figure.
template <class Scalar>
double& worst_ratio() {
  static double ratio = 0;
  return ratio;
}

template <class Scalar>
void track(const std::string& what, const Matrix<Scalar>& candidate, const Matrix<Exact>& exact, const Matrix<Exact>& bound) {
  require_within(what + " (" + ref::scalar_name<Scalar>() + ")", candidate, exact, bound);
  const auto s = ref::compare<Exact>(what, ref::matrix_cast<Exact>(candidate), exact, bound);
  worst_ratio<Scalar>() = std::max(worst_ratio<Scalar>(), s.max_bound_ratio);
}

template <class Scalar>
void check_forms_within_bound(const LinearAttentionCase& c) {
  const la::Inputs<Scalar> in = la::cast<Scalar>(c.inputs);
  const auto exact = la::parallel_masked(c.inputs);
  const auto magnitude = la::forward_magnitude(c.inputs);
  const Matrix<Exact> out_bound = scaled<Scalar>(magnitude.output, c);
  const Matrix<Exact> state_bound = scaled<Scalar>(magnitude.final_state, c);
  const la::Forward<Scalar> forms[] = {la::parallel_masked(in), la::token_recurrence(in), la::chunkwise(in, c.shape.chunk_size)};
  const char* names[] = {"parallel", "recurrent", "chunkwise"};
  for (int f = 0; f < 3; ++f) {
    track(std::string(names[f]) + " output", forms[f].output, exact.output, out_bound);
    track(std::string(names[f]) + " final state", forms[f].final_state, exact.final_state, state_bound);
  }
}

template <class Scalar>
void check_backward_within_bound(const LinearAttentionCase& c) {
  const la::Inputs<Scalar> in = la::cast<Scalar>(c.inputs);
  const la::Cotangents<Scalar> cot = la::cast<Scalar>(c.cotangents);
  const auto exact = la::parallel_masked_backward(c.inputs, c.cotangents);
  const auto magnitude = la::backward_magnitude(c.inputs, c.cotangents);
  const la::Gradients<Scalar> paths[] = {la::parallel_masked_backward(in, cot), la::token_recurrence_backward(in, cot),
                                         la::chunkwise_backward(in, cot, c.shape.chunk_size)};
  const char* names[] = {"parallel", "recurrent", "chunkwise"};
  for (int p = 0; p < 3; ++p) {
    const std::string n = names[p];
    track(n + " dq", paths[p].dq, exact.dq, scaled<Scalar>(magnitude.dq, c));
    track(n + " dk", paths[p].dk, exact.dk, scaled<Scalar>(magnitude.dk, c));
    track(n + " dv", paths[p].dv, exact.dv, scaled<Scalar>(magnitude.dv, c));
    track(n + " dS_0", paths[p].d_initial_state, exact.d_initial_state, scaled<Scalar>(magnitude.d_initial_state, c));
  }
}

// Each test runs its property through rc::check (so the calibration figure can be printed once
// at the end): fine entries, so that float and double really round.
template <class Scalar>
void run_within_bound_property() {
  worst_ratio<Scalar>() = 0;
  const bool ok = rc::check(ref::scalar_name<Scalar>() + " forms within the rounding bound", [] {
    const auto c = *gen_linear_attention_case({.max_length = 100, .max_dim = 20}, Entries::fine);
    check_forms_within_bound<Scalar>(c);
    check_backward_within_bound<Scalar>(c);
  });
  EXPECT_TRUE(ok);
  std::cout << ref::scalar_name<Scalar>() << ": largest observed err/bound " << worst_ratio<Scalar>()
            << " (the bound is a worst case; 0 < ratio <= 1 shows it is both met and not vacuous)\n";
  EXPECT_GT(worst_ratio<Scalar>(), 0.0) << "no rounding happened: the inputs cannot exercise the bound";
}

TEST(LinearAttentionFloat, DoubleFormsWithinRoundingBound) { run_within_bound_property<double>(); }
TEST(LinearAttentionFloat, FloatFormsWithinRoundingBound) { run_within_bound_property<float>(); }

}  // namespace
}  // namespace deltaproof::testing
