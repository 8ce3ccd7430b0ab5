// What the CUDA benchmarks share: random device inputs and the timing loop.
// Timing: CUDA events around each launch (UseManualTime), one launch per iteration; the caller's
// input sets alternate so that a launch never finds its inputs in L2.
#pragma once

#include "cuda/check.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace deltaproof::bench {

inline std::uint16_t to_bf16(float x) {  // round to nearest even
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Random, never-zero values of magnitude in [lo, hi] with random sign (or positive).
inline std::vector<float> random_values(std::size_t count, float lo, float hi, bool signed_values, std::uint64_t seed) {
  std::uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<float> out(count);
  for (auto& x : out) {  // xorshift: cheap enough for 10⁸ entries
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const float magnitude = lo + (hi - lo) * float(r >> 40) / float(1 << 24);
    x = (signed_values && (r & 1)) ? -magnitude : magnitude;
  }
  return out;
}

inline void* device_bf16(std::size_t count, float lo, float hi, bool signed_values, std::uint64_t seed) {
  const std::vector<float> values = random_values(count, lo, hi, signed_values, seed);
  std::vector<std::uint16_t> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = to_bf16(values[i]);
  void* d = nullptr;
  cuda::check(cudaMalloc(&d, count * 2), "cudaMalloc");
  cuda::check(cudaMemcpy(d, host.data(), count * 2, cudaMemcpyHostToDevice), "upload");
  return d;
}
inline void* device_f32(std::size_t count, float lo, float hi, bool signed_values, std::uint64_t seed) {
  const std::vector<float> host = random_values(count, lo, hi, signed_values, seed);
  void* d = nullptr;
  cuda::check(cudaMalloc(&d, count * 4), "cudaMalloc");
  cuda::check(cudaMemcpy(d, host.data(), count * 4, cudaMemcpyHostToDevice), "upload");
  return d;
}

// Workspace written by the kernels before it is read.
inline void* device_workspace(std::size_t bytes) {
  void* d = nullptr;
  cuda::check(cudaMalloc(&d, bytes), "cudaMalloc");
  cuda::check(cudaMemset(d, 0, bytes), "cudaMemset");
  return d;
}

// Times one launch per iteration with CUDA events; launch(i) runs on input set i of `sets`.
template <class Launch>
void time_launches(benchmark::State& state, int sets, Launch&& launch) {
  cudaEvent_t start, stop;
  cuda::check(cudaEventCreate(&start), "cudaEventCreate");
  cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
  launch(0);  // warm-up (also sets the kernels' shared-memory limits)
  cuda::check(cudaDeviceSynchronize(), "warm-up");
  int i = 0;
  for (auto _ : state) {
    cuda::check(cudaEventRecord(start), "cudaEventRecord");
    launch(++i % sets);
    cuda::check(cudaEventRecord(stop), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace deltaproof::bench
