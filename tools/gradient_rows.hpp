// `deltaproof gradcheck` on the reference: analytic gradients (High) against central differences
// of the forward in High, element by element, one row per tensor, printed as a table or as JSON.
// An element passes when |fd − analytic| < 10^-digits · max(|analytic|, tensor scale), where the
// tensor scale (its largest |analytic| entry) stands in for exact zeros.
#pragma once

#include "reference/error_report.hpp"
#include "reference/gradcheck.hpp"
#include "tools/commands.hpp"
#include "tools/report.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace deltaproof::tools {

struct GradientRow {
  std::string tensor;
  ref::ErrorSummary summary;
  double worst_relative;
  bool pass;
};

inline std::vector<GradientRow> gradient_rows(const ref::Params<ref::High>& analytic, const ref::Params<ref::High>& numeric,
                                              int digits) {
  using ref::High;
  const High tolerance = pow(High(10), -digits);
  std::vector<GradientRow> rows;
  for (size_t p = 0; p < analytic.size(); ++p) {
    const ref::Matrix<High>& a = analytic[p].value;
    const High scale = a.cwiseAbs().maxCoeff();
    High worst(0);
    for (ref::Index i = 0; i < a.rows(); ++i)
      for (ref::Index j = 0; j < a.cols(); ++j) {
        const High denom = std::max(High(abs(a(i, j))), scale);
        if (denom > 0) worst = std::max(worst, High(abs(numeric[p].value(i, j) - a(i, j)) / denom));
      }
    rows.push_back({analytic[p].name, ref::compare<High>(analytic[p].name, numeric[p].value, a), ref::to_double(worst),
                    worst < tolerance});
  }
  return rows;
}

inline bool all_pass(const std::vector<GradientRow>& rows) {
  return std::all_of(rows.begin(), rows.end(), [](const GradientRow& r) { return r.pass; });
}

// The JSON field "rows": [{"tensor", "max_abs", "max_rel", "rms", "worst_index", "pass"}, …].
inline void print_gradient_rows_json(const std::vector<GradientRow>& rows) {
  std::cout << "\"rows\": [";
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& s = rows[r].summary;
    std::cout << (r ? ", " : "") << "{\"tensor\": " << json_string(rows[r].tensor) << ", \"max_abs\": " << json_number(s.max_abs)
              << ", \"max_rel\": " << json_number(rows[r].worst_relative) << ", \"rms\": " << json_number(s.rms_abs)
              << ", \"worst_index\": [" << s.worst_row << ", " << s.worst_col << "], \"pass\": " << (rows[r].pass ? "true" : "false")
              << "}";
  }
  std::cout << "]";
}

// The method line and one table row per tensor.
inline void print_gradient_rows_table(const CaseOptions& o, const std::vector<GradientRow>& rows) {
  std::cout << "form: " << o.form << "; analytic backward vs central differences in High (100 digits), step " << o.step
            << ", pass below 1e-" << o.digits << " relative\n\n";
  std::printf("  %-6s %12s %12s %12s  %-12s %s\n", "tensor", "max abs", "max rel", "rms", "worst", "verdict");
  for (const auto& r : rows) {
    char worst[48];
    std::snprintf(worst, sizeof worst, "(%ld, %ld)", static_cast<long>(r.summary.worst_row), static_cast<long>(r.summary.worst_col));
    std::printf("  %-6s %12.3e %12.3e %12.3e  %-12s %s\n", r.tensor.c_str(), r.summary.max_abs, r.worst_relative,
                r.summary.rms_abs, worst, r.pass ? "pass" : "FAIL");
  }
}

}  // namespace deltaproof::tools
