// What the CUDA benchmarks share: random device inputs and the timing loop.
// Timing: CUDA events around each launch (UseManualTime), one launch per iteration; the caller's
// input sets alternate so that a launch never finds its inputs in L2.
#pragma once

#include "cuda/check.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <atomic>
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
// On an idle GPU the start event is taken as soon as it is recorded, so the time also holds the host's
// argument validation and kernel submission. With `queued`, a host function ahead of the start event
// holds the stream until the iteration's launch and stop event are submitted: the events then bracket the
// GPU's work alone (nvbench's blocking kernel does the same). launch(i) must then make no synchronizing
// CUDA call (it would wait for the held stream forever).
template <class Launch>
void time_launches(benchmark::State& state, int sets, Launch&& launch, bool queued = false) {
  cudaEvent_t start, stop;
  cuda::check(cudaEventCreate(&start), "cudaEventCreate");
  cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
  launch(0);  // warm-up (also sets the kernels' shared-memory limits)
  cuda::check(cudaDeviceSynchronize(), "warm-up");
  std::atomic<bool> submitted{false};
  const auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load(std::memory_order_acquire)) {}
  };
  struct Release {  // lets the stream go on every path out of the submission, a throw included
    std::atomic<bool>& flag;
    ~Release() { flag.store(true, std::memory_order_release); }
  };
  int i = 0;
  for (auto _ : state) {
    submitted.store(false, std::memory_order_relaxed);
    if (queued) cuda::check(cudaLaunchHostFunc(nullptr, hold, &submitted), "cudaLaunchHostFunc");
    {
      const Release release{submitted};
      cuda::check(cudaEventRecord(start), "cudaEventRecord");
      launch(++i % sets);
      cuda::check(cudaEventRecord(stop), "cudaEventRecord");
    }
    cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace deltaproof::bench
