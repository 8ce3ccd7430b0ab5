// DeltaNet oracle on the CPU: the cost of each form against C in double, the cost of exactness
// (High = 100-digit MPFR, Exact = ℚ) at one shared shape, the oracle's performance targets, and the
// three triangular-solve paths.
//
//   bench_delta_rule --benchmark_out=delta.json --benchmark_out_format=json
//   bench_delta_rule --benchmark_filter='Target'     # the two targets only (about 30 s)
//
// Inputs (RandomDyadic): q, v, S_0 entries n/4 with |n| <= 8, keys n/16 with |n| <= 4, β = p/8:
// dyadic, so exact in every scalar type and the same values for all of them. Over ℚ the state's
// entries grow by about 9 bits per token (4,600 bits at L = 512, D = 64).
//
// Times: real (wall) time and the process's CPU time (all threads; large products use every core,
// DELTAPROOF_THREADS=1 for one). FLOP counter: the dense cost model below, multiply-adds as 2.
#include "reference/delta_rule.hpp"
#include "reference/parallel.hpp"
#include "reference/random_inputs.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>

namespace {

namespace dr = deltaproof::ref::delta_rule;
using deltaproof::ref::Exact;
using deltaproof::ref::High;
using deltaproof::ref::Index;
using deltaproof::ref::Matrix;
using deltaproof::ref::RandomDyadic;
using deltaproof::ref::Vector;

template <class Scalar>
dr::Inputs<Scalar> make_inputs(Index length, Index dim, std::uint64_t seed = 1) {
  RandomDyadic rng(seed);
  dr::Inputs<Exact> in{rng.matrix<Exact>(length, dim), rng.matrix<Exact>(length, dim, 4, 16),
                       rng.matrix<Exact>(length, dim), Vector<Exact>(length), rng.matrix<Exact>(dim, dim)};
  for (Index t = 0; t < length; ++t) in.beta(t) = rng.unit_interval<Exact>();
  return dr::cast<Scalar>(in);
}

// Multiply-adds counted as 2 FLOPs.
double recurrence_flops(double L, double D) { return L * 6 * D * D; }  // S k, e kᵀ update, S q
double chunkwise_flops(double L, double C, double D) {
  const double per_chunk = 2 * C * C * D          // A = I + strictly_lower(diag(β) K Kᵀ)
                           + C * C * C / 3         // T = A⁻¹ (unit lower, forward substitution)
                           + 4 * C * C * D         // W, U
                           + 2 * C * D * D         // V̄ = U − W Sᵀ
                           + 2 * C * D * D + 2 * C * C * D + 2 * C * C * D  // O
                           + 2 * C * D * D;        // S += V̄ᵀ K
  return L / C * per_chunk;
}

void set_flops(benchmark::State& state, double flops) {
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

// Read–correct–write token recurrence (over ℚ on integers, reference/exact_recurrence.hpp).
template <class Scalar>
void BM_DeltaRecurrence(benchmark::State& state) {
  const Index L = state.range(0), D = state.range(1);
  const auto in = make_inputs<Scalar>(L, D);
  for (auto _ : state) benchmark::DoNotOptimize(dr::token_recurrence_read_correct_write(in));
  set_flops(state, recurrence_flops(L, D));
  state.SetLabel(deltaproof::ref::scalar_name<Scalar>());
}

template <class Scalar>
void BM_DeltaChunkwise(benchmark::State& state) {
  const Index L = state.range(0), C = state.range(1), D = state.range(2);
  const auto in = make_inputs<Scalar>(L, D);
  for (auto _ : state) benchmark::DoNotOptimize(dr::chunkwise(in, C));
  set_flops(state, chunkwise_flops(L, std::min(C, L), D));
  state.SetLabel(deltaproof::ref::scalar_name<Scalar>());
}

// A benchmark of seconds per iteration: one iteration per repetition, wall and process CPU time.
void heavy(benchmark::internal::Benchmark* b) {
  b->Iterations(1)->MeasureProcessCPUTime()->UseRealTime()->Unit(benchmark::kSecond);
}
// Milliseconds per iteration: wall and process CPU time.
void timed(benchmark::internal::Benchmark* b) { b->MeasureProcessCPUTime()->UseRealTime()->Unit(benchmark::kMillisecond); }

// The oracle's performance targets: High chunkwise, one head, L = 4096, D = 128 (<= 20 s; C = 64 as the
// kernels use, 16 and 32 beside it), and the Exact recurrence at L = 1024, D = 64 (<= 30 s).
void BM_TargetHighChunkwise(benchmark::State& state) { BM_DeltaChunkwise<High>(state); }
void BM_TargetExactRecurrence(benchmark::State& state) { BM_DeltaRecurrence<Exact>(state); }
BENCHMARK(BM_TargetHighChunkwise)->ArgsProduct({{4096}, {16, 32, 64}, {128}})->ArgNames({"L", "C", "D"})->Apply(heavy);
BENCHMARK(BM_TargetExactRecurrence)->Args({1024, 64})->ArgNames({"L", "D"})->Apply(heavy);

// The cost against C in double at the target shape.
BENCHMARK(BM_DeltaRecurrence<double>)->Args({4096, 128})->ArgNames({"L", "D"})->Apply(timed);
BENCHMARK(BM_DeltaChunkwise<double>)
    ->ArgsProduct({{4096}, {1, 4, 16, 32, 64, 128}, {128}})
    ->ArgNames({"L", "C", "D"})
    ->Apply(timed);

// The cost of exactness: every scalar at one shape (L = 256, D = 32), the recurrence and C sweep.
const std::vector<int64_t> exactness_chunks = {1, 16, 64, 256};
BENCHMARK(BM_DeltaRecurrence<float>)->Args({256, 32})->ArgNames({"L", "D"})->Apply(timed);
BENCHMARK(BM_DeltaRecurrence<double>)->Args({256, 32})->ArgNames({"L", "D"})->Apply(timed);
BENCHMARK(BM_DeltaRecurrence<High>)->Args({256, 32})->ArgNames({"L", "D"})->Apply(timed);
BENCHMARK(BM_DeltaRecurrence<Exact>)->Args({256, 32})->ArgNames({"L", "D"})->Apply(timed);
BENCHMARK(BM_DeltaChunkwise<float>)->ArgsProduct({{256}, exactness_chunks, {32}})->ArgNames({"L", "C", "D"})->Apply(timed);
BENCHMARK(BM_DeltaChunkwise<double>)->ArgsProduct({{256}, exactness_chunks, {32}})->ArgNames({"L", "C", "D"})->Apply(timed);
BENCHMARK(BM_DeltaChunkwise<High>)->ArgsProduct({{256}, exactness_chunks, {32}})->ArgNames({"L", "C", "D"})->Apply(timed);
BENCHMARK(BM_DeltaChunkwise<Exact>)->ArgsProduct({{256}, exactness_chunks, {32}})->ArgNames({"L", "C", "D"})->Apply(timed);

// solve: 0 forward substitution, 1 blocked (16×16 base, merged 16→32→…), 2 recursive (base 16).
void BM_TriangularSolve(benchmark::State& state) {
  const Index C = state.range(0);
  const auto solve = static_cast<dr::TriangularSolve>(state.range(1));
  const auto in = make_inputs<double>(C, 64);
  const Matrix<double> a = dr::wy_system<double>(in.k, in.beta);
  for (auto _ : state) benchmark::DoNotOptimize(dr::invert_unit_lower<double>(a, solve, 16));
  state.SetLabel(dr::to_string(solve));
  state.counters["FLOPS"] = benchmark::Counter(static_cast<double>(C) * C * C / 3, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TriangularSolve)->ArgsProduct({{16, 32, 64, 128}, {0, 1, 2}})->ArgNames({"C", "solve"});

}  // namespace

// DELTAPROOF_THREADS=n: the oracle's threads (default: every core).
int main(int argc, char** argv) {
  if (const char* threads = std::getenv("DELTAPROOF_THREADS")) deltaproof::ref::set_thread_count(unsigned(std::max(0, std::atoi(threads))));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
