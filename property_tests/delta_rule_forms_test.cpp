// DeltaNet: every forward form of the derivation equals its neighbours over ℚ.
#include "property_tests/delta_properties.hpp"
#include "reference/random_inputs.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

// Exact DeltaNet entries grow with L (unnormalized keys multiply them by up to 4·DK per token),
// so shapes stay below the linear-attention suite's caps; C covers 1..L+1 all the same.
constexpr ShapeLimits kForms{.max_length = 48, .max_dim = 12, .max_chunk = 40};

RC_GTEST_PROP(DeltaRuleForms, TokenViewsAndAffineScanAgree, ()) { check_delta_token_views_agree(*gen_delta_case(kForms)); }

RC_GTEST_PROP(DeltaRuleForms, ChunkStagesMatchDenseProducts, ()) {
  const auto c = *gen_delta_case(kForms);
  check_delta_chunk_stages(c, *gen_solve(), *gen_base_block());
}

RC_GTEST_PROP(DeltaRuleForms, ChunkwiseMatchesRecurrenceForEverySolve, ()) {
  const auto c = *gen_delta_case(kForms);
  check_delta_chunkwise_matches_recurrence(c, *gen_solve(), *gen_base_block());
}

// C = L: the whole-sequence parallel form.
RC_GTEST_PROP(DeltaRuleForms, ParallelFormMatchesRecurrence, ()) {
  const auto c = *gen_delta_case({.max_length = 40, .max_dim = 10, .max_chunk = 40});
  const auto parallel = dr::parallel_wy(c.inputs, {*gen_solve(), *gen_base_block()});
  const auto recurrent = dr::token_recurrence(c.inputs);
  require_equal("parallel output vs recurrence", parallel.output, recurrent.output);
  require_equal("parallel final state vs recurrence", parallel.final_state, recurrent.final_state);
}

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

// C = 128 with the article's 16×16 base blocks (16 → 32 → 64 → 128) and a recursive base of 16;
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
  const auto batch = *rc::gen::inRange<Index>(1, 3);
  const auto heads = *rc::gen::inRange<Index>(1, 3);
  const Shape s = *gen_shape({.max_length = 20, .max_dim = 8});
  dr::BatchInputs<Exact> in{ref::Tensor4<Exact>(batch, heads, s.length, s.key_dim),
                            ref::Tensor4<Exact>(batch, heads, s.length, s.key_dim),
                            ref::Tensor4<Exact>(batch, heads, s.length, s.value_dim),
                            ref::Tensor4<Exact>(batch, heads, s.length, 1), std::nullopt};
  if (s.with_initial_state) in.initial_state = ref::Tensor4<Exact>(batch, heads, s.value_dim, s.key_dim);
  ref::for_each_head(batch, heads, [&](Index b, Index h) {
    in.q.set_head(b, h, *gen_matrix(s.length, s.key_dim));
    in.k.set_head(b, h, *gen_matrix(s.length, s.key_dim));
    in.v.set_head(b, h, *gen_matrix(s.length, s.value_dim));
    in.beta.set_head(b, h, Matrix<Exact>(*gen_gates(s.length, GateRegime::mixed)));
    if (in.initial_state) in.initial_state->set_head(b, h, *gen_matrix(s.value_dim, s.key_dim));
  });
  const auto out = dr::batched(in, [&](const dr::Inputs<Exact>& x) { return dr::chunkwise(x, s.chunk_size); });
  ref::for_each_head(batch, heads, [&](Index b, Index h) {
    const auto one = dr::token_recurrence(in.head(b, h));
    require_equal("batched output head", out.output.head(b, h), one.output);
    require_equal("batched final state head", out.final_state.head(b, h), one.final_state);
  });
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
