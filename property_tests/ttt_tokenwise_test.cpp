// Tokenwise TTT with a linear last layer: each theorem against the plain gradient-descent loop
// (gradients by dual numbers, no hand-derived formula), exactly over ℚ.
#include "property_tests/ttt_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

// ½‖S k − v‖², one step per token: exactly DeltaNet.
RC_GTEST_PROP(TttTokenwise, SquaredBindingLossIsDeltaNet, ()) {
  const auto c = *gen_ttt_case({.max_length = 64, .max_dim = 9});
  const auto gd = ttt::gradient_descent<Exact, ttt::SquaredBinding>(c.inputs);
  const auto delta = delta_rule_recurrence(c.inputs);
  require_equal("TTT(squared) output vs DeltaNet", gd.output, delta.output);
  require_equal("TTT(squared) final state vs DeltaNet", gd.final_state, delta.final_state);
}

// −vᵀ S k: exactly additive linear attention with v scaled by η (every form of it).
RC_GTEST_PROP(TttTokenwise, LinearObjectiveIsLinearAttention, ()) {
  const auto c = *gen_ttt_case({.max_length = 64, .max_dim = 9});
  const auto gd = ttt::gradient_descent<Exact, ttt::NegativeDot>(c.inputs);
  const la::Inputs<Exact> writes{c.inputs.q, c.inputs.k, c.inputs.learning_rate.asDiagonal() * c.inputs.v,
                                 c.inputs.initial_state};
  const auto recurrent = la::token_recurrence(writes);
  const auto chunked = la::chunkwise(writes, c.shape.chunk_size);
  require_equal("TTT(linear) output vs linear attention", gd.output, recurrent.output);
  require_equal("TTT(linear) final state vs linear attention", gd.final_state, recurrent.final_state);
  require_equal("TTT(linear) output vs chunkwise linear attention", gd.output, chunked.output);
}

// One gradient step on the last linear layer = a linear-attention write with k̂ = φ(k),
// v̂ = −η ∂ℓ/∂f, the feature map frozen: the writes, replayed through linear attention's own
// recurrence and parallel form, give the loop's outputs and final weights.
template <class Loss, class Features>
void check_general_statement(const TttCase& c) {
  const auto gd = ttt::gradient_descent<Exact, Loss, Features>(c.inputs);
  const auto as_la = ttt::as_linear_attention<Exact, Loss, Features>(c.inputs);
  const std::string what = std::string(Loss::name) + ", phi = " + Features::name;
  require_equal("write form vs gradient descent output (" + what + ")", as_la.forward.output, gd.output);
  require_equal("write form vs gradient descent final W (" + what + ")", as_la.forward.final_state, gd.final_state);
  const auto replay = la::token_recurrence(as_la.writes);
  require_equal("linear attention on (phi(q), phi(k), v_hat) vs gradient descent (" + what + ")", replay.output, gd.output);
  require_equal("linear attention final state vs final W (" + what + ")", replay.final_state, gd.final_state);
  require_equal("parallel linear attention on the writes (" + what + ")", la::parallel_masked(as_la.writes).output, gd.output);
}

RC_GTEST_PROP(TttTokenwise, GeneralStatementIdentityFeatures, ()) {
  const auto c = *gen_ttt_case({.max_length = 24, .max_dim = 5});
  check_general_statement<ttt::SquaredBinding, ttt::IdentityFeatures>(c);
  check_general_statement<ttt::NegativeDot, ttt::IdentityFeatures>(c);
}

RC_GTEST_PROP(TttTokenwise, GeneralStatementFrozenQuadraticFeatures, ()) {
  const auto c = *gen_ttt_case({.max_length = 16, .max_dim = 4}, 2);
  check_general_statement<ttt::SquaredBinding, ttt::QuadraticFeatures>(c);
  check_general_statement<ttt::NegativeDot, ttt::QuadraticFeatures>(c);
}

// A non-quadratic loss: v̂ is cubic in the state, so rationals grow fast; short sequences.
RC_GTEST_PROP(TttTokenwise, GeneralStatementQuarticLoss, ()) {
  check_general_statement<ttt::QuarticBinding, ttt::IdentityFeatures>(*gen_ttt_case({.max_length = 5, .max_dim = 3, .max_chunk = 4}));
  check_general_statement<ttt::QuarticBinding, ttt::QuadraticFeatures>(*gen_ttt_case({.max_length = 5, .max_dim = 3, .max_chunk = 4}, 2));
}

// Momentum M_t = a_t M_{t−1} + η_t ∇ℓ_t: at step t the write of token i carries
// A_ti = Σ_{j=i..t} Π_{s=i+1..j} a_s; the masked form equals the loop.
template <class Loss, class Features>
void check_momentum(const TttCase& c) {
  const auto gd = ttt::gradient_descent<Exact, Loss, Features>(c.inputs, {1, c.momentum});
  const auto masked = ttt::momentum_linear_attention<Exact, Loss, Features>(c.inputs, c.momentum);
  const std::string what = std::string(Loss::name) + ", phi = " + Features::name;
  require_equal("momentum masked form vs loop output (" + what + ")", masked.output, gd.output);
  require_equal("momentum masked form vs loop final W (" + what + ")", masked.final_state, gd.final_state);
}

RC_GTEST_PROP(TttTokenwise, MomentumIsLinearAttentionWithMomentumMask, ()) {
  const auto c = *gen_ttt_case({.max_length = 16, .max_dim = 4});
  check_momentum<ttt::SquaredBinding, ttt::IdentityFeatures>(c);
  check_momentum<ttt::NegativeDot, ttt::IdentityFeatures>(c);
}

RC_GTEST_PROP(TttTokenwise, MomentumWithFrozenFeaturesAndQuarticLoss, ()) {
  const auto c = *gen_ttt_case({.max_length = 5, .max_dim = 3, .max_chunk = 4}, 2);
  check_momentum<ttt::SquaredBinding, ttt::QuadraticFeatures>(c);
  check_momentum<ttt::QuarticBinding, ttt::QuadraticFeatures>(c);
}

// The linear objective with momentum is linear attention with the mask A (fixed writes η v).
RC_GTEST_PROP(TttTokenwise, MomentumMaskMatchesUnrolledSum, ()) {
  const auto c = *gen_ttt_case({.max_length = 12, .max_dim = 3});
  const Matrix<Exact> a = ttt::momentum_mask(c.momentum);
  for (Index t = 0; t < a.rows(); ++t)
    for (Index i = 0; i < a.cols(); ++i) {
      Exact expected(0);  // Σ_{j=i..t} Π_{s=i+1..j} a_s, straight from the statement
      for (Index j = i; j <= t; ++j) {
        Exact product(1);
        for (Index s = i + 1; s <= j; ++s) product *= c.momentum(s);
        expected += product;
      }
      RC_ASSERT(a(t, i) == expected);
    }
  // a ≡ 0 is plain TTT: the mask is causal.
  RC_ASSERT(ttt::momentum_mask(Vector<Exact>(Vector<Exact>::Zero(c.shape.length))) == ref::causal_mask<Exact>(c.shape.length));
}

TEST(TttTokenwise, RejectsBadInput) {
  ttt::Inputs<double> in{Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 2),
                         Vector<double>::Ones(4), std::nullopt};
  EXPECT_THROW((ttt::gradient_descent<double, ttt::SquaredBinding>(in, {0, std::nullopt})), std::invalid_argument);
  EXPECT_THROW((ttt::minibatch_dual<double, ttt::SquaredBinding>(in, 0)), std::invalid_argument);
  in.learning_rate = Vector<double>::Ones(3);
  EXPECT_THROW((ttt::gradient_descent<double, ttt::SquaredBinding>(in)), std::invalid_argument);
  in.learning_rate = Vector<double>::Ones(4);
  in.k = Matrix<double>::Ones(5, 3);
  EXPECT_THROW((ttt::as_linear_attention<double, ttt::NegativeDot>(in)), std::invalid_argument);
  in.k = Matrix<double>::Ones(4, 3);
  in.initial_state = Matrix<double>::Ones(3, 2);  // (DK, DV): transposed
  EXPECT_THROW((ttt::gradient_descent<double, ttt::NegativeDot>(in)), std::invalid_argument);
  try {
    ttt::minibatch_dual<double, ttt::NegativeDot>(in, 0);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("initial_state"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deltaproof::testing
