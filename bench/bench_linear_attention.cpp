// CPU oracle cost of the linear-attention forms (double), and the cost of exactness (Exact).
//
//   bench_linear_attention --benchmark_format=json --benchmark_out=la.json
//
// FLOP counter: the chunkwise cost model 2·L·C·(DK+DV) (intra-chunk scores and their product
// with V) + 4·L·DK·DV (inter-chunk output Q S_[c]ᵀ and state update); C = L for the parallel
// form, C = 1 for the recurrence. Backward: about twice the forward.
#include "reference/linear_attention.hpp"
#include "reference/random_inputs.hpp"

#include <benchmark/benchmark.h>

namespace {

namespace la = deltaproof::ref::linear_attention;
using deltaproof::ref::Exact;
using deltaproof::ref::High;
using deltaproof::ref::Index;

double model_flops(Index L, Index C, Index DK, Index DV) {
  return 2.0 * L * C * (DK + DV) + 4.0 * L * DK * DV;
}

template <class Scalar>
struct Problem {
  la::Inputs<Scalar> inputs;
  la::Cotangents<Scalar> cotangents;
};

template <class Scalar>
Problem<Scalar> make_problem(Index L, Index DK, Index DV) {
  deltaproof::ref::RandomDyadic random(42);
  Problem<Scalar> p;
  p.inputs = {random.matrix<Scalar>(L, DK), random.matrix<Scalar>(L, DK), random.matrix<Scalar>(L, DV),
              random.matrix<Scalar>(DV, DK)};
  p.cotangents = {random.matrix<Scalar>(L, DV), random.matrix<Scalar>(DV, DK)};
  return p;
}

void set_counters(benchmark::State& state, double flops) {
  state.counters["FLOP"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

template <class Scalar>
void BM_Parallel(benchmark::State& state) {
  const Index L = state.range(0), D = state.range(1);
  const auto p = make_problem<Scalar>(L, D, D);
  for (auto _ : state) benchmark::DoNotOptimize(la::parallel_masked(p.inputs));
  set_counters(state, model_flops(L, L, D, D));
}

template <class Scalar>
void BM_Recurrent(benchmark::State& state) {
  const Index L = state.range(0), D = state.range(1);
  const auto p = make_problem<Scalar>(L, D, D);
  for (auto _ : state) benchmark::DoNotOptimize(la::token_recurrence(p.inputs));
  set_counters(state, model_flops(L, 1, D, D));
}

template <class Scalar>
void BM_Chunkwise(benchmark::State& state) {
  const Index L = state.range(0), C = state.range(1), D = state.range(2);
  const auto p = make_problem<Scalar>(L, D, D);
  for (auto _ : state) benchmark::DoNotOptimize(la::chunkwise(p.inputs, C));
  set_counters(state, model_flops(L, C, D, D));
}

template <class Scalar>
void BM_ChunkwiseBackward(benchmark::State& state) {
  const Index L = state.range(0), C = state.range(1), D = state.range(2);
  const auto p = make_problem<Scalar>(L, D, D);
  for (auto _ : state) benchmark::DoNotOptimize(la::chunkwise_backward(p.inputs, p.cotangents, C));
  set_counters(state, 2 * model_flops(L, C, D, D));
}

const std::vector<int64_t> chunk_sizes = {1, 4, 16, 32, 64, 128, 256};

BENCHMARK(BM_Parallel<double>)->ArgNames({"L", "D"})->Args({4096, 64})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Recurrent<double>)->ArgNames({"L", "D"})->Args({4096, 64})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Chunkwise<double>)->ArgNames({"L", "C", "D"})->ArgsProduct({{4096}, chunk_sizes, {64}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ChunkwiseBackward<double>)
    ->ArgNames({"L", "C", "D"})->ArgsProduct({{4096}, chunk_sizes, {64}})->Unit(benchmark::kMillisecond);

// The cost of exactness: the same forms in High (100-digit MPFR) and over ℚ at L = 256, D = 16.
BENCHMARK(BM_Parallel<High>)->ArgNames({"L", "D"})->Args({256, 16})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Recurrent<High>)->ArgNames({"L", "D"})->Args({256, 16})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Chunkwise<High>)->ArgNames({"L", "C", "D"})->Args({256, 16, 16})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ChunkwiseBackward<High>)->ArgNames({"L", "C", "D"})->Args({256, 16, 16})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Parallel<Exact>)->ArgNames({"L", "D"})->Args({256, 16})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Recurrent<Exact>)->ArgNames({"L", "D"})->Args({256, 16})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Chunkwise<Exact>)->ArgNames({"L", "C", "D"})->Args({256, 16, 16})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ChunkwiseBackward<Exact>)->ArgNames({"L", "C", "D"})->Args({256, 16, 16})->Unit(benchmark::kMillisecond);

// The exact oracle of `deltaproof verify --L 1000 --dk 64 --dv 64` (any --scalar): the parallel
// form and its backward over ℚ at about that size.
BENCHMARK(BM_Parallel<Exact>)->ArgNames({"L", "D"})->Args({1024, 64})->Unit(benchmark::kSecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
