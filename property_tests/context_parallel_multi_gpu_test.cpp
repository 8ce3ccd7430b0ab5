// Linear attention's context-parallel forward over NCCL (cuda/context_parallel.h: nccl_exchange), one rank per GPU
// (up to four), judged as the one-walk forward is: each GPU gets a copy of the inputs, runs its rank's tokens,
// and its rows of the output come back to GPU 0 (copies through CUDA's unified addressing: no peer access
// needed). Skipped with fewer than two GPUs. ctest label multi-gpu; built where CMake found NCCL.
#include "cuda/context_parallel_nccl.h"
#include "property_tests/support/context_parallel_ranks.hpp"
#include "property_tests/support/gpu.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

namespace deltaproof::testing {
namespace {

using namespace context_parallel_ranks;

// p's tensors copied to `device` (packed layouts, as kernel_checks lays them out), and freed with it.
struct DeviceCopy {
  kla::ForwardParams params;
  std::vector<void*> owned;
  DeviceCopy(const kla::ForwardParams& p, int device) : params(p) {
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    const std::size_t element = cuda::size_of(p.dtype), state = cuda::size_of(kla::state_dtype(p.dtype));
    const auto copy = [&](const void* src, std::size_t bytes, bool contents) -> void* {
      if (!src) return nullptr;
      void* dst = nullptr;
      cuda::check(cudaMalloc(&dst, bytes), "cudaMalloc");
      owned.push_back(dst);
      if (contents) cuda::check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy to the rank's GPU");
      return dst;
    };
    params.q = copy(p.q, std::size_t(p.batch) * p.q_strides.batch * element, true);
    params.k = copy(p.k, std::size_t(p.batch) * p.k_strides.batch * element, true);
    params.v = copy(p.v, std::size_t(p.batch) * p.v_strides.batch * element, true);
    params.output = copy(p.output, std::size_t(p.batch) * p.output_strides.batch * element, false);
    params.initial_state = copy(p.initial_state, std::size_t(p.batch) * p.initial_state_strides.batch * state, true);
    params.final_state = copy(p.final_state, std::size_t(p.batch) * p.final_state_strides.batch * state, false);
  }
  ~DeviceCopy() {
    for (void* m : owned) cudaFree(m);
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
};

TEST(ContextParallelMultiGpu, NcclRanksMatchOracle) {
  DELTAPROOF_REQUIRE_GPU();
  int devices = 0;
  cuda::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices < 2) GTEST_SKIP() << "fewer than two GPUs";
  const int ranks = std::min(devices, 4);
  std::vector<ncclComm_t> comms(ranks);
  ASSERT_EQ(ncclCommInitAll(comms.data(), ranks, nullptr), ncclSuccess);
  std::uint64_t seed = 11;
  for (const CudaShape& s : kShapes) {
    const CudaCase c = verify::linear_attention::make_case(s, seed++);
    Kernels kernels;
    kernels.forward = [&](const kla::ForwardParams& p) {
      if (rank_count(p.length, ranks) != ranks) throw std::logic_error("a GPU would hold no tokens: a longer case is needed");
      if (p.output_strides.batch != std::int64_t(p.heads) * p.output_strides.head)
        throw std::logic_error("the output's rows are copied back as (batch, head) blocks: a packed output is needed");
      std::vector<std::unique_ptr<DeviceCopy>> copies;
      for (int d = 1; d < ranks; ++d) copies.push_back(std::make_unique<DeviceCopy>(p, d));
      run_ranks(p, ranks, [](int r) { return r; }, [&](int r, int) { return cp::nccl_exchange(comms[r]); },
                [&](int r) { return r == 0 ? p : copies[r - 1]->params; });
      // Each rank's rows of every (batch, head) back into GPU 0's output; the last rank's final state.
      const std::size_t element = cuda::size_of(p.dtype), pitch = p.output_strides.head * element;
      const int run = run_length(p.length, ranks);
      for (int r = 1; r < ranks; ++r) {
        const std::size_t offset = std::size_t(r) * run * p.output_strides.row * element;
        const std::size_t width = std::size_t(std::min(run, p.length - r * run)) * p.output_strides.row * element;
        cuda::check(cudaMemcpy2D(static_cast<char*>(p.output) + offset, pitch,
                                 static_cast<const char*>(copies[r - 1]->params.output) + offset, pitch, width,
                                 std::size_t(p.batch) * p.heads, cudaMemcpyDefault),
                    "cudaMemcpy2D of the rank's output rows");
      }
      if (p.final_state)
        cuda::check(cudaMemcpy(p.final_state, copies.back()->params.final_state,
                               std::size_t(p.batch) * p.final_state_strides.batch * cuda::size_of(kla::state_dtype(p.dtype)),
                               cudaMemcpyDefault),
                    "cudaMemcpy of the final state");
      cuda::check(cudaSetDevice(0), "cudaSetDevice");
    };
    const std::string failure = failures(c, kernels);
    EXPECT_TRUE(failure.empty()) << failure;
  }
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
}

}  // namespace
}  // namespace deltaproof::testing
