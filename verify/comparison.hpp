// The one result type of deltaproof's verdicts: a candidate tensor (or kernel stage) against the
// oracle, as fields. Everything that prints, serialises or asserts on a verdict reads these
// fields; nothing parses a name or a message back.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace deltaproof::verify {

using Index = std::int64_t;

// How `error` and `bound` were measured, the way the bound is stated: entry by entry, as the 2-norm
// of one row (a token's vector), or as the Frobenius norm of a whole matrix (a state).
enum class Norm { elementwise, rowwise, frobenius };

// agree: the error is within the bound. disagree: it is not, and every premise of the bound holds.
// inconclusive: it is not, but the inputs lie outside a premise of the bound, so the bound says
// nothing there (a kernel may well be right); the premise is named with what was measured.
enum class Status { agree, disagree, inconclusive };

// A premise of a bound that the inputs break: which, the quantity measured, and what the premise
// allows (e.g. "u32·‖(I − |A|)⁻¹‖∞ over a 64-token chunk", 3.1, 0.5).
struct Premise {
  std::string reason;
  double measured = 0, limit = 0;
};

struct Comparison {
  std::string tensor;             // "o", "ht", "dq", … or a kernel stage ("W", "T16", "boundary")
  Index batch = -1, head = -1;    // worst (batch or varlen sequence, head); −1 where not applicable
  Index chunk = -1;               // worst chunk for stage checks; −1 for whole-sequence tensors
  std::vector<Index> index;       // worst entry (or row) in the tensor's own layout
  double error = 0;               // |candidate − oracle| at the worst entry (row norm for rowwise)
  double bound = 0;               // the derived bound there
  double ratio = 0;               // error / bound at the worst entry: the largest over the tensor
  double reference = 0;           // oracle value (or row norm) at the worst entry
  double max_abs = 0, rms = 0;    // over every entry, whatever the norm
  Index count = 0;                // entries compared
  Norm norm = Norm::elementwise;
  bool finite = true;             // false when the candidate holds NaN or Inf
  std::string formula;            // the bound as stated, e.g. "ε·M + u_out(|y| + ε·M), M = the form on |inputs|"
  std::optional<Premise> premise; // a premise of the bound the inputs break there (none: all hold)

  // Within the bound (finite, ratio ≤ 1): agree; outside it, inconclusive where a premise is broken.
  Status status() const;
  bool agrees() const { return status() == Status::agree; }
};

// Folds `other` (the same tensor elsewhere: another head, chunk) into `into`: the worse status wins
// (a non-finite disagreement first, then disagree, inconclusive, agree), then the larger ratio.
void merge_worst(Comparison& into, const Comparison& other);

struct Verdict {
  std::vector<Comparison> comparisons;  // one per judged tensor (or stage)
  // The double oracle's own rounding bound as a share of the kernel bound (at most 1 %, else the
  // High oracle is used) and how many (sequence, head) units fell back to High.
  double oracle_share = 0;
  Index units_in_high = 0, units = 0;

  // disagree if any row disagrees; else inconclusive if any row is; else agree.
  Status status() const;
  bool agrees() const { return status() == Status::agree; }
  bool inconclusive() const { return status() == Status::inconclusive; }
  // The broken premise of the first inconclusive row (none when no row is inconclusive).
  std::optional<Premise> premise() const;
  const Comparison* find(const std::string& tensor) const;
};

std::string name_of(Status s);  // "agree", "disagree", "inconclusive"
std::string name_of(Norm n);    // "elementwise", "rowwise", "frobenius"
// "‖I − β k kᵀ‖ = 19.8 > 1": a broken premise in one line.
std::string describe(const Premise& p);

nlohmann::json to_json(const Comparison& c);
nlohmann::json to_json(const Verdict& v);
// Aligned table, one row per comparison: tensor, how the error is measured, the error there, the
// bound, err/bound, the worst index, max abs and rms over all entries, the verdict; then each row's
// bound formula and each broken premise.
std::string format_table(const Verdict& v);

}  // namespace deltaproof::verify
