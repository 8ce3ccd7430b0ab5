// Oracle matrices compared as verify::Comparison rows: a candidate block (one head, one chunk, one
// stage) against the oracle's block within an elementwise bound, or token by token in norm. The
// verdict is decided where the bound was computed (in Exact or High for the kernel stages); `ratio`
// is its double image, nudged across 1 only where rounding err/bound to double would flip that
// verdict, so `agrees()` always says what the exact comparison said. Printing reads the fields.
#pragma once

#include "reference/error_report.hpp"
#include "reference/scalar.hpp"
#include "verify/comparison.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace deltaproof::verify {

// Where a comparison sits: −1 where not applicable.
struct Location {
  Index batch = -1, head = -1, chunk = -1;
};

// The ratio of a comparison whose exact verdict is `within`: the double ratio, kept on its side of 1.
inline double ratio_with_verdict(double ratio, bool within) {
  if (within) return std::min(ratio, 1.0);
  return std::isnan(ratio) ? ratio : std::max(ratio, std::nextafter(1.0, 2.0));
}

// An ErrorSummary (reference/error_report.hpp, oracle against oracle or against a kernel) as a row.
// index is (row, column) of the compared block; without a bound the bound is 0 and a nonzero error
// disagrees (exact agreement is then the claim).
inline Comparison from_summary(const ref::ErrorSummary& s, Location at = {}) {
  Comparison c;
  c.tensor = s.name;
  c.batch = at.batch, c.head = at.head, c.chunk = at.chunk;
  c.count = s.count;
  c.max_abs = s.max_abs, c.rms = s.rms_abs;
  if (s.shape_mismatch) {
    c.ratio = std::numeric_limits<double>::infinity();
    return c;
  }
  if (s.worst_row >= 0) c.index = {Index(s.worst_row), Index(s.worst_col)};
  c.reference = s.reference_at_worst;
  if (s.has_bound) {
    c.bound = s.bound_at_worst;
    c.ratio = ratio_with_verdict(s.max_bound_ratio, s.within_bound);
    // ErrorSummary keeps the error at the worst-ratio entry only through the ratio and the bound.
    c.error = c.bound > 0 ? s.max_bound_ratio * c.bound : s.max_abs;
  } else {
    c.error = s.max_abs;
    c.ratio = s.max_abs == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
  return c;
}

// |candidate − reference| <= bound entry by entry, decided in T (Exact or High).
template <class T>
Comparison compare_within(const std::string& tensor, const ref::Matrix<T>& candidate, const ref::Matrix<T>& reference,
                          const ref::Matrix<T>& bound, Location at = {}) {
  return from_summary(ref::compare<T>(tensor, candidate, reference, bound), at);
}

// Token-wise normwise agreement over heads (head index hd = b·heads + h):
//   ‖ĉ_t − c_t‖ <= τ (‖c_t‖ + RMS_t ‖c_t‖) [+ f (‖m_t‖ + RMS_t ‖m_t‖)] for every row t,
// the bracket where `magnitude` (m, per head, the terms' absolute sums) is given, with f = floor_unit.
// One rowwise row: the worst token by error/allowed, index {t}; max_abs and rms over every entry.
inline Comparison compare_rows_normwise(const std::string& tensor, const std::vector<ref::Matrix<double>>& candidate,
                                        const std::vector<ref::Matrix<double>>& reference, double tau, Index heads,
                                        const std::vector<ref::Matrix<double>>* magnitude = nullptr, double floor_unit = 0) {
  Comparison worst;
  worst.tensor = tensor;
  worst.norm = Norm::rowwise;
  double sum_sq = 0, worst_key = -1;
  for (size_t hd = 0; hd < reference.size(); ++hd) {
    const ref::Matrix<double>& ref_m = reference[hd];
    const ref::Matrix<double> diff = candidate[hd] - ref_m;
    sum_sq += diff.squaredNorm();
    worst.count += diff.size();
    if (diff.size()) worst.max_abs = std::max(worst.max_abs, diff.cwiseAbs().maxCoeff());
    if (!candidate[hd].allFinite()) worst.finite = false;
    const double rms = std::sqrt(ref_m.squaredNorm() / double(std::max<Index>(1, ref_m.rows())));
    const ref::Matrix<double>* mag = magnitude != nullptr ? &(*magnitude)[hd] : nullptr;
    const double mag_rms = mag != nullptr ? std::sqrt(mag->squaredNorm() / double(std::max<Index>(1, mag->rows()))) : 0.0;
    for (Index t = 0; t < ref_m.rows(); ++t) {
      const double err = diff.row(t).norm();
      const double allowed = tau * (ref_m.row(t).norm() + rms) + (mag != nullptr ? floor_unit * (mag->row(t).norm() + mag_rms) : 0.0);
      const double ratio = ratio_with_verdict(allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0.0), err <= allowed);
      const double key = std::isnan(ratio) ? INFINITY : ratio;  // a NaN row is the worst
      if (key > worst_key) {
        worst_key = key;
        worst.batch = heads > 0 ? Index(hd) / heads : 0, worst.head = heads > 0 ? Index(hd) % heads : Index(hd);
        worst.index = {t};
        worst.error = err, worst.bound = allowed, worst.ratio = ratio, worst.reference = ref_m.row(t).norm();
      }
    }
  }
  worst.rms = worst.count ? std::sqrt(sum_sq / double(worst.count)) : 0.0;
  return worst;
}

// One row per tensor name (in order of first appearance): the worst of its rows (merge_worst).
inline std::vector<Comparison> worst_per_tensor(const std::vector<Comparison>& rows) {
  std::vector<Comparison> worst;
  for (const Comparison& c : rows) {
    auto it = std::find_if(worst.begin(), worst.end(), [&](const Comparison& w) { return w.tensor == c.tensor; });
    if (it == worst.end()) worst.push_back(c);
    else merge_worst(*it, c);
  }
  return worst;
}

inline bool all_agree(const std::vector<Comparison>& rows) {
  return std::all_of(rows.begin(), rows.end(), [](const Comparison& c) { return c.agrees(); });
}

inline std::string number_text(double x) {
  if (x == 0) return "0";
  char b[32];
  std::snprintf(b, sizeof b, "%.3e", x);
  return b;
}

// "(b, h, chunk c) [i, j]": the worst entry's place, leaving out what does not apply.
inline std::string location_text(const Comparison& c) {
  std::string s;
  if (c.batch >= 0 || c.head >= 0) s += "b=" + std::to_string(c.batch) + " h=" + std::to_string(c.head) + " ";
  if (c.chunk >= 0) s += "chunk=" + std::to_string(c.chunk) + " ";
  s += c.norm == Norm::rowwise ? "row " : c.norm == Norm::frobenius ? "whole " : "";
  s += "(";
  for (size_t i = 0; i < c.index.size(); ++i) s += (i ? ", " : "") + std::to_string(c.index[i]);
  return s + ")";
}

// One line: tensor, place, error and bound at the worst entry, err/bound, max and RMS over all.
inline std::string describe(const Comparison& c) {
  return c.tensor + " at " + location_text(c) + ": error " + number_text(c.error) + ", bound " + number_text(c.bound) +
         ", err/bound " + (c.finite ? number_text(c.ratio) : std::string("non-finite")) + ", max abs " +
         number_text(c.max_abs) + ", rms " + number_text(c.rms) +
         (c.status() == Status::agree          ? ""
          : c.status() == Status::inconclusive ? "  INCONCLUSIVE (" + describe(*c.premise) + ")"
                                               : "  OUTSIDE BOUND");
}

// Every row that disagrees, one per line (empty when all agree).
inline std::string describe_failures(const std::vector<Comparison>& rows) {
  std::string s;
  for (const Comparison& c : rows)
    if (!c.agrees()) s += describe(c) + "\n";
  return s;
}

// An aligned table: an optional label column (e.g. which kernel), then the fields.
inline std::string format_rows(const std::vector<Comparison>& rows, const std::vector<std::string>& labels = {}) {
  std::string out;
  char line[512];
  const bool labelled = !labels.empty();
  std::snprintf(line, sizeof line, "  %-14s %-18s %-28s %11s %11s %11s %11s %11s  %s\n", "tensor", labelled ? "kernel" : "",
                "worst at", "error", "bound", "err/bound", "max abs", "rms", "verdict");
  out += line;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Comparison& c = rows[i];
    std::snprintf(line, sizeof line, "  %-14s %-18s %-28s %11s %11s %11s %11s %11s  %s\n", c.tensor.c_str(),
                  labelled && i < labels.size() ? labels[i].c_str() : "", location_text(c).c_str(), number_text(c.error).c_str(),
                  number_text(c.bound).c_str(), c.finite ? number_text(c.ratio).c_str() : "non-finite",
                  number_text(c.max_abs).c_str(), number_text(c.rms).c_str(),
                  c.status() == Status::agree ? "agree" : c.status() == Status::inconclusive ? "INCONCLUSIVE" : "DISAGREE");
    out += line;
  }
  return out;
}

}  // namespace deltaproof::verify
