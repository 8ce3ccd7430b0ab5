// `deltaproof verify --impl cuda --op delta|gated-delta`: the DeltaNet / Gated DeltaNet kernels on
// one seeded case (bf16; --L, --C in {16, 32, 64}, --dk, --dv, --seed; S_0 given), every stage
// against the oracle within its derived bound (kernel_checks/delta_rule_stages.hpp, the same checks the
// GPU tests run), then the output end to end against a float64 recurrence. Table printing only:
// every row is a verify::Comparison.
#include "cuda/check.hpp"
#include "tools/commands.hpp"
#include "kernel_checks/delta_rule_stages.hpp"
#include "verify/matrix_comparison.hpp"

#include <iostream>
#include <string>
#include <vector>

namespace deltaproof::tools {
namespace {

namespace vdr = verify::delta_rule;

int verify_delta_family_cuda(const CaseOptions& o, bool gated) {
  if (const auto code = cuda_case_unusable(o)) return *code;
  vdr::DeltaCase c;
  c.gated = gated, c.dtype = cuda::DType::bf16, c.length = o.length, c.chunk = o.chunk_size;
  c.key_dim = o.key_dim, c.value_dim = o.value_dim, c.seed = o.seed, c.with_initial_state = true;
  const vdr::HostInputs in = vdr::make_inputs(c);
  const vdr::ForwardResult r = vdr::run_forward(c, in);
  const std::vector<verify::Comparison> stages = vdr::check_stages(c, in, r);

  // One row per stage: the (head, chunk) with the largest err/bound.
  std::vector<verify::Comparison> rows = verify::worst_per_tensor(stages);
  std::vector<std::string> labels(rows.size(), "cuda vs oracle");

  // End to end: every token's output within 16·u_bf16 (normwise) of a float64 recurrence.
  const vdr::DoubleForward oracle = vdr::double_oracle(c, in);
  const auto output = vdr::heads_of(r.output);
  rows.push_back(vdr::compare_end_to_end("output", c, output, oracle.output, vdr::end_to_end_tau(c.dtype)));
  labels.push_back("cuda vs float64");

  std::cout << (gated ? "Gated DeltaNet" : "DeltaNet") << " CUDA kernels (bf16) vs oracle, stage by stage: " << vdr::describe(c)
            << "\n"
            << verify::format_rows(rows, labels);
  std::cout << "output relative L2 vs float64: " << vdr::relative_l2_all(output, oracle.output) << "\n";
  const bool pass = verify::all_agree(rows);
  std::cout << (pass ? "AGREE" : "DISAGREE") << "\n";
  return pass ? 0 : 1;
}

}  // namespace

int verify_delta_rule_cuda(const CaseOptions& options) { return verify_delta_family_cuda(options, false); }
int verify_gated_delta_rule_cuda(const CaseOptions& options) { return verify_delta_family_cuda(options, true); }

}  // namespace deltaproof::tools
