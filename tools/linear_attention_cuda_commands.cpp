// `deltaproof verify|gradcheck --op linear --impl cuda`: the CUDA kernels on one seeded case,
// against the exact oracle evaluated on the exact values of the kernels' rounded inputs.
// The bound is reference/linear_attention_kernel_bound.hpp's (the GPU tests check the same one).
#include "cuda/linear_attention.h"
#include "property_tests/support/device_tensors.hpp"
#include "reference/gradcheck.hpp"
#include "reference/linear_attention.hpp"
#include "reference/linear_attention_kernel_bound.hpp"
#include "reference/random_inputs.hpp"
#include "tools/commands.hpp"
#include "tools/linear_attention_case.hpp"
#include "tools/report.hpp"

#include <cmath>
#include <iostream>
#include <optional>

namespace deltaproof::tools {
namespace {

namespace la = ref::linear_attention;
namespace kla = cuda::linear_attention;
using cuda::DType;
using ref::Exact;
using ref::Index;
using ref::Matrix;
using ref::Tensor4;

// Exit code 2 and one line when the kernels cannot run this case; nullopt when they can.
std::optional<int> unusable(const CaseOptions& o) {
  if (!cuda::gpu_available()) {
    std::cerr << "deltaproof: --impl cuda: no CUDA device available\n";
    return 2;
  }
  if (o.chunk_size != 16 && o.chunk_size != 32 && o.chunk_size != 64) {
    std::cerr << "deltaproof: --C: the CUDA kernels take 16, 32 or 64 (got " << o.chunk_size << ")\n";
    return 2;
  }
  return std::nullopt;
}

using ExactCase = LinearAttentionCase;

Tensor4<Exact> as_tensor(const Matrix<Exact>& m) {
  Tensor4<Exact> t(1, 1, m.rows(), m.cols());
  t.set_head(0, 0, m);
  return t;
}

// One run of the forward and backward kernels, and the exact values of the inputs they saw.
struct KernelRun {
  ExactCase rounded;
  la::Forward<Exact> forward;
  la::Gradients<Exact> gradients;
};

KernelRun run_kernels(const ExactCase& c, DType dtype, int chunk_size) {
  const DType state = kla::state_dtype(dtype);
  const auto q = testing::upload(as_tensor(c.inputs.q), dtype), k = testing::upload(as_tensor(c.inputs.k), dtype),
             v = testing::upload(as_tensor(c.inputs.v), dtype), d_out = testing::upload(as_tensor(c.cotangents.d_output), dtype);
  const auto s0 = testing::upload(as_tensor(*c.inputs.initial_state), state);
  const auto d_final = testing::upload(as_tensor(*c.cotangents.d_final_state), state);
  const Index L = c.inputs.q.rows(), DK = c.inputs.q.cols(), DV = c.inputs.v.cols();
  auto out = testing::allocate(dtype, 1, 1, L, DV), final_state = testing::allocate(state, 1, 1, DV, DK);
  auto dq = testing::allocate(dtype, 1, 1, L, DK), dk = testing::allocate(dtype, 1, 1, L, DK),
       dv = testing::allocate(dtype, 1, 1, L, DV), ds0 = testing::allocate(state, 1, 1, DV, DK);

  kla::ForwardParams f;
  f.dtype = dtype, f.batch = 1, f.heads = 1, f.length = int(L), f.key_dim = int(DK), f.value_dim = int(DV), f.chunk_size = chunk_size;
  f.q = q.device.data(), f.k = k.device.data(), f.v = v.device.data(), f.output = out.data();
  f.initial_state = s0.device.data(), f.final_state = final_state.data();
  kla::set_contiguous_strides(f);
  kla::forward(f);
  kla::BackwardParams b;
  b.dtype = dtype, b.batch = 1, b.heads = 1, b.length = int(L), b.key_dim = int(DK), b.value_dim = int(DV), b.chunk_size = chunk_size;
  b.q = f.q, b.k = f.k, b.v = f.v, b.d_output = d_out.device.data();
  b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data();
  b.initial_state = f.initial_state, b.d_final_state = d_final.device.data(), b.d_initial_state = ds0.data();
  kla::set_contiguous_strides(b);
  kla::backward(b);

  KernelRun r;
  r.rounded.inputs = {q.exact.head(0, 0), k.exact.head(0, 0), v.exact.head(0, 0), s0.exact.head(0, 0)};
  r.rounded.cotangents = {d_out.exact.head(0, 0), d_final.exact.head(0, 0)};
  r.forward = {testing::download(out).head(0, 0), testing::download(final_state).head(0, 0)};
  r.gradients = {testing::download(dq).head(0, 0), testing::download(dk).head(0, 0), testing::download(dv).head(0, 0),
                 testing::download(ds0).head(0, 0)};
  return r;
}

double output_roundoff(DType d) { return d == DType::bf16 ? std::ldexp(1.0, -8) : d == DType::f16 ? std::ldexp(1.0, -11) : 0; }

struct Bounds {
  la::KernelPrecision values, states;  // outputs and gradients; final state and dS_0
};
Bounds bounds_for(const CaseOptions& o, DType dtype) {
  const Index m = la::kernel_rounding_depth(o.length, o.chunk_size, o.key_dim, o.value_dim);
  const bool fp64 = dtype == DType::f64, tc = kla::uses_tensor_cores(dtype, int(o.key_dim), int(o.value_dim));
  return {la::kernel_precision(m, fp64, tc, output_roundoff(dtype)), la::kernel_precision(m, fp64, tc, 0)};
}

std::string kernel_name(DType dtype, const CaseOptions& o) {
  return "cuda " + cuda::name_of(dtype) + (kla::uses_tensor_cores(dtype, int(o.key_dim), int(o.value_dim)) ? " (tc)" : "");
}

void add_row(ComparisonTable& table, const std::string& quantity, const std::string& name, const Matrix<Exact>& kernel,
             const Matrix<Exact>& exact, const Matrix<Exact>& magnitude, const la::KernelPrecision& p) {
  const auto s = ref::compare<Exact>(quantity, kernel, exact, la::kernel_bound(magnitude, exact, p));
  table.add(quantity, name, "exact", s, s.within_bound);
}

void print_case(const std::string& what, const CaseOptions& o) {
  std::cout << "deltaproof " << what << ": linear attention, CUDA kernels on " << cuda::gpu_name() << ", L=" << o.length
            << " C=" << o.chunk_size << " DK=" << o.key_dim << " DV=" << o.value_dim << " seed=" << o.seed << "\n"
            << "inputs: q, k, v, S_0, dO, dS_L with entries n/2^22, |n| < 2^22, rounded to each dtype; the oracle runs\n"
            << "exactly on the rounded values\n";
}

}  // namespace

int verify_linear_attention_cuda(const CaseOptions& o) {
  if (const auto code = unusable(o)) return *code;
  print_case("verify", o);
  std::cout << "\n";
  const ExactCase c = make_linear_attention_case(o);
  ComparisonTable forward("forward kernel (output o, final state S_L) vs the exact oracle");
  ComparisonTable backward("backward kernel (dq, dk, dv, dS_0 of <dO, o> + <dS_L, S_L>) vs the exact oracle");
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const KernelRun r = run_kernels(c, dtype, int(o.chunk_size));
    const auto exact = la::parallel_masked(r.rounded.inputs);
    const auto exact_grad = la::parallel_masked_backward(r.rounded.inputs, r.rounded.cotangents);
    const auto mag = la::forward_magnitude(r.rounded.inputs);
    const auto mag_grad = la::backward_magnitude(r.rounded.inputs, r.rounded.cotangents);
    const Bounds bound = bounds_for(o, dtype);
    const std::string name = kernel_name(dtype, o);
    add_row(forward, "output", name, r.forward.output, exact.output, mag.output, bound.values);
    add_row(forward, "final state", name, r.forward.final_state, exact.final_state, mag.final_state, bound.states);
    add_row(backward, "dq", name, r.gradients.dq, exact_grad.dq, mag_grad.dq, bound.values);
    add_row(backward, "dk", name, r.gradients.dk, exact_grad.dk, mag_grad.dk, bound.values);
    add_row(backward, "dv", name, r.gradients.dv, exact_grad.dv, mag_grad.dv, bound.values);
    add_row(backward, "dS_0", name, r.gradients.d_initial_state, exact_grad.d_initial_state, mag_grad.d_initial_state,
            bound.states);
  }
  forward.print(std::cout);
  std::cout << "\n";
  backward.print(std::cout);
  std::cout << "\nbound (reference/linear_attention_kernel_bound.hpp): c*form(|inputs|) + u_out*(|exact| + c*form(|inputs|)),\n"
            << "c = gamma_m(u_acc) (+ 2^-16 for the bf16 tensor-core pass), m = L + ceil(L/C) + DK + DV + C + 8 = "
            << la::kernel_rounding_depth(o.length, o.chunk_size, o.key_dim, o.value_dim)
            << ", u_out = 2^-8 (bf16), 2^-11 (fp16), 0 otherwise\n";
  const bool pass = forward.all_pass() && backward.all_pass();
  std::cout << "\n" << (pass ? "kernels agree with the oracle" : "KERNELS DISAGREE WITH THE ORACLE") << "\n";
  return pass ? 0 : 1;
}

// The fp64 kernels: backward vs the exact gradients (within the bound), and for each input tensor
// p a directional check of the kernel's own forward against its backward along a random dyadic
// direction u: (L(x+hu) − L(x−hu))/2h vs <∇_p L, u> with h = 2^-6, L = <dO, o> + <dS_L, S_L>. L is
// a cubic along the line, so the exact gap between the two is h²/6·L''' (computed over ℚ); the
// kernels may add their rounding bound at each point (over 2h) and in each gradient entry (times |u|).
int gradcheck_linear_attention_cuda(const CaseOptions& o) {
  if (const auto code = unusable(o)) return *code;
  const ExactCase c = make_linear_attention_case(o);
  const KernelRun at = run_kernels(c, DType::f64, int(o.chunk_size));
  const Bounds bound = bounds_for(o, DType::f64);
  const auto exact_grad = la::parallel_masked_backward(c.inputs, c.cotangents);
  const auto mag_grad = la::backward_magnitude(c.inputs, c.cotangents);
  ComparisonTable table("fp64 backward kernel vs the exact gradients");
  add_row(table, "dq", "cuda fp64", at.gradients.dq, exact_grad.dq, mag_grad.dq, bound.values);
  add_row(table, "dk", "cuda fp64", at.gradients.dk, exact_grad.dk, mag_grad.dk, bound.values);
  add_row(table, "dv", "cuda fp64", at.gradients.dv, exact_grad.dv, mag_grad.dv, bound.values);
  add_row(table, "dS_0", "cuda fp64", at.gradients.d_initial_state, exact_grad.d_initial_state, mag_grad.d_initial_state,
          bound.states);

  // Kernel pairing at x, its exact value, and the bound on their difference.
  const auto pairing = [&](const ExactCase& x, Exact& kernel, Exact& exact, Exact& allowance) {
    const KernelRun r = run_kernels(x, DType::f64, int(o.chunk_size));
    const auto e = la::parallel_masked(x.inputs);
    const auto mag = la::forward_magnitude(x.inputs);
    const auto& cot = x.cotangents;
    kernel = ref::frobenius_inner(cot.d_output, r.forward.output) + ref::frobenius_inner(*cot.d_final_state, r.forward.final_state);
    exact = ref::frobenius_inner(cot.d_output, e.output) + ref::frobenius_inner(*cot.d_final_state, e.final_state);
    allowance = ref::frobenius_inner(Matrix<Exact>(cot.d_output.cwiseAbs()), la::kernel_bound(mag.output, e.output, bound.values)) +
                ref::frobenius_inner(Matrix<Exact>(cot.d_final_state->cwiseAbs()),
                                     la::kernel_bound(mag.final_state, e.final_state, bound.states));
  };
  const Exact h = Exact(1) / 64;
  ref::RandomDyadic random(o.seed + 1);
  const auto params = [](la::Inputs<Exact>& in) {
    return std::vector<std::pair<std::string, Matrix<Exact>*>>{{"q", &in.q}, {"k", &in.k}, {"v", &in.v}, {"S_0", &*in.initial_state}};
  };
  const Matrix<Exact>* gradient_of[] = {&at.gradients.dq, &at.gradients.dk, &at.gradients.dv, &at.gradients.d_initial_state};
  const Matrix<Exact>* exact_gradient_of[] = {&exact_grad.dq, &exact_grad.dk, &exact_grad.dv, &exact_grad.d_initial_state};
  const Matrix<Exact>* magnitude_of[] = {&mag_grad.dq, &mag_grad.dk, &mag_grad.dv, &mag_grad.d_initial_state};
  struct Directional {
    std::string tensor;
    double difference, derivative, gap, allowed;
    bool pass;
  };
  std::vector<Directional> rows;
  ExactCase base = c;
  const auto names = params(base.inputs);
  for (size_t p = 0; p < names.size(); ++p) {
    const Matrix<Exact> u = random.matrix<Exact>(names[p].second->rows(), names[p].second->cols());
    ExactCase plus = c, minus = c;
    *params(plus.inputs)[p].second += h * u;
    *params(minus.inputs)[p].second -= h * u;
    Exact k_plus, e_plus, a_plus, k_minus, e_minus, a_minus;
    pairing(plus, k_plus, e_plus, a_plus);
    pairing(minus, k_minus, e_minus, a_minus);
    const Exact difference = (k_plus - k_minus) / (2 * h);
    const Exact derivative = ref::frobenius_inner(u, *gradient_of[p]);
    const Exact truncation = abs((e_plus - e_minus) / (2 * h) - ref::frobenius_inner(u, *exact_gradient_of[p]));
    const la::KernelPrecision& gp = p == 3 ? bound.states : bound.values;
    const Exact allowed = truncation + (a_plus + a_minus) / (2 * h) +
                          ref::frobenius_inner(Matrix<Exact>(u.cwiseAbs()), la::kernel_bound(*magnitude_of[p], *exact_gradient_of[p], gp));
    const Exact gap = abs(difference - derivative);
    rows.push_back({names[p].first, ref::to_double(difference), ref::to_double(derivative), ref::to_double(gap),
                    ref::to_double(allowed), gap <= allowed});
  }
  bool pass = table.all_pass();
  for (const auto& r : rows) pass = pass && r.pass;

  if (o.json) {
    std::cout << "{\"op\": \"linear\", \"impl\": \"cuda\", \"L\": " << o.length << ", \"C\": " << o.chunk_size
              << ", \"dk\": " << o.key_dim << ", \"dv\": " << o.value_dim << ", \"seed\": " << o.seed
              << ", \"scalar\": \"fp64 kernels\", \"step\": \"2^-6\", \"rows\": [";
    for (size_t r = 0; r < rows.size(); ++r)
      std::cout << (r ? ", " : "") << "{\"tensor\": " << json_string(rows[r].tensor) << ", \"central_difference\": "
                << json_number(rows[r].difference) << ", \"backward\": " << json_number(rows[r].derivative)
                << ", \"gap\": " << json_number(rows[r].gap) << ", \"allowed\": " << json_number(rows[r].allowed)
                << ", \"pass\": " << (rows[r].pass ? "true" : "false") << "}";
    std::cout << "], \"backward_within_bound\": " << (table.all_pass() ? "true" : "false")
              << ", \"pass\": " << (pass ? "true" : "false") << "}\n";
    return pass ? 0 : 1;
  }
  print_case("gradcheck", o);
  std::cout << "\n";
  table.print(std::cout);
  std::cout << "\ndirectional: fp64 kernel forward, central difference with h = 2^-6 along a random dyadic u, vs <backward, u>\n";
  std::printf("  %-6s %16s %16s %12s %12s  %s\n", "tensor", "central diff", "backward", "gap", "allowed", "verdict");
  for (const auto& r : rows)
    std::printf("  %-6s %16.9e %16.9e %12.3e %12.3e  %s\n", r.tensor.c_str(), r.difference, r.derivative, r.gap, r.allowed,
                r.pass ? "pass" : "FAIL");
  std::cout << "\n" << (pass ? "gradients agree" : "GRADIENTS DISAGREE") << "\n";
  return pass ? 0 : 1;
}

}  // namespace deltaproof::tools
