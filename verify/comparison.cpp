#include "verify/comparison.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace deltaproof::verify {

Status Comparison::status() const {
  if (finite && ratio <= 1.0) return Status::agree;
  return premise ? Status::inconclusive : Status::disagree;
}

static int severity(const Comparison& c) {
  switch (c.status()) {
    case Status::disagree: return c.finite ? 3 : 4;
    case Status::inconclusive: return 2;
    default: return 1;
  }
}

void merge_worst(Comparison& into, const Comparison& other) {
  const double total_sq = into.rms * into.rms * double(into.count) + other.rms * other.rms * double(other.count);
  const Index count = into.count + other.count;
  const double max_abs = std::max(into.max_abs, other.max_abs);
  const bool finite = into.finite && other.finite;
  const int a = severity(into), b = severity(other);
  const bool other_worse = into.count == 0 || b > a || (b == a && (std::isnan(other.ratio) || other.ratio > into.ratio));
  if (other_worse) {
    const std::string tensor = into.tensor.empty() ? other.tensor : into.tensor;
    into = other;
    into.tensor = tensor;
  }
  into.count = count;
  into.max_abs = max_abs;
  into.rms = count ? std::sqrt(total_sq / double(count)) : 0.0;
  (void)finite;  // the worst row's own finiteness decides its status; max_abs and rms cover all
}

Status Verdict::status() const {
  Status s = Status::agree;
  for (const auto& c : comparisons) {
    const Status r = c.status();
    if (r == Status::disagree) return r;
    if (r == Status::inconclusive) s = r;
  }
  return s;
}

std::optional<Premise> Verdict::premise() const {
  for (const auto& c : comparisons)
    if (c.status() == Status::inconclusive) return c.premise;
  return std::nullopt;
}

const Comparison* Verdict::find(const std::string& tensor) const {
  for (const auto& c : comparisons)
    if (c.tensor == tensor) return &c;
  return nullptr;
}

std::string name_of(Status s) {
  switch (s) {
    case Status::agree: return "agree";
    case Status::disagree: return "disagree";
    default: return "inconclusive";
  }
}

std::string name_of(Norm n) {
  switch (n) {
    case Norm::elementwise: return "elementwise";
    case Norm::rowwise: return "rowwise";
    default: return "frobenius";
  }
}

static nlohmann::json number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

static std::string short_number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

std::string describe(const Premise& p) {
  return p.reason + " = " + short_number(p.measured) + " > " + short_number(p.limit);
}

static nlohmann::json premise_json(const std::optional<Premise>& p) {
  if (!p) return nullptr;
  return {{"reason", p->reason}, {"measured", number(p->measured)}, {"limit", number(p->limit)}, {"text", describe(*p)}};
}

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
          {"norm", name_of(c.norm)},
          {"formula", c.formula},
          {"finite", c.finite},
          {"status", name_of(c.status())},
          {"premise", premise_json(c.status() == Status::inconclusive ? c.premise : std::nullopt)},
          {"agrees", c.agrees()}};
}

nlohmann::json to_json(const Verdict& v) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : v.comparisons) rows.push_back(to_json(c));
  return {{"status", name_of(v.status())},
          {"agrees", v.agrees()},
          {"inconclusive", v.inconclusive()},
          {"premise", premise_json(v.premise())},
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

static const char* norm_label(Norm n) {
  switch (n) {
    case Norm::elementwise: return "entry";
    case Norm::rowwise: return "row norm";
    default: return "Frobenius";
  }
}

std::string format_table(const Verdict& v) {
  std::ostringstream os;
  char line[512];
  // error and bound are measured the same way (the norm column), at the worst place (largest err/bound).
  std::snprintf(line, sizeof line, "  %-8s %-10s %11s %11s %11s  %-22s %11s %11s  %s\n", "tensor", "measured", "error",
                "bound", "err/bound", "worst", "max abs", "rms", "verdict");
  os << line;
  for (const auto& c : v.comparisons) {
    const Status s = c.status();
    std::snprintf(line, sizeof line, "  %-8s %-10s %11s %11s %11s  %-22s %11s %11s  %s\n", c.tensor.c_str(), norm_label(c.norm),
                  sci(c.error).c_str(), sci(c.bound).c_str(), c.finite ? sci(c.ratio).c_str() : "non-finite",
                  index_string(c.index).c_str(), sci(c.max_abs).c_str(), sci(c.rms).c_str(),
                  s == Status::agree ? "agree" : s == Status::disagree ? "DISAGREE" : "INCONCLUSIVE");
    os << line;
  }
  bool any_formula = false;
  for (const auto& c : v.comparisons) any_formula = any_formula || !c.formula.empty();
  if (any_formula) {
    os << "  bounds:\n";
    for (const auto& c : v.comparisons)
      if (!c.formula.empty()) os << "    " << c.tensor << ": " << c.formula << "\n";
  }
  for (const auto& c : v.comparisons)
    if (c.status() == Status::inconclusive)
      os << "  " << c.tensor << " inconclusive, outside the bound's premise: " << describe(*c.premise) << "\n";
  return os.str();
}

}  // namespace deltaproof::verify
