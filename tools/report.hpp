// Tables and JSON for the command line: one row per comparison, printed aligned.
#pragma once

#include "reference/error_report.hpp"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace deltaproof::tools {

// A table of comparisons "left vs right" of one quantity, with a verdict per row.
class ComparisonTable {
 public:
  explicit ComparisonTable(std::string title) : title_(std::move(title)) {}

  void add(const std::string& quantity, const std::string& left, const std::string& right,
           const ref::ErrorSummary& summary, bool pass) {
    rows_.push_back({quantity, left + " vs " + right, summary, pass});
  }
  bool all_pass() const {
    for (const auto& r : rows_)
      if (!r.pass) return false;
    return true;
  }
  void print(std::ostream& os) const {
    os << title_ << "\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-14s %-28s %12s %12s %12s  %s\n", "quantity", "forms", "max abs", "max rel",
                  "err/bound", "verdict");
    os << line;
    for (const auto& r : rows_) {
      std::snprintf(line, sizeof line, "  %-14s %-28s %12s %12s %12s  %s\n", r.quantity.c_str(), r.pair.c_str(),
                    format_ratio(r.summary.max_abs).c_str(), format_ratio(r.summary.max_rel).c_str(),
                    r.summary.has_bound ? format_ratio(r.summary.max_bound_ratio).c_str() : "-",
                    r.pass ? (r.summary.exact_zero() ? "exact" : "ok") : "FAIL");
      os << line;
      if (!r.pass) os << "    " << r.summary.describe() << "\n";
    }
  }

 private:
  struct Row {
    std::string quantity, pair;
    ref::ErrorSummary summary;
    bool pass;
  };
  static std::string format_ratio(double x) {  // "0" for an exact zero
    if (x == 0) return "0";
    char b[32];
    std::snprintf(b, sizeof b, "%.3e", x);
    return b;
  }
  std::string title_;
  std::vector<Row> rows_;
};

// Minimal JSON string escaping for the --json outputs.
inline std::string json_string(const std::string& s) {
  std::ostringstream o;
  o << '"';
  for (char c : s) {
    if (c == '"' || c == '\\') o << '\\' << c;
    else if (c == '\n') o << "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o << "\\u00" << "0123456789abcdef"[c >> 4] << "0123456789abcdef"[c & 15];
    else o << c;
  }
  o << '"';
  return o.str();
}

inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, "%.6e", x);
  return b;
}

}  // namespace deltaproof::tools
