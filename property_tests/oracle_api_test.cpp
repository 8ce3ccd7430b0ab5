// Public functions of the oracle that no other CPU test calls ("every public function of
// the oracle exercised by a CPU test"). Before this file, linear attention's batched backward and
// tensor_cast were reached only from GPU tests, Gated DeltaNet's batched forms and with_gates from
// nothing on the CPU, and the helpers below only through the forms built on them (chunk_backward,
// the gate gradients, combine, TTT's and LaCT's helpers) or by nothing at all (the thread count,
// Polynomial's printing). Each property is exact over ℚ where the function is rational; SiLU,
// GELU, exp and norms are checked in High.
#include "property_tests/batch_properties.hpp"
#include "property_tests/support/assertions.hpp"
#include "property_tests/support/delta_cases.hpp"
#include "property_tests/support/linear_attention_cases.hpp"
#include "reference/delta_conditioning.hpp"
#include "reference/high_agreement.hpp"
#include "reference/lact.hpp"
#include "reference/polynomial.hpp"
#include "reference/random_inputs.hpp"
#include "reference/ttt.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <sstream>
#include <thread>

namespace deltaproof::testing {
namespace {

using ref::High;
using ref::Vector;

// ---------------------------------------------------------------------------------------
// [B, H, L, D] batches.

// The batched backward is the per-head backward of another path on every head (with S_0 and dS_L
// when the shape has them).
RC_GTEST_PROP(OracleApi, LinearAttentionBatchedBackwardEqualsPerHead, ()) {
  check_batched_backward_equals_per_head<la::BatchInputs<Exact>>(gen_batch_shape(2, 3, {.max_length = 24, .max_dim = 8}));
}

RC_GTEST_PROP(OracleApi, GatedDeltaRuleBatchedEqualsPerHead, ()) {
  check_batched_equals_per_head<gd::BatchInputs<Exact>>(gen_batch_shape(2, 2, {.max_length = 12, .max_dim = 6}));
}

RC_GTEST_PROP(OracleApi, GatedDeltaRuleBatchedBackwardEqualsPerHead, ()) {
  check_batched_backward_equals_per_head<gd::BatchInputs<Exact>>(gen_batch_shape(2, 2, {.max_length = 10, .max_dim = 5}));
}

// A batched form reads every head of every tensor at the offsets of q's [B, H, L, ·]: a tensor of
// another shape is refused, naming it, before any head is read.
TEST(OracleApi, BatchedFormsRejectEveryMisshapenTensor) {
  const auto t = [](Index b, Index h, Index r, Index c) { return Tensor4<Exact>(b, h, r, c); };
  const gd::BatchInputs<Exact> good{t(1, 2, 3, 2), t(1, 2, 3, 2), t(1, 2, 3, 4), t(1, 2, 3, 1), t(1, 2, 3, 1), t(1, 2, 4, 2)};
  const auto forward = [](const gd::BatchInputs<Exact>& in) {
    return gd::batched(in, [](const gd::Inputs<Exact>& x) { return gd::token_recurrence(x); });
  };
  const auto refused = [&](const gd::BatchInputs<Exact>& in, const std::string& name) {
    try {
      forward(in);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "a misshapen " << name << " was accepted";
  };
  EXPECT_NO_THROW(forward(good));
  gd::BatchInputs<Exact> in = good;
  in.k = t(1, 2, 3, 3), refused(in, "k"), in = good;
  in.v = t(2, 2, 3, 4), refused(in, "v"), in = good;
  in.beta = t(1, 2, 3, 2), refused(in, "beta"), in = good;
  in.alpha = t(1, 2, 4, 1), refused(in, "alpha"), in = good;
  in.initial_state = t(1, 1, 4, 2), refused(in, "initial_state"), in = good;
  // The cotangents are read at the same offsets: dO like the output, dS_L like the final state.
  const auto backward = [&](const la::BatchCotangents<Exact>& cot) {
    return gd::batched_backward(good, cot, [](const auto& x, const auto& d) { return gd::token_recurrence_backward(x, d); });
  };
  EXPECT_NO_THROW(backward({t(1, 2, 3, 4), t(1, 2, 4, 2)}));
  EXPECT_THROW(backward({t(1, 2, 2, 4), std::nullopt}), std::invalid_argument);
  EXPECT_THROW(backward({t(1, 2, 3, 4), t(1, 2, 2, 4)}), std::invalid_argument);
  // Linear attention and DeltaNet through the same checks.
  const la::BatchInputs<Exact> linear{t(1, 1, 3, 2), t(1, 1, 3, 2), t(2, 1, 3, 4), std::nullopt};
  EXPECT_THROW(la::batched(linear, [](const auto& x) { return la::token_recurrence(x); }), std::invalid_argument);
  const dr::BatchInputs<Exact> delta{t(1, 1, 3, 2), t(1, 1, 3, 2), t(1, 1, 3, 4), t(1, 1, 2, 1), std::nullopt};
  EXPECT_THROW(dr::batched(delta, [](const auto& x) { return dr::token_recurrence(x); }), std::invalid_argument);
}

// Heads are spread over threads, each computed as it would be serially: the thread count changes nothing.
RC_GTEST_PROP(OracleApi, BatchedFormsDoNotDependOnTheThreadCount, ()) {
  const BatchShape s = gen_batch_shape(3, 3, {.max_length = 10, .max_dim = 5});
  const auto in = gen_batch<dr::BatchInputs<Exact>>(s);
  const auto run = [&](unsigned threads) {
    ref::set_thread_count(threads);
    RC_ASSERT(ref::thread_count() == threads);
    return dr::batched(in, [&](const auto& x) { return dr::chunkwise(x, s.shape.chunk_size); });
  };
  const auto serial = run(1), spread = run(4);
  ref::set_thread_count(0);
  RC_ASSERT(serial.output.data == spread.output.data && serial.final_state.data == spread.final_state.data);
}

// parallel_for calls f(i) once for every i, and rethrows an exception from any thread.
TEST(OracleApi, ParallelForVisitsEveryIndexOnceAndRethrows) {
  ref::set_thread_count(3);
  std::vector<int> visits(10, 0);
  ref::parallel_for(10, [&](Index i) { ++visits[static_cast<size_t>(i)]; });
  EXPECT_EQ(visits, std::vector<int>(10, 1));
  EXPECT_THROW(ref::parallel_for(10, [](Index i) { ref::require(i != 7, "index 7"); }), std::invalid_argument);
  ref::set_thread_count(0);
  EXPECT_EQ(ref::thread_count(), std::max(1u, std::thread::hardware_concurrency()));
  int count = 0;
  ref::for_each_head(2, 3, [&](Index b, Index h) { EXPECT_EQ(b * 3 + h, count++); });
  EXPECT_EQ(count, 6);
}

// Dyadic entries n/4 are exact in double: Exact → double → Exact is the identity, entry for entry.
RC_GTEST_PROP(OracleApi, TensorCastOfDyadicsRoundTrips, ()) {
  const Tensor4<Exact> t = gen_tensor(*rc::gen::inRange<Index>(1, 3), *rc::gen::inRange<Index>(1, 3),
                                      *rc::gen::inRange<Index>(0, 5), *rc::gen::inRange<Index>(1, 5));
  const Tensor4<double> d = ref::tensor_cast<double>(t);
  RC_ASSERT(d.batch == t.batch && d.heads == t.heads && d.rows == t.rows && d.cols == t.cols);
  RC_ASSERT(ref::tensor_cast<Exact>(d).data == t.data);
}

// ---------------------------------------------------------------------------------------
// Conversions, masks and magnitudes.

RC_GTEST_PROP(OracleApi, DeltaRuleCastsOfDyadicsRoundTrip, ()) {
  const auto c = *gen_gated_delta_case({.max_length = 12, .max_dim = 6});
  // Gates p/8 and p/8192 and entries n/4 are dyadic: exact in double.
  const gd::Inputs<Exact> back = gd::cast<Exact>(gd::cast<double>(c.inputs));
  require_equal("q", back.q, c.inputs.q);
  require_equal("beta", Matrix<Exact>(back.beta), Matrix<Exact>(c.inputs.beta));
  require_equal("alpha", Matrix<Exact>(back.alpha), Matrix<Exact>(c.inputs.alpha));
  RC_ASSERT(back.initial_state.has_value() == c.inputs.initial_state.has_value());
  const dr::Inputs<Exact> ungated{c.inputs.q, c.inputs.k, c.inputs.v, c.inputs.beta, c.inputs.initial_state};
  const dr::Inputs<Exact> ungated_back = dr::cast<Exact>(dr::cast<double>(ungated));
  require_equal("k", ungated_back.k, ungated.k);
  require_equal("v", ungated_back.v, ungated.v);
  require_equal("beta (delta_rule::vector_cast)", Matrix<Exact>(dr::vector_cast<Exact>(dr::vector_cast<double>(ungated.beta))),
                Matrix<Exact>(ungated.beta));
}

TEST(OracleApi, ChunkMaskIsTheCausalMaskWithItsDiagonal) {
  for (Index n : {1, 2, 5, 16}) {
    const Matrix<Exact> m = la::chunk_mask<Exact>(n);
    ASSERT_EQ(m.rows(), n);
    for (Index i = 0; i < n; ++i)
      for (Index j = 0; j < n; ++j) EXPECT_EQ(m(i, j), Exact(j <= i ? 1 : 0)) << "(" << i << ", " << j << ")";
  }
}

// forward_magnitude / backward_magnitude are the forms on |inputs| (absolute): every entry of a
// form bounds the same entry of the form on signed inputs (triangle inequality), with equality
// when no input is negative.
RC_GTEST_PROP(OracleApi, MagnitudesBoundEveryFormAndAreTheFormOnNonNegativeInputs, ()) {
  const auto c = *gen_linear_attention_case({.max_length = 24, .max_dim = 8});
  const auto f = la::chunkwise(c.inputs, c.shape.chunk_size);
  const auto g = la::chunkwise_backward(c.inputs, c.cotangents, c.shape.chunk_size);
  const auto fm = la::forward_magnitude(c.inputs);
  const auto gm = la::backward_magnitude(c.inputs, c.cotangents);
  auto bounded = [](const Matrix<Exact>& x, const Matrix<Exact>& bound) {
    return ((bound - x.cwiseAbs()).array() >= Exact(0)).all();
  };
  RC_ASSERT(bounded(f.output, fm.output) && bounded(f.final_state, fm.final_state));
  RC_ASSERT(bounded(g.dq, gm.dq) && bounded(g.dk, gm.dk) && bounded(g.dv, gm.dv) && bounded(g.d_initial_state, gm.d_initial_state));
  const la::Inputs<Exact> positive = la::absolute(c.inputs);
  const la::Cotangents<Exact> positive_cot = la::absolute(c.cotangents);
  const auto fp = la::chunkwise(positive, c.shape.chunk_size);
  require_equal("form on |inputs| vs forward_magnitude", fp.output, la::forward_magnitude(positive).output);
  require_equal("backward on |inputs| vs backward_magnitude", la::chunkwise_backward(positive, positive_cot, c.shape.chunk_size).dk,
                la::backward_magnitude(positive, positive_cot).dk);
}

// ---------------------------------------------------------------------------------------
// DeltaNet's triangular solve and cotangents.

RC_GTEST_PROP(OracleApi, EveryTriangularSolveInvertsAUnitLowerSystem, ()) {
  const Index n = *rc::gen::element<Index>(1, 2, 7, 16, 17, 33);
  const Matrix<Exact> a = Matrix<Exact>::Identity(n, n) + dr::strictly_lower(*gen_matrix(n, n));
  for (auto solve : {dr::TriangularSolve::forward_substitution, dr::TriangularSolve::blocked, dr::TriangularSolve::recursive}) {
    const Matrix<Exact> t = dr::invert_unit_lower(a, solve, 4);
    require_equal("A T for " + dr::to_string(solve), Matrix<Exact>(a * t), Matrix<Exact>(Matrix<Exact>::Identity(n, n)));
  }
}

// T = [[T11, 0], [T21, T22]] from the inverses of A's diagonal blocks: the inverse of A.
RC_GTEST_PROP(OracleApi, BlockInverseMergeOfTwoInvertedBlocksIsTheInverse, ()) {
  const Index n1 = *rc::gen::inRange<Index>(1, 6), n2 = *rc::gen::inRange<Index>(1, 6), n = n1 + n2;
  const Matrix<Exact> a = Matrix<Exact>::Identity(n, n) + dr::strictly_lower(*gen_matrix(n, n));
  const Matrix<Exact> t11 = dr::invert_unit_lower_forward_substitution<Exact>(a.topLeftCorner(n1, n1));
  const Matrix<Exact> t22 = dr::invert_unit_lower_forward_substitution<Exact>(a.bottomRightCorner(n2, n2));
  const Matrix<Exact> t = dr::block_inverse_merge(a, 0, t11, t22);
  require_equal("A T", Matrix<Exact>(a * t), Matrix<Exact>(Matrix<Exact>::Identity(n, n)));
}

TEST(OracleApi, FinalStateCotangentIsTheGivenOneOrZero) {
  dr::Cotangents<Exact> cot{Matrix<Exact>::Ones(3, 2), std::nullopt};
  EXPECT_EQ(dr::final_state_cotangent(cot, 2, 4), Matrix<Exact>(Matrix<Exact>::Zero(2, 4)));
  cot.d_final_state = Matrix<Exact>::Constant(2, 4, Exact(3, 4));
  EXPECT_EQ(dr::final_state_cotangent(cot, 2, 4), *cot.d_final_state);
}

// combine(a, b) applies the affine map a, then b; and it is associative, which is what lets the
// tree scan bracket the prefixes as it likes.
RC_GTEST_PROP(OracleApi, CombineIsTheCompositionOfAffineMapsAndAssociative, ()) {
  const Index dk = *rc::gen::inRange<Index>(1, 4), dv = *rc::gen::inRange<Index>(1, 4);
  const auto maps = dr::affine_maps<Exact>(*gen_matrix(3, dk), *gen_matrix(3, dv), *gen_gates(3, GateRegime::mixed));
  const Matrix<Exact> state = *gen_matrix(dv, dk);
  const auto ab = dr::combine(maps[0], maps[1]);
  require_equal("combine(a, b) applied", ab.apply(state), maps[1].apply(maps[0].apply(state)));
  const auto left = dr::combine(ab, maps[2]), right = dr::combine(maps[0], dr::combine(maps[1], maps[2]));
  require_equal("(a b) c vs a (b c): transition", left.transition, right.transition);
  require_equal("(a b) c vs a (b c): write", left.write, right.write);
}

// One chunk's backward from its own state S_[c] and the incoming G' = dL/dS_[c+1] is the token
// recurrence's backward over that chunk alone, started from S_[c] with final cotangent G': every
// gradient, dL/dS_[c], and (gated) dα through the decays' cotangent. A middle chunk, so that S_[c]
// and G' are both generic.
template <class Case>
void check_chunk_backward_is_the_chunks_recurrence_backward(const Case& c) {
  constexpr bool gated = requires { c.inputs.alpha; };
  const Index C = c.shape.chunk_size, L = c.shape.length;
  const auto chunks = ref::chunks_of(L, C);
  const ref::Chunk ch = chunks[*rc::gen::inRange<size_t>(0, chunks.size())];
  const auto fwd = chunkwise(c.inputs, C);
  const auto tokens = [&](Index begin, Index n, const std::optional<Matrix<Exact>>& s0) {
    auto in = c.inputs;
    in.q = c.inputs.q.middleRows(begin, n), in.k = c.inputs.k.middleRows(begin, n), in.v = c.inputs.v.middleRows(begin, n);
    in.beta = c.inputs.beta.segment(begin, n);
    if constexpr (gated) in.alpha = c.inputs.alpha.segment(begin, n);
    in.initial_state = s0;
    return in;
  };
  const Index after = ch.begin + ch.size;
  const auto state_after = after < L ? fwd.boundary_states[static_cast<size_t>(ch.index) + 1] : fwd.final_state;
  const dr::Cotangents<Exact> rest{c.cotangents.d_output.middleRows(after, L - after), c.cotangents.d_final_state};
  const Matrix<Exact> g_next = token_recurrence_backward(tokens(after, L - after, state_after), rest).d_initial_state;
  const Matrix<Exact>& s = fwd.boundary_states[static_cast<size_t>(ch.index)];
  const Matrix<Exact> d_out = c.cotangents.d_output.middleRows(ch.begin, ch.size);
  const auto one = tokens(ch.begin, ch.size, s);
  const auto cg = chunk_backward<Exact>(one.q, one.k, one.v, one.beta, fwd.chunks[static_cast<size_t>(ch.index)], s, d_out, g_next);
  const auto want = token_recurrence_backward(one, dr::Cotangents<Exact>{d_out, g_next});
  require_equal("chunk dq", cg.dq, want.dq);
  require_equal("chunk dk", cg.dk, want.dk);
  require_equal("chunk dv", cg.dv, want.dv);
  require_equal("chunk dbeta", Matrix<Exact>(cg.d_beta), Matrix<Exact>(want.d_beta));
  require_equal("chunk dS_[c]", cg.d_state, want.d_initial_state);
  if constexpr (gated)
    require_equal("chunk dalpha from dGamma", Matrix<Exact>(gd::gate_gradient_from_decay(fwd.chunks[static_cast<size_t>(ch.index)].decay, cg.d_decay)),
                  Matrix<Exact>(want.d_alpha));
}

RC_GTEST_PROP(OracleApi, DeltaRuleChunkBackwardIsTheChunksRecurrenceBackward, ()) {
  check_chunk_backward_is_the_chunks_recurrence_backward(*gen_delta_case({.max_length = 24, .max_dim = 6, .max_chunk = 12}));
}

RC_GTEST_PROP(OracleApi, GatedDeltaRuleChunkBackwardIsTheChunksRecurrenceBackward, ()) {
  check_chunk_backward_is_the_chunks_recurrence_backward(*gen_gated_delta_case({.max_length = 24, .max_dim = 6, .max_chunk = 12}));
}

// dL/dg_j = α_j dL/dα_j for any decay cotangent dΓ: Γ(j−1, s) α_j Γ(e, j) = Γ(e, s).
RC_GTEST_PROP(OracleApi, LogGateGradientIsAlphaTimesTheGateGradient, ()) {
  const Index n = *rc::gen::inRange<Index>(1, 9);
  const Vector<Exact> alpha = *gen_gates(n, GateRegime::mixed);
  const Matrix<Exact> decay = gd::decay_from_gates(alpha);
  const Matrix<Exact> d_decay = *gen_matrix(n + 1, n + 1);
  require_equal("dL/dg vs alpha dL/dalpha", Matrix<Exact>(gd::log_gate_gradient_from_decay(decay, d_decay)),
                Matrix<Exact>(alpha.cwiseProduct(gd::gate_gradient_from_decay(decay, d_decay))));
}

// Every family's inputs check the same shapes and name the argument: the tokens (q, k, v), each
// per-token coefficient by name, and the initial state with its shape.
TEST(OracleApi, EveryInputsNamesItsBadArgument) {
  const auto names = [](const auto& validate, const std::string& name) {
    try {
      validate();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "bad " << name << " accepted";
  };
  const Matrix<double> q = Matrix<double>::Ones(4, 3), v = Matrix<double>::Ones(4, 2);
  const Vector<double> ones = Vector<double>::Ones(4), short_ = Vector<double>::Ones(3);
  names([&] { la::Inputs<double>{q, Matrix<double>::Ones(5, 3), v, std::nullopt}.validate(); }, "q, k, v must have the same length L");
  names([&] { la::Inputs<double>{q, Matrix<double>::Ones(4, 2), v, std::nullopt}.validate(); }, "key dim DK");
  names([&] { la::Inputs<double>{q, q, v, Matrix<double>::Ones(3, 2)}.validate(); }, "initial_state must be (DV, DK)");
  names([&] { dr::Inputs<double>{q, q, v, short_, std::nullopt}.validate(); }, "beta");
  names([&] { gd::Inputs<double>{q, q, v, ones, short_, std::nullopt}.validate(); }, "alpha");
  names([&] { gd::LogGateInputs<double>{q, q, v, ones, short_, std::nullopt}.validate(); }, "log_gate");
  names([&] { gd::ScalarGateInputs<double>{q, q, v, short_, std::nullopt}.validate(); }, "alpha");
  names([&] { ref::ttt::Inputs<double>{q, q, v, short_, std::nullopt}.validate(3); }, "learning_rate");
  names([&] { ref::ttt::Inputs<double>{q, q, v, ones, Matrix<double>::Ones(2, 3)}.validate(6); }, "(DV, DF)");
  names([&] { ref::lact::Inputs<double>{q, q, v, short_, {Matrix<double>::Ones(2, 3)}}.validate<ref::lact::LinearFastWeight>(); },
        "learning_rate");
  names([&] { ref::lact::Inputs<double>{q, q, v, ones, {Matrix<double>::Ones(3, 2)}}.validate<ref::lact::LinearFastWeight>(); },
        "initial_weights");
  // S_0 or the zero state, (DV, DK), or (DV, DF) for TTT's features.
  EXPECT_EQ(la::Inputs<double>({q, q, v, std::nullopt}).initial_state_or_zero(), Matrix<double>(Matrix<double>::Zero(2, 3)));
  EXPECT_EQ(ref::ttt::Inputs<double>({q, q, v, ones, std::nullopt}).initial_state_or_zero(6), Matrix<double>(Matrix<double>::Zero(2, 6)));
  EXPECT_EQ(dr::Inputs<double>({q, q, v, ones, Matrix<double>::Constant(2, 3, 0.5)}).initial_state_or_zero(),
            Matrix<double>(Matrix<double>::Constant(2, 3, 0.5)));
}

// The dispatch by Form is the named form, forward and backward.
RC_GTEST_PROP(OracleApi, LinearAttentionDispatchByFormIsTheNamedForm, ()) {
  const auto c = *gen_linear_attention_case({.max_length = 16, .max_dim = 6});
  const Index C = c.shape.chunk_size;
  require_equal("forward(parallel)", la::forward(la::Form::parallel, c.inputs, C).output, la::parallel_masked(c.inputs).output);
  require_equal("forward(recurrent)", la::forward(la::Form::recurrent, c.inputs, C).final_state, la::token_recurrence(c.inputs).final_state);
  require_equal("forward(chunkwise)", la::forward(la::Form::chunkwise, c.inputs, C).output, la::chunkwise(c.inputs, C).output);
  require_equal("backward(parallel)", la::backward(la::Form::parallel, c.inputs, c.cotangents, C).dk,
                la::parallel_masked_backward(c.inputs, c.cotangents).dk);
  require_equal("backward(recurrent)", la::backward(la::Form::recurrent, c.inputs, c.cotangents, C).dq,
                la::token_recurrence_backward(c.inputs, c.cotangents).dq);
  require_equal("backward(chunkwise)", la::backward(la::Form::chunkwise, c.inputs, c.cotangents, C).d_initial_state,
                la::chunkwise_backward(c.inputs, c.cotangents, C).d_initial_state);
}

// Gated DeltaNet's conditioning report with every α = 1 is DeltaNet's, row for row (the gated
// forms multiply by exact ones there, in float too).
RC_GTEST_PROP(OracleApi, GatedConditioningWithAlphaOneIsDeltaNets, ()) {
  const auto d = *gen_delta_case({.max_length = 12, .max_dim = 4, .max_chunk = 12});
  const gd::Inputs<Exact> ones{d.inputs.q, d.inputs.k, d.inputs.v, d.inputs.beta, Vector<Exact>::Ones(d.shape.length),
                               d.inputs.initial_state};
  const std::vector<Index> sizes{1, d.shape.chunk_size};
  const auto gated = ref::conditioning<float>(ones, sizes), plain = ref::conditioning<float>(d.inputs, sizes);
  RC_ASSERT(gated.size() == plain.size());
  for (size_t r = 0; r < plain.size(); ++r) {
    RC_ASSERT(gated[r].max_abs_t == plain[r].max_abs_t && gated[r].max_abs_w == plain[r].max_abs_w);
    RC_ASSERT(gated[r].chunkwise_relative_l2 == plain[r].chunkwise_relative_l2);
    RC_ASSERT(gated[r].recurrence_relative_l2 == plain[r].recurrence_relative_l2);
  }
}

// ---------------------------------------------------------------------------------------
// Gated DeltaNet's decays.

// D_ri = Γ(r+1, i+1) = Π_{i<t≤r} α_t (0-based tokens) for r ≥ i, 0 above; λ_i = Π_{i<t<C} α_t.
RC_GTEST_PROP(OracleApi, TokenDecayAndDecayToEndAreTheGateProducts, ()) {
  const Index n = *rc::gen::inRange<Index>(1, 10);
  const Vector<Exact> alpha = *gen_gates(n, GateRegime::mixed);
  const Matrix<Exact> decay = gd::decay_from_gates(alpha);
  const Matrix<Exact> d = gd::token_decay(decay);
  const Vector<Exact> lambda = gd::decay_to_end(decay);
  RC_ASSERT(d.rows() == n && d.cols() == n && lambda.size() == n);
  for (Index i = 0; i < n; ++i) {
    Exact product(1);
    for (Index r = 0; r < n; ++r) {
      if (r > i) product *= alpha(r);
      RC_ASSERT(d(r, i) == (r >= i ? product : Exact(0)));
    }
    RC_ASSERT(lambda(i) == product);  // the loop ended at r = C − 1
  }
}

// α = exp(g): with_gates turns the kernels' log-gates back into the oracle's gates.
TEST(OracleApi, WithGatesExponentiatesTheLogGates) {
  gd::LogGateInputs<High> in{Matrix<High>::Ones(3, 2), Matrix<High>::Ones(3, 2), Matrix<High>::Ones(3, 1),
                             Vector<High>::Constant(3, High(0.5)), Vector<High>(3), std::nullopt};
  const High gates[] = {High(1), High(1) / 8, High(1) / 8192};
  for (int t = 0; t < 3; ++t) in.log_gate(t) = log(gates[t]);
  const gd::Inputs<High> out = gd::with_gates(in);
  for (int t = 0; t < 3; ++t) EXPECT_LT(abs(out.alpha(t) - gates[t]), High(1e-95)) << "token " << t;
  EXPECT_EQ(out.beta, in.beta);
  EXPECT_FALSE(out.initial_state.has_value());
}

// ---------------------------------------------------------------------------------------
// Nonlinearities (High) and LaCT's schedule names.

// Each hand-written derivative against a central difference in 100 digits: error O(h²) ≈ 1e-40.
TEST(OracleApi, SiluAndGeluDerivativesMatchCentralDifferences) {
  const High h("1e-20");
  for (const char* at : {"-3.5", "-0.25", "0", "0.125", "2"}) {
    const High x(at);
    const High silu_difference = (ref::lact::silu(x + h) - ref::lact::silu(x - h)) / (2 * h);
    EXPECT_LT(abs(silu_difference - ref::lact::silu_derivative(x)), High("1e-35")) << "silu at " << at;
    const High gelu_difference = (ref::ttt::gelu(x + h) - ref::ttt::gelu(x - h)) / (2 * h);
    EXPECT_LT(abs(gelu_difference - ref::ttt::gelu_derivative(x)), High("1e-35")) << "gelu at " << at;
    // The dual-number forms carry the same derivative in their tangent.
    EXPECT_EQ(ref::lact::silu(ref::Dual<High>(x, High(1))).tangent, ref::lact::silu_derivative(x));
    EXPECT_EQ(ref::ttt::gelu(ref::Dual<High>(x, High(1))).tangent, ref::ttt::gelu_derivative(x));
  }
  EXPECT_EQ(ref::lact::silu(High(0)), High(0));
  EXPECT_EQ(ref::ttt::gelu(High(0)), High(0));
}

TEST(OracleApi, LactScheduleNamesParseBack) {
  for (auto s : {ref::lact::Schedule::UpdateThenApply, ref::lact::Schedule::ApplyThenUpdate, ref::lact::Schedule::SingleChunk})
    EXPECT_EQ(ref::lact::parse_schedule(ref::lact::to_string(s)), s);
  EXPECT_FALSE(ref::lact::parse_schedule("update_apply").has_value());
  EXPECT_FALSE(ref::lact::parse_schedule("").has_value());
}

TEST(OracleApi, HighAgreementBoundScalesWithTheLargestEntry) {
  EXPECT_EQ(ref::high_agreement_relative_bound(), Exact(1) / Exact(boost::multiprecision::pow(boost::multiprecision::mpz_int(10), 60)));
  const Matrix<Exact> bound = ref::high_agreement_bound(Matrix<double>(Matrix<double>::Constant(2, 3, -4.0)));
  EXPECT_EQ(bound, Matrix<Exact>(Matrix<Exact>::Constant(2, 3, 5 * ref::high_agreement_relative_bound())));
}

// ---------------------------------------------------------------------------------------
// TTT's and LaCT's helpers.

// ∇_W ℓ(W φ, v) by dual numbers, weight by weight, is the closed form ∂ℓ/∂f φᵀ, for each loss.
template <class Loss>
void check_loss_gradient_by_dual(const Matrix<Exact>& w, const Vector<Exact>& phi, const Vector<Exact>& target) {
  const Vector<Exact> f = w * phi;
  require_equal(std::string("dual gradient vs dl/df phi^T for ") + Loss::name, ref::ttt::loss_gradient_by_dual<Exact, Loss>(w, phi, target),
                Matrix<Exact>(Loss::output_gradient(f, target) * phi.transpose()));
}

RC_GTEST_PROP(OracleApi, TttLossGradientByDualIsTheClosedForm, ()) {
  const Index dv = *rc::gen::inRange<Index>(1, 4), df = *rc::gen::inRange<Index>(1, 5);
  const Matrix<Exact> w = *gen_matrix(dv, df);
  const Vector<Exact> phi = (*gen_matrix(df, 1)).col(0), target = (*gen_matrix(dv, 1)).col(0);
  check_loss_gradient_by_dual<ref::ttt::SquaredBinding>(w, phi, target);
  check_loss_gradient_by_dual<ref::ttt::NegativeDot>(w, phi, target);
  check_loss_gradient_by_dual<ref::ttt::QuarticBinding>(w, phi, target);
}

// With η = 0 nothing is learned: both TTT-MLP forms read f(q_t) = W2 σ(W1 q_t) (mlp_apply) with
// the initial weights, and keep them; bad weight shapes and b = 0 are refused (validate_mlp).
TEST(OracleApi, TttMlpApplyIsWhatBothFormsReadWithoutLearning) {
  ref::RandomDyadic random(5);
  const ref::ttt::Inputs<High> in{random.matrix<High>(6, 3), random.matrix<High>(6, 3), random.matrix<High>(6, 2),
                                  Vector<High>::Zero(6), std::nullopt};
  const ref::ttt::MlpWeights<High> w0{random.matrix<High>(4, 3), random.matrix<High>(2, 4)};
  const auto primal = ref::ttt::mlp_minibatch_primal(in, w0, 4), dual = ref::ttt::mlp_minibatch_dual(in, w0, 4);
  Matrix<High> applied(6, 2);
  for (Index t = 0; t < 6; ++t) applied.row(t) = ref::ttt::mlp_apply(w0.w1, w0.w2, Vector<High>(in.q.row(t).transpose())).transpose();
  const Matrix<Exact> bound = ref::high_agreement_bound(applied);
  for (const auto* out : {&primal, &dual}) {
    EXPECT_TRUE(ref::compare<Exact>("output", ref::matrix_cast<Exact>(out->output), ref::matrix_cast<Exact>(applied), bound).within_bound);
    EXPECT_EQ(out->final_weights.w1, w0.w1);
    EXPECT_EQ(out->final_weights.w2, w0.w2);
  }
  EXPECT_THROW(ref::ttt::validate_mlp(in, {w0.w1, Matrix<High>::Ones(2, 3)}, 4), std::invalid_argument);  // W2 (DV, DH) = (2, 4)
  EXPECT_THROW(ref::ttt::validate_mlp(in, {Matrix<High>::Ones(4, 2), w0.w2}, 4), std::invalid_argument);  // W1 (DH, DK) = (4, 3)
  EXPECT_THROW(ref::ttt::validate_mlp(in, w0, 0), std::invalid_argument);
}

// For the linear fast weight ℓ_c(W) = −Σ η_i v_iᵀ W k_i is linear in W: ℓ_c(W) = <W, ∇ℓ_c>; its
// gradient does not depend on W, so the running-weights schedule (a planted bug elsewhere) gives
// the same sum; one absorbed chunk moves W by exactly −g_c (plus μ times the last update).
RC_GTEST_PROP(OracleApi, LactLinearFastWeightHelpersOverRationals, ()) {
  namespace lact = ref::lact;
  const Index n = *rc::gen::inRange<Index>(1, 5), dk = *rc::gen::inRange<Index>(1, 4), dv = *rc::gen::inRange<Index>(1, 4);
  const Matrix<Exact> k = *gen_matrix(n, dk), v = *gen_matrix(n, dv);
  const Vector<Exact> eta = *gen_gates(n, GateRegime::generic);
  const lact::Weights<Exact> w{*gen_matrix(dv, dk)};
  const lact::Weights<Exact> g = lact::LinearFastWeight::chunk_gradient(w, k, v, eta);
  RC_ASSERT(lact::inner_loss<lact::LinearFastWeight>(w, k, v, eta) == ref::frobenius_inner(w[0], g[0]));
  require_equal("running-weights gradient (linear)", lact::chunk_gradient<Exact, lact::LinearFastWeight, lact::GradientAtRunningWeights>(w, k, v, eta)[0],
                g[0]);
  require_equal("faithful chunk gradient", lact::chunk_gradient<Exact, lact::LinearFastWeight, lact::Faithful>(w, k, v, eta)[0], g[0]);
  lact::Options<Exact> opt;
  opt.momentum = Exact(1, 2);
  lact::Weights<Exact> moved = w, buffer{Matrix<Exact>::Zero(dv, dk)};
  lact::absorb_chunk<Exact, lact::LinearFastWeight, lact::Faithful>(moved, buffer, w, k, v, eta, opt);
  require_equal("W after one chunk", moved[0], Matrix<Exact>(w[0] - g[0]));
  lact::absorb_chunk<Exact, lact::LinearFastWeight, lact::Faithful>(moved, buffer, w, k, v, eta, opt);
  require_equal("momentum buffer after two", buffer[0], Matrix<Exact>(g[0] * Exact(3, 2)));
  require_equal("W after two chunks", moved[0], Matrix<Exact>(w[0] - g[0] * Exact(5, 2)));
  // lift: the same values on dual numbers, every tangent zero.
  const lact::Inputs<Exact> in{*gen_matrix(n, dk), k, v, eta, w};
  const auto lifted = lact::lift(in);
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < dk; ++j) RC_ASSERT(lifted.k(i, j).value == k(i, j) && lifted.k(i, j).tangent == Exact(0));
  RC_ASSERT(lifted.initial_weights.size() == 1 && lifted.initial_weights[0](0, 0).value == w[0](0, 0));
}

TEST(OracleApi, LactScheduleChunksAndOptionsCast) {
  namespace lact = ref::lact;
  using S = lact::Schedule;
  // Token i = 5 with C = 2 is in chunk 2; update→apply reads the weights after chunk 2, apply→update after chunk 1.
  EXPECT_EQ(lact::chunk_of(S::UpdateThenApply, 5, 2), 2);
  EXPECT_EQ(lact::chunk_of(S::SingleChunk, 5, 2), 0);
  EXPECT_EQ(lact::last_absorbed_chunk(S::UpdateThenApply, 5, 2), 2);
  EXPECT_EQ(lact::last_absorbed_chunk(S::ApplyThenUpdate, 5, 2), 1);
  EXPECT_EQ(lact::last_absorbed_chunk(S::ApplyThenUpdate, 1, 2), -1);  // the first chunk reads W_[0]
  EXPECT_EQ(lact::last_absorbed_chunk(S::SingleChunk, 5, 2), 0);
  const lact::Options<Exact> o{S::ApplyThenUpdate, 3, 2, Exact(1, 4), true, true};
  const lact::Options<double> d = lact::options_cast(o, 0.25);
  EXPECT_TRUE(d.schedule == S::ApplyThenUpdate && d.chunk_size == 3 && d.window == 2 && d.momentum == 0.25 && d.weight_norm &&
              d.orthogonalize);
}

// Rows rescaled to the given norms (to High's rounding), a zero row left as it is; row_norms reads them back.
TEST(OracleApi, LactWithRowNormsSetsEachNonZeroRow) {
  namespace lact = ref::lact;
  Matrix<High> w(3, 2);
  w << High(3), High(4), High(0), High(0), High(-1), High(1);
  const Vector<High> norms = (Vector<High>(3) << High(10), High(7), High(2)).finished();
  const Matrix<High> scaled = lact::with_row_norms(w, norms);
  const Vector<High> back = lact::row_norms(scaled);
  EXPECT_LT(abs(back(0) - 10), High("1e-95"));
  EXPECT_LT(abs(back(2) - 2), High("1e-95"));
  EXPECT_EQ(Matrix<High>(scaled.row(1)), Matrix<High>(w.row(1)));
  EXPECT_LT(abs(scaled(0, 0) - 6), High("1e-95"));  // direction kept: (3, 4) → (6, 8)
}

// ---------------------------------------------------------------------------------------
// Utilities of the oracle.

RC_GTEST_PROP(OracleApi, FrobeniusInnerAndAlongAreTheirFormulas, ()) {
  const Index r = *rc::gen::inRange<Index>(1, 4), c = *rc::gen::inRange<Index>(1, 4);
  const Matrix<Exact> a = *gen_matrix(r, c), b = *gen_matrix(r, c);
  RC_ASSERT(ref::frobenius_inner(a, b) == Matrix<Exact>(a.transpose() * b).trace());
  const ref::Params<Exact> x{{"a", a}, {"b", b}}, u{{"a", b}, {"b", a}};
  const Exact t = *gen_entry();
  const auto moved = ref::along(x, t, u);
  require_equal("x + t u (a)", moved[0].value, Matrix<Exact>(a + t * b));
  require_equal("x + t u (b)", moved[1].value, Matrix<Exact>(b + t * a));
}

TEST(OracleApi, RelativeL2AndRequire) {
  const Matrix<Exact> reference = Matrix<Exact>::Constant(2, 2, Exact(2));
  EXPECT_EQ(ref::relative_l2<Exact>(Matrix<Exact>::Constant(2, 2, Exact(3)), reference), 0.5);  // ‖1‖ / ‖2‖
  EXPECT_EQ(ref::relative_l2<Exact>(reference, reference), 0.0);
  EXPECT_EQ(ref::relative_l2<Exact>(Matrix<Exact>::Zero(2, 2), Matrix<Exact>::Zero(2, 2)), 0.0);
  EXPECT_EQ(ref::relative_l2<Exact>(reference, Matrix<Exact>::Zero(2, 2)), INFINITY);
  try {
    ref::require(false, "chunk_size must be >= 1");
    ADD_FAILURE() << "require(false) returned";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "chunk_size must be >= 1");
  }
  EXPECT_NO_THROW(ref::require(true, "unused"));
}

// (x + y)² = x² + 2xy + y² as terms; its derivative in x is 2x + 2y; printed with the given names.
TEST(OracleApi, PolynomialTermsDerivativeAndPrinting) {
  const ref::Polynomial x = ref::Polynomial::variable(0), y = ref::Polynomial::variable(1);
  const ref::Polynomial square = (x + y) * (x + y);
  EXPECT_EQ(square.size(), 3u);
  EXPECT_EQ(square.terms().at({0, 1}), Exact(2));
  EXPECT_EQ(square.derivative(0), ref::Polynomial(2) * x + ref::Polynomial(2) * y);
  EXPECT_EQ(square.str({"x", "y"}), "1*x*x + 2*x*y + 1*y*y");
  EXPECT_EQ((square - square).size(), 0u);
  EXPECT_EQ(ref::Polynomial().str({}), "0");
}

// A parameter prints as its name, shape and exact entries (rapidcheck's counterexamples).
TEST(OracleApi, ParamPrintsNameShapeAndEntries) {
  std::ostringstream s;
  s << ref::Param<Exact>{"beta", (Matrix<Exact>(2, 1) << Exact(1, 2), Exact(-3)).finished()};
  EXPECT_EQ(s.str(), "beta (2x1) =\n  [1/2]\n  [-3]\n");
}

}  // namespace
}  // namespace deltaproof::testing
