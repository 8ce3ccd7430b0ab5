// The backward kernels' own source (cuda/delta_rule_backward_kernels.cuh) executed on the CPU, and
// judged by the same stage checks as the GPU runs (kernel_checks/delta_rule_backward_stages.hpp).
//
// NOT a GPU result: the blocks run on the emulated machine of support/cuda_emulation.hpp (its header
// says what it checks and what it cannot). What this proves: the kernels' indices, loop bounds,
// barrier placement and shuffle participation; that they stay inside their shared memory and their
// buffers and write every output entry; that their arithmetic is within the derived stage bounds;
// and — by running each block's threads in ascending, descending and shuffled orders and requiring
// the same bits — that no result depends on the order in which threads run between barriers.
// compute-sanitizer on the H200 remains the word on memory and races.
#include "property_tests/support/cuda_emulation.hpp"
#include "property_tests/support/emulation_suite.hpp"

#include "cuda/delta_rule.h"
#include "property_tests/support/delta_rule_backward_gradients.hpp"
#include "property_tests/support/gpu.hpp"
#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

// The kernels' source, compiled here under its own namespace (never the nvcc build's launch stubs).
#define DELTAPROOF_BACKWARD_KERNELS backward_kernels_emulated
namespace deltaproof::cuda::backward_kernels_emulated {
using std::min;
DELTAPROOF_EMULATION_SHARED_MEMORY(smem);  // the kernels' extern __shared__
}  // namespace deltaproof::cuda::backward_kernels_emulated

#include "cuda/delta_rule_backward_kernels.cuh"

namespace deltaproof::emulation_suite {
namespace {

using namespace deltaproof::verify;
using namespace deltaproof::verify::delta_rule;
namespace bk = deltaproof::cuda::backward_kernels_emulated;

struct EmulatedBuffers {
  Tensor q, k, v, beta, log_gate, initial_state, d_output, d_final_state;
  Tensor dq, dk, dv, d_beta, d_log_gate, d_initial_state;
  Tensor gate_sums, a, t, scores, w, u, boundary, v_new, d_v_new, state_gradients, d_w, e, d_gate_sums, output, final_state;
};

template <class T, int C>
void run_stages(const cuda::delta_rule::BackwardStageParams& p, const bk::Buffers& b, ThreadOrder order, std::uint64_t seed) {
  for (bk::Stage stage : {bk::Stage::prepare, bk::Stage::state_scan, bk::Stage::gradient_scan, bk::Stage::chunk_gradients}) {
    const bk::LaunchShape shape = bk::launch_shape<T, C>(stage, p);
    emulation::launch({shape.grid, dim3(bk::kThreads), shape.shared_bytes, order, seed++}, shape.kernel, p, b);
  }
}

// The whole backward (and its forward recompute) on the emulated machine, every intermediate kept.
BackwardResult emulate_backward(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                ThreadOrder order = ThreadOrder::ascending, std::uint64_t seed = 1) {
  const DType d = c.dtype, acc = accumulator_dtype(d);
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim, C = c.chunk;
  const Index N = cuda::chunk_count(int(L), int(C));
  EmulatedBuffers m;
  m.q = write("q", in.q, d), m.k = write("k", in.k, d), m.v = write("v", in.v, d), m.beta = write("beta", in.beta, d);
  m.log_gate = write("log_gate", in.log_gate, acc), m.d_output = write("d_output", cot.d_output, d);
  if (c.with_initial_state) m.initial_state = write("initial_state", in.initial_state, acc);
  if (cot.d_final_state) m.d_final_state = write("d_final_state", *cot.d_final_state, acc);
  m.dq = Tensor("dq", d, B, H, L, DK), m.dk = Tensor("dk", d, B, H, L, DK), m.dv = Tensor("dv", d, B, H, L, DV);
  m.d_beta = Tensor("d_beta", d, B, H, L, 1), m.d_initial_state = Tensor("d_initial_state", acc, B, H, DV, DK);
  if (c.gated) m.d_log_gate = Tensor("d_log_gate", acc, B, H, L, 1);
  m.gate_sums = Tensor("gate_sums", acc, B, H, L, 1), m.d_gate_sums = Tensor("gate_sum_gradients", acc, B, H, L, 1);
  m.a = Tensor("wy_system", acc, B, H, N * C, C), m.t = Tensor("wy_inverse", acc, B, H, N * C, C);
  m.scores = Tensor("scores", acc, B, H, N * C, C), m.e = Tensor("wy_system_adjoint", acc, B, H, N * C, C);
  m.w = Tensor("w", acc, B, H, L, DK), m.d_w = Tensor("d_w", acc, B, H, L, DK), m.u = Tensor("u", acc, B, H, L, DV);
  m.v_new = Tensor("v_new", acc, B, H, L, DV), m.d_v_new = Tensor("d_v_new", acc, B, H, L, DV);
  m.boundary = Tensor("boundary_states", acc, B, H, N * DV, DK), m.state_gradients = Tensor("state_gradients", acc, B, H, N * DV, DK);
  m.output = Tensor("output", d, B, H, L, DV), m.final_state = Tensor("final_state", acc, B, H, DV, DK);

  cuda::delta_rule::BackwardStageParams p;
  p.dtype = d, p.batch = int(B), p.heads = int(H), p.length = int(L), p.key_dim = int(DK), p.value_dim = int(DV), p.chunk_size = int(C);
  cuda::delta_rule::set_contiguous_strides(p);
  p.q = m.q.data(), p.k = m.k.data(), p.v = m.v.data(), p.beta = m.beta.data(), p.d_output = m.d_output.data();
  p.log_gate = c.gated ? m.log_gate.data() : nullptr;
  p.initial_state = m.initial_state.data(), p.d_final_state = m.d_final_state.data();
  p.dq = m.dq.data(), p.dk = m.dk.data(), p.dv = m.dv.data(), p.d_beta = m.d_beta.data();
  p.d_log_gate = m.d_log_gate.data(), p.d_initial_state = m.d_initial_state.data();
  p.wy_system = m.a.data(), p.wy_system_adjoint = m.e.data(), p.gate_sum_gradients = m.d_gate_sums.data();
  p.output = m.output.data(), p.final_state = m.final_state.data();
  const bk::Buffers b{m.gate_sums.data(), m.t.data(), m.w.data(), m.u.data(), m.scores.data(), m.boundary.data(),
                      m.v_new.data(), m.d_v_new.data(), m.state_gradients.data(), m.d_w.data()};
  auto by_chunk = [&](auto type_tag) {
    using T = decltype(type_tag);
    switch (C) {
      case 16: return run_stages<T, 16>(p, b, order, seed);
      case 32: return run_stages<T, 32>(p, b, order, seed);
      default: return run_stages<T, 64>(p, b, order, seed);
    }
  };
  switch (d) {
    case DType::f32: by_chunk(float{}); break;
    case DType::f64: by_chunk(double{}); break;
    case DType::bf16: by_chunk(__nv_bfloat16{}); break;
    default: by_chunk(__half{}); break;
  }
  for (const Tensor* input : {&m.q, &m.k, &m.v, &m.beta, &m.log_gate, &m.initial_state, &m.d_output, &m.d_final_state})
    input->buffer.check_guards();
  BackwardResult r;
  r.dq = read(m.dq), r.dk = read(m.dk), r.dv = read(m.dv), r.d_beta = read(m.d_beta), r.d_log_gate = read(m.d_log_gate);
  r.d_initial_state = read(m.d_initial_state), r.gate_sums = read(m.gate_sums), r.a = read(m.a), r.t = read(m.t);
  r.scores = read(m.scores), r.w = read(m.w), r.u = read(m.u), r.boundary = read(m.boundary), r.v_new = read(m.v_new);
  r.d_v_new = read(m.d_v_new), r.state_gradients = read(m.state_gradients), r.d_w = read(m.d_w), r.e = read(m.e);
  r.d_gate_sums = read(m.d_gate_sums), r.output = read(m.output), r.final_state = read(m.final_state);
  return r;
}

// emulate_backward in ascending thread order, as the shared gradient checks call a backward.
const auto run_emulated = [](const DeltaCase& c, const HostInputs& in, const Cotangents& cot) { return emulate_backward(c, in, cot); };

std::string failures(const DeltaCase& c, const std::vector<Comparison>& rows) { return describe(c) + "\n" + describe_failures(rows); }

std::vector<Tensor4<Exact>*> every_tensor(BackwardResult& r) {
  return {&r.dq, &r.dk, &r.dv, &r.d_beta, &r.d_log_gate, &r.d_initial_state, &r.gate_sums, &r.a, &r.t, &r.scores, &r.w,
          &r.u, &r.boundary, &r.v_new, &r.d_v_new, &r.state_gradients, &r.d_w, &r.e, &r.d_gate_sums, &r.output, &r.final_state};
}

// Cases that reach every code path of the kernels: L < C, L = 1, partial last chunks, several
// chunks, DK and DV of 1, past one lane loop (33, 40), a partial 16-row value slice, S_0 and dS_L
// present and absent, every dtype.
std::vector<DeltaCase> emulation_cases() {
  std::vector<DeltaCase> cases;
  const struct {
    Index L, C, dk, dv;
    bool s0;
    DType d;
  } shapes[] = {{1, 64, 8, 5, true, DType::bf16},  {17, 16, 1, 20, false, DType::f32}, {40, 32, 33, 1, true, DType::f16},
                {70, 64, 12, 40, true, DType::f64}, {35, 16, 9, 17, true, DType::bf16}};
  std::uint64_t seed = 50;
  for (bool gated : {false, true})
    for (const auto& s : shapes) {
      DeltaCase c;
      c.gated = gated, c.length = s.L, c.chunk = s.C, c.key_dim = s.dk, c.value_dim = s.dv, c.with_initial_state = s.s0;
      c.dtype = s.d, c.heads = 2, c.seed = seed++;
      cases.push_back(c);
    }
  return cases;
}

// Every stage of the emulated kernels within its bound (the GPU suite's check), forward recompute
// included; each block's threads in a shuffled order.
TEST(DeltaRuleBackwardCpuEmulation, StagesMatchTheOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const DeltaCase& c : emulation_cases()) {
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c, c.length != 17);
    const BackwardResult r = emulate_backward(c, in, cot, ThreadOrder::shuffled, c.seed);
    const auto rep = check_backward_stages(c, in, cot, r);
    EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
    std::string worst;
    for (const Comparison& row : worst_per_tensor(rep)) worst += row.tensor + " " + number_text(row.ratio) + " ";
    std::cout << describe(c) << "\n  emulated, max err/bound: " << worst << "\n";
  }
}

// The GPU suite's RegimeVeryNegativeGates case, emulated: log-gates down to −128 per token make
// fp32 W and dS_0 entries of 1e-46, below fp32's smallest subnormal. The H200 rounded them to 0 (as
// IEEE fp32 must) and the bounds without η_acc called that OUTSIDE (W err/bound 4.2, dS_0 11.6).
TEST(DeltaRuleBackwardCpuEmulation, VeryNegativeGatesWithinBound) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (DType d : {DType::bf16, DType::f32}) {
    DeltaCase c;
    c.gated = true, c.dtype = d, c.gate_step = 8, c.length = 90, c.chunk = 64, c.key_dim = 16, c.value_dim = 16;
    c.with_initial_state = true, c.seed = 500;
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const auto rep = check_backward_stages(c, in, cot, emulate_backward(c, in, cot));
    EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
  }
}

// The same bits whatever order the threads of a block run in between barriers: no result depends
// on a race.
TEST(DeltaRuleBackwardCpuEmulation, ResultsDoNotDependOnThreadOrder) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const DeltaCase& c : {emulation_cases()[3], emulation_cases()[9]}) {
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    BackwardResult ascending = emulate_backward(c, in, cot, ThreadOrder::ascending);
    for (auto [schedule, seed] : {std::pair{ThreadOrder::descending, 1}, {ThreadOrder::shuffled, 2},
                                  {ThreadOrder::shuffled, 3}}) {
      BackwardResult other = emulate_backward(c, in, cot, schedule, std::uint64_t(seed));
      const auto a = every_tensor(ascending), o = every_tensor(other);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i]->data == o[i]->data) << describe(c) << " tensor #" << i;
    }
  }
}

// g = 0: Gated DeltaNet computes exactly DeltaNet's numbers.
TEST(DeltaRuleBackwardCpuEmulation, ZeroGatesEqualDeltaNetBitwise) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  DeltaCase c;
  c.length = 45, c.chunk = 16, c.key_dim = 10, c.value_dim = 18, c.with_initial_state = true, c.zero_gates = true, c.seed = 77;
  const HostInputs in = make_inputs(c);
  const Cotangents cot = make_cotangents(c);
  BackwardResult plain = emulate_backward(c, in, cot);
  c.gated = true;
  BackwardResult gated = emulate_backward(c, in, cot);
  gated.d_log_gate = {};
  const auto a = every_tensor(plain), o = every_tensor(gated);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i]->data == o[i]->data) << "tensor #" << i;
}

// The case seed 28 of the GPU suite's ChunkSizesAgree drew: DK = 1, |k| = 1, β = 1 make
// I − β k kᵀ = 0, so dS_0 = 0 over ℝ, while the kernels' fp32 terms of size |dO||q| leave a residue at every C.
// The normwise agreement alone (τ times a zero norm) refused it; with the terms' magnitudes the allowance holds
// what accumulation can leave, and still refuses a gradient off by 2⁻¹⁶ of its terms.
TEST(DeltaRuleBackwardCpuEmulation, GradientThatCancelsToZeroAgreesWithinItsTerms) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  DeltaCase c;
  c.gated = true, c.dtype = DType::f16, c.length = 1, c.key_dim = 1, c.value_dim = 32, c.seed = 0;
  HostInputs in = make_inputs(c);
  in.k.data.assign(in.k.data.size(), Exact(1)), in.beta.data.assign(in.beta.data.size(), Exact(1));
  const Cotangents cot = make_cotangents(c);
  const DoubleGradients oracle = double_gradients(c, in, cot);
  ASSERT_TRUE(oracle.d_initial_state[0].isZero(0.0));
  bool residue = false;
  for (Index C : {16, 32, 64}) {
    c.chunk = C;
    BackwardResult r = emulate_backward(c, in, cot);
    for (const Exact& x : r.d_initial_state.data) residue = residue || x != 0;
    for (const Comparison& row : compare_gradients_end_to_end(c, r, oracle, gradient_tau(c.dtype), &oracle.magnitude))
      EXPECT_TRUE(row.agrees()) << describe(c) << ": " << describe(row);
    const Exact offset(0x1p-16 * oracle.magnitude.d_initial_state[0].maxCoeff());
    for (Exact& x : r.d_initial_state.data) x += offset;
    const std::vector<Comparison> planted = compare_gradients_end_to_end(c, r, oracle, gradient_tau(c.dtype), &oracle.magnitude);
    EXPECT_FALSE(std::all_of(planted.begin(), planted.end(), [](const Comparison& row) { return row.agrees(); }))
        << describe(c) << ": dS_0 off by 2^-16 of its terms passed";
  }
  EXPECT_TRUE(residue) << "no C left a residue: the case no longer exercises the allowance";
}

// The fp64 kernels against central differences of their own fp64 forward (the GPU suite's check,
// here on the emulation: it tries the check's allowance before a GPU does), and the check failing
// for a gradient off by 2⁻²⁰ relative.
TEST(DeltaRuleBackwardCpuEmulation, Fp64BackwardMatchesCentralDifferences) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  const ForwardRunner forward = [](const DeltaCase& c, const HostInputs& in) {
    return emulate_backward(c, in, make_cotangents(c, false));
  };
  const BackwardRunner backward = [](const DeltaCase& c, const HostInputs& in, const Cotangents& cot) {
    return emulate_backward(c, in, cot);
  };
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.dtype = DType::f64, c.length = 21, c.chunk = 16, c.key_dim = 6, c.value_dim = 5;
    c.with_initial_state = true, c.seed = 650;
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    std::vector<std::string> tensors = {"q", "k", "v", "beta", "S_0"};
    if (gated) tensors.push_back("g");
    for (size_t i = 0; i < tensors.size(); ++i) {
      const DirectionalCheck d = check_directional_derivative(c, in, cot, tensors[i], 700 + i, forward, backward);
      std::cout << describe(c) << " " << tensors[i] << ": central difference " << d.central_difference << ", backward "
                << d.backward << ", exact gap " << d.exact_gap << " | " << describe(d.row) << "\n";
      EXPECT_TRUE(d.row.agrees()) << describe(c) << " " << describe(d.row);
    }
    const BackwardRunner off = [&](const DeltaCase& x, const HostInputs& i, const Cotangents& t) {
      BackwardResult r = emulate_backward(x, i, t);
      for (Exact& v : r.dk.data) v *= Exact(1) + Exact(1) / (1 << 20);
      return r;
    };
    EXPECT_FALSE(check_directional_derivative(c, in, cot, "k", 701, forward, off).row.agrees()) << describe(c);
  }
}

// Gradients end to end against the float64 token recurrence within gradient_tau, at C = 16, 32, 64.
TEST(DeltaRuleBackwardCpuEmulation, GradientsAgreeWithFloat64AtEveryChunkSize) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (auto [gated, d] : {std::pair{true, DType::bf16}, {false, DType::f32}, {true, DType::f64}})
    for (Index C : {16, 32, 64}) {
      DeltaCase c;
      c.gated = gated, c.dtype = d, c.length = 70, c.chunk = C, c.key_dim = 10, c.value_dim = 9, c.with_initial_state = true;
      c.seed = 90;
      testing::expect_gradients_agree_with_float64(c, run_emulated);
    }
}

// The design page's accuracy inputs at a reduced shape (bf16, L=128, D=32, C=64): every gradient's relative
// L2 against float64, printed and held to the 3.5e-3 target (the H200 run measures D=128, L=512).
TEST(DeltaRuleBackwardCpuEmulation, AccuracyAtAReducedDesignShape) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.length = 128, c.key_dim = 32, c.value_dim = 32, c.chunk = 64, c.seed = 42;
    std::cout << (gated ? "Gated DeltaNet" : "DeltaNet") << " emulated backward (bf16, L=128, D=32, C=64), rel L2 vs float64:";
    testing::expect_design_input_accuracy(c, 3.5e-3, run_emulated);
    std::cout << "\n";
  }
}

// The emulation itself can fail: a kernel that reads shared memory before writing it, or a value
// slice of the wrong size, must not pass. Here the emulated result is broken as such a kernel would
// break it (a NaN read from poisoned memory, an unwritten entry) and read() must refuse it.
TEST(DeltaRuleBackwardCpuEmulation, UnwrittenEntriesAreRefused) {
  Tensor b("probe", DType::f32, 1, 1, 2, 3);
  EXPECT_THROW(read(b), std::runtime_error);  // nothing written: NaN everywhere
  b = write("probe", Tensor4<Exact>(1, 1, 2, 3), DType::f32);
  EXPECT_NO_THROW(read(b));
  b.buffer.front_guard() = 0;  // a write just before the buffer
  EXPECT_THROW(read(b), std::runtime_error);
}

}  // namespace
}  // namespace deltaproof::emulation_suite
