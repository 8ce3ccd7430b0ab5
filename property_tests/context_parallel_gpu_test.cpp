// Linear attention's context-parallel forward (cuda/context_parallel.h) against the oracle, judged as the one-walk
// forward is (kernel_checks' check_forward): R ∈ {1, 2, 3, 8} ranks as threads on one GPU, each with its own stream,
// exchanging their summaries in process. (Over NCCL, one rank per GPU: context_parallel_multi_gpu_test.cpp.)
#include "property_tests/support/context_parallel_ranks.hpp"
#include "property_tests/support/gpu.hpp"

#include <gtest/gtest.h>

namespace deltaproof::testing {
namespace {

using namespace context_parallel_ranks;

TEST(ContextParallelGpu, InProcessRanksMatchOracle) {
  DELTAPROOF_REQUIRE_GPU();
  std::uint64_t seed = 1;
  for (const CudaShape& s : kShapes)
    for (int ranks : {1, 2, 3, 8}) {
      const CudaCase c = verify::linear_attention::make_case(s, seed++);
      Kernels kernels;
      kernels.forward = [ranks](const kla::ForwardParams& p) {
        auto group = std::make_shared<cp::InProcessGroup>(rank_count(p.length, ranks));
        run_ranks(p, ranks, [](int) { return 0; }, [group](int r, int) { return group->member(r); }, [&p](int) { return p; });
      };
      const std::string failure = failures(c, kernels);
      EXPECT_TRUE(failure.empty()) << "ranks=" << ranks << ": " << failure;
    }
}

TEST(ContextParallelGpuArguments, RejectsBadRanksBeforeAnyCudaCall) {
  EXPECT_TRUE(starts_with(rejection([] { cp::InProcessGroup group(0); }), "ranks"));
  EXPECT_TRUE(starts_with(rejection([] { cp::InProcessGroup(2).member(2); }), "rank"));
}

}  // namespace
}  // namespace deltaproof::testing
