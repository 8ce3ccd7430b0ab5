#include "property_tests/support/delta_cases.hpp"

#include "property_tests/support/case_rules.hpp"

namespace deltaproof::testing {

const char* name(GateRegime r) {
  switch (r) {
    case GateRegime::generic: return "p/8";
    case GateRegime::one: return "1";
    case GateRegime::tiny: return "p/8192";
    case GateRegime::mixed: return "mixed";
  }
  return "?";
}

const char* name(KeyRegime r) { return r == KeyRegime::small ? "small" : "unnormalized"; }

std::ostream& operator<<(std::ostream& os, const DeltaRegime& r) {
  return os << "{beta " << name(r.beta) << ", alpha " << name(r.alpha) << ", keys " << name(r.keys) << "}";
}

rc::Gen<DeltaRegime> gen_delta_regime() {
  const auto gate = rc::gen::element(GateRegime::generic, GateRegime::one, GateRegime::tiny, GateRegime::mixed);
  return rc::gen::build<DeltaRegime>(rc::gen::set(&DeltaRegime::beta, gate), rc::gen::set(&DeltaRegime::alpha, gate),
                                     rc::gen::set(&DeltaRegime::keys, rc::gen::element(KeyRegime::small, KeyRegime::unnormalized)));
}

namespace {
rc::Gen<Exact> gen_gate(GateRegime regime) {
  using testing::gate_numerator_max, testing::generic_gate_denominator, testing::tiny_gate_denominator;
  const auto generic =
      rc::gen::map(rc::gen::inRange(1, gate_numerator_max + 1), [](int p) { return Exact(p) / generic_gate_denominator; });
  const auto tiny = rc::gen::map(rc::gen::inRange(1, gate_numerator_max + 1), [](int p) { return Exact(p) / tiny_gate_denominator; });
  switch (regime) {
    case GateRegime::generic: return generic;
    case GateRegime::one: return rc::gen::just(Exact(1));
    case GateRegime::tiny: return tiny;
    case GateRegime::mixed: return rc::gen::oneOf(generic, rc::gen::just(Exact(1)), tiny);
  }
  return generic;
}
}  // namespace

rc::Gen<Vector<Exact>> gen_gates(Index length, GateRegime regime) {
  return rc::gen::map(rc::gen::container<std::vector<Exact>>(static_cast<size_t>(length), gen_gate(regime)),
                      [length](const std::vector<Exact>& values) {
                        Vector<Exact> g(length);
                        for (Index t = 0; t < length; ++t) g(t) = values[static_cast<size_t>(t)];
                        return g;
                      });
}

rc::Gen<Matrix<Exact>> gen_keys(Index rows, Index cols, KeyRegime regime) {
  if (regime == KeyRegime::unnormalized) return gen_matrix(rows, cols);
  return rc::gen::map(gen_matrix(rows, cols), [](Matrix<Exact> m) {
    // n/4 with |n| <= 8 becomes n/16 with |n| <= 4 (rounding n/2 toward zero keeps it dyadic).
    for (Index i = 0; i < m.rows(); ++i)
      for (Index j = 0; j < m.cols(); ++j) {
        const Exact n = m(i, j) * 4;
        m(i, j) = Exact(static_cast<int>(n.convert_to<double>()) / 2) / 16;
      }
    return m;
  });
}

rc::Gen<ref::Params<Exact>> gen_direction(const ref::Params<Exact>& p) {
  std::vector<rc::Gen<Matrix<Exact>>> parts;
  for (const auto& x : p) parts.push_back(gen_matrix(x.value.rows(), x.value.cols()));
  return rc::gen::exec([p, parts] {
    ref::Params<Exact> u = p;
    for (size_t i = 0; i < p.size(); ++i) u[i].value = *parts[i];
    return u;
  });
}

namespace {
std::ostream& print_common(std::ostream& os, const Shape& s, const DeltaRegime& r, const Matrix<Exact>& q,
                           const Matrix<Exact>& k, const Matrix<Exact>& v, const Vector<Exact>& beta,
                           const std::optional<Matrix<Exact>>& s0, const dr::Cotangents<Exact>& cot) {
  os << s << " regime " << r << "\nq =\n" << q << "\nk =\n" << k << "\nv =\n" << v << "\nbeta = " << beta.transpose();
  if (s0) os << "\nS_0 =\n" << *s0;
  os << "\ndO =\n" << cot.d_output;
  if (cot.d_final_state) os << "\ndS_L =\n" << *cot.d_final_state;
  return os;
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const DeltaCase& c) {
  os << "DeltaNet case ";
  return print_common(os, c.shape, c.regime, c.inputs.q, c.inputs.k, c.inputs.v, c.inputs.beta, c.inputs.initial_state,
                      c.cotangents);
}

std::ostream& operator<<(std::ostream& os, const GatedDeltaCase& c) {
  os << "Gated DeltaNet case ";
  print_common(os, c.shape, c.regime, c.inputs.q, c.inputs.k, c.inputs.v, c.inputs.beta, c.inputs.initial_state,
               c.cotangents);
  return os << "\nalpha = " << c.inputs.alpha.transpose();
}

rc::Gen<DeltaCase> gen_delta_case(ShapeLimits limits) {
  return rc::gen::mapcat(rc::gen::pair(gen_shape(limits), gen_delta_regime()), [](const std::pair<Shape, DeltaRegime>& sr) {
    const auto& [s, r] = sr;
    const Index state_rows = s.with_initial_state ? s.value_dim : 0;
    return rc::gen::apply(
        [s, r](Matrix<Exact> q, Matrix<Exact> k, Matrix<Exact> v, Vector<Exact> beta, Matrix<Exact> s0,
               Matrix<Exact> d_out, Matrix<Exact> d_final) {
          DeltaCase c{s, r, {std::move(q), std::move(k), std::move(v), std::move(beta), std::nullopt},
                      {std::move(d_out), std::nullopt}};
          if (s.with_initial_state) {
            c.inputs.initial_state = std::move(s0);
            c.cotangents.d_final_state = std::move(d_final);
          }
          return c;
        },
        gen_matrix(s.length, s.key_dim), gen_keys(s.length, s.key_dim, r.keys), gen_matrix(s.length, s.value_dim),
        gen_gates(s.length, r.beta), gen_matrix(state_rows, s.key_dim), gen_matrix(s.length, s.value_dim),
        gen_matrix(state_rows, s.key_dim));
  });
}

rc::Gen<GatedDeltaCase> gen_gated_delta_case(ShapeLimits limits) {
  return rc::gen::mapcat(gen_delta_case(limits), [](const DeltaCase& d) {
    return rc::gen::map(gen_gates(d.shape.length, d.regime.alpha), [d](Vector<Exact> alpha) {
      return GatedDeltaCase{d.shape, d.regime,
                            {d.inputs.q, d.inputs.k, d.inputs.v, d.inputs.beta, std::move(alpha), d.inputs.initial_state},
                            d.cotangents};
    });
  });
}

}  // namespace deltaproof::testing
