// The asynchronous WY prepare (cuda/delta_rule_prepare_kernels.cuh: wy_prepare_async_kernel) on the CPU emulation of
// CUDA blocks (support/cuda_emulation.hpp), for what delta_rule_forward_cpu_emulation_test.cpp (16-bit inputs,
// head dims multiples of 8, the register scan) does not reach: fp32 inputs, odd and wide head dims (plain loads
// instead of cp.async), every C, each followed by the fallback scan (chunk_scan_shared_kernel) and judged by the
// GPU suite's stage checks (it gave the synchronous prepare's bits on these cases, the same arithmetic
// rearranged, until that kernel left the tree at c5339b7); and bugs planted in its own arithmetic as compile-time policies, each caught by the T rows.
// NOT a GPU result (see the emulation's header for what it cannot show).
#include "property_tests/support/cuda_emulation.hpp"
#include "property_tests/support/emulation_suite.hpp"

#include "cuda/delta_rule.h"
#include "kernel_checks/delta_rule_stages.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace deltaproof::cuda::forward_kernels_emulated {
using std::min;
DELTAPROOF_EMULATION_SHARED_MEMORY(smem);  // the kernels' extern __shared__
}  // namespace deltaproof::cuda::forward_kernels_emulated

// The kernels' source, compiled here under its own namespace (never the nvcc build's launch stubs).
#define DELTAPROOF_FORWARD_KERNELS forward_kernels_emulated
#include "cuda/delta_rule_forward_kernels.cuh"

namespace deltaproof::emulation_suite {
namespace {

using namespace deltaproof::verify;
using namespace deltaproof::verify::delta_rule;
namespace fk = deltaproof::cuda::forward_kernels_emulated;

// Planted bugs (the kernel's own hooks, FaithfulPrepare's mutants).
struct SubstitutionReadsTheNextRow : fk::FaithfulPrepare {  // row 9 of each diagonal block uses row 10's coefficients
  static constexpr int substitution_row(int i) { return i == 9 ? 10 : i; }
};
struct MergeDropsItsDiagonalTerm : fk::FaithfulPrepare {  // T21 = −T22 X without T22_ii X_ij
  static constexpr bool keeps_merge_term(int row, int m) { return m != row; }
};

struct Emulated {
  Tensor q, k, v, beta, log_gate, initial_state;
  Tensor output, final_state, w, u, w_lo, u_lo, v_new, a, t, boundary;
};

template <class T, int C, class Policy>
void run_prepare(const cuda::delta_rule::ForwardStageParams& p, ThreadOrder order, std::uint64_t seed) {
  const dim3 grid(cuda::chunk_count(p.length, C), p.batch * p.heads);
  emulation::launch({grid, dim3(fk::wy_prepare_async_threads(C)), fk::wy_prepare_async_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes,
                     order, seed},
                    fk::for_gates(p.log_gate, fk::wy_prepare_async_kernel<T, C, true, Policy>,
                                  fk::wy_prepare_async_kernel<T, C, false, Policy>),
                    p);
}

// The fallback scan with 16 value rows per block (it fits every head dim up to 256).
template <class T, int C>
void run_fallback_scan(const cuda::delta_rule::ForwardStageParams& p, std::uint64_t seed) {
  emulation::launch({dim3((p.value_dim + 15) / 16, p.batch * p.heads), dim3(fk::kScanThreads), fk::scan_layout(sizeof(T), C, 16, p.key_dim).bytes,
                     ThreadOrder::shuffled, seed},
                    fk::chunk_scan_shared_kernel<T, C, 16>, p);
}

struct PrepareRun {
  ForwardResult result;
  ref::Tensor4<ref::Exact> w_lo, u_lo;  // 16-bit inputs only
};

// [B, H, L, D] values laid out token-major, [B, L, H, D] (fla's layout), and the strides that view them as
// [B, H, L, D] again.
ref::Tensor4<ref::Exact> token_major(const ref::Tensor4<ref::Exact>& t) {
  ref::Tensor4<ref::Exact> out(t.batch, t.rows, t.heads, t.cols);
  for (Index b = 0; b < t.batch; ++b)
    for (Index h = 0; h < t.heads; ++h)
      for (Index i = 0; i < t.rows; ++i)
        for (Index j = 0; j < t.cols; ++j)
          out.data[size_t(((b * t.rows + i) * t.heads + h) * t.cols + j)] = t.data[size_t(((b * t.heads + h) * t.rows + i) * t.cols + j)];
  return out;
}
cuda::Strides token_major_strides(Index heads, Index length, Index cols) { return {length * heads * cols, cols, heads * cols}; }

enum class Layout { packed, token_major };

// The prepare (under Policy) and, when `scan`, the fallback scan; every written tensor read back.
// token_major: k, v, β and g as fla lays them out (the kernels follow the strides; q and the scan stay packed).
template <class Policy = fk::FaithfulPrepare>
PrepareRun emulate(const DeltaCase& c, const HostInputs& in, bool scan = true,
                   ThreadOrder order = ThreadOrder::shuffled, Layout layout = Layout::packed) {
  const DType d = c.dtype;
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim, C = c.chunk;
  const Index N = cuda::chunk_count(int(L), int(C));
  const bool split = d != DType::f32;
  Emulated m;
  const bool strided = layout == Layout::token_major;
  auto laid_out = [&](const ref::Tensor4<ref::Exact>& t) { return strided ? token_major(t) : t; };
  m.q = write("q", in.q, d), m.k = write("k", laid_out(in.k), d), m.v = write("v", laid_out(in.v), d);
  m.beta = write("beta", laid_out(in.beta), d);
  if (c.gated) m.log_gate = write("log_gate", laid_out(in.log_gate), DType::f32);
  if (c.with_initial_state) m.initial_state = write("initial_state", in.initial_state, DType::f32);
  m.w = Tensor("w", d, B, H, L, DK), m.u = Tensor("u", d, B, H, L, DV);
  if (split) m.w_lo = Tensor("w_lo", d, B, H, L, DK), m.u_lo = Tensor("u_lo", d, B, H, L, DV);
  m.a = Tensor("wy_system", DType::f32, B, H, N * C, C), m.t = Tensor("wy_inverse", DType::f32, B, H, N * C, C);
  if (scan) {
    m.output = Tensor("output", d, B, H, L, DV), m.final_state = Tensor("final_state", DType::f32, B, H, DV, DK);
    m.v_new = Tensor("v_new", DType::f32, B, H, L, DV), m.boundary = Tensor("boundary_states", DType::f32, B, H, N * DV, DK);
  }
  cuda::delta_rule::ForwardStageParams p;
  p.dtype = d, p.batch = int(B), p.heads = int(H), p.length = int(L), p.key_dim = int(DK), p.value_dim = int(DV), p.chunk_size = int(C);
  cuda::delta_rule::set_contiguous_strides(p);
  if (strided) {
    p.k_strides = token_major_strides(H, L, DK), p.v_strides = token_major_strides(H, L, DV);
    p.beta_strides = p.log_gate_strides = token_major_strides(H, L, 1);
  }
  p.q = m.q.data(), p.k = m.k.data(), p.v = m.v.data(), p.beta = m.beta.data();
  p.log_gate = static_cast<const float*>(m.log_gate.data()), p.initial_state = static_cast<const float*>(m.initial_state.data());
  p.w = m.w.data(), p.u = m.u.data(), p.w_lo = m.w_lo.data(), p.u_lo = m.u_lo.data();
  p.wy_system = static_cast<float*>(m.a.data()), p.wy_inverse = static_cast<float*>(m.t.data());
  p.output = m.output.data(), p.final_state = static_cast<float*>(m.final_state.data());
  p.v_new = static_cast<float*>(m.v_new.data()), p.boundary_states = static_cast<float*>(m.boundary.data());
  auto by_chunk = [&](auto type_tag) {
    using T = decltype(type_tag);
    auto go = [&](auto chunk_tag) {
      constexpr int kC = decltype(chunk_tag)::value;
      run_prepare<T, kC, Policy>(p, order, c.seed);
      if (scan) run_fallback_scan<T, kC>(p, c.seed + 1);
    };
    switch (C) {
      case 16: return go(std::integral_constant<int, 16>{});
      case 32: return go(std::integral_constant<int, 32>{});
      default: return go(std::integral_constant<int, 64>{});
    }
  };
  if (d == DType::f32) by_chunk(float{});
  else if (d == DType::bf16) by_chunk(__nv_bfloat16{});
  else by_chunk(__half{});
  for (const Tensor* input : {&m.q, &m.k, &m.v, &m.beta, &m.log_gate, &m.initial_state}) input->buffer.check_guards();
  PrepareRun r;
  r.result.w = read(m.w), r.result.u = read(m.u), r.result.a = read(m.a), r.result.t = read(m.t);
  r.w_lo = read(m.w_lo), r.u_lo = read(m.u_lo);
  if (scan) {
    r.result.output = read(m.output), r.result.final_state = read(m.final_state);
    r.result.v_new = read(m.v_new), r.result.boundary = read(m.boundary);
  }
  return r;
}

// Inputs the register-scan emulation test does not take: fp32 (cp.async of 4 floats, and plain loads at odd
// dims), head dims 1, 15, 60, 100 (plain loads), 256 (the widest), 128 and 120 (16-bit rows padded to 128: the
// shared row copy, whole rows and rows zero past the width), and a few of each C and gate regime.
std::vector<DeltaCase> prepare_cases() {
  const struct {
    DType dtype;
    Index chunk, length, dk, dv;
    bool gated, s0;
  } rows[] = {{DType::f32, 16, 17, 15, 1, true, true},     {DType::f32, 64, 70, 24, 40, false, false},
              {DType::bf16, 32, 40, 60, 100, true, false}, {DType::f16, 64, 65, 100, 15, false, true},
              {DType::bf16, 64, 64, 256, 24, true, true},  {DType::f16, 16, 33, 1, 256, true, false},
              {DType::f32, 32, 31, 256, 8, true, false},   {DType::bf16, 64, 100, 128, 128, true, true},
              {DType::f16, 32, 45, 120, 128, false, false}};
  std::vector<DeltaCase> cases;
  std::uint64_t seed = 700;
  for (const auto& row : rows) {
    DeltaCase c;
    c.dtype = row.dtype, c.chunk = row.chunk, c.length = row.length, c.key_dim = row.dk, c.value_dim = row.dv;
    c.gated = row.gated, c.with_initial_state = row.s0, c.heads = 2, c.seed = seed++;
    cases.push_back(c);
  }
  return cases;
}

std::string worst_per_stage(const std::vector<Comparison>& rows) {
  std::string text;
  for (const Comparison& row : worst_per_tensor(rows)) text += row.tensor + " " + number_text(row.ratio) + " ";
  return text;
}

// Every stage of every case within the GPU suite's bound.
TEST(DeltaRulePrepareCpuEmulation, StagesMatchTheOracleOnEveryInput) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const DeltaCase& c : prepare_cases()) {
    const HostInputs in = make_inputs(c);
    const auto rep = check_stages(c, in, emulate(c, in).result);
    EXPECT_TRUE(all_agree(rep)) << describe(c) << "\n" << describe_failures(rep);
    std::cout << describe(c) << "\n  max err/bound: " << worst_per_stage(rep) << "\n";
  }
}

// The same bits whatever order the threads run in between barriers, on the paths the register-scan test does
// not take (fp32 cp.async, plain loads at odd dims, 256-wide rows).
TEST(DeltaRulePrepareCpuEmulation, ResultsDoNotDependOnThreadOrder) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  const std::vector<DeltaCase> cases = prepare_cases();
  for (const DeltaCase& c : {cases[1], cases[3], cases[5]}) {
    const HostInputs in = make_inputs(c);
    const PrepareRun ascending = emulate(c, in, false, ThreadOrder::ascending);
    for (ThreadOrder order : {ThreadOrder::descending, ThreadOrder::shuffled}) {
      const PrepareRun other = emulate(c, in, false, order);
      EXPECT_TRUE(ascending.result.a.data == other.result.a.data && ascending.result.t.data == other.result.t.data) << describe(c);
      EXPECT_TRUE(ascending.result.w.data == other.result.w.data && ascending.result.u.data == other.result.u.data) << describe(c);
      EXPECT_TRUE(ascending.w_lo.data == other.w_lo.data && ascending.u_lo.data == other.u_lo.data) << describe(c);
    }
  }
}

// Token-major inputs (fla's [B, T, H, D] viewed through strides): the same bits as packed ones, on cp.async rows
// (row stride H·D) and plain loads (odd D) alike.
TEST(DeltaRulePrepareCpuEmulation, StridedInputsGiveTheSameBits) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  const std::vector<DeltaCase> cases = prepare_cases();
  for (DeltaCase c : {cases[1], cases[2], cases[4]}) {
    c.batch = 2, c.heads = 3;
    const HostInputs in = make_inputs(c);
    const PrepareRun packed = emulate(c, in, false);
    const PrepareRun strided = emulate(c, in, false, ThreadOrder::shuffled, Layout::token_major);
    EXPECT_TRUE(packed.result.a.data == strided.result.a.data && packed.result.t.data == strided.result.t.data) << describe(c);
    EXPECT_TRUE(packed.result.w.data == strided.result.w.data && packed.result.u.data == strided.result.u.data) << describe(c);
    EXPECT_TRUE(packed.w_lo.data == strided.w_lo.data && packed.u_lo.data == strided.u_lo.data) << describe(c);
  }
}

// Bugs planted in the prepare's inverse: the T rows (and the per-block rows T16, T32, T64) must reject each.
TEST(DeltaRulePrepareCpuEmulation, PlantedBugsInTheInverseAreCaught) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  DeltaCase c;
  c.gated = true, c.length = 64 + 37, c.chunk = 64, c.key_dim = 32, c.value_dim = 24, c.with_initial_state = true;
  c.heads = 2, c.seed = 909;
  const HostInputs in = make_inputs(c);
  ASSERT_TRUE(all_agree(check_stages(c, in, emulate(c, in).result)));
  auto expect_caught = [&](const std::string& name, const std::vector<Comparison>& rep) {
    EXPECT_FALSE(all_agree(rep)) << name << " passed the stage checks";
    std::string rows;
    for (const Comparison& row : worst_per_tensor(rep))
      if (!row.agrees()) rows += row.tensor + " " + number_text(row.ratio) + " ";
    std::cout << name << ": rejected by " << rows << "\n";
  };
  expect_caught("the substitution reading the next row of A", check_stages(c, in, emulate<SubstitutionReadsTheNextRow>(c, in).result));
  expect_caught("a merge dropping its diagonal term", check_stages(c, in, emulate<MergeDropsItsDiagonalTerm>(c, in).result));
}

}  // namespace
}  // namespace deltaproof::emulation_suite
