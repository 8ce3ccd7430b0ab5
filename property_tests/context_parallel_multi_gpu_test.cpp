// Linear attention's context-parallel forward over NCCL (cuda/context_parallel.h: nccl_exchange), one rank per GPU
// (up to four), judged as the one-walk forward is; the ranks read and write GPU 0's tensors through peer access.
// Skipped with fewer than two GPUs or without peer access. ctest label multi-gpu; built where CMake found NCCL.
#include "cuda/context_parallel_nccl.h"
#include "property_tests/support/context_parallel_ranks.hpp"
#include "property_tests/support/gpu.hpp"

#include <gtest/gtest.h>

namespace deltaproof::testing {
namespace {

using namespace context_parallel_ranks;

TEST(ContextParallelMultiGpu, NcclRanksMatchOracle) {
  DELTAPROOF_REQUIRE_GPU();
  int devices = 0;
  cuda::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices < 2) GTEST_SKIP() << "fewer than two GPUs";
  const int ranks = std::min(devices, 4);
  for (int d = 1; d < ranks; ++d) {  // ranks on GPU d read and write GPU 0's tensors
    int can = 0;
    cuda::check(cudaDeviceCanAccessPeer(&can, d, 0), "cudaDeviceCanAccessPeer");
    if (!can) GTEST_SKIP() << "GPU " << d << " cannot access GPU 0's memory";
    cuda::check(cudaSetDevice(d), "cudaSetDevice");
    const cudaError_t e = cudaDeviceEnablePeerAccess(0, 0);
    if (e != cudaErrorPeerAccessAlreadyEnabled) cuda::check(e, "cudaDeviceEnablePeerAccess");
    (void)cudaGetLastError();  // "already enabled" is not an error here: not left for a later launch check
  }
  cuda::check(cudaSetDevice(0), "cudaSetDevice");
  std::vector<ncclComm_t> comms(ranks);
  ASSERT_EQ(ncclCommInitAll(comms.data(), ranks, nullptr), ncclSuccess);
  std::uint64_t seed = 11;
  for (const CudaShape& s : kShapes) {
    const CudaCase c = verify::linear_attention::make_case(s, seed++);
    Kernels kernels;
    kernels.forward = [&](const kla::ForwardParams& p) {
      run_ranks(p, ranks, [](int r) { return r; }, [&](int r, int) { return cp::nccl_exchange(comms[r]); });
    };
    const std::string failure = failures(c, kernels);
    EXPECT_TRUE(failure.empty()) << failure;
  }
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
}

}  // namespace
}  // namespace deltaproof::testing
