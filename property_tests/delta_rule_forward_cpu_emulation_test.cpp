// The DeltaNet / Gated DeltaNet forward kernels' own source (cuda/delta_rule_forward_kernels.cuh:
// wy_prepare_async_kernel, then the register scan chunk_scan_registers_kernel) executed on the CPU
// emulation of CUDA blocks (support/cuda_emulation.hpp: ldmatrix, mma.sync, cp.async and WMMA as
// the PTX ISA defines them), every intermediate read back and judged by the GPU suite's stage checks
// (kernel_checks/delta_rule_stages.hpp, as property_tests/delta_rule_gpu_test.cpp). NOT a GPU result; it
// is what a tensor-core kernel must pass before GPU time is spent on it. mma.sync here sums exactly
// and truncates once to fp32, the truncating end of the bounds' u_acc; expf is glibc's.
//
// The forward over segments (cuda/delta_rule_segments.cuh: the runs' summaries, the states entering them, the runs
// from there) runs here too, through the launcher's own run_segments, and is held run by run to these one walks
// (kernel_checks/delta_rule_segments.hpp).
//
// Planted bugs: a few tensor-core helpers the kernels call are routed through test wrappers (macros
// defined only here, before the kernel source is included), which are the helpers themselves
// unless a test plants a bug in them for the length of one run.
#include "property_tests/support/cuda_emulation.hpp"
#include "property_tests/support/emulation_suite.hpp"

#include "cuda/delta_rule_launch.h"
#include "cuda/tensor_core.cuh"
#include "cuda/arguments.hpp"
#include "cuda/segments.hpp"
#include "kernel_checks/delta_rule_segments.hpp"
#include "kernel_checks/delta_rule_stages.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>
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
#include "cuda/delta_rule_segments.cuh"
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

// ---------------------------------------------------------------------------------------
// Over segments.

struct SegmentPlant {
  bool reversed_order = false;      // the summaries composed last to first
  bool ungated_transition = false;  // a transition without the gates' product (Gated DeltaNet)
};
struct ReversedOrder {
  static constexpr bool reversed = true;
};

// run_segments' launches on the emulated machine.
template <class T, int C>
struct EmulatedSegmentLaunches {
  SegmentPlant plant;
  ThreadOrder order;
  std::uint64_t seed;
  // delta_rule.cu's resolve for the register scan: W, U, then the scores, from the workspace.
  cuda::delta_rule::ForwardStageParams resolve(const cuda::delta_rule::ForwardStageParams& p) const {
    const std::size_t heads = std::size_t(p.batch) * p.heads, N = cuda::chunk_count(p.length, C);
    cuda::WorkspaceCarver carver(p.workspace);
    cuda::delta_rule::ForwardStageParams r = p;
    r.w = carver.take(nullptr, heads * p.length * p.key_dim * sizeof(T));
    r.u = carver.take(nullptr, heads * p.length * p.value_dim * sizeof(T));
    r.scores = carver.take(nullptr, heads * N * C * C * sizeof(T));
    return r;
  }
  void prepare(const cuda::delta_rule::ForwardStageParams& p) const {
    const auto kernel = fk::for_gates(p.log_gate, fk::wy_prepare_async_kernel<T, C, true>, fk::wy_prepare_async_kernel<T, C, false>);
    emulation::launch({dim3(cuda::chunk_count(p.length, C), unsigned(p.batch * p.heads)), dim3(fk::wy_prepare_async_threads(C)),
                       fk::wy_prepare_async_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes, order, seed},
                      kernel, p);
  }
  void scan(cuda::delta_rule::ForwardStageParams p, fk::Summary summary) const {
    using fk::Summary;
    const emulation::Launch config{dim3(unsigned((p.value_dim + fk::kTcSlice - 1) / fk::kTcSlice), unsigned(p.batch * p.heads)),
                                   dim3(fk::kTcScanThreads), fk::tc_scan_layout(C).bytes, order, seed};
    if (summary == Summary::transition && plant.ungated_transition) p.log_gate = nullptr;
    const auto run = [&](auto kernels) { emulation::launch(config, fk::for_gates(p.log_gate, kernels.first, kernels.second), p, fk::StatePassOutputs{}); };
    using Kernel = void (*)(cuda::delta_rule::ForwardStageParams, fk::StatePassOutputs);
    if (summary == Summary::state)
      run(std::pair<Kernel, Kernel>{fk::chunk_scan_registers_kernel<T, C, true, false, Summary::state>,
                                    fk::chunk_scan_registers_kernel<T, C, false, false, Summary::state>});
    else if (summary == Summary::transition)
      run(std::pair<Kernel, Kernel>{fk::chunk_scan_registers_kernel<T, C, true, false, Summary::transition>,
                                    fk::chunk_scan_registers_kernel<T, C, false, false, Summary::transition>});
    else
      run(std::pair<Kernel, Kernel>{fk::chunk_scan_registers_kernel<T, C, true>, fk::chunk_scan_registers_kernel<T, C, false>});
  }
  void segment_scan(const fk::SegmentScan& s) const {
    const emulation::Launch config{dim3(unsigned((s.value_dim + fk::kSegmentScanRows - 1) / fk::kSegmentScanRows), unsigned(s.heads)),
                                   dim3(fk::kSegmentScanThreads), fk::segment_scan_shared_bytes(s.key_dim), order, seed};
    if (plant.reversed_order) emulation::launch(config, fk::segment_scan_kernel<ReversedOrder>, s);
    else emulation::launch(config, fk::segment_scan_kernel<>, s);
  }
  void copy_state(const fk::StateCopy& s) const {
    const unsigned entries = unsigned(s.heads * s.rows * s.cols);
    emulation::launch({dim3((entries + fk::kStateCopyThreads - 1) / fk::kStateCopyThreads), dim3(fk::kStateCopyThreads), 0, order, seed},
                      fk::copy_state_kernel, s);
  }
};

// The forward over `segments` runs on the emulated machine, as testing::forward runs it (its segment_* given).
SegmentedResult emulate_segments(const DeltaCase& c, const HostInputs& in, int segments, SegmentPlant plant = {},
                                 ThreadOrder order = ThreadOrder::shuffled) {
  const DType d = c.dtype;
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim, C = c.chunk;
  const cuda::SegmentLayout layout = cuda::segment_layout(int(L), cuda::choose_segments(segments, int(B * H), int(L), int(C), 1, 1));
  if (layout.folded < 1) throw std::invalid_argument("emulate_segments: " + describe(c) + " is one run");
  const Index n = layout.folded;
  Tensor q = write("q", in.q, d), k = write("k", in.k, d), v = write("v", in.v, d), beta = write("beta", in.beta, d);
  Tensor log_gate, initial_state;
  if (c.gated) log_gate = write("log_gate", in.log_gate, DType::f32);
  if (c.with_initial_state) initial_state = write("initial_state", in.initial_state, DType::f32);
  Tensor output("output", d, B, H, L, DV), final_state("final_state", DType::f32, B, H, DV, DK);
  Tensor states("segment_states", DType::f32, B, n * H, DV, DK), transitions("segment_transitions", DType::f32, B, n * H, DK, DK);
  Tensor incoming("segment_incoming", DType::f32, B, (n + 1) * H, DV, DK);
  // The W, U and scores of the runs walked together (the last run alone needs no more); their final states.
  const std::size_t heads = std::size_t(fk::runs_walked_together(layout) * H), chunks = std::size_t(cuda::chunk_count(layout.length, int(C))), es = cuda::size_of(d);
  const std::size_t bytes = heads * layout.length * (DK + DV) * es + heads * chunks * C * C * es + 3 * cuda::workspace_alignment;
  Tensor workspace("workspace", DType::f32, 1, 1, 1, Index((bytes + 3) / 4));
  Tensor finals("run_final_states", DType::f32, 1, (n + 1) * H, DV, DK);

  cuda::delta_rule::ForwardStageParams p;
  p.dtype = d, p.batch = int(B), p.heads = int(H), p.length = int(L), p.key_dim = int(DK), p.value_dim = int(DV), p.chunk_size = int(C);
  p.segments = segments;
  cuda::delta_rule::set_contiguous_strides(p);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.beta = beta.data();
  p.log_gate = static_cast<const float*>(log_gate.data()), p.initial_state = static_cast<const float*>(initial_state.data());
  p.output = output.data(), p.final_state = static_cast<float*>(final_state.data());
  p.segment_states = static_cast<float*>(states.data()), p.segment_transitions = static_cast<float*>(transitions.data());
  p.segment_incoming = static_cast<float*>(incoming.data());
  auto by_chunk = [&](auto type_tag) {
    using T = decltype(type_tag);
    const auto run = [&](auto chunk) {
      EmulatedSegmentLaunches<T, decltype(chunk)::value> launches{plant, order, c.seed};
      fk::run_segments(p, layout, workspace.data(), static_cast<float*>(finals.data()), launches);
    };
    switch (C) {
      case 16: return run(std::integral_constant<int, 16>{});
      case 32: return run(std::integral_constant<int, 32>{});
      default: return run(std::integral_constant<int, 64>{});
    }
  };
  if (d == DType::bf16) by_chunk(__nv_bfloat16{});
  else by_chunk(__half{});
  for (const Tensor* input : {&q, &k, &v, &beta, &log_gate, &initial_state}) input->buffer.check_guards();
  workspace.buffer.check_guards();
  return {read(output), read(final_state), read(states), read(transitions), read(incoming)};
}

ForwardResult emulated_one_walk(const DeltaCase& c, const HostInputs& in) { return emulate_forward(c, in); }

struct SegmentCase {
  DeltaCase c;
  int segments;
};

// R ∈ {2, 3, 8, 13}; runs that are not whole chunks; R = 13 at L = 20 (ceil(20/13) = 2 tokens a run: ten runs, the
// last three requested ones empty); runs of one length, walked in one launch (L = 8·16 with R = 8; L = 63 with R = 3,
// runs of 21 tokens at C = 32); two sequences; both dtypes, gates and S_0 each way; one and two value slices.
std::vector<SegmentCase> segment_cases() {
  const struct {
    Index batch, length, chunk, dk, dv;
    int segments;
  } shapes[] = {{1, 3 * 16 + 5, 16, 16, 24, 2}, {2, 2 * 32 + 7, 32, 32, 8, 3}, {1, 20, 16, 8, 16, 13},
                {1, 8 * 16 + 3, 16, 24, 72, 8}, {2, 64 + 9, 64, 16, 16, 3}, {1, 100, 16, 8, 8, 13},
                {2, 8 * 16, 16, 16, 8, 8}, {1, 3 * 21, 32, 8, 24, 3}};
  std::vector<SegmentCase> cases;
  int i = 0;
  for (const auto& s : shapes) {
    DeltaCase c;
    c.batch = s.batch, c.heads = 2, c.length = s.length, c.chunk = s.chunk, c.key_dim = s.dk, c.value_dim = s.dv;
    c.dtype = i % 2 ? DType::f16 : DType::bf16, c.gated = i % 3 != 1, c.with_initial_state = i % 2 == 0, c.seed = 900 + i;
    cases.push_back({c, s.segments});
    ++i;
  }
  return cases;
}

// Run by run, the segmented forward is the one walk: its summaries, incoming states, outputs and final state as
// kernel_checks/delta_rule_segments.hpp states, every one walk within its stage bounds.
TEST(DeltaRuleForwardCpuEmulation, SegmentsAreTheOneWalkRunByRun) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const auto& [c, segments] : segment_cases()) {
    const HostInputs in = make_inputs(c);
    const auto rep = check_segments(c, in, segments, emulate_segments(c, in, segments), emulated_one_walk);
    EXPECT_TRUE(all_agree(rep)) << "segments=" << segments << " " << stage_failures(c, rep);
    std::cout << describe(c) << " segments=" << segments << "\n  max err/bound: " << worst_per_stage(rep) << "\n";
  }
}

// The runs the launcher walks (cuda/segments.hpp), for every L ≤ 300, requested R ≤ 20 and C: they cover the sequence
// exactly, none empty, at most R of them. The automatic choice at long L (slots for 2..300 runs): where
// even_segments changes it, the new count divides L's chunks, keeps at least half the runs, and every run then has
// one length (walked in one launch).
TEST(DeltaRuleForwardCpuEmulation, SegmentLayoutsCoverTheSequence) {
  for (int chunk : {16, 32, 64}) {
    for (int L = 1; L <= 300; ++L)
      for (int R = 1; R <= 20; ++R) {
        const cuda::SegmentLayout s = cuda::segment_layout(L, cuda::choose_segments(R, 1, L, chunk, 1, 1));
        ASSERT_TRUE(s.folded >= 0 && s.tail >= 1 && s.tail <= s.length && s.folded + 1 <= R) << L << " " << R;
        ASSERT_EQ(std::int64_t(s.folded) * s.length + s.tail, L) << L << " " << R;
      }
    int changed = 0;
    for (int L : {1 << 16, 1 << 18, 1 << 20, 3 * (1 << 16), 100000, (1 << 20) + 37})
      for (int slots = 2; slots <= 300; ++slots) {
        const cuda::Segmentation chosen = cuda::choose_segments(0, 1, L, chunk, 1, slots);
        const cuda::Segmentation even = cuda::even_segments(chosen, L, chunk);
        const cuda::SegmentLayout s = cuda::segment_layout(L, even);
        ASSERT_EQ(std::int64_t(s.folded) * s.length + s.tail, L);
        if (even.segments == chosen.segments) continue;
        ++changed;
        ASSERT_TRUE(L % chunk == 0 && (L / chunk) % even.segments == 0 && 2 * even.segments >= chosen.segments) << L << " " << slots;
        ASSERT_EQ(s.tail, s.length) << L << " " << slots;
        ASSERT_EQ(s.folded + 1, even.segments);
      }
    EXPECT_GT(changed, 0) << "even_segments never changed a choice";
  }
}

// Planted in the segmented forward: the summaries composed in the wrong order, a transition missing the gates'
// product. Each is caught, by the row that names it.
TEST(DeltaRuleForwardCpuEmulation, SegmentPlantedBugsAreCaught) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  DeltaCase c;
  c.gated = true, c.length = 3 * 16 + 5, c.chunk = 16, c.key_dim = 16, c.value_dim = 8, c.with_initial_state = true;
  c.heads = 2, c.seed = 811;
  const HostInputs in = make_inputs(c);
  ASSERT_TRUE(all_agree(check_segments(c, in, 4, emulate_segments(c, in, 4), emulated_one_walk)));
  for (auto [plant, name, row] : {std::tuple{SegmentPlant{true, false}, "summaries composed last to first", "S_in"},
                                  std::tuple{SegmentPlant{false, true}, "a transition without the gates", "P"}}) {
    const auto rep = check_segments(c, in, 4, emulate_segments(c, in, 4, plant), emulated_one_walk);
    bool caught = false;
    for (const Comparison& r : rep) caught = caught || (r.tensor == row && !r.agrees());
    EXPECT_TRUE(caught) << name << " passed the " << row << " check";
    std::cout << name << ": max err/bound " << worst_per_stage(rep) << "\n";
  }
}

}  // namespace
}  // namespace deltaproof::emulation_suite
