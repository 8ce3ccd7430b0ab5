// `deltaproof verify|gradcheck --op delta|gated-delta`: every DeltaNet / Gated DeltaNet form on one
// seeded case, the WY stages, the backward paths, and the conditioning of the WY systems. One code
// path serves both families (Family<In> below); Gated DeltaNet adds its log-gate path and scalar gate.
#include "reference/delta_conditioning.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/gradcheck.hpp"
#include "reference/random_inputs.hpp"
#include "tools/commands.hpp"
#include "tools/gradient_rows.hpp"
#include "tools/progress.hpp"
#include "tools/report.hpp"
#include "verify/version.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>

namespace deltaproof::tools {
namespace {

namespace dr = ref::delta_rule;
namespace gd = ref::gated_delta_rule;
using ref::Exact;
using ref::High;
using ref::Index;
using ref::Matrix;
using ref::Vector;
using dr::TriangularSolve;

// A decimal such as "0.5", "1", "2.5e-3", exactly as a rational; nullopt if it is not one.
std::optional<Exact> parse_decimal(const std::string& s) {
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  Exact value(0), scale(1);
  bool digits = false, point = false;
  for (; i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.'); ++i) {
    if (s[i] == '.') {
      if (point) return std::nullopt;
      point = true;
      continue;
    }
    digits = true;
    value = value * 10 + (s[i] - '0');
    if (point) scale *= 10;
  }
  if (!digits) return std::nullopt;
  value /= scale;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    try {
      size_t used = 0;
      const int exponent = std::stoi(s.substr(i + 1), &used);
      if (i + 1 + used != s.size() || exponent < -300 || exponent > 300) return std::nullopt;
      Exact p(1);
      for (int e = 0; e < std::abs(exponent); ++e) p *= 10;
      value = exponent < 0 ? value / p : value * p;
      i = s.size();
    } catch (...) {
      return std::nullopt;
    }
  }
  if (i != s.size()) return std::nullopt;
  return negative ? Exact(-value) : value;
}

// "random": p/8 with p in 1..8 per token; otherwise the given value for every token.
Vector<Exact> gates(ref::RandomDyadic& random, Index length, const std::string& spec) {
  Vector<Exact> g(length);
  const std::optional<Exact> fixed = spec == "random" ? std::nullopt : parse_decimal(spec);
  for (Index t = 0; t < length; ++t) g(t) = fixed ? *fixed : random.unit_interval<Exact>();
  return g;
}

// What no argument names, per family: the op's names, and the oracle functions that take no Inputs
// (inputs_of, from a parameter list) or need a scalar chosen (cast). Everything else is reached by
// unqualified calls through the inputs' type (argument-dependent lookup: dr:: or gd::).
template <bool Gated>
struct FamilyOf {
  static constexpr bool gated = Gated;
  static constexpr const char* op = Gated ? "gated-delta" : "delta";
  static constexpr const char* title = Gated ? "Gated DeltaNet" : "DeltaNet";
  template <class S>
  static auto inputs_of(const ref::Params<S>& p) {
    if constexpr (Gated) return gd::inputs_of(p);
    else return dr::inputs_of(p);
  }
  template <class To, class In>
  static auto cast(const In& in) {
    if constexpr (Gated) return gd::cast<To>(in);
    else return dr::cast<To>(in);
  }
};
template <class In>
using Family = FamilyOf<std::is_same_v<In, gd::Inputs<Exact>>>;

template <class In>
struct Case {
  In inputs;
  dr::Cotangents<Exact> cotangents;
};

// q, v, S_0, dO, dS_L: entries n/2^22 with |n| < 2^22 (exact in float, double and ℚ). Keys:
// "small" scales them by 2^-s with 2^-2s·DK <= 1, so ‖k‖ < 1 and β‖k‖² < 1 (well-conditioned);
// "unnormalized" draws n/2^20 (entries up to 4): T = A⁻¹ and the state then grow geometrically.
// The gates α (Gated DeltaNet) are drawn last.
constexpr int scale = 1 << 22;  // entries n/2^22

template <class In>
Case<In> make_case(const CaseOptions& o) {
  ref::RandomDyadic random(o.seed);
  auto draw = [&](Index rows, Index cols, int denominator = scale) {
    return random.matrix<Exact>(rows, cols, scale - 1, denominator);
  };
  int shift = 0;
  while ((Index(1) << (2 * shift)) < o.key_dim) ++shift;
  Case<In> c;
  c.inputs.q = draw(o.length, o.key_dim);
  c.inputs.k = o.keys == "unnormalized" ? draw(o.length, o.key_dim, scale / 4) : Matrix<Exact>(draw(o.length, o.key_dim) / Exact(1 << shift));
  c.inputs.v = draw(o.length, o.value_dim);
  c.inputs.beta = gates(random, o.length, o.beta);
  c.inputs.initial_state = draw(o.value_dim, o.key_dim);
  c.cotangents.d_output = draw(o.length, o.value_dim);
  c.cotangents.d_final_state = draw(o.value_dim, o.key_dim);
  if constexpr (Family<In>::gated) c.inputs.alpha = gates(random, o.length, o.alpha);
  return c;
}

template <class To>
Matrix<To> to_scalar(const Matrix<Exact>& m) { return ref::matrix_cast<To>(m); }
template <class To>
Vector<To> to_scalar(const Vector<Exact>& v) { return dr::vector_cast<To>(v); }

template <class In>
void print_header(const std::string& what, const CaseOptions& o) {
  std::cout << "deltaproof " << what << ": " << Family<In>::title << ", L=" << o.length << " C=" << o.chunk_size
            << " DK=" << o.key_dim << " DV=" << o.value_dim << " seed=" << o.seed << "\n"
            << "inputs: q, v, S_0, dO, dS_L entries n/2^22, |n| < 2^22; keys " << o.keys << "; beta " << o.beta;
  if (Family<In>::gated) std::cout << "; alpha " << o.alpha;
  std::cout << "\n";
}

// Rows of one quantity: every form against the exact oracle. Over ℚ a row passes only when
// equal. In floating point there is no a-priori elementwise bound for DeltaNet (T = A⁻¹ can be
// arbitrarily large, see the conditioning section), so a form is calibrated against the token
// recurrence run in the same precision (the first form): it passes when its relative L2 error is
// at most 4× the recurrence's, or 16 u.
template <class Scalar>
void add_rows(ComparisonTable& table, const std::string& quantity, const std::vector<std::string>& names,
              const std::vector<Matrix<Scalar>>& values, const Matrix<Exact>& exact) {
  const double u = ref::unit_roundoff<Scalar>();
  double baseline = 0;
  for (size_t a = 0; a < values.size(); ++a) {
    const bool finite = ref::is_exact_v<Scalar> || values[a].allFinite();
    const Matrix<Exact> candidate = finite ? ref::matrix_cast<Exact>(values[a]) : Matrix<Exact>(exact);
    auto s = ref::compare<Exact>(quantity, candidate, exact);
    bool pass = s.exact_zero();
    if constexpr (!ref::is_exact_v<Scalar>) {
      const double rel = finite ? ref::relative_l2(candidate, exact) : INFINITY;
      if (!finite) s.max_abs = s.max_rel = INFINITY;
      if (a == 0) baseline = rel;
      pass = rel <= std::max(4 * baseline, 16 * u);
    }
    table.add(quantity, names[a], "exact", s, pass);
  }
}

template <class Scalar>
Matrix<Scalar> as_matrix(const Vector<Scalar>& v) { return Matrix<Scalar>(v); }

// The WY stages of every chunk over ℚ: one row per identity, the worst chunk reported.
class StageTable {
 public:
  void add(const std::string& identity, const Matrix<Exact>& left, const Matrix<Exact>& right) {
    const auto s = ref::compare<Exact>(identity, left, right);
    auto& row = rows_[identity];
    if (!row.second) order_.push_back(identity);
    row.second = true;
    if (!s.exact_zero()) row.first = s;
    else if (row.first.name.empty()) row.first = s;
  }
  template <class Map>
  void add_maps(const std::string& identity, const std::vector<Map>& a, const std::vector<Map>& b) {
    for (size_t r = 0; r < a.size(); ++r) {
      add(identity + " (transition)", a[r].transition, b[r].transition);
      add(identity + " (write)", a[r].write, b[r].write);
    }
  }
  bool print(std::ostream& os) const {
    os << "WY stages over Q, every chunk (equal or not; worst chunk shown)\n";
    bool all = true;
    for (const auto& id : order_) {
      const auto& s = rows_.at(id).first;
      const bool ok = s.exact_zero();
      all = all && ok;
      char line[256];
      std::snprintf(line, sizeof line, "  %-58s %s\n", id.c_str(), ok ? "exact" : "FAIL");
      os << line;
      if (!ok) os << "    " << s.describe() << "\n";
    }
    return all;
  }

 private:
  std::map<std::string, std::pair<ref::ErrorSummary, bool>> rows_;
  std::vector<std::string> order_;
};

// The WY stages of a chunkwise run, every chunk, over ℚ; each identity by the family's own formulas.
template <class In>
void wy_stages(StageTable& st, const In& in, Index chunk_size) {
  constexpr bool gated = Family<In>::gated;
  const auto chunked = chunkwise(in, chunk_size);
  const auto chunks = ref::chunks_of(in.length(), chunk_size);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto& ch = chunks[c];
    const Matrix<Exact> k = in.k.middleRows(ch.begin, ch.size), v = in.v.middleRows(ch.begin, ch.size);
    const Vector<Exact> beta = in.beta.segment(ch.begin, ch.size);
    const auto& x = chunked.chunks[c];
    std::vector<dr::AffineMap<Exact>> maps, wy_prefixes;
    dr::WY<Exact> wy;
    if constexpr (gated) {
      maps = gd::affine_maps<Exact>(k, v, beta, Vector<Exact>(in.alpha.segment(ch.begin, ch.size)));
      wy = gd::wy_recurrence<Exact>(k, v, beta, x.decay);
      wy_prefixes = gd::wy_prefix_products<Exact>(wy, k, x.decay);
    } else {
      maps = dr::affine_maps<Exact>(k, v, beta);
      wy = dr::wy_recurrence<Exact>(k, v, beta);
      wy_prefixes = dr::wy_prefix_products<Exact>(wy, k);
    }
    const auto dense = dr::sequential_prefix_scan(maps);
    st.add_maps("affine prefixes: tree scan == sequential", dr::tree_prefix_scan(maps), dense);
    st.add(gated ? "W: gated Equation 7 == T diag(beta gamma) K" : "W: Equation 7 == T diag(beta) K", wy.w, x.w);
    st.add(gated ? "U: gated Equation 7 == T diag(beta) V" : "U: Equation 7 == T diag(beta) V", wy.u, x.u);
    st.add_maps(gated ? "gamma P_r, H_r from WY == dense" : "P_r = I - sum w k^T, H_r = sum u k^T == dense", wy_prefixes, dense);
    st.add("A T == I", x.a * x.t, Matrix<Exact>::Identity(ch.size, ch.size));
    st.add("T: blocked (16) == forward substitution", dr::invert_unit_lower_blocked(x.a, 16).t, x.t);
    st.add("T: recursive (base 4) == forward substitution", dr::invert_unit_lower_recursive(x.a, 4), x.t);
    st.add("V_new == U - W S_[c]^T", x.v_new, x.u - x.w * chunked.boundary_states[c].transpose());
  }
}

template <class Rows>
void print_conditioning(const Rows& rows, const CaseOptions& o) {
  std::cout << "conditioning of the WY systems (this input; float forms vs the exact oracle)\n";
  std::printf("  %6s %12s %12s %22s %22s\n", "C", "max|T|", "max|W|", "float chunkwise relL2", "float recurrent relL2");
  for (const auto& r : rows)
    std::printf("  %6ld %12.3e %12.3e %22.3e %22.3e%s\n", static_cast<long>(r.chunk_size), r.max_abs_t, r.max_abs_w,
                r.chunkwise_relative_l2, r.recurrence_relative_l2,
                r.chunkwise_finite ? "" : (r.recurrence_finite ? "  (chunkwise overflowed)" : "  (both overflowed)"));
  std::cout << "  (informational: keys " << o.keys << "; max|T| grows with C for unnormalized keys)\n";
}

std::vector<Index> conditioning_chunk_sizes(const CaseOptions& o) {
  std::vector<Index> sizes;
  for (Index c : {1, 4, 16, 32, 64, 128})
    if (c <= o.length) sizes.push_back(c);
  if (std::find(sizes.begin(), sizes.end(), o.chunk_size) == sizes.end()) sizes.push_back(o.chunk_size);
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

// (name, gradient) of every input: dq, dk, dv, dβ, dα (gated), dS_0.
template <class Scalar, class Grad>
std::vector<std::pair<std::string, Matrix<Scalar>>> gradient_list(const Grad& g) {
  std::vector<std::pair<std::string, Matrix<Scalar>>> out{{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}, {"dbeta", as_matrix(g.d_beta)}};
  if constexpr (requires { g.d_alpha; }) out.push_back({"dalpha", as_matrix(g.d_alpha)});
  out.push_back({"dS_0", g.d_initial_state});
  return out;
}


// Verdict line and exit code shared by both families.
int finish(bool pass, bool exact) {
  if (!exact)
    std::cout << "\ncriterion (floating point): relative L2 error <= max(4 x that of the token recurrence in the same "
                 "precision, 16 u); DeltaNet has no a-priori elementwise bound (T = A^-1 is unbounded)\n";
  std::cout << "\n" << (pass ? "all forms agree" : "FORMS DISAGREE") << "\n";
  return pass ? 0 : 1;
}

// Gated DeltaNet's own forms, after the shared ones: the kernels' log-gate path (g = ln α in this
// precision, in High for the exact run) against the exact oracle, printed here with its verdict,
// and the additive scalar gate S_t = α_t S_{t-1} + v_t k_tᵀ, whose table `additive` holds.
template <class Scalar>
bool log_gate_and_scalar_gate(const Case<gd::Inputs<Exact>>& c, const gd::Inputs<Scalar>& in, const dr::Forward<Scalar>& recurrent,
                              const dr::Forward<Exact>& exact_fwd, const CaseOptions& o, ComparisonTable& additive) {
  using LogScalar = std::conditional_t<ref::is_exact_v<Scalar>, High, Scalar>;
  gd::LogGateInputs<LogScalar> logs{to_scalar<LogScalar>(c.inputs.q), to_scalar<LogScalar>(c.inputs.k), to_scalar<LogScalar>(c.inputs.v),
                                    to_scalar<LogScalar>(c.inputs.beta), Vector<LogScalar>(o.length),
                                    to_scalar<LogScalar>(*c.inputs.initial_state)};
  for (Index t = 0; t < o.length; ++t) {
    using std::log;
    logs.log_gate(t) = LogScalar(log(ref::scalar_cast<LogScalar>(c.inputs.alpha(t))));
  }
  const auto log_fwd = gd::chunkwise_log_gate(logs, o.chunk_size);
  bool log_pass = true;
  if constexpr (ref::is_exact_v<Scalar>) {
    // ln α is irrational: the log-gate path runs in High and must keep 50 of its 99 digits.
    std::cout << "log-gate path (g = ln alpha, exp(G_e - G_s) on the causal side), in High vs the exact oracle\n";
    for (const auto& [what, got, want] : {std::tuple{"output", &log_fwd.output, &exact_fwd.output},
                                          std::tuple{"final state", &log_fwd.final_state, &exact_fwd.final_state}}) {
      const double rel = ref::relative_l2(ref::matrix_cast<Exact>(*got), *want);
      log_pass = log_pass && rel <= 1e-50;
      std::printf("  log-gate chunkwise in High, %s: relative L2 error %.3e vs exact (pass below 1e-50): %s\n", what, rel,
                  rel <= 1e-50 ? "ok" : "FAIL");
    }
  } else {
    ComparisonTable log_table("log-gate path (g = ln alpha, exp(G_e - G_s) on the causal side), vs the exact oracle");
    add_rows<Scalar>(log_table, "output", {"recurrent-rcw", "chunk-log-gate"}, std::vector<Matrix<Scalar>>{recurrent.output, log_fwd.output},
                     exact_fwd.output);
    add_rows<Scalar>(log_table, "final state", {"recurrent-rcw", "chunk-log-gate"},
                     std::vector<Matrix<Scalar>>{recurrent.final_state, log_fwd.final_state}, exact_fwd.final_state);
    log_table.print(std::cout);
    log_pass = log_table.all_pass();
  }
  const gd::ScalarGateInputs<Exact> additive_exact{c.inputs.q, c.inputs.k, c.inputs.v, c.inputs.alpha, c.inputs.initial_state};
  const gd::ScalarGateInputs<Scalar> additive_in{in.q, in.k, in.v, in.alpha, in.initial_state};
  add_rows<Scalar>(additive, "output", {"recurrent", "chunkwise"},
                   std::vector<Matrix<Scalar>>{gd::additive_token_recurrence(additive_in).output,
                                               gd::additive_chunkwise(additive_in, o.chunk_size).output},
                   gd::additive_token_recurrence(additive_exact).output);
  return log_pass;
}

// Every forward form and backward path in Scalar against the exact oracle, the WY stages over ℚ, and
// the conditioning of the WY systems; Gated DeltaNet adds its log-gate path and scalar gate.
template <class In, class Scalar>
int verify_in(const CaseOptions& o) {
  constexpr bool gated = Family<In>::gated;
  print_header<In>("verify", o);
  std::cout << "scalar: " << ref::scalar_name<Scalar>() << "\n\n";
  Progress progress(std::string("deltaproof verify --op ") + Family<In>::op, gated ? 5 : 4);
  progress.step("forward forms");
  const Case<In> c = make_case<In>(o);
  const auto in = Family<In>::template cast<Scalar>(c.inputs);
  const auto cot = dr::cast<Scalar>(c.cotangents);
  const Index C = o.chunk_size;

  const std::vector<std::string> names = {"recurrent-rcw", "recurrent-ew", "affine-scan", "chunk-fs",
                                          "chunk-blocked", "chunk-recursive", "parallel"};
  const std::vector<dr::Forward<Scalar>> fwd = {
      token_recurrence_read_correct_write(in), token_recurrence(in), affine_scan(in),
      chunkwise(in, C, {TriangularSolve::forward_substitution, 16}), chunkwise(in, C, {TriangularSolve::blocked, 16}),
      chunkwise(in, C, {TriangularSolve::recursive, 4}), parallel_wy(in)};
  const auto exact_fwd = token_recurrence_read_correct_write(c.inputs);
  ComparisonTable forward("forward (output o, final state S_L), each form vs the exact token recurrence");
  std::vector<Matrix<Scalar>> outputs, states;
  for (const auto& f : fwd) outputs.push_back(f.output), states.push_back(f.final_state);
  add_rows(forward, "output", names, outputs, exact_fwd.output);
  add_rows(forward, "final state", names, states, exact_fwd.final_state);
  forward.print(std::cout);
  std::cout << "\n";

  bool gated_pass = true;
  if constexpr (gated) {
    progress.step("log-gate path and scalar gate");
    ComparisonTable additive("additive scalar gate (S_t = alpha_t S_{t-1} + v_t k_t^T), vs the exact recurrence");
    gated_pass = log_gate_and_scalar_gate(c, in, fwd[0], exact_fwd, o, additive);
    std::cout << "\n";
    additive.print(std::cout);
    std::cout << "\n";
    gated_pass = gated_pass && additive.all_pass();
  }

  progress.step("backward paths");
  const std::vector<std::string> bnames = {"recurrent", "chunk-fs", "chunk-blocked", "chunk-recursive", "parallel"};
  const std::vector bwd = {
      token_recurrence_backward(in, cot), chunkwise_backward(in, cot, C, {TriangularSolve::forward_substitution, 16}),
      chunkwise_backward(in, cot, C, {TriangularSolve::blocked, 16}), chunkwise_backward(in, cot, C, {TriangularSolve::recursive, 4}),
      chunkwise_backward(in, cot, std::max<Index>(1, o.length))};
  ComparisonTable backward("backward (gradients of <dO, o> + <dS_L, S_L>), each path vs the exact recurrence backward");
  const auto exact_list = gradient_list<Exact>(token_recurrence_backward(c.inputs, c.cotangents));
  for (size_t g = 0; g < exact_list.size(); ++g) {
    std::vector<Matrix<Scalar>> values;
    for (const auto& b : bwd) values.push_back(gradient_list<Scalar>(b)[g].second);
    add_rows(backward, exact_list[g].first, bnames, values, exact_list[g].second);
  }

  progress.step("WY stages over Q");
  StageTable stages;
  wy_stages(stages, c.inputs, C);
  backward.print(std::cout);
  std::cout << "\n";
  const bool stages_pass = stages.print(std::cout);
  std::cout << "\n";
  progress.step("conditioning");
  print_conditioning(ref::conditioning<float>(c.inputs, conditioning_chunk_sizes(o)), o);
  return finish(forward.all_pass() && gated_pass && backward.all_pass() && stages_pass, ref::is_exact_v<Scalar>);
}

// Analytic gradients of one reference path (in High) against central differences of the token
// recurrence in High, element by element (tools/gradient_rows.hpp), as for --op linear; plus, over
// ℚ, the chunkwise backward against the recurrence backward and a dual-number directional derivative.
template <class In>
int gradcheck_family(const CaseOptions& o) {
  using F = Family<In>;
  Progress progress(std::string("deltaproof gradcheck --op ") + F::op, 3);
  progress.step("analytic backward");
  const Case<In> c = make_case<In>(o);
  const Index chunk = o.form == "parallel" ? std::max<Index>(1, o.length) : o.chunk_size;
  const auto in = F::template cast<High>(c.inputs);
  const dr::Cotangents<High> cot = dr::cast<High>(c.cotangents);
  const auto grad = o.form == "recurrent" ? token_recurrence_backward(in, cot) : chunkwise_backward(in, cot, chunk);
  const ref::Params<High> analytic = params_of(grad, true);
  progress.step("central differences");
  const auto numeric = ref::central_difference_gradient(
      [&](const ref::Params<High>& p) { return dr::pairing(token_recurrence_read_correct_write(F::inputs_of(p)), cot); },
      params_of(in), High(o.step));

  progress.step("exact checks over Q");
  // Over ℚ: the chunkwise backward == the recurrence backward, and <∇L, u> == the dual derivative.
  const auto exact_params = params_of(chunkwise_backward(c.inputs, c.cotangents, chunk), true);
  const auto recurrent_params = params_of(token_recurrence_backward(c.inputs, c.cotangents), true);
  bool exact_equal = true;
  for (size_t p = 0; p < exact_params.size(); ++p) exact_equal = exact_equal && exact_params[p].value == recurrent_params[p].value;
  ref::RandomDyadic random(o.seed + 1);
  ref::Params<Exact> direction = params_of(c.inputs);
  for (auto& d : direction) d.value = random.matrix<Exact>(d.value.rows(), d.value.cols());
  const Exact dual = ref::exact_directional_derivative(
      [&](const ref::Params<ref::Dual<Exact>>& p) {
        const auto f = chunkwise(F::inputs_of(p), chunk);
        ref::Dual<Exact> sum(0);
        for (Index i = 0; i < f.output.rows(); ++i)
          for (Index j = 0; j < f.output.cols(); ++j) sum += ref::Dual<Exact>(c.cotangents.d_output(i, j)) * f.output(i, j);
        for (Index i = 0; i < f.final_state.rows(); ++i)
          for (Index j = 0; j < f.final_state.cols(); ++j)
            sum += ref::Dual<Exact>((*c.cotangents.d_final_state)(i, j)) * f.final_state(i, j);
        return sum;
      },
      params_of(c.inputs), direction);
  const bool dual_equal = dual == ref::inner(exact_params, direction);

  const std::vector<GradientRow> rows = gradient_rows(analytic, numeric, o.digits);
  const bool pass = exact_equal && dual_equal && all_pass(rows);
  if (o.json) {
    std::cout << "{\"deltaproof_version\": " << json_string(verify::version()) << ", \"op\": " << json_string(F::op) << ", \"impl\": \"reference\", \"form\": " << json_string(o.form)
              << ", \"L\": " << o.length << ", \"C\": " << o.chunk_size << ", \"dk\": " << o.key_dim << ", \"dv\": " << o.value_dim
              << ", \"seed\": " << o.seed << ", \"beta\": " << json_string(o.beta);
    if (F::gated) std::cout << ", \"alpha\": " << json_string(o.alpha);
    std::cout << ", \"keys\": " << json_string(o.keys) << ", \"step\": " << json_string(o.step) << ", \"digits\": " << o.digits
              << ", \"scalar\": \"high (100 digits)\", \"exact_chunkwise_equals_recurrent\": " << (exact_equal ? "true" : "false")
              << ", \"exact_dual_directional_derivative\": " << (dual_equal ? "true" : "false") << ", ";
    print_gradient_rows_json(rows);
    std::cout << ", \"pass\": " << (pass ? "true" : "false") << "}\n";
  } else {
    print_header<In>("gradcheck", o);
    print_gradient_rows_table(o, rows);
    std::cout << "\nover Q: chunkwise backward (C=" << chunk << ") == recurrence backward: " << (exact_equal ? "exact" : "FAIL")
              << "\nover Q: <grad, u> == dual-number directional derivative of the chunkwise form: " << (dual_equal ? "exact" : "FAIL")
              << "\n\n" << (pass ? "gradients agree" : "GRADIENTS DISAGREE") << "\n";
  }
  return pass ? 0 : 1;
}

}  // namespace

int verify_delta_rule(const CaseOptions& o) {
  if (o.scalar == "exact") return verify_in<dr::Inputs<Exact>, Exact>(o);
  if (o.scalar == "high") return verify_in<dr::Inputs<Exact>, High>(o);
  if (o.scalar == "double") return verify_in<dr::Inputs<Exact>, double>(o);
  return verify_in<dr::Inputs<Exact>, float>(o);
}

int verify_gated_delta_rule(const CaseOptions& o) {
  if (o.scalar == "exact") return verify_in<gd::Inputs<Exact>, Exact>(o);
  if (o.scalar == "high") return verify_in<gd::Inputs<Exact>, High>(o);
  if (o.scalar == "double") return verify_in<gd::Inputs<Exact>, double>(o);
  return verify_in<gd::Inputs<Exact>, float>(o);
}

int gradcheck_delta_rule(const CaseOptions& o) { return gradcheck_family<dr::Inputs<Exact>>(o); }
int gradcheck_gated_delta_rule(const CaseOptions& o) { return gradcheck_family<gd::Inputs<Exact>>(o); }

}  // namespace deltaproof::tools
