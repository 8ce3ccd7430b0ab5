// The one result type of deltaproof's verdicts: a candidate tensor (or kernel stage) against the
// oracle, as fields. Everything that prints, serialises or asserts on a verdict reads these
// fields; nothing parses a name or a message back.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace deltaproof::verify {

using Index = std::int64_t;

// How `error` and `bound` were measured: entry by entry, or as the 2-norm of one row (a token's
// vector, or a whole state matrix in Frobenius norm).
enum class Norm { elementwise, rowwise };

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

  bool agrees() const { return finite && ratio <= 1.0; }
};

// Folds `other` (the same tensor elsewhere: another head, chunk) into `into`: worst ratio wins.
void merge_worst(Comparison& into, const Comparison& other);

struct Verdict {
  std::vector<Comparison> comparisons;  // one per judged tensor (or stage)
  // The double oracle's own rounding bound as a share of the kernel bound (DESIGN: ≤ 1 %, else the
  // High oracle is used) and how many (sequence, head) units fell back to High.
  double oracle_share = 0;
  Index units_in_high = 0, units = 0;

  bool agrees() const;
  const Comparison* find(const std::string& tensor) const;
};

nlohmann::json to_json(const Comparison& c);
nlohmann::json to_json(const Verdict& v);
// Aligned table, one row per comparison: tensor, max abs, rms, bound, err/bound, worst, verdict.
std::string format_table(const Verdict& v);

}  // namespace deltaproof::verify
