// DeltaNet and Gated DeltaNet kernels on the GPU (the performance targets): chunkwise
// forward at bf16, B=8, H=16, L=4096, DK=DV=128 for C ∈ {16, 32, 64}, each stage timed on its own
// too (WY preparation, state scan + output), the backward (all four stages, each stage alone), a
// training step's forward + backward (the forward keeping what the backward's first kernel computes, and
// each half alone; the inference forward + the recomputing backward beside it), and decode of one token
// at B=64, H=16, D=128 with an fp32 state; the forward at long context with few heads (B = 1), one walk against
// segments. Timing:
// CUDA events around each launch (UseManualTime), 60 repetitions of one launch each, median
// reported; two input sets alternate so that a launch never finds its inputs in L2 (each set is
// far larger than the 50 MB L2). Data random and never zero: keys normalized in expectation
// (entries ~ ±0.088 ≈ 1/√128), β in (0.25, 1), g in (−0.1, −0.025), dO in (0.25, 1) signed.
#include "bench/cuda_bench_support.hpp"
#include "cuda/check.hpp"
#include "cuda/delta_rule.h"
#include "cuda/testing/delta_rule_stages.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

namespace kc = deltaproof::cuda;
namespace kdr = deltaproof::cuda::delta_rule;
using kc::check;
using kc::DType;
using namespace deltaproof::bench;

namespace {

constexpr int kBatch = 8, kHeads = 16, kLength = 4096, kDim = 128;
constexpr int kDecodeBatch = 64;
constexpr int kSets = 2;

struct ForwardSet {
  void *q, *k, *v, *beta, *gate, *o, *final_state, *workspace;
};

// The benchmark's shape at chunk size C, packed, no tensors yet (forward or backward params).
template <class Params>
Params shape(int C) {
  Params p;
  p.dtype = DType::bf16, p.batch = kBatch, p.heads = kHeads, p.length = kLength, p.key_dim = kDim, p.value_dim = kDim;
  p.chunk_size = C;
  kdr::set_contiguous_strides(p);
  return p;
}
const std::vector<ForwardSet>& forward_sets() {
  static const std::vector<ForwardSet> sets = [] {
    std::vector<ForwardSet> s;
    const std::size_t n = std::size_t{kBatch} * kHeads * kLength * kDim, tokens = std::size_t{kBatch} * kHeads * kLength;
    const std::size_t states = std::size_t{kBatch} * kHeads * kDim * kDim;
    std::size_t workspace = 0;  // W and U, and the scores (C × C per chunk): the largest need over C
    for (int C : {16, 32, 64}) workspace = std::max(workspace, kdr::workspace_bytes(shape<kdr::ForwardParams>(C)));
    for (int i = 0; i < kSets; ++i)
      s.push_back({device_bf16(n, 0.02f, 0.15f, true, 10 * i + 1), device_bf16(n, 0.02f, 0.15f, true, 10 * i + 2),
                   device_bf16(n, 0.25f, 1.f, true, 10 * i + 3), device_bf16(tokens, 0.25f, 1.f, false, 10 * i + 4),
                   device_f32(tokens, -0.1f, -0.025f, false, 10 * i + 5), device_workspace(n * 2),
                   device_workspace(states * 4), device_workspace(workspace)});
    return s;
  }();
  return sets;
}

kdr::ForwardParams forward_params(int set, int C, bool gated) {
  const ForwardSet& s = forward_sets()[size_t(set)];
  kdr::ForwardParams p = shape<kdr::ForwardParams>(C);
  p.q = s.q, p.k = s.k, p.v = s.v, p.beta = s.beta;
  p.log_gate = gated ? static_cast<const float*>(s.gate) : nullptr;
  p.output = s.o, p.final_state = static_cast<float*>(s.final_state), p.workspace = s.workspace;
  return p;
}

// Algorithmic FLOPs per token: K Kᵀ (2CD), W and U (4CD), W Sᵀ, Q Sᵀ and the update (6D²),
// Q Kᵀ and P V̄ (4CD).
double forward_flops(int C) { return double(kBatch) * kHeads * kLength * (10.0 * C * kDim + 6.0 * kDim * kDim); }
constexpr double kTensorBytes = double(kBatch) * kHeads * kLength * kDim * 2;

enum class Stage { forward, prepare, scan };

void forward_benchmark(benchmark::State& state, Stage stage) {
  const int C = static_cast<int>(state.range(0));
  const bool gated = state.range(1) != 0;
  time_launches(state, kSets, [&](int i) {
    const kdr::ForwardParams p = forward_params(i, C, gated);
    if (stage == Stage::forward) kdr::forward(p);
    else if (stage == Stage::prepare) kdr::testing::wy_prepare({p, {}});  // W and U in the same workspace
    else kdr::testing::chunk_scan({p, {}});
  });
  // Compulsory traffic of the whole forward: read q, k, v, write o.
  state.counters["bytes"] = benchmark::Counter(4 * kTensorBytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOPs"] = benchmark::Counter(forward_flops(C), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DeltaRuleForward(benchmark::State& state) { forward_benchmark(state, Stage::forward); }
void BM_DeltaRuleWyPrepare(benchmark::State& state) { forward_benchmark(state, Stage::prepare); }
void BM_DeltaRuleChunkScan(benchmark::State& state) { forward_benchmark(state, Stage::scan); }

// Long context with few heads: B = 1, D = 128, C = 64, H heads, 2^log2L tokens, DeltaNet or Gated DeltaNet, the
// forward as one walk per sequence (segments = 1) or over the segments the launcher chooses (0). One input set,
// sized for the largest shape (16 GiB of bf16 q, k, v, o): at these lengths no input stays in L2 between launches.
void BM_DeltaRuleLongForward(benchmark::State& state) {
  const int H = static_cast<int>(state.range(0)), L = 1 << state.range(1), segments = static_cast<int>(state.range(3));
  const bool gated = state.range(2) != 0;
  constexpr int kMaxHeads = 16, kMaxLength = 1 << 20;
  static void *q = nullptr, *k, *v, *beta, *gate, *o, *final_state, *workspace;
  const auto params = [&](int heads, int length) {
    kdr::ForwardParams p;
    p.dtype = DType::bf16, p.batch = 1, p.heads = heads, p.length = length, p.key_dim = kDim, p.value_dim = kDim, p.chunk_size = 64;
    kdr::set_contiguous_strides(p);
    return p;
  };
  if (!q) {
    const std::size_t tokens = std::size_t{kMaxHeads} * kMaxLength, n = tokens * kDim;
    q = device_bf16(n, 0.02f, 0.15f, true, 701), k = device_bf16(n, 0.02f, 0.15f, true, 702), v = device_bf16(n, 0.25f, 1.f, true, 703);
    beta = device_bf16(tokens, 0.25f, 1.f, false, 704), gate = device_f32(tokens, -0.1f, -0.025f, false, 705);
    o = device_workspace(n * 2), final_state = device_workspace(std::size_t{kMaxHeads} * kDim * kDim * 4);
    workspace = device_workspace(kdr::workspace_bytes(params(kMaxHeads, kMaxLength)));
  }
  time_launches(state, 1, [&](int) {
    kdr::ForwardParams p = params(H, L);
    p.q = q, p.k = k, p.v = v, p.beta = beta, p.log_gate = gated ? static_cast<const float*>(gate) : nullptr;
    p.output = o, p.final_state = static_cast<float*>(final_state), p.workspace = workspace, p.segments = segments;
    kdr::forward(p);
  });
  state.counters["bytes"] = benchmark::Counter(4.0 * H * L * kDim * 2, benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------------------
// Backward (cuda/delta_rule_backward.cu): its inputs are a forward set's q, k, v, β, g plus dO and
// dS_L; outputs dq, dk, dv, dβ, dg, dS_0; the intermediates in a workspace sized for the largest need over C.
// bf16 at D = 128 takes the tensor-core backward (cuda/delta_rule_backward_tensor_core.cu); its stages are timed alone.

struct BackwardSet {
  void *d_output, *d_final_state, *dq, *dk, *dv, *d_beta, *d_gate, *d_initial_state, *workspace;
  void* saved;  // a training forward's (ForwardParams::saved), for the backward that reads it
};

const std::vector<BackwardSet>& backward_sets() {
  static const std::vector<BackwardSet> sets = [] {
    std::vector<BackwardSet> s;
    const std::size_t n = std::size_t{kBatch} * kHeads * kLength * kDim, tokens = std::size_t{kBatch} * kHeads * kLength;
    const std::size_t states = std::size_t{kBatch} * kHeads * kDim * kDim;
    std::size_t workspace = 0, saved = 0;
    for (int C : {16, 32, 64}) {
      workspace = std::max(workspace, kdr::workspace_bytes(shape<kdr::BackwardParams>(C)));
      saved = std::max(saved, kdr::saved_bytes(shape<kdr::ForwardParams>(C)));
    }
    for (int i = 0; i < kSets; ++i)
      s.push_back({device_bf16(n, 0.25f, 1.f, true, 10 * i + 6), device_f32(states, 0.01f, 0.1f, true, 10 * i + 7),
                   device_workspace(n * 2), device_workspace(n * 2), device_workspace(n * 2), device_workspace(tokens * 2),
                   device_workspace(tokens * 4), device_workspace(states * 4), device_workspace(workspace),
                   device_workspace(saved)});
    return s;
  }();
  return sets;
}

kdr::BackwardParams backward_params(int set, int C, bool gated) {
  const ForwardSet& f = forward_sets()[size_t(set)];
  const BackwardSet& b = backward_sets()[size_t(set)];
  kdr::BackwardParams p = shape<kdr::BackwardParams>(C);
  p.q = f.q, p.k = f.k, p.v = f.v, p.beta = f.beta;
  p.log_gate = gated ? f.gate : nullptr;
  p.d_output = b.d_output, p.d_final_state = b.d_final_state;
  p.dq = b.dq, p.dk = b.dk, p.dv = b.dv, p.d_beta = b.d_beta, p.d_initial_state = b.d_initial_state;
  p.d_log_gate = gated ? b.d_gate : nullptr;
  p.workspace = b.workspace;
  return p;
}

// Algorithmic FLOPs per token of the backward (no triangular savings; D = DK = DV; the hi + lo products and
// the recomputed forward's extra products not counted):
// prepare K Kᵀ, Q Kᵀ, W, U 8CD; state scan V̄ and S 4D²; gradient scan dV̄ 2CD + 2D², G 4D²;
// chunk gradients K Kᵀ, dO V̄ᵀ, E_o K, dT (two), E_oᵀ Q, F K, Tᵀ dW, Tᵀ dU 20CD, dO S, dV̄ S,
// V̄ G' 6D², X and E 4C² — 28CD + 16D² + 4C² in all.
double backward_flops(int C) {
  return double(kBatch) * kHeads * kLength * (28.0 * C * kDim + 16.0 * kDim * kDim + 4.0 * C * C);
}

// A training step is forward_and_backward: the forward keeps what the backward's first two kernels compute
// (ForwardParams::saved), the backward reads it; training_forward and from_saved are its two halves.
// forward_and_recomputing_backward is the inference forward followed by the backward that recomputes.
enum class BackwardStage {
  all, prepare, state_pass, gradient_scan, chunk_gradients, forward_and_backward, training_forward, from_saved,
  forward_and_recomputing_backward
};

void backward_benchmark(benchmark::State& state, BackwardStage stage) {
  const int C = static_cast<int>(state.range(0));
  const bool gated = state.range(1) != 0;
  const auto training_forward_params = [&](int i) {
    kdr::ForwardParams f = forward_params(i, C, gated);
    f.saved = backward_sets()[size_t(i)].saved;
    return f;
  };
  const auto from_saved_params = [&](int i) {
    kdr::BackwardParams p = backward_params(i, C, gated);
    p.saved = backward_sets()[size_t(i)].saved;
    return p;
  };
  // Every set's intermediates written once, so that a stage timed alone reads what it would read.
  for (int i = 0; i < kSets; ++i) {
    kdr::backward(backward_params(i, C, gated));
    kdr::forward(training_forward_params(i));
  }
  check(cudaDeviceSynchronize(), "backward warm-up");
  time_launches(state, kSets, [&](int i) {
    const kdr::BackwardParams p = backward_params(i, C, gated);
    const kdr::BackwardStageParams stages{p, {}};  // a stage alone carves the same workspace as the whole backward
    switch (stage) {
      case BackwardStage::all: return kdr::backward(p);
      case BackwardStage::prepare: return kdr::testing::backward_tensor_core_stage(stages, kdr::TensorCoreStage::prepare);
      case BackwardStage::state_pass: return kdr::testing::backward_tensor_core_stage(stages, kdr::TensorCoreStage::state_pass);
      case BackwardStage::gradient_scan: return kdr::testing::backward_tensor_core_stage(stages, kdr::TensorCoreStage::gradient_scan);
      case BackwardStage::chunk_gradients: return kdr::testing::backward_tensor_core_stage(stages, kdr::TensorCoreStage::chunk_gradients);
      case BackwardStage::forward_and_backward:
        kdr::forward(training_forward_params(i));
        return kdr::backward(from_saved_params(i));
      case BackwardStage::training_forward: return kdr::forward(training_forward_params(i));
      case BackwardStage::from_saved: return kdr::backward(from_saved_params(i));
      case BackwardStage::forward_and_recomputing_backward:
        kdr::forward(forward_params(i, C, gated));
        return kdr::backward(p);
    }
  });
  // Compulsory traffic: read q, k, v, dO, write dq, dk, dv (forward + backward: also write o; the training
  // forward alone: read q, k, v, write o).
  const bool both = stage == BackwardStage::forward_and_backward || stage == BackwardStage::forward_and_recomputing_backward;
  const double tensors = stage == BackwardStage::training_forward ? 4 : both ? 8 : 7;
  const double flops = stage == BackwardStage::training_forward ? forward_flops(C) : backward_flops(C) + (both ? forward_flops(C) : 0);
  state.counters["bytes"] = benchmark::Counter(tensors * kTensorBytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOPs"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DeltaRuleBackward(benchmark::State& state) { backward_benchmark(state, BackwardStage::all); }
void BM_DeltaRuleBackwardPrepare(benchmark::State& state) { backward_benchmark(state, BackwardStage::prepare); }
void BM_DeltaRuleBackwardStatePass(benchmark::State& state) { backward_benchmark(state, BackwardStage::state_pass); }
void BM_DeltaRuleBackwardGradientScan(benchmark::State& state) { backward_benchmark(state, BackwardStage::gradient_scan); }
void BM_DeltaRuleBackwardChunkGradients(benchmark::State& state) { backward_benchmark(state, BackwardStage::chunk_gradients); }
void BM_DeltaRuleForwardBackward(benchmark::State& state) { backward_benchmark(state, BackwardStage::forward_and_backward); }
void BM_DeltaRuleTrainingForward(benchmark::State& state) { backward_benchmark(state, BackwardStage::training_forward); }
void BM_DeltaRuleBackwardFromSaved(benchmark::State& state) { backward_benchmark(state, BackwardStage::from_saved); }
void BM_DeltaRuleForwardBackwardRecomputing(benchmark::State& state) {
  backward_benchmark(state, BackwardStage::forward_and_recomputing_backward);
}

// queued: timed with the launch queued ahead of the clock (time_launches), the GPU's time alone.
void decode_benchmark(benchmark::State& state, bool queued) {
  const int B = static_cast<int>(state.range(0)), T = 1;
  const bool gated = state.range(1) != 0;
  const std::size_t tokens = static_cast<std::size_t>(B) * kHeads * T, states = static_cast<std::size_t>(B) * kHeads * kDim * kDim;
  struct Set {
    void *q, *k, *v, *beta, *gate, *o, *s;
  };
  static std::vector<Set> sets;  // kept across benchmarks
  if (sets.empty())
    for (int i = 0; i < kSets; ++i)
      sets.push_back({device_bf16(tokens * kDim, 0.02f, 0.15f, true, 100 + i), device_bf16(tokens * kDim, 0.02f, 0.15f, true, 200 + i),
                      device_bf16(tokens * kDim, 0.25f, 1.f, true, 300 + i), device_bf16(tokens, 0.25f, 1.f, false, 400 + i),
                      device_f32(tokens, -0.1f, -0.025f, false, 500 + i), device_bf16(tokens * kDim, 1, 1, true, 600 + i),
                      device_f32(states, 0.1f, 1.f, true, 700 + i)});
  time_launches(state, kSets, [&](int i) {
    kdr::DecodeParams p;
    p.dtype = DType::bf16, p.batch = B, p.heads = kHeads, p.tokens = T, p.key_dim = kDim, p.value_dim = kDim;
    kdr::set_contiguous_strides(p);
    p.q = sets[i].q, p.k = sets[i].k, p.v = sets[i].v, p.beta = sets[i].beta, p.output = sets[i].o;
    p.log_gate = gated ? static_cast<const float*>(sets[i].gate) : nullptr;
    p.initial_state = static_cast<const float*>(sets[i].s), p.final_state = static_cast<float*>(sets[i].s);  // in place
    kdr::decode(p);
  }, queued);
  const double bytes = 2.0 * states * 4 + 4.0 * tokens * kDim * 2;  // state in and out, q, k, v, o
  state.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOPs"] = benchmark::Counter(6.0 * states * T, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DeltaRuleDecode(benchmark::State& state) { decode_benchmark(state, false); }
void BM_DeltaRuleDecodeQueued(benchmark::State& state) { decode_benchmark(state, true); }

}  // namespace

#define DELTA_FORWARD_ARGS                                                                                     \
  ArgNames({"C", "gated"})->ArgsProduct({{16, 32, 64}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond)       \
      ->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true)
BENCHMARK(BM_DeltaRuleForward)->DELTA_FORWARD_ARGS;
BENCHMARK(BM_DeltaRuleWyPrepare)->DELTA_FORWARD_ARGS;
BENCHMARK(BM_DeltaRuleChunkScan)->DELTA_FORWARD_ARGS;
BENCHMARK(BM_DeltaRuleLongForward)->ArgNames({"H", "log2L", "gated", "segments"})
    ->ArgsProduct({{2, 4, 8, 16}, {16, 18, 20}, {0, 1}, {1, 0}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(10)->ReportAggregatesOnly(true);
#define DELTA_BACKWARD_ARGS                                                                                    \
  ArgNames({"C", "gated"})->ArgsProduct({{16, 32, 64}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond)       \
      ->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true)
BENCHMARK(BM_DeltaRuleBackward)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleForwardBackward)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleTrainingForward)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleBackwardFromSaved)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleForwardBackwardRecomputing)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleBackwardPrepare)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleBackwardStatePass)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleBackwardGradientScan)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleBackwardChunkGradients)->DELTA_BACKWARD_ARGS;
BENCHMARK(BM_DeltaRuleDecode)->ArgNames({"B", "gated"})->ArgsProduct({{kDecodeBatch}, {0, 1}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true);
BENCHMARK(BM_DeltaRuleDecodeQueued)->ArgNames({"B", "gated"})->ArgsProduct({{kDecodeBatch}, {0, 1}})
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(1)->Repetitions(60)->ReportAggregatesOnly(true);

BENCHMARK_MAIN();
