// TTT cases and properties, as functions of a case (templated on a Policy where a planted bug can
// enter), so that the planted-bug tests run the very same checks on a broken form.
#pragma once

#include "property_tests/support/assertions.hpp"
#include "property_tests/support/generators.hpp"
#include "reference/delta_rule.hpp"
#include "reference/linear_attention.hpp"
#include "reference/ttt.hpp"

#include <ostream>

namespace deltaproof::testing {

namespace ttt = ref::ttt;
namespace la = ref::linear_attention;
using ref::Vector;

struct TttCase {
  Shape shape;                         // chunk_size is the mini-batch size b
  ttt::Inputs<Exact> inputs;
  Vector<Exact> momentum;              // (L): a_t ∈ {0, 1/4, …, 1}
};

inline std::ostream& operator<<(std::ostream& os, const TttCase& c) {
  os << "TTT case " << c.shape << " (b = C)\nq =\n" << c.inputs.q << "\nk =\n" << c.inputs.k << "\nv =\n" << c.inputs.v
     << "\neta = " << c.inputs.learning_rate.transpose() << "\nmomentum = " << c.momentum.transpose();
  if (c.inputs.initial_state) os << "\nW_0 =\n" << *c.inputs.initial_state;
  return os;
}

// n fractions p/denominator with p ∈ [min_numerator, max_numerator].
inline rc::Gen<Vector<Exact>> gen_fractions(Index n, int min_numerator, int max_numerator, int denominator) {
  return rc::gen::map(rc::gen::container<std::vector<int>>(static_cast<size_t>(n), rc::gen::inRange(min_numerator, max_numerator + 1)),
                      [denominator](const std::vector<int>& p) {
                        Vector<Exact> r(static_cast<Index>(p.size()));
                        for (size_t i = 0; i < p.size(); ++i) r(static_cast<Index>(i)) = Exact(p[i]) / denominator;
                        return r;
                      });
}

// feature_factor: DF = factor · DK (2 for the quadratic feature map).
inline rc::Gen<TttCase> gen_ttt_case(ShapeLimits limits, Index feature_factor = 1) {
  return rc::gen::mapcat(gen_shape(limits), [feature_factor](const Shape& s) {
    const Index state_rows = s.with_initial_state ? s.value_dim : 0;
    return rc::gen::apply(
        [s](Matrix<Exact> q, Matrix<Exact> k, Matrix<Exact> v, Vector<Exact> eta, Matrix<Exact> w0, Vector<Exact> a) {
          TttCase c{s, {std::move(q), std::move(k), std::move(v), std::move(eta), std::nullopt}, std::move(a)};
          if (s.with_initial_state) c.inputs.initial_state = std::move(w0);
          return c;
        },
        gen_matrix(s.length, s.key_dim), gen_matrix(s.length, s.key_dim), gen_matrix(s.length, s.value_dim),
        // η = p/8 ∈ (0, 1] (β = 1 and small β both come up); a = p/4 ∈ [0, 1]
        gen_fractions(s.length, 1, 8, 8), gen_matrix(state_rows, feature_factor * s.key_dim),
        gen_fractions(s.length, 0, 4, 4));
  });
}

// DeltaNet from its own oracle (reference/delta_rule.hpp), on the same q, k, v, β = η, S_0 = W_0.
inline ref::delta_rule::Forward<Exact> delta_rule_recurrence(const ttt::Inputs<Exact>& in) {
  return ref::delta_rule::token_recurrence(
      ref::delta_rule::Inputs<Exact>{in.q, in.k, in.v, in.learning_rate, in.initial_state});
}

// Mini-batch primal (explicit loop) == dual (masked matrix form), exactly.
template <class Loss, class Features = ttt::IdentityFeatures, class Policy = ttt::Faithful>
void check_minibatch_primal_equals_dual(const TttCase& c) {
  const auto primal = ttt::gradient_descent<Exact, Loss, Features, Policy>(c.inputs, {c.shape.chunk_size, std::nullopt});
  const auto dual = ttt::minibatch_dual<Exact, Loss, Features>(c.inputs, c.shape.chunk_size);
  require_equal(std::string("mini-batch primal vs dual output, ") + Loss::name, primal.output, dual.output);
  require_equal(std::string("mini-batch primal vs dual final W, ") + Loss::name, primal.final_state, dual.final_state);
}

}  // namespace deltaproof::testing
