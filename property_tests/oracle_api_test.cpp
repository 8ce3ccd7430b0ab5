// Public functions of the oracle that no other CPU test calls (issue 14: "every public function of
// the oracle exercised by a CPU test"). Before this file, linear attention's batched backward and
// tensor_cast were reached only from GPU tests, Gated DeltaNet's batched forms and with_gates from
// nothing on the CPU, and the helpers below only through the forms built on them. Each property
// is exact over ℚ where the function is rational; SiLU, GELU and exp are checked in High.
#include "property_tests/batch_properties.hpp"
#include "property_tests/support/assertions.hpp"
#include "property_tests/support/delta_cases.hpp"
#include "property_tests/support/linear_attention_cases.hpp"
#include "reference/high_agreement.hpp"
#include "reference/lact.hpp"
#include "reference/ttt.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

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

TEST(OracleApi, GatedDeltaRuleBatchedRejectsGatesOfTheWrongShape) {
  gd::BatchInputs<Exact> in{Tensor4<Exact>(1, 2, 3, 2), Tensor4<Exact>(1, 2, 3, 2), Tensor4<Exact>(1, 2, 3, 2),
                            Tensor4<Exact>(1, 2, 3, 1), Tensor4<Exact>(1, 2, 4, 1), std::nullopt};
  EXPECT_THROW(gd::batched(in, [](const gd::Inputs<Exact>& x) { return gd::token_recurrence(x); }), std::invalid_argument);
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

}  // namespace
}  // namespace deltaproof::testing
