// DeltaNet: every forward form of the derivation equals its neighbours over ℚ.
#include "property_tests/batch_properties.hpp"
#include "property_tests/delta_properties.hpp"
#include "reference/random_inputs.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

// Exact DeltaNet entries grow with L (unnormalized keys multiply them by up to 4·DK per token),
// so shapes stay below the linear-attention suite's caps; C covers 1..L+1 all the same.
constexpr ShapeLimits kForms{.max_length = 96, .max_dim = 24, .max_chunk = 64};
// The erase–write view and the affine scan multiply dense (DK, DK) matrices per token.
constexpr ShapeLimits kDense{.max_length = 64, .max_dim = 16, .max_chunk = 64};

DELTAPROOF_DELTA_FORM_PROPERTIES(DeltaRuleForms, gen_delta_case, kDense, kForms, kForms)

// The three triangular solves on WY systems of the kernels' sizes and awkward ones, any base block.
RC_GTEST_PROP(DeltaRuleForms, TriangularSolvesAgreeIncludingBlocks, ()) {
  const Index n = *rc::gen::oneOf(rc::gen::element<Index>(1, 2, 15, 16, 17, 32, 33, 64), rc::gen::inRange<Index>(1, 70));
  const Index dim = *rc::gen::inRange<Index>(1, 5);
  const auto regime = *gen_delta_regime();
  const Matrix<Exact> k = *gen_keys(n, dim, regime.keys);
  const Vector<Exact> beta = *gen_gates(n, regime.beta);
  RC_TAG(n);
  check_triangular_solves_agree(dr::wy_system<Exact>(k, beta), *gen_base_block(), *gen_base_block());
}

// C = 128 with the derivation's 16×16 base blocks (16 → 32 → 64 → 128) and a recursive base of 16;
// one case, since an exact 128×128 inverse of an unnormalized system costs about a second.
TEST(DeltaRuleForms, TriangularSolvesAgreeAtC128) {
  ref::RandomDyadic rng(128);
  const Matrix<Exact> k = rng.matrix<Exact>(128, 4);
  Vector<Exact> beta(128);
  for (Index i = 0; i < 128; ++i) beta(i) = rng.unit_interval<Exact>();
  const Matrix<Exact> a = dr::wy_system<Exact>(k, beta);
  const Matrix<Exact> t = dr::invert_unit_lower_forward_substitution(a);
  const auto blocked = dr::invert_unit_lower_blocked(a, 16);
  EXPECT_TRUE(blocked.t == t);
  ASSERT_EQ(blocked.merged_levels.size(), 3u);
  for (size_t level = 0; level < 3; ++level) {
    const Index size = Index(32) << level;
    for (size_t j = 0; j < blocked.merged_levels[level].size(); ++j)
      EXPECT_TRUE(blocked.merged_levels[level][j] == t.block(Index(j) * size, Index(j) * size, size, size)) << level << " " << j;
  }
  EXPECT_TRUE(dr::invert_unit_lower_recursive(a, 16) == t);
  // T is A⁻¹: check one block row of A T = I (the full product costs more than the inverse).
  EXPECT_TRUE(Matrix<Exact>(a.bottomRows(16) * t) == Matrix<Exact>(Matrix<Exact>::Identity(128, 128).bottomRows(16)));
}

// Any two chunk sizes agree (C = 1 is the recurrence, C >= L the parallel form).
RC_GTEST_PROP(DeltaRuleForms, ChunkSizeDoesNotMatter, ()) {
  const auto c = *gen_delta_case(kForms);
  const Index other = *rc::gen::inRange<Index>(1, c.shape.length + 2);
  const auto a = dr::chunkwise(c.inputs, c.shape.chunk_size);
  const auto b = dr::chunkwise(c.inputs, other, {TriangularSolve::blocked, 4});
  require_equal("output, C vs C'", a.output, b.output);
  require_equal("final state, C vs C'", a.final_state, b.final_state);
}

RC_GTEST_PROP(DeltaRuleForms, BatchedEqualsPerHead, ()) {
  check_batched_equals_per_head<dr::BatchInputs<Exact>>(gen_batch_shape(2, 2, {.max_length = 20, .max_dim = 8}));
}

// The forms are generic on purpose: they run on dual numbers (no comparisons, no conversions).
TEST(DeltaRuleForms, RunOnDualNumbers) {
  using D = Dual<Exact>;
  dr::Inputs<D> in{Matrix<D>::Constant(3, 2, D(1)), Matrix<D>::Constant(3, 2, D(1)), Matrix<D>::Constant(3, 2, D(1)),
                   Vector<D>::Constant(3, D(1)), std::nullopt};
  EXPECT_TRUE(dr::chunkwise(in, 2, {TriangularSolve::recursive, 1}).output == dr::token_recurrence(in).output);
}

TEST(DeltaRuleForms, RejectsBadShapes) {
  dr::Inputs<double> in{Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 2),
                        Vector<double>::Ones(3), std::nullopt};
  EXPECT_THROW(dr::chunkwise(in, 2), std::invalid_argument);  // beta has 3 entries, L = 4
  in.beta = Vector<double>::Ones(4);
  EXPECT_THROW(dr::chunkwise(in, 0), std::invalid_argument);
  EXPECT_THROW(dr::invert_unit_lower_blocked<double>(Matrix<double>::Identity(4, 4), 0), std::invalid_argument);
  EXPECT_THROW(dr::invert_unit_lower_forward_substitution<double>(Matrix<double>::Ones(4, 3)), std::invalid_argument);
  in.initial_state = Matrix<double>::Ones(3, 2);  // (DK, DV): transposed
  EXPECT_THROW(dr::token_recurrence(in), std::invalid_argument);
}

}  // namespace
}  // namespace deltaproof::testing
