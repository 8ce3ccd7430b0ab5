// `deltaproof gradcheck --impl cuda --op delta|gated-delta`: the DeltaNet / Gated DeltaNet backward
// kernel on one seeded case (--L, --C in {16, 32, 64}, --dk, --dv, --seed; S_0 and dS_L given):
//   1. every backward stage, bf16 and fp64, against the oracle within its derived bound
//      (kernel_checks/delta_rule_backward_stages.hpp, the checks the GPU tests run), one row per stage;
//   2. the bf16 gradients end to end against the float64 token recurrence (normwise, 16·u_bf16);
//   3. the fp64 backward against directional central differences of its own fp64 forward, one
//      random direction per input tensor (q, k, v, β, g, S_0), the exact truncation gap removed.
// Exit 0 when every row agrees, 1 otherwise, 2 for an unusable case (one line on stderr).
#include "cuda/check.hpp"
#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "tools/commands.hpp"
#include "verify/matrix_comparison.hpp"
#include "verify/version.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace deltaproof::tools {
namespace {

namespace vdr = verify::delta_rule;
using cuda::DType;

vdr::DeltaCase case_of(const CaseOptions& o, bool gated, DType dtype) {
  vdr::DeltaCase c;
  c.gated = gated, c.dtype = dtype, c.length = o.length, c.chunk = o.chunk_size;
  c.key_dim = o.key_dim, c.value_dim = o.value_dim, c.seed = o.seed, c.with_initial_state = true;
  return c;
}

int gradcheck_delta_family_cuda(const CaseOptions& o, bool gated) {
  if (const auto code = cuda_case_unusable(o)) return *code;
  std::vector<verify::Comparison> rows;
  std::vector<std::string> labels;
  for (DType dtype : {DType::bf16, DType::f64}) {
    const vdr::DeltaCase c = case_of(o, gated, dtype);
    const vdr::HostInputs in = vdr::make_inputs(c);
    const vdr::Cotangents cot = vdr::make_cotangents(c);
    for (const verify::Comparison& row : verify::worst_per_tensor(vdr::check_backward_stages(c, in, cot, vdr::run_backward(c, in, cot))))
      rows.push_back(row), labels.push_back("cuda " + cuda::name_of(dtype) + " vs oracle");
  }
  {
    const vdr::DeltaCase c = case_of(o, gated, DType::bf16);
    const vdr::HostInputs in = vdr::make_inputs(c);
    const vdr::Cotangents cot = vdr::make_cotangents(c);
    const vdr::DoubleGradients oracle = vdr::double_gradients(c, in, cot);
    for (const verify::Comparison& row : vdr::compare_gradients_end_to_end(c, vdr::run_backward(c, in, cot, false), oracle,
                                                                           vdr::gradient_tau(c.dtype), &oracle.magnitude))
      rows.push_back(row), labels.push_back("cuda bf16 vs float64");
  }
  const vdr::DeltaCase c64 = case_of(o, gated, DType::f64);
  const vdr::HostInputs in64 = vdr::make_inputs(c64);
  const vdr::Cotangents cot64 = vdr::make_cotangents(c64);
  std::vector<vdr::DirectionalCheck> directions;
  std::vector<std::string> tensors = {"q", "k", "v", "beta", "S_0"};
  if (gated) tensors.push_back("g");
  for (size_t i = 0; i < tensors.size(); ++i)
    directions.push_back(vdr::check_directional_derivative(c64, in64, cot64, tensors[i], o.seed + 100 + i));

  bool pass = verify::all_agree(rows);
  for (const auto& d : directions) pass = pass && d.row.agrees();
  const std::string op = gated ? "gated-delta" : "delta";
  if (o.json) {
    nlohmann::json j = {{"deltaproof_version", verify::version()}, {"op", op}, {"impl", "cuda"}, {"L", o.length}, {"C", o.chunk_size}, {"dk", o.key_dim},
                        {"dv", o.value_dim}, {"seed", o.seed}, {"step", "2^-6"}};
    j["rows"] = nlohmann::json::array();
    for (size_t r = 0; r < rows.size(); ++r) {
      nlohmann::json row = verify::to_json(rows[r]);
      row["kernel"] = labels[r];
      j["rows"].push_back(row);
    }
    j["directional"] = nlohmann::json::array();
    for (const auto& d : directions)
      j["directional"].push_back({{"tensor", d.row.tensor}, {"central_difference", d.central_difference}, {"backward", d.backward},
                                  {"exact_gap", d.exact_gap}, {"error", d.row.error}, {"allowed", d.row.bound},
                                  {"pass", d.row.agrees()}});
    j["pass"] = pass;
    std::cout << j.dump() << "\n";
    return pass ? 0 : 1;
  }
  std::cout << "deltaproof gradcheck: " << (gated ? "Gated DeltaNet" : "DeltaNet") << " backward kernel on " << cuda::gpu_name()
            << ", L=" << o.length << " C=" << o.chunk_size << " DK=" << o.key_dim << " DV=" << o.value_dim << " seed=" << o.seed
            << " (S_0 and dS_L given)\n\n"
            << "backward stages vs the oracle (worst head and chunk per stage), gradients vs float64\n"
            << verify::format_rows(rows, labels)
            << "\ndirectional: fp64 backward vs central differences of its own fp64 forward, h = 2^-6, exact gap removed\n";
  std::printf("  %-6s %16s %16s %12s %12s %12s  %s\n", "tensor", "central diff", "backward", "exact gap", "error", "allowed",
              "verdict");
  for (const auto& d : directions)
    std::printf("  %-6s %16.9e %16.9e %12.3e %12.3e %12.3e  %s\n", d.row.tensor.c_str(), d.central_difference, d.backward,
                d.exact_gap, d.row.error, d.row.bound, d.row.agrees() ? "pass" : "FAIL");
  std::cout << "\n" << (pass ? "gradients agree" : "GRADIENTS DISAGREE") << "\n";
  return pass ? 0 : 1;
}

}  // namespace

int gradcheck_delta_rule_cuda(const CaseOptions& options) { return gradcheck_delta_family_cuda(options, false); }
int gradcheck_gated_delta_rule_cuda(const CaseOptions& options) { return gradcheck_delta_family_cuda(options, true); }

}  // namespace deltaproof::tools
