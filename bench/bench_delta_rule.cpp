// DeltaNet oracle in double: the chunkwise form against the token recurrence across C, and the
// cost of the three triangular-solve paths (forward substitution, the article's blocked 16×16
// schedule, the general recursive merge) across C ∈ {16, 32, 64, 128}.
#include "reference/delta_rule.hpp"
#include "reference/random_inputs.hpp"

#include <benchmark/benchmark.h>

namespace {

namespace dr = deltaproof::ref::delta_rule;
using deltaproof::ref::Index;
using deltaproof::ref::Matrix;
using deltaproof::ref::RandomDyadic;
using deltaproof::ref::Vector;

// Keys n/16 with |n| <= 4 (β‖k‖² about 1 at D = 64): the recurrence stays in double's range.
dr::Inputs<double> make_inputs(Index length, Index dim, std::uint64_t seed = 1) {
  RandomDyadic rng(seed);
  dr::Inputs<double> in{rng.matrix<double>(length, dim), rng.matrix<double>(length, dim, 4, 16),
                        rng.matrix<double>(length, dim), Vector<double>(length), rng.matrix<double>(dim, dim)};
  for (Index t = 0; t < length; ++t) in.beta(t) = rng.unit_interval<double>();
  return in;
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

void BM_DeltaRecurrence(benchmark::State& state) {
  const Index L = state.range(0), D = state.range(1);
  const auto in = make_inputs(L, D);
  for (auto _ : state) benchmark::DoNotOptimize(dr::token_recurrence_read_correct_write(in));
  state.counters["FLOPS"] = benchmark::Counter(recurrence_flops(L, D), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DeltaRecurrence)->ArgsProduct({{512}, {64}})->ArgNames({"L", "D"})->Unit(benchmark::kMillisecond);

void BM_DeltaChunkwise(benchmark::State& state) {
  const Index L = state.range(0), C = state.range(1), D = state.range(2);
  const auto in = make_inputs(L, D);
  for (auto _ : state) benchmark::DoNotOptimize(dr::chunkwise(in, C));
  state.counters["FLOPS"] = benchmark::Counter(chunkwise_flops(L, C, D), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DeltaChunkwise)
    ->ArgsProduct({{512}, {1, 4, 16, 32, 64, 128}, {64}})
    ->ArgNames({"L", "C", "D"})
    ->Unit(benchmark::kMillisecond);

// solve: 0 forward substitution, 1 blocked (16×16 base, merged 16→32→…), 2 recursive (base 16).
void BM_TriangularSolve(benchmark::State& state) {
  const Index C = state.range(0);
  const auto solve = static_cast<dr::TriangularSolve>(state.range(1));
  const auto in = make_inputs(C, 64);
  const Matrix<double> a = dr::wy_system<double>(in.k, in.beta);
  for (auto _ : state) benchmark::DoNotOptimize(dr::invert_unit_lower<double>(a, solve, 16));
  state.SetLabel(dr::to_string(solve));
  state.counters["FLOPS"] = benchmark::Counter(static_cast<double>(C) * C * C / 3, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TriangularSolve)->ArgsProduct({{16, 32, 64, 128}, {0, 1, 2}})->ArgNames({"C", "solve"});

}  // namespace

BENCHMARK_MAIN();
