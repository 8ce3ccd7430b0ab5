// Error summaries in the style of Boost.Math: max and RMS, the worst index, and the bound.
#pragma once

#include "reference/scalar.hpp"

#include <cmath>
#include <optional>
#include <sstream>
#include <string>

namespace deltaproof::ref {

struct ErrorSummary {
  std::string name;
  Index count = 0;
  double max_abs = 0, rms_abs = 0, max_rel = 0;  // rel = |err| / |reference|, over nonzero references
  Index worst_row = -1, worst_col = -1;          // where |err| is largest (or err/bound, with a bound)
  double reference_at_worst = 0;
  // With an elementwise bound: the largest err/bound and whether every |err_ij| <= bound_ij.
  bool has_bound = false, within_bound = true;
  double max_bound_ratio = 0, bound_at_worst = 0;
  bool shape_mismatch = false;

  bool exact_zero() const { return !shape_mismatch && max_abs == 0; }
  std::string describe() const {
    std::ostringstream s;
    s.precision(3);
    s << name << ": ";
    if (shape_mismatch) return s.str() + "shape mismatch";
    s << std::scientific << "max abs " << max_abs << ", rms " << rms_abs << ", max rel " << max_rel;
    if (worst_row >= 0) s << ", worst (" << worst_row << ", " << worst_col << ") ref " << reference_at_worst;
    if (has_bound) s << ", bound there " << bound_at_worst << ", max err/bound " << max_bound_ratio
                     << (within_bound ? " (within bound)" : " (OUTSIDE bound)");
    return s.str();
  }
};

// A matrix as rows of exact values ("-3/4 1 0"), for counterexamples and the command line.
template <class T>
std::string format_matrix(const Matrix<T>& m) {
  std::ostringstream s;
  for (Index i = 0; i < m.rows(); ++i) {
    s << "  [";
    for (Index j = 0; j < m.cols(); ++j) {
      if (j) s << ' ';
      if constexpr (is_boost_v<T>) s << m(i, j).str();
      else s << m(i, j);
    }
    s << "]\n";
  }
  return s.str();
}

// Compares candidate with reference in the scalar T (use Exact for exact error). Optional
// elementwise bound: the comparison passes iff |candidate − reference| <= bound everywhere.
template <class T>
ErrorSummary compare(const std::string& name, const Matrix<T>& candidate, const Matrix<T>& reference,
                     const std::optional<Matrix<T>>& bound = std::nullopt) {
  ErrorSummary r;
  r.name = name;
  if (candidate.rows() != reference.rows() || candidate.cols() != reference.cols() ||
      (bound && (bound->rows() != reference.rows() || bound->cols() != reference.cols()))) {
    r.shape_mismatch = r.has_bound = true;
    r.within_bound = false;
    return r;
  }
  r.count = reference.size();
  r.has_bound = bound.has_value();
  double sum_sq = 0, worst_key = -1;
  for (Index i = 0; i < reference.rows(); ++i)
    for (Index j = 0; j < reference.cols(); ++j) {
      const T diff = candidate(i, j) - reference(i, j);
      const T abs_diff = diff < T(0) ? T(-diff) : diff;
      const double err = to_double(abs_diff);
      const double ref = to_double(reference(i, j));
      sum_sq += err * err;
      r.max_abs = std::max(r.max_abs, err);
      if (ref != 0) r.max_rel = std::max(r.max_rel, err / std::abs(ref));
      double key = err;
      if (bound) {
        const T& b = (*bound)(i, j);
        if (abs_diff > b) r.within_bound = false;
        const double bd = to_double(b);
        const double ratio = bd > 0 ? err / bd : (err > 0 ? INFINITY : 0.0);
        r.max_bound_ratio = std::max(r.max_bound_ratio, ratio);
        key = ratio;
      }
      if (key > worst_key) {
        worst_key = key;
        r.worst_row = i, r.worst_col = j, r.reference_at_worst = ref;
        if (bound) r.bound_at_worst = to_double((*bound)(i, j));
      }
    }
  r.rms_abs = r.count ? std::sqrt(sum_sq / static_cast<double>(r.count)) : 0.0;
  return r;
}

// Relative L2 error ‖candidate − reference‖ / ‖reference‖, the figure the design page's accuracy targets quote.
template <class T>
double relative_l2(const Matrix<T>& candidate, const Matrix<T>& reference) {
  const T num = (candidate - reference).cwiseProduct(candidate - reference).sum();
  const T den = reference.cwiseProduct(reference).sum();
  const double d = to_double(den);
  return d == 0 ? (to_double(num) == 0 ? 0.0 : INFINITY) : std::sqrt(to_double(num) / d);
}

}  // namespace deltaproof::ref
