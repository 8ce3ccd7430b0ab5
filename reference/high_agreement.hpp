// Agreement of two High evaluations that differ in formula, not in value (TTT-MLP primal vs dual,
// LaCT's update vs a dual-number gradient, Newton–Schulz identities).
//
// Each entry passes through at most 10⁴ roundings of relative size u = 10⁻⁹⁹ for the shapes the
// tests use, and the smooth steps (GELU, SiLU, softmax, norms, a few chained gradient steps on
// entries <= 2) amplify a perturbation by far less than 10³⁰; so |a − b| <= 10⁻⁶⁰·(1 + max|b|)
// holds with margin, while a formula difference shows at the inputs' granularity (2⁻²), some
// sixty digits higher. A failure against this bound is a different formula, not rounding.
// A gradient descent that diverges (its entries squared or cubed each step) breaks the premise:
// there the gap is chaotic, so callers keep to runs whose entries stay moderate (the TTT
// command's small inner step; the MLP property discards the draws that diverge).
#pragma once

#include "reference/scalar.hpp"

namespace deltaproof::ref {

inline Exact high_agreement_relative_bound() { return Exact(1) / Exact(boost::multiprecision::pow(boost::multiprecision::mpz_int(10), 60)); }

template <class Scalar>
Matrix<Exact> high_agreement_bound(const Matrix<Scalar>& reference) {
  Exact scale(1);
  for (Index i = 0; i < reference.rows(); ++i)
    for (Index j = 0; j < reference.cols(); ++j) {
      const Exact a = abs(scalar_cast<Exact>(reference(i, j)));
      if (a + 1 > scale) scale = a + 1;
    }
  return Matrix<Exact>::Constant(reference.rows(), reference.cols(), scale * high_agreement_relative_bound());
}

}  // namespace deltaproof::ref
