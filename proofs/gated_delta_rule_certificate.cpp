// Certificate for proofs/gated_delta_rule.md: for each listed shape, every Gated DeltaNet form of
// reference/gated_delta_rule.hpp equals its neighbours for ALL inputs of that shape (q, k, v, β,
// α, S_0; cotangents and a direction for the backward), by Schwartz–Zippel identity testing
// (proofs/identity_testing.hpp); α = 1 gives DeltaNet's forms, intermediates included.
//
// The log-gate path (the kernels' parametrization g = ln α) is run exactly: its log-gates are
// formal logarithms (`LogOr` below), so the cumulative sums G and the differences G_e − G_s are
// exact integer combinations of the g_j, and exp maps Σ c_j g_j to Π α_j^{c_j} exactly. That
// certifies the path's algebra over ℚ (the decays, the chunkwise output, dL/dg = α ⊙ dL/dα), and
// that every exponent it evaluates is a sum of log-gates with coefficients in {0, 1}, i.e. ≤ 0.
//
// Built twice: faithful, and with DELTAPROOF_PLANTED (γ dropped from W = T diag(β ⊙ γ) K),
// which ctest expects to fail (WILL_FAIL).
#include "proofs/delta_claims.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/linear_attention.hpp"

#include <optional>
#include <stdexcept>
#include <string>

namespace deltaproof::proofs {

// Either a formal logarithm Σ_j c_j g_j (integer c_j, g_j = ln α_j) or an ordinary value V
// (Exact, or Degree when tracking degrees); `zero` is the neutral element of both.
template <class V>
class LogOr {
 public:
  enum class Kind { zero, log, value };

  LogOr() = default;
  explicit LogOr(int constant) {
    if (constant != 0) kind_ = Kind::value, value_ = V(constant);
  }
  static LogOr of(const V& v) {
    LogOr x;
    x.kind_ = Kind::value, x.value_ = v;
    return x;
  }
  static LogOr log_gate(size_t j) {  // g_j
    LogOr x;
    x.kind_ = Kind::log, x.coefficients_.assign(j + 1, 0), x.coefficients_[j] = 1;
    return x;
  }
  V to_value() const {
    if (kind_ == Kind::log) throw std::logic_error("LogOr: a formal logarithm used as a value");
    return kind_ == Kind::zero ? V(0) : value_;
  }

  // The gates α_j that exp(Σ c_j g_j) = Π α_j^{c_j} uses, and a record of every exponent seen.
  inline static const std::vector<V>* gates = nullptr;
  inline static long exponents = 0, exponents_not_sums_of_gates = 0;

  friend LogOr exp(const LogOr& x) {
    if (x.kind_ == Kind::value) throw std::logic_error("LogOr: exp of a value (not rational)");
    ++exponents;
    bool sum_of_gates = true;
    V product(1);
    for (size_t j = 0; j < x.coefficients_.size(); ++j) {
      const int c = x.coefficients_[j];
      if (c != 0 && c != 1) sum_of_gates = false;
      for (int p = 0; p < std::abs(c); ++p) product = c > 0 ? product * gates->at(j) : product / gates->at(j);
    }
    if (!sum_of_gates) ++exponents_not_sums_of_gates;
    return of(product);  // with V = Degree, a negative power (a division) is refused: not a polynomial
  }

  LogOr& operator+=(const LogOr& o) { return combine(o, +1); }
  LogOr& operator-=(const LogOr& o) { return combine(o, -1); }
  LogOr& operator*=(const LogOr& o) {
    if (kind_ == Kind::zero || o.kind_ == Kind::zero) return *this = LogOr();
    require_values(o);
    value_ *= o.value_;
    return *this;
  }
  LogOr& operator/=(const LogOr& o) {
    if (o.kind_ == Kind::zero) throw std::domain_error("LogOr: division by zero");
    if (kind_ == Kind::zero) return *this;
    require_values(o);
    value_ /= o.value_;
    return *this;
  }
  friend LogOr operator+(LogOr a, const LogOr& b) { return a += b; }
  friend LogOr operator-(LogOr a, const LogOr& b) { return a -= b; }
  friend LogOr operator*(LogOr a, const LogOr& b) { return a *= b; }
  friend LogOr operator/(LogOr a, const LogOr& b) { return a /= b; }
  friend LogOr operator-(const LogOr& a) { return LogOr() - a; }
  friend bool operator==(const LogOr& a, const LogOr& b) {
    if (a.kind_ == Kind::log || b.kind_ == Kind::log) return a.kind_ == b.kind_ && a.coefficients_ == b.coefficients_;
    return a.to_value() == b.to_value();
  }
  friend bool operator!=(const LogOr& a, const LogOr& b) { return !(a == b); }

 private:
  void require_values(const LogOr& o) const {
    if (kind_ == Kind::log || o.kind_ == Kind::log) throw std::logic_error("LogOr: a formal logarithm multiplied");
  }
  LogOr& combine(const LogOr& o, int sign) {
    if (o.kind_ == Kind::zero) return *this;
    if (kind_ == Kind::zero) {
      *this = o;
      if (sign < 0) {
        for (int& c : coefficients_) c = -c;
        value_ = -value_;
      }
      return *this;
    }
    if (kind_ != o.kind_) throw std::logic_error("LogOr: a formal logarithm added to a value");
    if (kind_ == Kind::value) {
      value_ = sign > 0 ? value_ + o.value_ : value_ - o.value_;
    } else {
      coefficients_.resize(std::max(coefficients_.size(), o.coefficients_.size()), 0);
      for (size_t j = 0; j < o.coefficients_.size(); ++j) coefficients_[j] += sign * o.coefficients_[j];
      while (!coefficients_.empty() && coefficients_.back() == 0) coefficients_.pop_back();
      if (coefficients_.empty()) kind_ = Kind::zero;
    }
    return *this;
  }

  Kind kind_ = Kind::zero;
  std::vector<int> coefficients_;
  V value_{};
};

}  // namespace deltaproof::proofs

namespace Eigen {
template <class V>
struct NumTraits<deltaproof::proofs::LogOr<V>> : deltaproof::ref::OwnScalarTraits<deltaproof::proofs::LogOr<V>, 4, 16, 16> {};
}  // namespace Eigen

namespace {

using namespace deltaproof::proofs;
namespace gd = deltaproof::ref::gated_delta_rule;
namespace la = deltaproof::ref::linear_attention;
namespace ref = deltaproof::ref;

#ifdef DELTAPROOF_PLANTED
// Planted bug: the in-chunk decay γ left out of W (W = T diag(β) K).
constexpr const char* kPlanted = "gamma dropped from W = T diag(beta gamma) K";
struct Policy : gd::Faithful {
  template <class Scalar, class KRows, class VRows>
  static dr::WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta,
                                   const Vector<Scalar>& /*gamma*/) {
    return {t * dr::scale_rows<Scalar>(beta, k), t * dr::scale_rows<Scalar>(beta, v)};
  }
};
#else
constexpr const char* kPlanted = nullptr;
using Policy = gd::Faithful;
#endif

template <class V>
Matrix<V> values(const Matrix<LogOr<V>>& m) {
  return m.unaryExpr([](const LogOr<V>& x) { return x.to_value(); });
}
template <class V>
Matrix<LogOr<V>> lifted(const Matrix<V>& m) {
  return m.unaryExpr([](const V& x) { return LogOr<V>::of(x); });
}

template <class Source>
auto gated_claims(const DeltaShape& sh, Source& src) {
  using S = std::decay_t<decltype(src.matrix(1, 1)(0, 0))>;
  gd::Inputs<S> in{src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DV), src.vector(sh.L),
                   src.vector(sh.L), std::nullopt};
  if (sh.initial_state) in.initial_state = src.matrix(sh.DV, sh.DK);
  Claims<S> out;

  const auto erase_write = claim_token_views(out, "gated ", in);
  const auto maps = gd::affine_maps<S>(in.k, in.v, in.beta, in.alpha);
  const std::vector<Matrix<S>> states = recurrence_states(in.initial_state_or_zero(), maps);

  auto& solves = out.add("gated A = I + strictly_lower(diag(beta)(K K^T . D)): A T = I; blocked (base " + std::to_string(sh.base) +
                         ") and recursive T = T_fs  [wy_system, invert_unit_lower_*]");
  auto& eq7 = out.add("gated Equation 7 = T diag(beta gamma) K, T diag(beta) V; A W = diag(beta gamma) K, A U = diag(beta) V"
                      "  [wy_recurrence, wy_factors]");
  auto& prefixes = out.add("gated WY prefixes (gamma_r P_r, H_r) = dense products; S_[c] P_r + H_r = recurrence state"
                           "  [wy_prefix_products]");
  for (const auto& ch : ref::chunks_of(sh.L, sh.C)) {
    const Matrix<S> k = in.k.middleRows(ch.begin, ch.size), v = in.v.middleRows(ch.begin, ch.size);
    const Vector<S> beta = in.beta.segment(ch.begin, ch.size), alpha = in.alpha.segment(ch.begin, ch.size);
    const Matrix<S> decay = gd::decay_from_gates<S>(alpha);
    const Matrix<S> a = gd::wy_system<S>(k, beta, decay);
    const Matrix<S> t = dr::invert_unit_lower_forward_substitution<S>(a);
    solves.equal(a * t, Matrix<S>::Identity(ch.size, ch.size));
    solves.equal(dr::invert_unit_lower_blocked<S, Policy>(a, sh.base).t, t);
    solves.equal(dr::invert_unit_lower_recursive<S, Policy>(a, sh.base), t);
    const Vector<S> gamma = gd::chunk_gamma(decay);
    const dr::WY<S> constructive = gd::wy_recurrence<S>(k, v, beta, decay);
    const dr::WY<S> solved = gd::wy_factors<S>(t, k, v, beta, gamma);
    eq7.equal(constructive.w, solved.w).equal(constructive.u, solved.u);
    eq7.equal(a * solved.w, dr::scale_rows<S>(Vector<S>(beta.cwiseProduct(gamma)), k)).equal(a * solved.u, dr::scale_rows<S>(beta, v));
    const auto dense = dr::sequential_prefix_scan(gd::affine_maps<S>(k, v, beta, alpha));
    equal_maps(prefixes, gd::wy_prefix_products<S>(constructive, k, decay), dense);
    for (Index r = 0; r < ch.size; ++r) prefixes.equal(dense[r].apply(states[ch.begin]), states[ch.begin + r + 1]);
  }

  claim_chunkwise_forms<Policy>(out, "gated ", in, sh, erase_write, states);

  // alpha = 1: DeltaNet, intermediates included.
  {
    const gd::Inputs<S> ones{in.q, in.k, in.v, in.beta, Vector<S>::Ones(sh.L), in.initial_state};
    const dr::Inputs<S> plain_in{in.q, in.k, in.v, in.beta, in.initial_state};
    const auto gated = gd::chunkwise<S, Policy>(ones, sh.C, {TriangularSolve::blocked, sh.base});
    const auto plain = dr::chunkwise<S>(plain_in, sh.C, {TriangularSolve::blocked, sh.base});
    auto& claim = out.add("alpha = 1 is DeltaNet: token recurrence, chunkwise O, S_L and every A, T, W, U, V_new"
                          "  [gated_delta_rule = delta_rule]");
    claim.equal(gd::token_recurrence(ones).output, dr::token_recurrence(plain_in).output);
    claim.equal(gated.output, plain.output).equal(gated.final_state, plain.final_state);
    for (size_t c = 0; c < plain.chunks.size(); ++c)
      claim.equal(gated.chunks[c].a, plain.chunks[c].a).equal(gated.chunks[c].t, plain.chunks[c].t)
          .equal(gated.chunks[c].w, plain.chunks[c].w).equal(gated.chunks[c].u, plain.chunks[c].u)
          .equal(gated.chunks[c].v_new, plain.chunks[c].v_new);
  }

  // The log-gate path, with exact exp on formal logarithms.
  using LS = LogOr<S>;
  const std::vector<S> gate_values(in.alpha.data(), in.alpha.data() + sh.L);
  LS::gates = &gate_values;
  LS::exponents = LS::exponents_not_sums_of_gates = 0;
  gd::LogGateInputs<LS> logs{lifted(in.q), lifted(in.k), lifted(in.v), lifted(Matrix<S>(in.beta)).col(0), Vector<LS>(sh.L),
                             std::nullopt};
  if (in.initial_state) logs.initial_state = lifted(*in.initial_state);
  for (Index t = 0; t < sh.L; ++t) logs.log_gate(t) = LS::log_gate(static_cast<size_t>(t));
  {
    const auto exact = gd::chunkwise<S, Policy>(in, sh.C);
    const auto from_logs = gd::chunkwise_log_gate<LS, Policy>(logs, sh.C);
    auto& claim = out.add("log-gate path, exp(G_e - G_s) for e >= s, = gate products: every decay Gamma, O, S_L"
                          "  [decay_from_log_gates = decay_from_gates, chunkwise_log_gate = chunkwise]");
    claim.equal(values(from_logs.output), exact.output).equal(values(from_logs.final_state), exact.final_state);
    for (size_t c = 0; c < exact.chunks.size(); ++c) claim.equal(values(from_logs.chunks[c].decay), exact.chunks[c].decay);
  }

  // Additive scalar gate S_t = alpha_t S_{t-1} + v_t k_t^T; alpha = 1 is linear attention.
  {
    const gd::ScalarGateInputs<S> additive{in.q, in.k, in.v, in.alpha, in.initial_state};
    const auto recurrent = gd::additive_token_recurrence(additive);
    const auto chunked = gd::additive_chunkwise(additive, sh.C);
    const gd::ScalarGateInputs<S> ungated{in.q, in.k, in.v, Vector<S>::Ones(sh.L), in.initial_state};
    out.add("additive scalar gate: chunkwise = recurrence; alpha = 1 = linear attention  [additive_chunkwise, additive_token_recurrence]")
        .equal(chunked.output, recurrent.output)
        .equal(chunked.final_state, recurrent.final_state)
        .equal(gd::additive_chunkwise(ungated, sh.C).output, la::token_recurrence(la::Inputs<S>{in.q, in.k, in.v, in.initial_state}).output);
  }

  // Backward.
  const gd::Cotangents<S> cot{src.matrix(sh.L, sh.DV), src.matrix(sh.DV, sh.DK)};
  const auto recurrent = gd::token_recurrence_backward(in, cot);
  claim_backward_paths<Policy>(out, "gated ", in, cot, sh, recurrent);
  {
    const gd::Cotangents<LS> cot_logs{lifted(cot.d_output), lifted(*cot.d_final_state)};
    const auto from_logs = gd::chunkwise_log_gate_backward<LS, Policy>(logs, cot_logs, sh.C);
    out.add("log-gate backward: dL/dg = alpha . dL/dalpha, other gradients equal  [chunkwise_log_gate_backward]")
        .equal(as_matrix(Vector<S>(values(Matrix<LS>(from_logs.d_alpha)).col(0))), as_matrix(Vector<S>(in.alpha.cwiseProduct(recurrent.d_alpha))))
        .equal(values(from_logs.dq), recurrent.dq)
        .equal(values(from_logs.dk), recurrent.dk)
        .equal(values(from_logs.dv), recurrent.dv)
        .equal(values(Matrix<LS>(from_logs.d_beta)), as_matrix(recurrent.d_beta))
        .equal(values(from_logs.d_initial_state), recurrent.d_initial_state);
  }
  out.add("log-gate path: every exponent evaluated is a sum of log-gates (coefficients 0/1), so <= 0: count of others = 0"
          " (" + std::to_string(LS::exponents) + " exponents)")
      .equal(as_matrix(S(static_cast<int>(LS::exponents_not_sums_of_gates))), as_matrix(S(0)));
  claim_formal_gradient(out, "gated ", in, cot, recurrent, src, [](const auto& p) { return gd::inputs_of(p); });
  return out;
}

}  // namespace

int main() {
  return certify_shapes("Gated DeltaNet certificate (proofs/gated_delta_rule.md): token views = affine scan = gated WY ="
                        " chunkwise (three solves) = parallel; alpha = 1 is DeltaNet; log-gate path = gate products;"
                        " backward paths = formal gradient",
                        kPlanted,
                        {{1, 4, 1, 1, false, 1}, {2, 1, 2, 1, true, 1}, {5, 2, 3, 2, true, 1}, {7, 4, 2, 3, false, 2},
                         {9, 8, 1, 2, true, 3}, {17, 16, 2, 2, true, 4}, {70, 64, 2, 2, true, 16}},
                        [](const DeltaShape& sh, auto& source) { return gated_claims(sh, source); });
}
