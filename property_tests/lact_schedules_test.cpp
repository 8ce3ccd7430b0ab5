// LaCT schedules and update options: the linear fast weight as masked linear attention (exact),
// the SwiGLU update as the summed gradient at the chunk's starting weights (dual numbers, High),
// momentum, weight normalization, Newton–Schulz, single chunk, the window branch; planted bugs.
#include "property_tests/lact_properties.hpp"
#include "reference/high_agreement.hpp"
#include "reference/linear_attention.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

using ref::matrix_cast;

Matrix<Exact> agreement_bound(const Matrix<High>& reference) { return ref::high_agreement_bound(reference); }

// ---------------------------------------------------------------------------------------
// Linear fast weight, additive update, exactly over ℚ.

RC_GTEST_PROP(LactSchedules, LinearFastWeightIsMaskedLinearAttention, ()) {
  check_linear_lact_is_masked_linear_attention(*gen_lact_case({.shape = {.max_length = 64, .max_dim = 9, .max_chunk = 16}}));
}

// update→apply at C = 1 is the causal mask: LaCT is then plain linear attention (the foundation's form).
RC_GTEST_PROP(LactSchedules, UpdateApplyWithChunkOneIsCausalLinearAttention, ()) {
  auto c = *gen_lact_case({.shape = {.max_length = 40, .max_dim = 6}});
  c.shape.chunk_size = 1;
  c.window = 0;
  c.momentum = 0;
  c.schedule = lact::Schedule::UpdateThenApply;
  const auto fwd = lact::forward<Exact, lact::LinearFastWeight>(c.linear_inputs(), c.options());
  const ref::linear_attention::Inputs<Exact> la{c.q, c.k, c.learning_rate.asDiagonal() * c.v, c.linear_weight};
  require_equal("LaCT(linear, update-apply, C=1) vs linear attention", fwd.output,
                ref::linear_attention::token_recurrence(la).output);
  RC_ASSERT(lact::block_mask<Exact>(lact::Schedule::UpdateThenApply, c.shape.length, 1) == ref::causal_mask<Exact>(c.shape.length));
}

// The block masks as the schedules define them (μ = 0): chunk(j) <= chunk(i), chunk(j) < chunk(i), all.
RC_GTEST_PROP(LactSchedules, BlockMasksAreTheScheduleDefinitions, ()) {
  const Index L = *rc::gen::inRange<Index>(1, 30), C = *rc::gen::inRange<Index>(1, 12);
  const auto bidirectional = lact::block_mask<Exact>(lact::Schedule::UpdateThenApply, L, C);
  const auto shifted = lact::block_mask<Exact>(lact::Schedule::ApplyThenUpdate, L, C);
  const auto single = lact::block_mask<Exact>(lact::Schedule::SingleChunk, L, C);
  for (Index i = 0; i < L; ++i)
    for (Index j = 0; j < L; ++j) {
      RC_ASSERT(bidirectional(i, j) == Exact(j / C <= i / C ? 1 : 0));
      RC_ASSERT(shifted(i, j) == Exact(j / C < i / C ? 1 : 0));
      RC_ASSERT(single(i, j) == Exact(1));
    }
}

// ---------------------------------------------------------------------------------------
// SwiGLU: each update is −(momentum-accumulated) ∇ℓ_c at W_[c], the gradient taken by dual numbers
// on the inner loss itself (not the hand-derived backward that forward() uses).

template <class Policy = lact::Faithful>
void check_swiglu_update_is_gradient_at_chunk_start(const LactCase& c) {
  const lact::Options<High> opt{c.schedule, c.shape.chunk_size, 0, High(c.momentum), false, false};
  const auto in = c.swiglu_inputs();
  const auto fwd = lact::forward<High, lact::SwiGluFastWeight, Policy>(in, opt);
  const auto chunks = ref::chunks_of(c.shape.length, c.schedule == lact::Schedule::SingleChunk ? c.shape.length : c.shape.chunk_size);
  lact::Weights<High> delta;
  for (const auto& m : in.initial_weights) delta.push_back(Matrix<High>::Zero(m.rows(), m.cols()));
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const bool updates = !(c.schedule == lact::Schedule::ApplyThenUpdate && ci + 1 == chunks.size());
    const auto& before = fwd.boundary_weights[ci];
    const auto& after = ci + 1 < chunks.size() ? fwd.boundary_weights[ci + 1] : fwd.final_weights;
    const auto& ch = chunks[ci];
    const auto g = lact::inner_loss_gradient_by_dual<lact::SwiGluFastWeight, High>(
        before, in.k.middleRows(ch.begin, ch.size), in.v.middleRows(ch.begin, ch.size),
        in.learning_rate.segment(ch.begin, ch.size));
    for (size_t p = 0; p < g.size(); ++p) {
      const std::string name = "W" + std::to_string(p) + " after chunk " + std::to_string(ci);
      if (!updates) {
        require_equal(name + " (last shifted chunk updates nothing)", after[p], before[p]);
        continue;
      }
      delta[p] = opt.momentum * delta[p] + g[p];
      const Matrix<High> expected = before[p] - delta[p];
      require_within(name + " vs W_[c] - momentum-summed gradient at W_[c]", after[p], matrix_cast<Exact>(expected),
                     agreement_bound(expected));
    }
  }
}

RC_GTEST_PROP(LactSchedules, SwiGluUpdateIsSummedGradientAtChunkStart, ()) {
  check_swiglu_update_is_gradient_at_chunk_start(*gen_lact_case({.shape = {.max_length = 24, .max_dim = 5, .max_chunk = 8}}));
}

// One chunk for the whole sequence is update→apply with C >= L, bit for bit, with every option on or off.
RC_GTEST_PROP(LactSchedules, SingleChunkIsUpdateApplyWithChunkCoveringSequence, ()) {
  const auto c = *gen_lact_case({.shape = {.max_length = 16, .max_dim = 3, .max_chunk = 6}});
  const bool norm = *rc::gen::arbitrary<bool>(), ortho = *rc::gen::arbitrary<bool>();
  const lact::Options<High> single{lact::Schedule::SingleChunk, c.shape.chunk_size, c.window, High(c.momentum), norm, ortho};
  const lact::Options<High> whole{lact::Schedule::UpdateThenApply, c.shape.length + *rc::gen::inRange<Index>(0, 3), c.window,
                                  High(c.momentum), norm, ortho};
  const auto in = c.swiglu_inputs();
  const auto a = lact::forward<High, lact::SwiGluFastWeight>(in, single);
  const auto b = lact::forward<High, lact::SwiGluFastWeight>(in, whole);
  RC_ASSERT(a.output == b.output);
}

// ---------------------------------------------------------------------------------------
// Newton–Schulz.

Matrix<High> high_matrix(Index r, Index c) { return matrix_cast<High>(*gen_matrix(r, c)); }

// On a (rectangular) diagonal matrix, NS is the scalar quintic x ← a x + b x³ + c x⁵ on d/‖d‖, 5 times.
RC_GTEST_PROP(LactNewtonSchulz, OnDiagonalIsTheScalarQuintic, ()) {
  const Index rows = *rc::gen::inRange<Index>(1, 6), cols = *rc::gen::inRange<Index>(1, 6);
  Matrix<High> g = Matrix<High>::Zero(rows, cols);
  const Matrix<High> d = high_matrix(std::min(rows, cols), 1);
  for (Index i = 0; i < d.rows(); ++i) g(i, i) = d(i, 0);
  const Matrix<High> ns = lact::newton_schulz(g);
  Matrix<High> expected = Matrix<High>::Zero(rows, cols);
  const High norm = sqrt(d.squaredNorm());
  for (Index i = 0; i < d.rows(); ++i) {
    High x = norm == 0 ? High(0) : d(i, 0) / norm;
    for (int s = 0; s < 5; ++s) x = High("3.4445") * x - High("4.7750") * x * x * x + High("2.0315") * x * x * x * x * x;
    expected(i, i) = x;
  }
  require_within("NS(diagonal) vs scalar quintic", ns, matrix_cast<Exact>(expected), agreement_bound(expected));
}

// Scaling by a power of two changes no rounding: NS(4G) == NS(G) bit for bit.
RC_GTEST_PROP(LactNewtonSchulz, IsScaleInvariant, ()) {
  const Matrix<High> g = high_matrix(*rc::gen::inRange<Index>(1, 6), *rc::gen::inRange<Index>(1, 6));
  RC_ASSERT(lact::newton_schulz(Matrix<High>(4 * g)) == lact::newton_schulz(g));
}

// NS(P G Q) = P NS(G) Q for signed permutations P, Q (orthogonal, so they commute with the polynomial).
RC_GTEST_PROP(LactNewtonSchulz, CommutesWithSignedPermutations, ()) {
  const Index rows = *rc::gen::inRange<Index>(1, 6), cols = *rc::gen::inRange<Index>(1, 6);
  const Matrix<High> g = high_matrix(rows, cols);
  const auto signed_permutation = [](Index n) {
    std::vector<Index> order = *rc::gen::unique<std::vector<Index>>(n, rc::gen::inRange<Index>(0, n));
    Matrix<High> p = Matrix<High>::Zero(n, n);
    for (Index i = 0; i < n; ++i) p(i, order[static_cast<size_t>(i)]) = *rc::gen::arbitrary<bool>() ? High(1) : High(-1);
    return p;
  };
  const Matrix<High> p = signed_permutation(rows), q = signed_permutation(cols);
  const Matrix<High> expected = p * lact::newton_schulz(g) * q;
  require_within("NS(P G Q) vs P NS(G) Q", lact::newton_schulz(Matrix<High>(p * g * q)), matrix_cast<Exact>(expected),
                 agreement_bound(expected));
}

// In LaCT the orthogonalized update is W_[c+1] = W_[c] − NS(Δ_c), Δ_c = μ Δ_{c−1} − Vᵀ diag(η) K (linear fast weight).
RC_GTEST_PROP(LactSchedules, OrthogonalizedUpdateIsNewtonSchulzOfMomentum, ()) {
  const auto c = *gen_lact_case({.shape = {.max_length = 24, .max_dim = 4, .max_chunk = 8}});
  const lact::Options<High> opt{lact::Schedule::UpdateThenApply, c.shape.chunk_size, 0, High(c.momentum), false, true};
  const auto in = c.linear_inputs_high();
  const auto fwd = lact::forward<High, lact::LinearFastWeight>(in, opt);
  Matrix<High> delta = Matrix<High>::Zero(c.shape.value_dim, c.shape.key_dim);
  const auto chunks = ref::chunks_of(c.shape.length, c.shape.chunk_size);
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const auto& ch = chunks[ci];
    const Matrix<High> k = in.k.middleRows(ch.begin, ch.size), v = in.v.middleRows(ch.begin, ch.size);
    delta = opt.momentum * delta - v.transpose() * in.learning_rate.segment(ch.begin, ch.size).asDiagonal() * k;
    const Matrix<High> expected = fwd.boundary_weights[ci][0] - lact::newton_schulz(delta);
    const auto& after = ci + 1 < chunks.size() ? fwd.boundary_weights[ci + 1][0] : fwd.final_weights[0];
    require_within("W after chunk " + std::to_string(ci) + " vs W - NS(momentum)", after, matrix_cast<Exact>(expected),
                   agreement_bound(expected));
  }
}

// ---------------------------------------------------------------------------------------
// Weight normalization: every row keeps its initial norm, and points along the unnormalized update.

RC_GTEST_PROP(LactSchedules, WeightNormRestoresRowNormsAlongTheUpdate, ()) {
  const auto c = *gen_lact_case({.shape = {.max_length = 16, .max_dim = 3, .max_chunk = 6}});
  const lact::Options<High> opt{c.schedule, c.shape.chunk_size, 0, High(c.momentum), true, *rc::gen::arbitrary<bool>()};
  const auto in = c.swiglu_inputs();
  const auto fwd = lact::forward<High, lact::SwiGluFastWeight>(in, opt);
  auto all = fwd.boundary_weights;
  all.push_back(fwd.final_weights);
  for (size_t ci = 0; ci < all.size(); ++ci)
    for (size_t p = 0; p < all[ci].size(); ++p) {
      const Vector<High> initial = lact::row_norms(in.initial_weights[p]);
      require_within("row norms of W" + std::to_string(p) + " at boundary " + std::to_string(ci),
                     Matrix<High>(lact::row_norms(all[ci][p])), matrix_cast<Exact>(Matrix<High>(initial)),
                     agreement_bound(Matrix<High>(initial)));
    }
  // Direction, linear fast weight without momentum: W_[c+1] ‖U_r‖ = n0_r U_r with U = W_[c] + Vᵀ diag(η) K.
  const lact::Options<High> plain{lact::Schedule::UpdateThenApply, c.shape.chunk_size, 0, High(0), true, false};
  const auto lin = c.linear_inputs_high();
  const auto f = lact::forward<High, lact::LinearFastWeight>(lin, plain);
  const auto chunks = ref::chunks_of(c.shape.length, c.shape.chunk_size);
  const Vector<High> n0 = lact::row_norms(lin.initial_weights[0]);
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const auto& ch = chunks[ci];
    const Matrix<High> u = f.boundary_weights[ci][0] + lin.v.middleRows(ch.begin, ch.size).transpose() *
                                                           lin.learning_rate.segment(ch.begin, ch.size).asDiagonal() *
                                                           lin.k.middleRows(ch.begin, ch.size);
    const auto& after = ci + 1 < chunks.size() ? f.boundary_weights[ci + 1][0] : f.final_weights[0];
    const Vector<High> un = lact::row_norms(u);
    Matrix<High> lhs(u.rows(), u.cols()), rhs(u.rows(), u.cols());
    for (Index r = 0; r < u.rows(); ++r) {
      lhs.row(r) = un(r) == 0 ? Matrix<High>(u.row(r)) : Matrix<High>(after.row(r) * un(r));
      rhs.row(r) = un(r) == 0 ? Matrix<High>(u.row(r)) : Matrix<High>(u.row(r) * n0(r));
    }
    require_within("normalized row direction after chunk " + std::to_string(ci), lhs, matrix_cast<Exact>(rhs), agreement_bound(rhs));
  }
}

// ---------------------------------------------------------------------------------------
// Window branch: with W >= L it is causal softmax attention, written here the textbook way.
RC_GTEST_PROP(LactSchedules, WindowCoveringSequenceIsCausalSoftmaxAttention, ()) {
  const auto c = *gen_lact_case({.shape = {.max_length = 16, .max_dim = 4}});
  const auto in = c.swiglu_inputs();
  const Matrix<High> got = lact::sliding_window_attention(in.q, in.k, in.v, c.shape.length + *rc::gen::inRange<Index>(0, 3));
  Matrix<High> expected = Matrix<High>::Zero(c.shape.length, c.shape.value_dim);
  for (Index i = 0; i < c.shape.length; ++i) {
    High total(0);
    for (Index j = 0; j <= i; ++j) total += exp(in.q.row(i).dot(in.k.row(j)));
    for (Index j = 0; j <= i; ++j) expected.row(i) += exp(in.q.row(i).dot(in.k.row(j))) / total * in.v.row(j);
  }
  require_within("window attention (W >= L) vs causal softmax", got, matrix_cast<Exact>(expected), agreement_bound(expected));
}

// ---------------------------------------------------------------------------------------
// Planted bugs: the properties above must fail on them.

TEST(LactPlantedBugs, ShiftedScheduleReadingUpdatedWeightsBreaksMaskedLinearAttention) {
  EXPECT_FALSE(rc::check("apply-update that reads updated weights vs shifted block mask", [] {
    auto c = *gen_lact_case({.shape = {.max_length = 12, .max_dim = 3, .max_chunk = 4}});
    c.schedule = lact::Schedule::ApplyThenUpdate;
    check_linear_lact_is_masked_linear_attention<lact::ShiftedReadsUpdatedWeights>(c);
  }));
}

TEST(LactPlantedBugs, GradientAtRunningWeightsBreaksSwiGluUpdate) {
  EXPECT_FALSE(rc::check("SwiGLU LaCT with gradients at running weights vs gradient at chunk start", [] {
    check_swiglu_update_is_gradient_at_chunk_start<lact::GradientAtRunningWeights>(
        *gen_lact_case({.shape = {.max_length = 8, .max_dim = 3, .max_chunk = 4}}));
  }));
}

// ---------------------------------------------------------------------------------------

template <class F>
void expect_invalid_naming(F&& f, const std::string& name) {
  try {
    f();
    ADD_FAILURE() << "accepted bad " << name;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(LactSchedules, RejectsBadInput) {
  lact::Inputs<double> in{Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 2),
                          Vector<double>::Ones(4), {Matrix<double>::Ones(2, 3)}};
  using FW = lact::LinearFastWeight;
  expect_invalid_naming([&] { lact::forward<double, FW>(in, {lact::Schedule::UpdateThenApply, 0}); }, "chunk_size");
  expect_invalid_naming([&] { lact::forward<double, FW>(in, {lact::Schedule::ApplyThenUpdate, 2, -1}); }, "window");
  expect_invalid_naming([&] { lact::predicted_dependencies(lact::Schedule::ApplyThenUpdate, 4, 2, -1); }, "window");
  expect_invalid_naming([&] { lact::predicted_dependencies(lact::Schedule::ApplyThenUpdate, 4, 0, 1); }, "chunk_size");
  auto bad = in;
  bad.v = Matrix<double>::Ones(5, 2);
  expect_invalid_naming([&] { lact::forward<double, FW>(bad, {lact::Schedule::UpdateThenApply, 2}); }, "q, k, v");
  bad = in;
  bad.learning_rate = Vector<double>::Ones(3);
  expect_invalid_naming([&] { lact::forward<double, FW>(bad, {lact::Schedule::UpdateThenApply, 2}); }, "learning_rate");
  bad = in;
  bad.initial_weights = {Matrix<double>::Ones(3, 2)};
  expect_invalid_naming([&] { lact::forward<double, FW>(bad, {lact::Schedule::UpdateThenApply, 2}); }, "initial_weights");
  bad.initial_weights = {Matrix<double>::Ones(4, 3), Matrix<double>::Ones(2, 4), Matrix<double>::Ones(4, 2)};
  expect_invalid_naming([&] { lact::forward<double, lact::SwiGluFastWeight>(bad, {lact::Schedule::UpdateThenApply, 2}); }, "W2");
  lact::Inputs<Exact> exact{Matrix<Exact>::Ones(4, 3), Matrix<Exact>::Ones(4, 3), Matrix<Exact>::Ones(4, 2),
                            Vector<Exact>::Ones(4), {Matrix<Exact>::Ones(2, 3)}};
  expect_invalid_naming([&] { lact::forward<Exact, FW>(exact, {lact::Schedule::ApplyThenUpdate, 2, 1}); }, "window");
}

}  // namespace
}  // namespace deltaproof::testing
