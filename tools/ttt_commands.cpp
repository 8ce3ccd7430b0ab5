// `deltaproof verify --op ttt`: the TTT theorems on one seeded case, exactly over ℚ (TTT-MLP in
// High, within the agreement bound of reference/high_agreement.hpp). --C is the mini-batch size b.
#include "reference/delta_rule.hpp"
#include "reference/linear_attention.hpp"
#include "reference/random_inputs.hpp"
#include "reference/ttt.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"
#include "tools/report.hpp"

#include <algorithm>
#include <iostream>

namespace deltaproof::tools {
namespace {

namespace ttt = ref::ttt;
namespace la = ref::linear_attention;
using ref::Exact;
using ref::High;
using ref::Index;
using ref::Matrix;
using ref::Vector;

// The quartic loss makes v̂ cubic in the state, so rationals triple in size per token: it is
// checked on a short prefix only.
constexpr Index quartic_prefix = 4;
constexpr Index mlp_hidden_dim = 4;

Vector<Exact> fractions(ref::RandomDyadic& random, Index n, int denominator) {
  Vector<Exact> r(n);
  for (Index i = 0; i < n; ++i) r(i) = random.unit_interval<Exact>(denominator);
  return r;
}

ttt::Inputs<Exact> make_inputs(ref::RandomDyadic& random, Index length, Index key_dim, Index value_dim, Index feature_dim) {
  ttt::Inputs<Exact> in;
  in.q = random.matrix<Exact>(length, key_dim);
  in.k = random.matrix<Exact>(length, key_dim);
  in.v = random.matrix<Exact>(length, value_dim);
  in.learning_rate = fractions(random, length, 8);  // η = p/8 ∈ (0, 1]
  in.initial_state = random.matrix<Exact>(value_dim, feature_dim);
  return in;
}

ttt::Inputs<Exact> prefix(const ttt::Inputs<Exact>& in, Index n) {
  return {in.q.topRows(n), in.k.topRows(n), in.v.topRows(n), in.learning_rate.head(n), in.initial_state};
}

void add_exact(ComparisonTable& t, const std::string& quantity, const std::string& left, const std::string& right,
               const Matrix<Exact>& a, const Matrix<Exact>& b) {
  const auto s = ref::compare<Exact>(quantity, a, b);
  t.add(quantity, left, right, s, s.exact_zero());
}

void add_high(ComparisonTable& t, const std::string& quantity, const std::string& left, const std::string& right,
              const Matrix<High>& a, const Matrix<High>& b) {
  const auto s = ref::compare<Exact>(quantity, ref::matrix_cast<Exact>(a), ref::matrix_cast<Exact>(b),
                                     ref::high_agreement_bound(b));
  t.add(quantity, left, right, s, s.within_bound);
}

template <class Loss, class Features>
void add_general_statement(ComparisonTable& t, const ttt::Inputs<Exact>& in, const std::string& label) {
  const auto gd = ttt::gradient_descent<Exact, Loss, Features>(in);
  const auto writes = ttt::as_linear_attention<Exact, Loss, Features>(in);
  const auto replay = la::token_recurrence(writes.writes);
  add_exact(t, "output", "GD " + label, "LA writes", gd.output, replay.output);
  add_exact(t, "final W", "GD " + label, "LA writes", gd.final_state, replay.final_state);
}

}  // namespace

int verify_ttt(const CaseOptions& o) {
  if (o.scalar != "exact") {
    std::cerr << "deltaproof: --scalar: --op ttt verifies over exact rationals (High for TTT-MLP); only exact is allowed\n";
    return 2;
  }
  const Index L = o.length, DK = o.key_dim, DV = o.value_dim, b = o.chunk_size;
  std::cout << "deltaproof verify: TTT, L=" << L << " b=C=" << b << " DK=" << DK << " DV=" << DV << " seed=" << o.seed
            << "\ninputs: q, k, v, W_0 with entries n/4, |n| <= 8; eta = p/8 in (0, 1]; momentum a = p/4 in (0, 1]\n\n";
  Progress progress("deltaproof verify --op ttt", 3);
  progress.step("tokenwise TTT");
  ref::RandomDyadic random(o.seed);
  const ttt::Inputs<Exact> in = make_inputs(random, L, DK, DV, DK);
  const ttt::Inputs<Exact> in_quadratic = make_inputs(random, L, DK, DV, 2 * DK);
  const Vector<Exact> momentum = fractions(random, L, 4);

  ComparisonTable tokenwise("tokenwise TTT, f(x) = W phi(x), one gradient step per token (exact over Q)");
  {
    const auto gd = ttt::gradient_descent<Exact, ttt::SquaredBinding>(in);
    const auto delta = ref::delta_rule::token_recurrence(
        ref::delta_rule::Inputs<Exact>{in.q, in.k, in.v, in.learning_rate, in.initial_state});
    add_exact(tokenwise, "output", "GD 1/2|Sk-v|^2", "DeltaNet", gd.output, delta.output);
    add_exact(tokenwise, "final W", "GD 1/2|Sk-v|^2", "DeltaNet", gd.final_state, delta.final_state);
  }
  {
    const auto gd = ttt::gradient_descent<Exact, ttt::NegativeDot>(in);
    const auto lin = la::token_recurrence(la::Inputs<Exact>{in.q, in.k, in.learning_rate.asDiagonal() * in.v, in.initial_state});
    add_exact(tokenwise, "output", "GD -v.Sk", "linear attn (eta v)", gd.output, lin.output);
    add_exact(tokenwise, "final W", "GD -v.Sk", "linear attn (eta v)", gd.final_state, lin.final_state);
  }
  add_general_statement<ttt::SquaredBinding, ttt::IdentityFeatures>(tokenwise, in, "squared");
  add_general_statement<ttt::SquaredBinding, ttt::QuadraticFeatures>(tokenwise, in_quadratic, "squared, [x,x*x]");
  add_general_statement<ttt::NegativeDot, ttt::QuadraticFeatures>(tokenwise, in_quadratic, "-v.f, [x,x*x]");
  const Index n = std::min(L, quartic_prefix);
  add_general_statement<ttt::QuarticBinding, ttt::QuadraticFeatures>(tokenwise, prefix(in_quadratic, n),
                                                                     "quartic, first " + std::to_string(n));
  {
    const auto gd = ttt::gradient_descent<Exact, ttt::SquaredBinding>(in, {1, momentum});
    const auto masked = ttt::momentum_linear_attention<Exact, ttt::SquaredBinding>(in, momentum);
    add_exact(tokenwise, "output", "GD+momentum squared", "LA, momentum mask", gd.output, masked.output);
    add_exact(tokenwise, "final W", "GD+momentum squared", "LA, momentum mask", gd.final_state, masked.final_state);
  }

  progress.step("mini-batch TTT");
  ComparisonTable minibatch("mini-batch TTT, gradients at the batch's starting weights (exact over Q)");
  const std::string bs = std::to_string(b);
  {
    const auto primal = ttt::gradient_descent<Exact, ttt::SquaredBinding>(in, {b, std::nullopt});
    const auto dual = ttt::minibatch_dual<Exact, ttt::SquaredBinding>(in, b);
    add_exact(minibatch, "output", "primal b=" + bs + " squared", "dual", primal.output, dual.output);
    add_exact(minibatch, "final W", "primal b=" + bs + " squared", "dual", primal.final_state, dual.final_state);
    const auto primal_q = ttt::gradient_descent<Exact, ttt::SquaredBinding, ttt::QuadraticFeatures>(in_quadratic, {b, std::nullopt});
    const auto dual_q = ttt::minibatch_dual<Exact, ttt::SquaredBinding, ttt::QuadraticFeatures>(in_quadratic, b);
    add_exact(minibatch, "output", "primal b=" + bs + " [x,x*x]", "dual", primal_q.output, dual_q.output);
    const auto one = ttt::minibatch_dual<Exact, ttt::SquaredBinding>(in, 1);
    const auto delta = ref::delta_rule::token_recurrence(
        ref::delta_rule::Inputs<Exact>{in.q, in.k, in.v, in.learning_rate, in.initial_state});
    add_exact(minibatch, "output", "dual b=1", "DeltaNet", one.output, delta.output);
  }

  progress.step("TTT-MLP");
  ComparisonTable mlp("TTT-MLP, f(x) = W2 gelu(W1 x), DH=" + std::to_string(mlp_hidden_dim) + ", b=" + bs + ", eta/(8 DK DV) (High)");
  {
    // η/(8 DK DV): a smaller inner step keeps the two-layer loop from diverging on long cases.
    const Vector<Exact> eta = in.learning_rate / Exact(8 * DK * DV);
    const ttt::Inputs<High> high{ref::matrix_cast<High>(in.q), ref::matrix_cast<High>(in.k), ref::matrix_cast<High>(in.v),
                                 ref::matrix_cast<High>(Matrix<Exact>(eta)), std::nullopt};
    const ttt::MlpWeights<High> w{ref::matrix_cast<High>(random.matrix<Exact>(mlp_hidden_dim, DK)),
                                  ref::matrix_cast<High>(random.matrix<Exact>(DV, mlp_hidden_dim))};
    const auto primal = ttt::mlp_minibatch_primal(high, w, b);
    const auto dual = ttt::mlp_minibatch_dual(high, w, b);
    add_high(mlp, "output", "primal (dual numbers)", "dual (masked)", primal.output, dual.output);
    add_high(mlp, "final W1", "primal (dual numbers)", "dual (masked)", primal.final_weights.w1, dual.final_weights.w1);
    add_high(mlp, "final W2", "primal (dual numbers)", "dual (masked)", primal.final_weights.w2, dual.final_weights.w2);
  }

  for (const auto* t : {&tokenwise, &minibatch, &mlp}) {
    t->print(std::cout);
    std::cout << "\n";
  }
  std::cout << "High bound: |a - b| <= 1e-60 (1 + max|b|) (reference/high_agreement.hpp)\n";
  const bool pass = tokenwise.all_pass() && minibatch.all_pass() && mlp.all_pass();
  std::cout << "\n" << (pass ? "all TTT equivalences hold" : "TTT EQUIVALENCES FAIL") << "\n";
  return pass ? 0 : 1;
}

}  // namespace deltaproof::tools
