// `deltaproof verify --impl cuda --op delta|gated-delta`: the DeltaNet / Gated DeltaNet kernels on
// one seeded case (bf16; --L, --C in {16, 32, 64}, --dk, --dv, --seed; S_0 given), every stage
// against the oracle within its derived bound (property_tests/support/delta_rule_gpu_checks.hpp,
// the same checks the GPU tests run), then the output end to end against a float64 recurrence.
#include "property_tests/support/delta_rule_gpu_checks.hpp"
#include "cuda/check.hpp"
#include "tools/commands.hpp"
#include "tools/report.hpp"

#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace deltaproof::tools {
namespace {

int verify_delta_family_cuda(const CaseOptions& o, bool gated) {
  if (!cuda::gpu_available()) {
    std::cerr << "deltaproof: --impl cuda: no CUDA device available\n";
    return 2;
  }
  if (o.chunk_size != 16 && o.chunk_size != 32 && o.chunk_size != 64) {
    std::cerr << "deltaproof: --C: the CUDA kernels take 16, 32 or 64 (got " << o.chunk_size << ")\n";
    return 2;
  }
  testing::DeltaCase c;
  c.gated = gated, c.dtype = cuda::DType::bf16, c.length = o.length, c.chunk = o.chunk_size;
  c.key_dim = o.key_dim, c.value_dim = o.value_dim, c.seed = o.seed, c.with_initial_state = true;
  const testing::HostInputs in = testing::make_inputs(c);
  const testing::ForwardResult r = testing::run_forward(c, in);
  const testing::Report rep = testing::check_stages(c, in, r);

  // One row per stage: the chunk (and head) with the largest err/bound.
  std::map<std::string, ref::ErrorSummary> worst;
  std::vector<std::string> order;
  for (const auto& s : rep.summaries) {
    const std::string stage = s.name.substr(0, s.name.find('['));
    auto it = worst.find(stage);
    if (it == worst.end()) order.push_back(stage), worst.emplace(stage, s);
    else if (!s.within_bound || (it->second.within_bound && s.max_bound_ratio > it->second.max_bound_ratio)) it->second = s;
  }
  ComparisonTable table(std::string(gated ? "Gated DeltaNet" : "DeltaNet") + " CUDA kernels (bf16) vs oracle, stage by stage: " +
                        testing::describe(c));
  for (const auto& stage : order) table.add(stage, "cuda", "oracle", worst.at(stage), worst.at(stage).within_bound);

  // End to end: every token's output within 16·u_bf16 (normwise) of a float64 recurrence.
  const testing::DoubleForward oracle = testing::double_oracle(c, in);
  const auto output = testing::heads_of(r.output);
  const std::string bad = testing::rowwise_disagreement(output, oracle.output, testing::end_to_end_tau(c.dtype));
  ref::ErrorSummary e2e = ref::compare<double>("output end to end", output.front(), oracle.output.front());
  table.add("output", "cuda", "float64 recurrence", e2e, bad.empty());
  table.print(std::cout);
  std::cout << "output relative L2 vs float64: " << testing::relative_l2_all(output, oracle.output) << "\n";
  if (!bad.empty()) std::cout << "end to end: " << bad << "\n";
  const bool pass = rep.ok() && bad.empty();
  std::cout << (pass ? "AGREE" : "DISAGREE") << "\n";
  return pass ? 0 : 1;
}

}  // namespace

int verify_delta_rule_cuda(const CaseOptions& options) { return verify_delta_family_cuda(options, false); }
int verify_gated_delta_rule_cuda(const CaseOptions& options) { return verify_delta_family_cuda(options, true); }

}  // namespace deltaproof::tools
