// Linear attention kernels on the GPU (the performance targets): chunkwise forward and
// backward at bf16, B=8, H=16, L=4096, DK=DV=128 for C ∈ {16, 32, 64}; the forward at long context with
// few heads (B=1, H ∈ {2, 4, 8, 16}, L ∈ {2^16, 2^18, 2^20}), one walk against segments; and decode of one
// token at B=64, H=16, D=128 with an fp32 state. Timing: CUDA events around each launch (UseManualTime),
// 60 repetitions of one launch each, median reported; two input sets alternate so that a launch
// never finds its inputs in L2 (each set is far larger than the 50 MB L2 anyway).
#include "bench/cuda_bench_support.hpp"
#include "cuda/linear_attention.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <vector>

namespace kla = deltaproof::cuda::linear_attention;
using deltaproof::cuda::check;
using deltaproof::cuda::DType;
using namespace deltaproof::bench;

namespace {

constexpr int kBatch = 8, kHeads = 16, kLength = 4096, kDim = 128;
constexpr int kDecodeBatch = 64;
constexpr int kSets = 2;

struct TrainingSet {
  void *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
};
const std::vector<TrainingSet>& training_sets() {
  static const std::vector<TrainingSet> sets = [] {
    std::vector<TrainingSet> s;
    const std::size_t n = std::size_t{kBatch} * kHeads * kLength * kDim;
    for (int i = 0; i < kSets; ++i)
      s.push_back({device_bf16(n, 0.022f, 0.088f, true, 10 * i + 1), device_bf16(n, 0.022f, 0.088f, true, 10 * i + 2),
                   device_bf16(n, 0.25f, 1.f, true, 10 * i + 3), device_bf16(n, 0.25f, 1.f, true, 10 * i + 4),
                   device_bf16(n, 0.25f, 1.f, true, 10 * i + 5), device_bf16(n, 0.25f, 1.f, true, 10 * i + 6),
                   device_bf16(n, 0.25f, 1.f, true, 10 * i + 7), device_bf16(n, 0.25f, 1.f, true, 10 * i + 8)});
    return s;
  }();
  return sets;
}

// Algorithmic FLOPs of the chunkwise forward, per token: Q Kᵀ and P V (2C·DK + 2C·DV) plus
// Q S_[c]ᵀ and the state update (2·DK·DV each). The backward is three such passes.
double forward_flops(int C) {
  return double(kBatch) * kHeads * kLength * (2.0 * C * kDim + 2.0 * C * kDim + 4.0 * kDim * kDim);
}
constexpr double kTensorBytes = double(kBatch) * kHeads * kLength * kDim * 2;

void BM_LinearAttentionForward(benchmark::State& state) {
  const int C = static_cast<int>(state.range(0));
  const auto& sets = training_sets();
  time_launches(state, kSets, [&](int i) {
    kla::ForwardParams p;
    p.dtype = DType::bf16, p.batch = kBatch, p.heads = kHeads, p.length = kLength, p.key_dim = kDim, p.value_dim = kDim;
    p.chunk_size = C, p.q = sets[i].q, p.k = sets[i].k, p.v = sets[i].v, p.output = sets[i].o;
    kla::set_contiguous_strides(p);
    kla::forward(p);
  });
  state.counters["bytes"] = benchmark::Counter(4 * kTensorBytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOPs"] = benchmark::Counter(forward_flops(C), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_LinearAttentionBackward(benchmark::State& state) {
  const int C = static_cast<int>(state.range(0));
  const auto& sets = training_sets();
  time_launches(state, kSets, [&](int i) {
    kla::BackwardParams p;
    p.dtype = DType::bf16, p.batch = kBatch, p.heads = kHeads, p.length = kLength, p.key_dim = kDim, p.value_dim = kDim;
    p.chunk_size = C, p.q = sets[i].q, p.k = sets[i].k, p.v = sets[i].v, p.d_output = sets[i].d_o;
    p.dq = sets[i].dq, p.dk = sets[i].dk, p.dv = sets[i].dv;
    kla::set_contiguous_strides(p);
    kla::backward(p);
  });
  // Compulsory traffic: read q, k, v, dO; write dq, dk, dv.
  state.counters["bytes"] = benchmark::Counter(7 * kTensorBytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOPs"] = benchmark::Counter(3 * forward_flops(C), benchmark::Counter::kIsIterationInvariantRate);
}

// Long context with few heads: B = 1, D = 128, C = 64, H heads, 2^log2L tokens, the forward as one walk per
// sequence (segments = 1) or over the segments the launcher chooses (0). One input set, sized for the largest
// shape (16 GiB of bf16 q, k, v, o): at these lengths no input stays in L2 between launches.
void BM_LinearAttentionLongForward(benchmark::State& state) {
  const int H = static_cast<int>(state.range(0)), L = 1 << state.range(1), segments = static_cast<int>(state.range(2));
  constexpr int kMaxHeads = 16, kMaxLength = 1 << 20;
  static void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  if (!q) {
    const std::size_t n = std::size_t{kMaxHeads} * kMaxLength * kDim;
    q = device_bf16(n, 0.022f, 0.088f, true, 601), k = device_bf16(n, 0.022f, 0.088f, true, 602);
    v = device_bf16(n, 0.25f, 1.f, true, 603), o = device_bf16(n, 0.25f, 1.f, true, 604);
  }
  time_launches(state, 1, [&](int) {
    kla::ForwardParams p;
    p.dtype = DType::bf16, p.batch = 1, p.heads = H, p.length = L, p.key_dim = kDim, p.value_dim = kDim;
    p.chunk_size = 64, p.q = q, p.k = k, p.v = v, p.output = o, p.segments = segments;
    kla::set_contiguous_strides(p);
    kla::forward(p);
  });
  state.counters["bytes"] = benchmark::Counter(4.0 * H * L * kDim * 2, benchmark::Counter::kIsIterationInvariantRate);
}

// queued: timed with the launch queued ahead of the clock (time_launches), the GPU's time alone.
void decode_benchmark(benchmark::State& state, bool queued) {
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  const std::size_t tokens = static_cast<std::size_t>(B) * kHeads * T * kDim, states = static_cast<std::size_t>(B) * kHeads * kDim * kDim;
  struct Set { void *q, *k, *v, *o, *s; };
  static std::vector<Set> sets;  // kept across repetitions (one shape is benchmarked)
  if (sets.empty())
    for (int i = 0; i < kSets; ++i)
      sets.push_back({device_bf16(tokens, 0.022f, 0.088f, true, 100 + i), device_bf16(tokens, 0.022f, 0.088f, true, 200 + i),
                      device_bf16(tokens, 0.25f, 1.f, true, 300 + i), device_bf16(tokens, 0.25f, 1.f, true, 400 + i),
                      device_f32(states, 0.25f, 1.f, true, 500 + i)});
  time_launches(state, kSets, [&](int i) {
    kla::DecodeParams p;
    p.dtype = DType::bf16, p.batch = B, p.heads = kHeads, p.tokens = T, p.key_dim = kDim, p.value_dim = kDim;
    p.q = sets[i].q, p.k = sets[i].k, p.v = sets[i].v, p.output = sets[i].o;
    p.initial_state = p.final_state = sets[i].s;  // in place
    kla::set_contiguous_strides(p);
    kla::decode(p);
  }, queued);
  const double bytes = 2.0 * states * 4 + 4.0 * tokens * 2;  // state in and out, q, k, v, o
  state.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOPs"] = benchmark::Counter(4.0 * states * T, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_LinearAttentionDecode(benchmark::State& state) { decode_benchmark(state, false); }
void BM_LinearAttentionDecodeQueued(benchmark::State& state) { decode_benchmark(state, true); }

}  // namespace

BENCHMARK(BM_LinearAttentionForward)->ArgNames({"C"})->Arg(16)->Arg(32)->Arg(64)
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true);
BENCHMARK(BM_LinearAttentionBackward)->ArgNames({"C"})->Arg(16)->Arg(32)->Arg(64)
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true);
BENCHMARK(BM_LinearAttentionLongForward)->ArgNames({"H", "log2L", "segments"})
    ->ArgsProduct({{2, 4, 8, 16}, {16, 18, 20}, {1, 0}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(10)->ReportAggregatesOnly(true);
BENCHMARK(BM_LinearAttentionDecode)->ArgNames({"B", "T"})->Args({kDecodeBatch, 1})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true);
BENCHMARK(BM_LinearAttentionDecodeQueued)->ArgNames({"B", "T"})->Args({kDecodeBatch, 1})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true);

BENCHMARK_MAIN();
