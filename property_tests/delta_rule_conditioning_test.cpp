// Conditioning of the WY systems, documented with measured numbers (not hidden).
//
// Input family: RandomDyadic(7), DK = DV = 16, β = 1, entries n/4 with |n| <= 8, so keys are
// unnormalized (‖k‖² up to 64, β‖k‖² far above 2): every M_t = I − β k_t k_tᵀ then has an
// eigenvalue 1 − β‖k_t‖² of modulus > 1, so the exact state grows geometrically, and so does
// T = A⁻¹ with C (T encodes the in-chunk prefix products). What these tests establish:
//   1. max|T| grows geometrically with C: past 1e8 at C = 16 and past 1e30 at C = 64 here,
//      matching public reports of T past 1e10; with small keys (β‖k‖² <= 1) it stays near 1.
//   2. That growth alone does not break float: as long as the exact output fits in float's
//      range, the float chunkwise output is as accurate as the float token recurrence
//      (relative L2 and worst-row error within 4× of the recurrence's, ~1e-6).
//   3. float breaks down where the exact dynamics leave its range: at L = 80 the exact output
//      reaches 3e43 > FLT_MAX, and both the chunkwise form (every C) and the recurrence
//      overflow. No chunk size rescues it; only normalized keys (or β‖k‖² <= 2) do.
#include "reference/delta_conditioning.hpp"
#include "reference/random_inputs.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <iostream>

namespace deltaproof::ref {
namespace {

delta_rule::Inputs<Exact> unnormalized_input(Index length, int key_numerator = 8, int key_denominator = 4) {
  RandomDyadic rng(7);
  const Index dim = 16;
  delta_rule::Inputs<Exact> in{rng.matrix<Exact>(length, dim), rng.matrix<Exact>(length, dim, key_numerator, key_denominator),
                               rng.matrix<Exact>(length, dim), Vector<Exact>::Ones(length), std::nullopt};
  return in;
}

void print(const std::string& title, const std::vector<ConditioningRow>& rows) {
  std::cout << title << "\n     C        max|T|   float chunkwise rel L2 (worst row)   float recurrence rel L2 (worst row)\n";
  for (const auto& r : rows)
    std::cout << "  " << r.chunk_size << "\t" << r.max_abs_t << "\t" << r.chunkwise_relative_l2 << " (" << r.chunkwise_worst_row
              << ")\t" << r.recurrence_relative_l2 << " (" << r.recurrence_worst_row << ")\n";
}

TEST(DeltaRuleConditioning, MaxTGrowsGeometricallyWithChunkSizeForUnnormalizedKeys) {
  const auto rows = conditioning<float>(unnormalized_input(64), {1, 8, 16, 32, 64});
  print("L = 64, unnormalized keys", rows);
  EXPECT_EQ(rows[0].max_abs_t, 1.0);  // C = 1: T = [1]
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_GT(rows[i].max_abs_t, rows[i - 1].max_abs_t) << "C = " << rows[i].chunk_size;
  EXPECT_GT(rows[2].max_abs_t, 1e8);   // C = 16
  EXPECT_GT(rows[3].max_abs_t, 1e10);  // C = 32
  EXPECT_GT(rows[4].max_abs_t, 1e30);  // C = 64
}

TEST(DeltaRuleConditioning, LargeTAloneDoesNotBreakFloat) {
  const auto rows = conditioning<float>(unnormalized_input(64), {1, 8, 16, 32, 64});
  for (const auto& r : rows) {
    ASSERT_TRUE(r.chunkwise_finite && r.recurrence_finite) << "C = " << r.chunk_size;
    EXPECT_LE(r.chunkwise_relative_l2, 4 * r.recurrence_relative_l2) << "C = " << r.chunk_size;
    EXPECT_LE(r.chunkwise_worst_row, 4 * r.recurrence_worst_row) << "C = " << r.chunk_size;
  }
}

TEST(DeltaRuleConditioning, FloatBreaksDownWhereTheExactOutputLeavesItsRange) {
  const auto rows = conditioning<float>(unnormalized_input(80), {1, 16, 64});
  print("L = 80, unnormalized keys", rows);
  for (const auto& r : rows) {
    EXPECT_GT(r.max_abs_output, FLT_MAX);
    EXPECT_FALSE(r.chunkwise_finite) << "C = " << r.chunk_size;
    EXPECT_FALSE(r.recurrence_finite);
  }
}

TEST(DeltaRuleConditioning, SmallKeysKeepTNearOne) {
  // Entries n/8 with |n| <= 2: ‖k‖² <= 1, so β‖k‖² <= 1 and every M_t is a contraction.
  const auto rows = conditioning<float>(unnormalized_input(128, 2, 8), {16, 32, 64, 128});
  print("L = 128, small keys", rows);
  for (const auto& r : rows) {
    EXPECT_LT(r.max_abs_t, 2.0) << "C = " << r.chunk_size;
    EXPECT_LE(r.chunkwise_relative_l2, 4 * r.recurrence_relative_l2 + 1e-6) << "C = " << r.chunk_size;
  }
}

}  // namespace
}  // namespace deltaproof::ref
