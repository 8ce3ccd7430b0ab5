// The DeltaNet / Gated DeltaNet forward kernels' own source (cuda/delta_rule_forward_kernels.cuh:
// wy_prepare_async_kernel, then the register scan chunk_scan_registers_kernel) executed on the CPU
// emulation of CUDA blocks (support/cuda_emulation.hpp: ldmatrix, mma.sync, cp.async and WMMA as
// the PTX ISA defines them), every intermediate read back and judged by the GPU suite's stage checks
// (kernel_checks/delta_rule_stages.hpp, as property_tests/delta_rule_gpu_test.cpp). NOT a GPU result; it
// is what a tensor-core kernel must pass before GPU time is spent on it. mma.sync here sums exactly
// and truncates once to fp32, the truncating end of the bounds' u_acc; expf is glibc's.
//
// Planted bugs: a few tensor-core helpers the kernels call are routed through test wrappers (macros
// defined only here, before the kernel source is included), which are the helpers themselves
// unless a test plants a bug in them for the length of one run.
#include "property_tests/support/cuda_emulation.hpp"
#include "property_tests/support/emulation_suite.hpp"

#include "cuda/delta_rule_launch.h"
#include "cuda/tensor_core.cuh"
#include "kernel_checks/delta_rule_stages.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace deltaproof::cuda::forward_kernels_emulated {

enum class Plant { none, ldmatrix_row, transposed_fragment, copy_wait_missing, state_lo_dropped };
inline Plant planted = Plant::none;

// ldmatrix_x4 (A operands: the T factors in W and U, W and Q in the scan): with ldmatrix_row, lane 3
// gives lane 4's row address, so row 3 of the first 8×8 matrix is read twice and row 3 never.
inline void ldmatrix_x4_under_test(unsigned (&r)[4], const void* row) {
  if (planted == Plant::ldmatrix_row) {
    const int lane = int(threadIdx.x % 32);
    row = reinterpret_cast<const void*>(__shfl_sync(0xffffffffu, reinterpret_cast<std::uintptr_t>(row), lane == 3 ? 4 : lane));
  }
  tensor_core::ldmatrix_x4(r, row);
}
// ldmatrix_x4_trans (B operands from row-major storage): with transposed_fragment, the plain load.
inline void ldmatrix_x4_trans_under_test(unsigned (&r)[4], const void* row) {
  if (planted == Plant::transposed_fragment) tensor_core::ldmatrix_x4(r, row);
  else tensor_core::ldmatrix_x4_trans(r, row);
}
// split_pair (the hi + lo split of fp32 operands; in the forward only S's is fed to the tensor cores): with
// state_lo_dropped, lo = 0, so S enters as one bf16 rounding, which the register scan's bound does not allow.
template <class T>
inline void split_pair_under_test(float x0, float x1, unsigned& hi, unsigned& lo) {
  tensor_core::split_pair<T>(x0, x1, hi, lo);
  if (planted == Plant::state_lo_dropped) lo = 0;
}
// copy_async_wait_all: with copy_wait_missing, nothing (the copies are never waited for).
inline void copy_async_wait_all_under_test() {
  if (planted != Plant::copy_wait_missing) tensor_core::copy_async_wait_all();
}

using std::min;
DELTAPROOF_EMULATION_SHARED_MEMORY(smem);  // the kernels' extern __shared__

}  // namespace deltaproof::cuda::forward_kernels_emulated

#define ldmatrix_x4(r, row) ldmatrix_x4_under_test(r, row)
#define ldmatrix_x4_trans(r, row) ldmatrix_x4_trans_under_test(r, row)
#define copy_async_wait_all copy_async_wait_all_under_test
#define split_pair split_pair_under_test
// The kernels' source, compiled here under its own namespace (never the nvcc build's launch stubs).
#define DELTAPROOF_FORWARD_KERNELS forward_kernels_emulated
#include "cuda/delta_rule_forward_kernels.cuh"
#undef ldmatrix_x4
#undef ldmatrix_x4_trans
#undef copy_async_wait_all
#undef split_pair

namespace deltaproof::emulation_suite {
namespace {

using namespace deltaproof::verify;
using namespace deltaproof::verify::delta_rule;
namespace fk = deltaproof::cuda::forward_kernels_emulated;
using fk::Plant;

struct EmulatedForward {
  Tensor q, k, v, beta, log_gate, initial_state;
  Tensor output, final_state, w, u, scores, v_new, a, t, boundary;
};

// Stage 1 and the register scan, launched as delta_rule.cu launches them (its register_scan() case).
template <class T, int C>
void run_kernels(const cuda::delta_rule::ForwardStageParams& p, ThreadOrder order, std::uint64_t seed) {
  const unsigned heads = unsigned(p.batch * p.heads);
  const std::size_t prepare_bytes = fk::wy_prepare_async_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes;
  const auto prepare = fk::for_gates(p.log_gate, fk::wy_prepare_async_kernel<T, C, true>, fk::wy_prepare_async_kernel<T, C, false>);
  const auto scan = fk::for_gates(p.log_gate, fk::chunk_scan_registers_kernel<T, C, true>, fk::chunk_scan_registers_kernel<T, C, false>);
  emulation::launch({dim3(cuda::chunk_count(p.length, C), heads), dim3(fk::wy_prepare_async_threads(C)), prepare_bytes, order, seed}, prepare, p);
  emulation::launch({dim3((p.value_dim + fk::kTcSlice - 1) / fk::kTcSlice, heads), dim3(fk::kTcScanThreads),
                     fk::tc_scan_layout(C).bytes, order, seed + 1},
                    scan, p, fk::StatePassOutputs{});
}

// The forward on the emulated machine, every intermediate read back exactly (an entry never
// written is an error).
ForwardResult emulate_forward(const DeltaCase& c, const HostInputs& in, ThreadOrder order = ThreadOrder::shuffled,
                              Plant plant = Plant::none) {
  if (c.dtype == DType::f32 || c.key_dim > fk::kTcKeys || c.key_dim % 8 != 0 || c.value_dim % 8 != 0)
    throw std::invalid_argument("the register scan takes 16-bit inputs, DK <= 128, DK and DV multiples of 8");
  const DType d = c.dtype;
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim, C = c.chunk;
  const Index N = cuda::chunk_count(int(L), int(C));
  EmulatedForward m;
  m.q = write("q", in.q, d), m.k = write("k", in.k, d), m.v = write("v", in.v, d), m.beta = write("beta", in.beta, d);
  if (c.gated) m.log_gate = write("log_gate", in.log_gate, DType::f32);
  if (c.with_initial_state) m.initial_state = write("initial_state", in.initial_state, DType::f32);
  m.output = Tensor("output", d, B, H, L, DV), m.final_state = Tensor("final_state", DType::f32, B, H, DV, DK);
  m.w = Tensor("w", d, B, H, L, DK), m.u = Tensor("u", d, B, H, L, DV), m.scores = Tensor("scores", d, B, H, N * C, C);
  m.v_new = Tensor("v_new", DType::f32, B, H, L, DV);
  m.a = Tensor("wy_system", DType::f32, B, H, N * C, C), m.t = Tensor("wy_inverse", DType::f32, B, H, N * C, C);
  m.boundary = Tensor("boundary_states", DType::f32, B, H, N * DV, DK);

  cuda::delta_rule::ForwardStageParams p;
  p.dtype = d, p.batch = int(B), p.heads = int(H), p.length = int(L), p.key_dim = int(DK), p.value_dim = int(DV), p.chunk_size = int(C);
  cuda::delta_rule::set_contiguous_strides(p);
  p.q = m.q.data(), p.k = m.k.data(), p.v = m.v.data(), p.beta = m.beta.data();
  p.log_gate = static_cast<const float*>(m.log_gate.data()), p.initial_state = static_cast<const float*>(m.initial_state.data());
  p.output = m.output.data(), p.final_state = static_cast<float*>(m.final_state.data()), p.w = m.w.data(), p.u = m.u.data();
  p.scores = m.scores.data();
  p.wy_system = static_cast<float*>(m.a.data()), p.wy_inverse = static_cast<float*>(m.t.data());
  p.v_new = static_cast<float*>(m.v_new.data()), p.boundary_states = static_cast<float*>(m.boundary.data());

  struct Planting {
    explicit Planting(Plant p) { fk::planted = p; }
    ~Planting() { fk::planted = Plant::none; }
  } planting(plant);
  auto by_chunk = [&](auto type_tag) {
    using T = decltype(type_tag);
    switch (C) {
      case 16: return run_kernels<T, 16>(p, order, c.seed);
      case 32: return run_kernels<T, 32>(p, order, c.seed);
      default: return run_kernels<T, 64>(p, order, c.seed);
    }
  };
  if (d == DType::bf16) by_chunk(__nv_bfloat16{});
  else by_chunk(__half{});
  for (const Tensor* input : {&m.q, &m.k, &m.v, &m.beta, &m.log_gate, &m.initial_state}) input->buffer.check_guards();
  ForwardResult r;
  r.output = read(m.output), r.final_state = read(m.final_state), r.w = read(m.w), r.u = read(m.u);
  r.v_new = read(m.v_new), r.a = read(m.a), r.t = read(m.t), r.boundary = read(m.boundary);
  r.arithmetic = ScanArithmetic::register_scan;
  return r;
}

// The brief's shapes: C = 16, 32, 64 with L = 1, C − 1, C + 1, 2C + 3; DK and DV multiples of 8 up
// to 128 (one 64-wide value slice and two, a partial one); both dtypes, gates, S_0 each way.
std::vector<DeltaCase> forward_cases() {
  const struct {
    Index dk, dv;
  } dims[] = {{8, 8}, {16, 72}, {128, 40}, {24, 128}, {128, 128}, {40, 16}};
  std::vector<DeltaCase> cases;
  std::uint64_t seed = 300;
  int i = 0;
  for (Index C : {16, 32, 64})
    for (Index L : {Index(1), C - 1, C + 1, 2 * C + 3}) {
      DeltaCase c;
      c.chunk = C, c.length = L, c.key_dim = dims[i % 6].dk, c.value_dim = dims[i % 6].dv;
      c.dtype = i % 2 ? DType::f16 : DType::bf16, c.gated = i / 2 % 2, c.with_initial_state = (i + i / 4) % 2;
      c.heads = 2, c.seed = seed++;
      cases.push_back(c);
      ++i;
    }
  return cases;
}

std::string stage_failures(const DeltaCase& c, const std::vector<Comparison>& rows) { return describe(c) + "\n" + describe_failures(rows); }

std::string worst_per_stage(const std::vector<Comparison>& rows) {
  std::string text;
  for (const Comparison& row : worst_per_tensor(rows)) text += row.tensor + " " + number_text(row.ratio) + " ";
  return text;
}

// Every stage (A, T, W, U, V̄, S_[c], final state, O) of every case within the GPU suite's bound,
// each block's threads (and the blocks) in a shuffled order.
TEST(DeltaRuleForwardCpuEmulation, StagesMatchTheOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const DeltaCase& c : forward_cases()) {
    const auto start = std::chrono::steady_clock::now();
    const HostInputs in = make_inputs(c);
    const ForwardResult r = emulate_forward(c, in);
    const double emulated = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto rep = check_stages(c, in, r);
    EXPECT_TRUE(all_agree(rep)) << stage_failures(c, rep);
    std::cout << describe(c) << " (emulated in " << emulated << " s)\n  max err/bound: " << worst_per_stage(rep) << "\n";
  }
}

// The design page's accuracy inputs (normalized keys, sigmoid β, gates near 1) at a reduced shape: the
// stage checks again, on values that are not small integers.
TEST(DeltaRuleForwardCpuEmulation, StagesMatchTheOracleOnDesignInputs) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.dtype = gated ? DType::f16 : DType::bf16, c.length = 100, c.chunk = 64, c.key_dim = 64, c.value_dim = 64;
    c.seed = 42;  // design_inputs draws no S_0
    const HostInputs in = design_inputs(c);
    const auto rep = check_stages(c, in, emulate_forward(c, in));
    EXPECT_TRUE(all_agree(rep)) << stage_failures(c, rep);
    std::cout << describe(c) << "\n  max err/bound: " << worst_per_stage(rep) << "\n";
  }
}

// The same bits whatever order the threads (and blocks) run in between barriers: no result depends
// on a race, cp.async copies and their waits included.
TEST(DeltaRuleForwardCpuEmulation, ResultsDoNotDependOnThreadOrder) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  const std::vector<DeltaCase> cases = forward_cases();
  for (const DeltaCase& c : {cases[3], cases[6]}) {
    const HostInputs in = make_inputs(c);
    const ForwardResult ascending = emulate_forward(c, in, ThreadOrder::ascending);
    const ForwardResult descending = emulate_forward(c, in, ThreadOrder::descending);
    const ForwardResult shuffled = emulate_forward(c, in, ThreadOrder::shuffled);
    for (const ForwardResult* other : {&descending, &shuffled}) {
      EXPECT_TRUE(ascending.output.data == other->output.data) << describe(c);
      EXPECT_TRUE(ascending.final_state.data == other->final_state.data) << describe(c);
      EXPECT_TRUE(ascending.w.data == other->w.data && ascending.u.data == other->u.data) << describe(c);
      EXPECT_TRUE(ascending.v_new.data == other->v_new.data && ascending.boundary.data == other->boundary.data) << describe(c);
    }
  }
}

// Bugs planted in the kernels' tensor-core calls: the stage checks (or the emulation itself) must
// reject each. The case: gated bf16, two chunks and a partial one, S_0, DK = 32, DV = 24.
TEST(DeltaRuleForwardCpuEmulation, PlantedBugsAreCaught) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  DeltaCase c;
  c.gated = true, c.length = 2 * 32 + 3, c.chunk = 32, c.key_dim = 32, c.value_dim = 24, c.with_initial_state = true;
  c.heads = 2, c.seed = 808;
  const HostInputs in = make_inputs(c);
  ASSERT_TRUE(all_agree(check_stages(c, in, emulate_forward(c, in))));
  for (auto [plant, name] : {std::pair{Plant::ldmatrix_row, "one wrong ldmatrix row address"},
                             {Plant::transposed_fragment, "a B fragment loaded untransposed"},
                             {Plant::state_lo_dropped, "S fed as one bf16 rounding (its lo part dropped)"}}) {
    const auto rep = check_stages(c, in, emulate_forward(c, in, ThreadOrder::shuffled, plant));
    EXPECT_FALSE(all_agree(rep)) << name << " passed the stage checks";
    std::cout << name << ": max err/bound " << worst_per_stage(rep) << "\n";
  }
  // The copies never land: the scan reads NaN poison, and the emulation refuses the block anyway.
  try {
    emulate_forward(c, in, ThreadOrder::shuffled, Plant::copy_wait_missing);
    ADD_FAILURE() << "a missing cp.async wait went unnoticed";
  } catch (const std::runtime_error& e) {
    std::cout << "a missing cp.async wait: " << e.what() << "\n";
  }
}

}  // namespace
}  // namespace deltaproof::emulation_suite
