// Assertions for property suites (rapidcheck only sees RC_ASSERT / RC_FAIL).
#pragma once

#include "reference/error_report.hpp"

#include <rapidcheck.h>

#include <string>

namespace deltaproof::testing {

// Exact equality over ℚ; on failure the message carries max/RMS error and the worst index.
template <class Scalar>
void require_equal(const std::string& what, const ref::Matrix<Scalar>& candidate, const ref::Matrix<Scalar>& reference) {
  if (candidate.rows() == reference.rows() && candidate.cols() == reference.cols() && candidate == reference) return;
  RC_FAIL(what + " differs: " + ref::compare(what, candidate, reference).describe());
}

// |candidate − reference| <= bound elementwise, everything compared in Exact.
template <class Scalar>
void require_within(const std::string& what, const ref::Matrix<Scalar>& candidate,
                    const ref::Matrix<ref::Exact>& reference, const ref::Matrix<ref::Exact>& bound) {
  const auto summary = ref::compare<ref::Exact>(what, ref::matrix_cast<ref::Exact>(candidate), reference, bound);
  if (!summary.within_bound) RC_FAIL(what + " outside its rounding bound: " + summary.describe());
}

}  // namespace deltaproof::testing
