// LaCT dependency masks: which input tokens influence which outputs, measured (exact Jacobian
// blocks over ℚ for the linear fast weight; bitwise-unchanged outputs under perturbation in High
// for SwiGLU) and compared with the schedule's prediction; the causal gap of the shifted schedule
// with a sliding window; planted bugs.
#include "property_tests/lact_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <iostream>

namespace deltaproof::testing {
namespace {

using Pairs = std::vector<std::pair<Index, Index>>;

RC_GTEST_PROP(LactMasks, ExactJacobianBlocksMatchPrediction, ()) {
  check_exact_mask(*gen_lact_case({.shape = {.max_length = 20, .max_dim = 3, .max_chunk = 8}, .positive = true}));
}

// Weight normalization and Newton–Schulz keep only a direction: on a weight with a single column
// (or a 1x1 update) that direction is a sign, and the dependence on the magnitude is truly gone.
// The prediction ("may influence") is exact only away from those shapes, so they get the options
// only when every dim is >= 2.
bool normalizing_options_allowed(const LactCase& c) {
  return std::min({c.shape.key_dim, c.shape.value_dim, c.hidden_dim}) >= 2;
}

// SwiGLU's update is cubic in the weights, so with η up to 1 they can grow doubly exponentially
// over the chunks, until the late updates absorb the early ones in 100-digit rounding and a
// perturbation measures a gap that is not structural. η/8 keeps the weights moderate.
LactCase with_small_rates(LactCase c) {
  c.learning_rate /= 8;
  return c;
}

lact::Options<High> random_high_options(const LactCase& c) {
  const bool allowed = normalizing_options_allowed(c);
  return {c.schedule, c.shape.chunk_size, c.window, High(c.momentum), allowed && *rc::gen::arbitrary<bool>(),
          allowed && *rc::gen::arbitrary<bool>()};
}

RC_GTEST_PROP(LactMasks, PerturbationMatchesPredictionForSwiGluWithWindow, ()) {
  const auto c = with_small_rates(*gen_lact_case({.shape = {.max_length = 20, .max_dim = 3, .max_chunk = 8}, .positive = true}));
  check_perturbation_mask(c, random_high_options(c));
}

// Causal pairs missing from shifted LaCT + window W: j in output i's own chunk, j < i, i − j >= W.
Pairs expected_shifted_gaps(Index length, Index chunk_size, Index window) {
  Pairs gaps;
  for (Index i = 0; i < length; ++i)
    for (Index j = (i / chunk_size) * chunk_size; j < i; ++j)
      if (i - j >= window) gaps.push_back({i, j});
  return gaps;
}

Pairs measured_shifted_gaps(LactCase c, Index window, bool weight_norm = false, bool orthogonalize = false) {
  c.schedule = lact::Schedule::ApplyThenUpdate;
  c.window = window;
  const lact::Options<High> opt{c.schedule, c.shape.chunk_size, window, High(c.momentum), weight_norm, orthogonalize};
  const auto measured =
      lact::measure_dependencies_by_perturbation<lact::SwiGluFastWeight>(with_small_rates(c).swiglu_inputs(), opt);
  return lact::causal_gaps(measured);
}

// W >= C: the window covers every earlier token of the own chunk; nothing causal is missed.
RC_GTEST_PROP(LactMasks, ShiftedWithWindowAtLeastChunkHasNoCausalGap, ()) {
  const auto c = *gen_lact_case({.shape = {.max_length = 20, .max_dim = 3, .max_chunk = 8}, .positive = true});
  const Index window = c.shape.chunk_size + *rc::gen::inRange<Index>(0, 3);
  const bool allowed = normalizing_options_allowed(c);
  const Pairs gaps = measured_shifted_gaps(c, window, allowed && *rc::gen::arbitrary<bool>(), allowed && *rc::gen::arbitrary<bool>());
  if (!gaps.empty()) RC_FAIL("W = " + std::to_string(window) + " >= C leaves causal gaps " + lact::describe_pairs(gaps));
}

// W < C: a gap remains, exactly the pairs (i, j) with j in i's chunk and i − j >= W.
RC_GTEST_PROP(LactMasks, ShiftedWithWindowBelowChunkLeavesTheNamedGap, ()) {
  auto c = *gen_lact_case({.shape = {.max_length = 20, .max_dim = 3, .max_chunk = 8}, .positive = true});
  c.shape.chunk_size = std::max<Index>(2, c.shape.chunk_size);
  RC_PRE(c.shape.length >= c.shape.chunk_size);  // at least one full chunk, so the gap is not empty
  const Index window = *rc::gen::inRange<Index>(0, c.shape.chunk_size);
  const bool allowed = normalizing_options_allowed(c);
  const Pairs gaps = measured_shifted_gaps(c, window, allowed && *rc::gen::arbitrary<bool>(), allowed && *rc::gen::arbitrary<bool>());
  const Pairs expected = expected_shifted_gaps(c.shape.length, c.shape.chunk_size, window);
  RC_ASSERT(!expected.empty());
  if (gaps != expected)
    RC_FAIL("W = " + std::to_string(window) + " < C = " + std::to_string(c.shape.chunk_size) + ": measured gaps " +
            lact::describe_pairs(gaps) + ", expected " + lact::describe_pairs(expected));
}

// A worked instance, printed: L = 8, C = 4, W = 2.
TEST(LactMasks, NamesTheMissingPairsForChunkFourWindowTwo) {
  LactCase c;
  c.shape = {.length = 8, .key_dim = 2, .value_dim = 2, .chunk_size = 4};
  c.q = c.k = Matrix<Exact>::Constant(8, 2, Exact(1) / 2);
  c.q(3, 1) = Exact(-1) / 4, c.k(5, 0) = Exact(3) / 4;
  c.v = Matrix<Exact>::Constant(8, 2, Exact(1));
  c.learning_rate = Vector<Exact>::Constant(8, Exact(1) / 2);
  c.w0 = c.w2 = Matrix<Exact>::Constant(3, 2, Exact(1) / 4);
  c.w0(1, 0) = Exact(-1) / 2;
  c.w1 = Matrix<Exact>::Constant(2, 3, Exact(1) / 4);
  const Pairs gaps = measured_shifted_gaps(c, 2);
  std::cout << "shifted LaCT + window: L=8 C=4 W=2 misses " << lact::describe_pairs(gaps) << "\n";
  EXPECT_EQ(gaps, (Pairs{{2, 0}, {3, 0}, {3, 1}, {6, 4}, {7, 4}, {7, 5}})) << lact::describe_pairs(gaps);
  EXPECT_TRUE(measured_shifted_gaps(c, 4).empty());
}

// ---------------------------------------------------------------------------------------
// Planted bugs: the mask tests must fail on them.

TEST(LactPlantedBugs, ShiftedScheduleReadingUpdatedWeightsBreaksExactMask) {
  EXPECT_FALSE(rc::check("exact mask of apply-update that reads updated weights", [] {
    auto c = *gen_lact_case({.shape = {.max_length = 8, .max_dim = 2, .max_chunk = 4}, .positive = true});
    c.schedule = lact::Schedule::ApplyThenUpdate;
    check_exact_mask<lact::ShiftedReadsUpdatedWeights>(c);
  }));
}

TEST(LactPlantedBugs, WindowOneTooWideBreaksPerturbationMask) {
  EXPECT_FALSE(rc::check("perturbation mask with a window one token too wide", [] {
    auto c = *gen_lact_case({.shape = {.max_length = 8, .max_dim = 2, .max_chunk = 4}, .positive = true});
    c.schedule = lact::Schedule::ApplyThenUpdate;
    check_perturbation_mask<lact::WindowOneTooWide>(c, random_high_options(c));
  }));
}

}  // namespace
}  // namespace deltaproof::testing
