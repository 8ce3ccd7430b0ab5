#include "verify/comparison.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace deltaproof::verify {

void merge_worst(Comparison& into, const Comparison& other) {
  const double total_sq = into.rms * into.rms * double(into.count) + other.rms * other.rms * double(other.count);
  const Index count = into.count + other.count;
  const double max_abs = std::max(into.max_abs, other.max_abs);
  const bool finite = into.finite && other.finite;
  // NaN ratios (a non-finite candidate) always win, then the larger ratio.
  const bool other_worse = into.count == 0 || (!other.finite && into.finite) ||
                           (other.finite == into.finite && other.ratio > into.ratio);
  if (other_worse) {
    const std::string tensor = into.tensor.empty() ? other.tensor : into.tensor;
    into = other;
    into.tensor = tensor;
  }
  into.count = count;
  into.max_abs = max_abs;
  into.finite = finite;
  into.rms = count ? std::sqrt(total_sq / double(count)) : 0.0;
}

bool Verdict::agrees() const {
  for (const auto& c : comparisons)
    if (!c.agrees()) return false;
  return true;
}

const Comparison* Verdict::find(const std::string& tensor) const {
  for (const auto& c : comparisons)
    if (c.tensor == tensor) return &c;
  return nullptr;
}

static nlohmann::json number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

nlohmann::json to_json(const Comparison& c) {
  return {{"tensor", c.tensor},
          {"batch", c.batch},
          {"head", c.head},
          {"chunk", c.chunk},
          {"index", c.index},
          {"error", number(c.error)},
          {"bound", number(c.bound)},
          {"ratio", number(c.ratio)},
          {"reference", number(c.reference)},
          {"max_abs", number(c.max_abs)},
          {"rms", number(c.rms)},
          {"count", c.count},
          {"norm", c.norm == Norm::elementwise ? "elementwise" : "rowwise"},
          {"finite", c.finite},
          {"agrees", c.agrees()}};
}

nlohmann::json to_json(const Verdict& v) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : v.comparisons) rows.push_back(to_json(c));
  return {{"agrees", v.agrees()},
          {"oracle_share", number(v.oracle_share)},
          {"units", v.units},
          {"units_in_high", v.units_in_high},
          {"comparisons", rows}};
}

static std::string sci(double x) {
  if (x == 0) return "0";
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return "inf";
  char b[32];
  std::snprintf(b, sizeof b, "%.3e", x);
  return b;
}

static std::string index_string(const std::vector<Index>& index) {
  std::string s = "(";
  for (size_t i = 0; i < index.size(); ++i) s += (i ? ", " : "") + std::to_string(index[i]);
  return s + ")";
}

std::string format_table(const Verdict& v) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "  %-8s %11s %11s %11s %11s  %-22s %s\n", "tensor", "max abs", "rms", "bound",
                "err/bound", "worst", "verdict");
  os << line;
  for (const auto& c : v.comparisons) {
    std::snprintf(line, sizeof line, "  %-8s %11s %11s %11s %11s  %-22s %s\n", c.tensor.c_str(), sci(c.max_abs).c_str(),
                  sci(c.rms).c_str(), sci(c.bound).c_str(), c.finite ? sci(c.ratio).c_str() : "non-finite",
                  index_string(c.index).c_str(), c.agrees() ? "agree" : "DISAGREE");
    os << line;
  }
  return os.str();
}

}  // namespace deltaproof::verify
