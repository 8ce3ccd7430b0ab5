#include "property_tests/support/linear_attention_cases.hpp"

#include "reference/error_report.hpp"

namespace deltaproof::testing {

std::ostream& operator<<(std::ostream& os, const LinearAttentionCase& c) {
  using ref::format_matrix;
  os << "linear attention case " << c.shape << "\nq =\n" << format_matrix(c.inputs.q) << "k =\n"
     << format_matrix(c.inputs.k) << "v =\n" << format_matrix(c.inputs.v);
  if (c.inputs.initial_state) os << "S_0 =\n" << format_matrix(*c.inputs.initial_state);
  os << "dO =\n" << format_matrix(c.cotangents.d_output);
  if (c.cotangents.d_final_state) os << "dS_L =\n" << format_matrix(*c.cotangents.d_final_state);
  return os;
}

rc::Gen<LinearAttentionCase> gen_linear_attention_case(ShapeLimits limits, Entries e) {
  return rc::gen::mapcat(gen_shape(limits), [e](const Shape& s) {
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
        gen_matrix(s.length, s.key_dim, e), gen_matrix(s.length, s.key_dim, e), gen_matrix(s.length, s.value_dim, e),
        gen_matrix(state_entries, s.key_dim, e), gen_matrix(s.length, s.value_dim, e),
        gen_matrix(state_entries, s.key_dim, e));
  });
}

}  // namespace deltaproof::testing
