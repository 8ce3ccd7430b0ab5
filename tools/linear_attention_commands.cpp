// `deltaproof verify|gradcheck --op linear`: every linear-attention form on one seeded case.
#include "reference/linear_attention.hpp"
#include "reference/random_inputs.hpp"
#include "tools/commands.hpp"
#include "tools/gradient_rows.hpp"
#include "tools/linear_attention_case.hpp"
#include "tools/progress.hpp"
#include "tools/report.hpp"
#include "verify/version.hpp"

#include <iostream>

namespace deltaproof::tools {
namespace {

namespace la = ref::linear_attention;
using ref::Exact;
using ref::High;
using ref::Index;
using ref::Matrix;

using ExactCase = LinearAttentionCase;

void print_header(const std::string& what, const CaseOptions& o) {
  std::cout << "deltaproof " << what << ": linear attention, L=" << o.length << " C=" << o.chunk_size
            << " DK=" << o.key_dim << " DV=" << o.value_dim << " seed=" << o.seed << "\n"
            << "inputs: q, k, v, S_0, dO, dS_L with entries n/2^22, |n| < 2^22 (exact in float, double and Q)\n";
}

// One quantity of every form (in Scalar), compared in Exact: pairwise, and with the exact oracle.
// Over ℚ a pair passes only when equal; in floating point, when inside the derived bound
// (linear_attention.hpp: |form − exact| <= γ_m·form(|x|), so two forms differ by at most twice that).
template <class Scalar>
void add_rows(ComparisonTable& table, const std::string& quantity, const std::vector<std::string>& names,
              const std::vector<Matrix<Scalar>>& values, const Matrix<Exact>& exact, const Matrix<Exact>& magnitude,
              double gamma) {
  std::vector<Matrix<Exact>> as_exact;
  for (const auto& v : values) as_exact.push_back(ref::matrix_cast<Exact>(v));
  const Matrix<Exact> one_bound = magnitude * Exact(gamma);
  const Matrix<Exact> pair_bound = one_bound * Exact(2);
  for (size_t a = 0; a < values.size(); ++a)
    for (size_t b = a + 1; b < values.size(); ++b) {
      const auto s = ref::is_exact_v<Scalar> ? ref::compare<Exact>(quantity, as_exact[b], as_exact[a])
                                             : ref::compare<Exact>(quantity, as_exact[b], as_exact[a], pair_bound);
      table.add(quantity, names[b], names[a], s, ref::is_exact_v<Scalar> ? s.exact_zero() : s.within_bound);
    }
  if constexpr (!ref::is_exact_v<Scalar>)
    for (size_t a = 0; a < values.size(); ++a) {
      const auto s = ref::compare<Exact>(quantity, as_exact[a], exact, one_bound);
      table.add(quantity, names[a], "exact", s, s.within_bound);
    }
}

template <class Scalar>
int verify_in(const CaseOptions& o) {
  print_header("verify", o);
  std::cout << "scalar: " << ref::scalar_name<Scalar>() << "\n\n";
  Progress progress("deltaproof verify --op linear", 3);
  progress.step("forms in " + ref::scalar_name<Scalar>());
  const ExactCase c = make_linear_attention_case(o);
  const la::Inputs<Scalar> in = la::cast<Scalar>(c.inputs);
  const la::Cotangents<Scalar> cot = la::cast<Scalar>(c.cotangents);
  const double gamma = ref::gamma(la::rounding_depth(o.length, o.key_dim, o.value_dim), ref::unit_roundoff<Scalar>());
  const std::vector<std::string> names = {"parallel", "recurrent", "chunkwise"};
  const la::Form forms[] = {la::Form::parallel, la::Form::recurrent, la::Form::chunkwise};

  std::vector<la::Forward<Scalar>> fwd;
  std::vector<la::Gradients<Scalar>> bwd;
  for (la::Form f : forms) {
    fwd.push_back(la::forward(f, in, o.chunk_size));
    bwd.push_back(la::backward(f, in, cot, o.chunk_size));
  }
  progress.step("exact oracle and magnitudes");
  const auto exact_fwd = la::parallel_masked(c.inputs);
  const auto exact_bwd = la::parallel_masked_backward(c.inputs, c.cotangents);
  const auto mag_fwd = la::forward_magnitude(c.inputs);
  const auto mag_bwd = la::backward_magnitude(c.inputs, c.cotangents);
  auto pick = [](const auto& list, auto member) {
    std::vector<Matrix<Scalar>> out;
    for (const auto& x : list) out.push_back(x.*member);
    return out;
  };

  progress.step("comparisons");
  ComparisonTable forward("forward (output o, final state S_L)");
  add_rows(forward, "output", names, pick(fwd, &la::Forward<Scalar>::output), exact_fwd.output, mag_fwd.output, gamma);
  add_rows(forward, "final state", names, pick(fwd, &la::Forward<Scalar>::final_state), exact_fwd.final_state,
           mag_fwd.final_state, gamma);
  ComparisonTable backward("backward (gradients of <dO, o> + <dS_L, S_L>)");
  add_rows(backward, "dq", names, pick(bwd, &la::Gradients<Scalar>::dq), exact_bwd.dq, mag_bwd.dq, gamma);
  add_rows(backward, "dk", names, pick(bwd, &la::Gradients<Scalar>::dk), exact_bwd.dk, mag_bwd.dk, gamma);
  add_rows(backward, "dv", names, pick(bwd, &la::Gradients<Scalar>::dv), exact_bwd.dv, mag_bwd.dv, gamma);
  add_rows(backward, "dS_0", names, pick(bwd, &la::Gradients<Scalar>::d_initial_state), exact_bwd.d_initial_state,
           mag_bwd.d_initial_state, gamma);
  forward.print(std::cout);
  std::cout << "\n";
  backward.print(std::cout);
  const bool pass = forward.all_pass() && backward.all_pass();
  if (!ref::is_exact_v<Scalar>)
    std::cout << "\nbound: gamma_m(u) * form(|inputs|) elementwise, m = L + DK + DV + 4 = "
              << la::rounding_depth(o.length, o.key_dim, o.value_dim) << ", u = " << ref::unit_roundoff<Scalar>()
              << " (pairs of forms: twice that)\n";
  std::cout << "\n" << (pass ? "all forms agree" : "FORMS DISAGREE") << "\n";
  return pass ? 0 : 1;
}

}  // namespace

int verify_linear_attention(const CaseOptions& o) {
  if (o.scalar == "exact") return verify_in<Exact>(o);
  if (o.scalar == "high") return verify_in<High>(o);
  if (o.scalar == "double") return verify_in<double>(o);
  return verify_in<float>(o);
}

// Analytic gradients of one reference form against central differences in High, element by
// element (tools/gradient_rows.hpp).
int gradcheck_linear_attention(const CaseOptions& o) {
  const la::Form form = o.form == "parallel" ? la::Form::parallel
                        : o.form == "recurrent" ? la::Form::recurrent : la::Form::chunkwise;
  Progress progress("deltaproof gradcheck --op linear", 2);
  progress.step("analytic backward");
  const ExactCase c = make_linear_attention_case(o);
  const la::Inputs<High> in = la::cast<High>(c.inputs);
  const auto analytic = la::params_of(la::backward(form, in, la::cast<High>(c.cotangents), o.chunk_size), true);
  const High step(o.step);
  progress.step("central differences");
  const auto numeric = ref::central_difference_gradient(la::loss_of(form, o.chunk_size, c.cotangents), la::params_of(in), step);
  const auto rows = gradient_rows(analytic, numeric, o.digits);
  const bool pass = all_pass(rows);
  if (o.json) {
    std::cout << "{\"deltaproof_version\": " << json_string(verify::version()) << ", \"op\": \"linear\", \"impl\": \"reference\", \"form\": " << json_string(o.form) << ", \"L\": " << o.length
              << ", \"C\": " << o.chunk_size << ", \"dk\": " << o.key_dim << ", \"dv\": " << o.value_dim
              << ", \"seed\": " << o.seed << ", \"step\": " << json_string(o.step) << ", \"digits\": " << o.digits
              << ", \"scalar\": \"high (100 digits)\", ";
    print_gradient_rows_json(rows);
    std::cout << ", \"pass\": " << (pass ? "true" : "false") << "}\n";
  } else {
    print_header("gradcheck", o);
    print_gradient_rows_table(o, rows);
    std::cout << "\n" << (pass ? "gradients agree" : "GRADIENTS DISAGREE") << "\n";
  }
  return pass ? 0 : 1;
}

}  // namespace deltaproof::tools
