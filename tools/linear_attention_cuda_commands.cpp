// `deltaproof verify|gradcheck --op linear --impl cuda`: the CUDA kernels on one seeded case,
// against the exact oracle evaluated on the exact values of the kernels' rounded inputs. The runs,
// bounds and comparisons are kernel_checks/linear_attention_kernel_checks.hpp's (the GPU tests call the
// same functions); this file turns the tool's case into theirs and prints their rows.
#include "cuda/linear_attention.h"
#include "kernel_checks/linear_attention_kernel_checks.hpp"
#include "reference/random_inputs.hpp"
#include "tools/commands.hpp"
#include "tools/linear_attention_case.hpp"
#include "tools/report.hpp"
#include "verify/matrix_comparison.hpp"
#include "verify/version.hpp"

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace deltaproof::tools {
namespace {

namespace la = ref::linear_attention;
namespace kla = cuda::linear_attention;
namespace vla = verify::linear_attention;
using cuda::DType;
using ref::Exact;
using ref::Matrix;
using ref::Tensor4;
using verify::Comparison;

Tensor4<Exact> as_tensor(const Matrix<Exact>& m) {
  Tensor4<Exact> t(1, 1, m.rows(), m.cols());
  t.set_head(0, 0, m);
  return t;
}

// The tool's case (one head; S_0 and dS_L given) as a case of the kernels in `dtype`.
vla::CudaCase cuda_case(const LinearAttentionCase& c, const CaseOptions& o, DType dtype) {
  vla::CudaCase k;
  k.shape = {1, 1, o.length, o.key_dim, o.value_dim, o.chunk_size, true, dtype};
  k.inputs = {as_tensor(c.inputs.q), as_tensor(c.inputs.k), as_tensor(c.inputs.v), as_tensor(*c.inputs.initial_state)};
  k.cotangents = {as_tensor(c.cotangents.d_output), as_tensor(*c.cotangents.d_final_state)};
  return k;
}

std::string kernel_name(DType dtype, const CaseOptions& o) {
  return "cuda " + cuda::name_of(dtype) + (kla::uses_tensor_cores(dtype, int(o.key_dim), int(o.value_dim)) ? " (tc)" : "");
}

// Rows of one kernel appended to a table, each labelled with the kernel's name.
void append(std::vector<Comparison>& rows, std::vector<std::string>& labels, const std::vector<Comparison>& more,
            const std::string& label) {
  for (const Comparison& c : more) rows.push_back(c), labels.push_back(label);
}

void print_case(const std::string& what, const CaseOptions& o) {
  std::cout << "deltaproof " << what << ": linear attention, CUDA kernels on " << cuda::gpu_name() << ", L=" << o.length
            << " C=" << o.chunk_size << " DK=" << o.key_dim << " DV=" << o.value_dim << " seed=" << o.seed << "\n"
            << "inputs: q, k, v, S_0, dO, dS_L with entries n/2^22, |n| < 2^22, rounded to each dtype; the oracle runs\n"
            << "exactly on the rounded values\n";
}

}  // namespace

std::optional<int> cuda_case_unusable(const CaseOptions& o) {
  if (o.chunk_size != 16 && o.chunk_size != 32 && o.chunk_size != 64) {
    std::cerr << "deltaproof: --C: the CUDA kernels take 16, 32 or 64 (got " << o.chunk_size << ")\n";
    return 2;
  }
  if (!cuda::gpu_available()) {
    std::cerr << "deltaproof: --impl cuda: no CUDA device available\n";
    return 2;
  }
  return std::nullopt;
}

int verify_linear_attention_cuda(const CaseOptions& o) {
  if (const auto code = cuda_case_unusable(o)) return *code;
  print_case("verify", o);
  std::cout << "\n";
  const LinearAttentionCase c = make_linear_attention_case(o);
  std::vector<Comparison> forward, backward;
  std::vector<std::string> forward_labels, backward_labels;
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    const vla::CudaCase k = cuda_case(c, o, dtype);
    append(forward, forward_labels, vla::check_forward(k, /*with_boundary=*/false), kernel_name(dtype, o));
    append(backward, backward_labels, vla::check_backward(k), kernel_name(dtype, o));
  }
  std::cout << "forward kernel (output o, final state S_L) vs the exact oracle\n" << verify::format_rows(forward, forward_labels)
            << "\nbackward kernel (dq, dk, dv, dS_0 of <dO, o> + <dS_L, S_L>) vs the exact oracle\n"
            << verify::format_rows(backward, backward_labels);
  std::cout << "\nbound (kernel_checks/linear_attention_kernel_bound.hpp): c*form(|inputs|) + u_out*(|exact| + c*form(|inputs|)),\n"
            << "c = gamma_m(u_acc) (+ 2^-16 for the bf16 tensor-core pass), m = L + ceil(L/C) + DK + DV + C + 8 = "
            << vla::kernel_rounding_depth(o.length, o.chunk_size, o.key_dim, o.value_dim)
            << ", u_out = 2^-8 (bf16), 2^-11 (fp16), 0 otherwise\n";
  const bool pass = verify::all_agree(forward) && verify::all_agree(backward);
  std::cout << "\n" << (pass ? "kernels agree with the oracle" : "KERNELS DISAGREE WITH THE ORACLE") << "\n";
  return pass ? 0 : 1;
}

// The fp64 kernels: backward vs the exact gradients (within the bound), and for each input tensor
// p a directional check of the kernel's own forward against its backward along a random dyadic
// direction u, zero outside p (verify's check_directional_derivative): (P(x+hu) − P(x−hu))/2h vs
// <∇_p P, u> with h = 2^-6, P = <dO, o> + <dS_L, S_L>; P is a cubic along the line, and the exact
// gap between the two, h²/6·P''', is computed over ℚ.
int gradcheck_linear_attention_cuda(const CaseOptions& o) {
  if (const auto code = cuda_case_unusable(o)) return *code;
  const LinearAttentionCase c = make_linear_attention_case(o);
  const vla::CudaCase at = cuda_case(c, o, DType::f64);
  const std::vector<Comparison> table = vla::check_backward(at);

  // One direction per input tensor, drawn in the order q, k, v, S_0.
  ref::RandomDyadic random(o.seed + 1);
  const auto zero_like = [](const Tensor4<Exact>& t) { return Tensor4<Exact>(t.batch, t.heads, t.rows, t.cols); };
  const la::BatchInputs<Exact> zero{zero_like(at.inputs.q), zero_like(at.inputs.k), zero_like(at.inputs.v),
                                    zero_like(*at.inputs.initial_state)};
  std::vector<vla::DirectionalCheck> rows;
  for (const std::string name : {"q", "k", "v", "S_0"}) {
    la::BatchInputs<Exact> u = zero;
    Tensor4<Exact>& moved = name == "q" ? u.q : name == "k" ? u.k : name == "v" ? u.v : *u.initial_state;
    moved = as_tensor(random.matrix<Exact>(moved.rows, moved.cols));
    rows.push_back(vla::check_directional_derivative(at, u, name));
  }
  bool pass = verify::all_agree(table);
  for (const auto& r : rows) pass = pass && r.row.agrees();

  if (o.json) {
    std::cout << "{\"deltaproof_version\": " << json_string(verify::version()) << ", \"op\": \"linear\", \"impl\": \"cuda\", \"L\": " << o.length << ", \"C\": " << o.chunk_size
              << ", \"dk\": " << o.key_dim << ", \"dv\": " << o.value_dim << ", \"seed\": " << o.seed
              << ", \"scalar\": \"fp64 kernels\", \"step\": \"2^-6\", \"rows\": [";
    for (size_t r = 0; r < rows.size(); ++r)
      std::cout << (r ? ", " : "") << "{\"tensor\": " << json_string(rows[r].row.tensor) << ", \"central_difference\": "
                << json_number(rows[r].central_difference) << ", \"backward\": " << json_number(rows[r].backward)
                << ", \"gap\": " << json_number(rows[r].row.error) << ", \"allowed\": " << json_number(rows[r].row.bound)
                << ", \"pass\": " << (rows[r].row.agrees() ? "true" : "false") << "}";
    std::cout << "], \"backward_within_bound\": " << (verify::all_agree(table) ? "true" : "false")
              << ", \"pass\": " << (pass ? "true" : "false") << "}\n";
    return pass ? 0 : 1;
  }
  print_case("gradcheck", o);
  std::cout << "\nfp64 backward kernel vs the exact gradients\n"
            << verify::format_rows(table, std::vector<std::string>(table.size(), "cuda fp64"));
  std::cout << "\ndirectional: fp64 kernel forward, central difference with h = 2^-6 along a random dyadic u, vs <backward, u>\n";
  std::printf("  %-6s %16s %16s %12s %12s  %s\n", "tensor", "central diff", "backward", "gap", "allowed", "verdict");
  for (const auto& r : rows)
    std::printf("  %-6s %16.9e %16.9e %12.3e %12.3e  %s\n", r.row.tensor.c_str(), r.central_difference, r.backward, r.row.error,
                r.row.bound, r.row.agrees() ? "pass" : "FAIL");
  std::cout << "\n" << (pass ? "gradients agree" : "GRADIENTS DISAGREE") << "\n";
  return pass ? 0 : 1;
}

}  // namespace deltaproof::tools
