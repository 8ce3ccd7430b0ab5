// Conditioning of the WY triangular systems, reported rather than hidden.
//
// For unnormalized keys the entries of T = A⁻¹ grow quickly with the chunk size C (A's
// off-diagonal entries β_r k_rᵀ k_i are then large, and forward substitution multiplies them
// along every path). A floating-point chunkwise form inherits that growth as cancellation in
// W, U and V̄ = U − W S_[c]ᵀ, while the token recurrence does not see T at all. This header
// measures both for a given input: max|T| over the chunks (exact), and the error of the
// chunkwise form and of the token recurrence in a floating type against the exact oracle.
#pragma once

#include "reference/error_report.hpp"
#include "reference/gated_delta_rule.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace deltaproof::ref {

struct ConditioningRow {
  Index chunk_size = 0;
  double max_abs_t = 0;                    // max |T_ij| over all chunks, from the exact T
  double max_abs_w = 0, max_abs_u = 0;     // max |W_ij|, |U_ij|: what a kernel stores
  double chunkwise_relative_l2 = 0;        // ‖O_float − O‖ / ‖O‖, chunkwise form in the floating type
  double chunkwise_max_abs = 0;            // max |O_float − O|
  double chunkwise_worst_row = 0;          // max over tokens t of ‖o_t,float − o_t‖ / ‖o_t‖ (small early rows included)
  double recurrence_relative_l2 = 0;       // the same for the token recurrence (independent of C)
  double recurrence_worst_row = 0;
  bool chunkwise_finite = true;            // false when the floating output overflowed (inf or NaN)
  bool recurrence_finite = true;
  double max_abs_output = 0;               // max |O_ij| of the exact output, for scale
};

namespace detail {
template <class Scalar>
double max_abs(const Matrix<Scalar>& m) {
  double out = 0;
  for (Index i = 0; i < m.rows(); ++i)
    for (Index j = 0; j < m.cols(); ++j) out = std::max(out, std::abs(to_double(m(i, j))));
  return out;
}

template <class Float, class In, class ChunkwiseFn, class RecurrenceFn, class CastFn>
std::vector<ConditioningRow> conditioning(const In& exact_in, const std::vector<Index>& chunk_sizes, ChunkwiseFn&& chunkwise,
                                          RecurrenceFn&& recurrence, CastFn&& cast) {
  const Matrix<Exact> reference = recurrence(exact_in).output;  // (L, DV), exact
  const auto float_in = cast(exact_in);
  const Matrix<Float> recurrent = recurrence(float_in).output;
  // Errors in Exact; an output that overflowed counts as an infinite error.
  struct Errors {
    double relative_l2 = INFINITY, max_abs = INFINITY, worst_row = INFINITY;
  };
  auto error_of = [&](const Matrix<Float>& out) {
    Errors e;
    if (!out.allFinite()) return e;
    const Matrix<Exact> candidate = matrix_cast<Exact>(out);
    e.relative_l2 = relative_l2(candidate, reference);
    e.max_abs = compare<Exact>("output", candidate, reference).max_abs;
    e.worst_row = 0;
    for (Index t = 0; t < reference.rows(); ++t)
      e.worst_row = std::max(e.worst_row, relative_l2<Exact>(candidate.row(t), reference.row(t)));
    return e;
  };
  const Errors recurrence_error = error_of(recurrent);
  std::vector<ConditioningRow> rows;
  for (Index c : chunk_sizes) {
    ConditioningRow row;
    row.chunk_size = c;
    const auto exact = chunkwise(exact_in, c);
    for (const auto& x : exact.chunks) {
      row.max_abs_t = std::max(row.max_abs_t, max_abs(x.t));
      row.max_abs_w = std::max(row.max_abs_w, max_abs(x.w));
      row.max_abs_u = std::max(row.max_abs_u, max_abs(x.u));
    }
    const Matrix<Float> out = chunkwise(float_in, c).output;
    row.chunkwise_finite = out.allFinite();
    const Errors chunk_error = error_of(out);
    row.chunkwise_relative_l2 = chunk_error.relative_l2;
    row.chunkwise_max_abs = chunk_error.max_abs;
    row.chunkwise_worst_row = chunk_error.worst_row;
    row.recurrence_finite = recurrent.allFinite();
    row.recurrence_relative_l2 = recurrence_error.relative_l2;
    row.recurrence_worst_row = recurrence_error.worst_row;
    row.max_abs_output = max_abs(reference);
    rows.push_back(row);
  }
  return rows;
}
}  // namespace detail

// Per chunk size: max|T| and the error of Float's chunkwise form and token recurrence against the
// exact oracle, all on the same inputs (exactly representable in Float, e.g. RandomDyadic's).
template <class Float>
std::vector<ConditioningRow> conditioning(const delta_rule::Inputs<Exact>& in, const std::vector<Index>& chunk_sizes) {
  return detail::conditioning<Float>(
      in, chunk_sizes, [](const auto& x, Index c) { return delta_rule::chunkwise(x, c); },
      [](const auto& x) { return delta_rule::token_recurrence_read_correct_write(x); },
      [](const auto& x) { return delta_rule::cast<Float>(x); });
}

template <class Float>
std::vector<ConditioningRow> conditioning(const gated_delta_rule::Inputs<Exact>& in, const std::vector<Index>& chunk_sizes) {
  return detail::conditioning<Float>(
      in, chunk_sizes, [](const auto& x, Index c) { return gated_delta_rule::chunkwise(x, c); },
      [](const auto& x) { return gated_delta_rule::token_recurrence_read_correct_write(x); },
      [](const auto& x) { return gated_delta_rule::cast<Float>(x); });
}

}  // namespace deltaproof::ref
