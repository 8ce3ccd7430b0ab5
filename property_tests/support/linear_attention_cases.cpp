#include "property_tests/support/linear_attention_cases.hpp"

namespace deltaproof::testing {

std::ostream& operator<<(std::ostream& os, const LinearAttentionCase& c) {
  os << "linear attention case " << c.shape << "\nq =\n" << c.inputs.q << "\nk =\n" << c.inputs.k << "\nv =\n" << c.inputs.v;
  if (c.inputs.initial_state) os << "\nS_0 =\n" << *c.inputs.initial_state;
  return os << "\ndO =\n" << c.cotangents.d_output;
}

rc::Gen<LinearAttentionCase> gen_linear_attention_case(ShapeLimits limits) {
  return rc::gen::mapcat(gen_shape(limits), [](const Shape& s) {
    const Index state_entries = s.with_initial_state ? s.value_dim : 0;
    return rc::gen::apply(
        [s](Matrix<Exact> q, Matrix<Exact> k, Matrix<Exact> v, Matrix<Exact> s0, Matrix<Exact> d_out, Matrix<Exact> d_final) {
          LinearAttentionCase c;
          c.shape = s;
          c.inputs = {std::move(q), std::move(k), std::move(v), std::nullopt};
          c.cotangents = {std::move(d_out), std::nullopt};
          if (s.with_initial_state) {
            c.inputs.initial_state = std::move(s0);
            c.cotangents.d_final_state = std::move(d_final);
          }
          return c;
        },
        gen_matrix(s.length, s.key_dim), gen_matrix(s.length, s.key_dim), gen_matrix(s.length, s.value_dim),
        gen_matrix(state_entries, s.key_dim), gen_matrix(s.length, s.value_dim), gen_matrix(state_entries, s.key_dim));
  });
}

}  // namespace deltaproof::testing
