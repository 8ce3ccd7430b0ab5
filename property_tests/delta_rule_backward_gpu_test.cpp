// DeltaNet and Gated DeltaNet backward kernel (cuda/delta_rule.h: delta_rule_backward) against the
// oracle, stage by stage, and its gradients end to end. The runs, the stage checks and their bounds
// live in kernel_checks/delta_rule_backward_stages.hpp; this file holds the generators, the regimes and the
// assertions over the verify::Comparison rows those return.
//
// DeltaRuleBackwardGpu.* skip without a device; the checker itself, without one, is
// delta_rule_backward_checks_test.cpp (DeltaRuleBackwardChecks.*).
#include "cuda/delta_rule.h"
#include "property_tests/support/bounded_property.hpp"
#include "property_tests/support/gpu.hpp"
#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "property_tests/support/case_rules.hpp"
#include "property_tests/support/delta_rule_backward_gradients.hpp"
#include "property_tests/support/delta_rule_backward_planted_bugs.hpp"
#include "property_tests/support/delta_rule_gpu_suite.hpp"
#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "kernel_checks/delta_rule_stages.hpp"
#include "kernel_checks/device_tensors.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace deltaproof::delta_rule_gpu_suite {
namespace {

bool bitwise_equal(const DeviceTensor& x, const DeviceTensor& y) { return dt::download_bytes(x) == dt::download_bytes(y); }

// Shapes first (chunk, length at the boundaries or free, awkward head dims), then dtype, S_0, seed.
rc::Gen<DeltaCase> gen_case(bool gated, Index max_length, Index max_dim) {
  return rc::gen::exec([=] {
    DeltaCase c;
    c.gated = gated;
    c.chunk = *rc::gen::elementOf(kernel_chunk_sizes());
    c.length = *rc::gen::oneOf(rc::gen::elementOf(boundary_and_partial_lengths(c.chunk)), rc::gen::inRange<Index>(1, max_length + 1));
    c.key_dim = *rc::gen::oneOf(rc::gen::elementOf(awkward_head_dims(max_dim)), rc::gen::inRange<Index>(1, max_dim + 1));
    c.value_dim = *rc::gen::oneOf(rc::gen::elementOf(awkward_head_dims(max_dim)), rc::gen::inRange<Index>(1, max_dim + 1));
    c.batch = *rc::gen::inRange<Index>(1, 3);
    c.heads = *rc::gen::inRange<Index>(1, 3);
    c.dtype = *rc::gen::element(DType::bf16, DType::f16, DType::f32, DType::f64);
    c.with_initial_state = *rc::gen::arbitrary<bool>();
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

// Cases the tensor-core backward takes (bf16, DK and DV multiples of 8 up to 128): shapes first.
rc::Gen<DeltaCase> gen_tensor_core_case(bool gated, Index max_length) {
  return rc::gen::exec([=] {
    DeltaCase c;
    c.gated = gated;
    c.chunk = *rc::gen::elementOf(kernel_chunk_sizes());
    c.length = *rc::gen::oneOf(rc::gen::elementOf(boundary_and_partial_lengths(c.chunk)), rc::gen::inRange<Index>(1, max_length + 1));
    c.key_dim = 8 * *rc::gen::inRange<Index>(1, 17);
    c.value_dim = 8 * *rc::gen::inRange<Index>(1, 17);
    c.batch = *rc::gen::inRange<Index>(1, 3);
    c.heads = *rc::gen::inRange<Index>(1, 3);
    c.dtype = DType::bf16;
    c.with_initial_state = *rc::gen::arbitrary<bool>();
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

// ---------------------------------------------------------------------------------------
// On the device: stages against the oracle.

// The public forward on the backward's device inputs, keeping what the backward would recompute in `saved`
// when given.
struct ForwardOutputs {
  DeviceTensor output, final_state;
};
// The case's sizes, packed strides, no tensors.
cuda::delta_rule::ForwardParams forward_shape(const DeltaCase& c) {
  cuda::delta_rule::ForwardParams p;
  p.dtype = c.dtype, p.batch = int(c.batch), p.heads = int(c.heads), p.length = int(c.length);
  p.key_dim = int(c.key_dim), p.value_dim = int(c.value_dim), p.chunk_size = int(c.chunk);
  cuda::delta_rule::set_contiguous_strides(p);
  return p;
}

ForwardOutputs public_forward(const DeltaCase& c, const BackwardDeviceInputs& d, void* saved) {
  cuda::delta_rule::ForwardParams p = forward_shape(c);
  ForwardOutputs out{dt::allocate(c.dtype, c.batch, c.heads, c.length, c.value_dim),
                     dt::allocate(DType::f32, c.batch, c.heads, c.value_dim, c.key_dim)};
  p.q = d.q.device.data(), p.k = d.k.device.data(), p.v = d.v.device.data(), p.beta = d.beta.device.data();
  p.log_gate = c.gated ? static_cast<const float*>(d.log_gate.device.data()) : nullptr;
  p.initial_state = c.with_initial_state ? static_cast<const float*>(d.initial_state.device.data()) : nullptr;
  p.output = out.output.data(), p.final_state = static_cast<float*>(out.final_state.data());
  DeviceBuffer workspace(cuda::delta_rule::workspace_bytes(p));
  p.workspace = workspace.get(), p.saved = saved;
  cuda::delta_rule::forward(p);
  cuda::check(cudaDeviceSynchronize(), "delta_rule::forward");  // before the workspace is freed
  return out;
}

std::size_t saved_bytes_of(const DeltaCase& c) { return cuda::delta_rule::saved_bytes(forward_shape(c)); }

// The training forward on the same inputs: its output and final state join a tensor-core result, whose stage
// checks then hold O (formed from the state pass's S_[c] rounded once and V̄) and S_L to their bounds.
void attach_training_forward(const DeltaCase& c, const HostInputs& in, const Cotangents& cot, BackwardResult& r) {
  const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
  DeviceBuffer saved(saved_bytes_of(c));
  const ForwardOutputs training = public_forward(c, dev, saved.get());
  r.output = dt::download(training.output), r.final_state = dt::download(training.final_state);
}

// run_backward with its intermediates; a tensor-core result with the training forward attached.
BackwardResult run_backward_and_training_forward(const DeltaCase& c, const HostInputs& in, const Cotangents& cot) {
  BackwardResult r = run_backward(c, in, cot);
  if (r.tensor_cores) attach_training_forward(c, in, cot, r);
  return r;
}

// Every backward stage of drawn cases (length up to max_length, head dims up to max_dim) within bound.
bool backward_stages_hold(const std::string& name, int cases, const rc::Gen<DeltaCase>& cases_drawn) {
  return check_cases(name, cases, [=](void) {
    const DeltaCase c = *cases_drawn;
    const bool with_final_gradient = *rc::gen::arbitrary<bool>();
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c, with_final_gradient);
    const auto rep = check_backward_stages(c, in, cot, run_backward_and_training_forward(c, in, cot));
    RC_TAG(cuda::name_of(c.dtype));
    if (!all_agree(rep)) RC_FAIL(failures(c, rep) + (with_final_gradient ? "dS_L given" : "dS_L = 0"));
  });
}

TEST(DeltaRuleBackwardGpu, StagesMatchOracleDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(backward_stages_hold("DeltaNet backward stages vs the exact oracle", 12, gen_case(false, 100, 32)));
}

TEST(DeltaRuleBackwardGpu, StagesMatchOracleGatedDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(backward_stages_hold("Gated DeltaNet backward stages vs the 100-digit oracle", 10, gen_case(true, 80, 32)));
}

// The tensor-core path (bf16, head dims multiples of 8 up to 128) over drawn shapes.
TEST(DeltaRuleBackwardGpu, StagesMatchOracleTensorCoreDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(backward_stages_hold("tensor-core DeltaNet backward stages vs the exact oracle", 8, gen_tensor_core_case(false, 200)));
}

TEST(DeltaRuleBackwardGpu, StagesMatchOracleTensorCoreGatedDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(backward_stages_hold("tensor-core Gated DeltaNet backward stages vs the 100-digit oracle", 6, gen_tensor_core_case(true, 150)));
}

// Prints the worst err/bound per stage for one mid-sized case of each dtype (calibration).
TEST(DeltaRuleBackwardGpu, StageBoundCalibration) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType d : {DType::bf16, DType::f16, DType::f32, DType::f64})
    for (bool gated : {false, true}) {
      DeltaCase c;
      c.gated = gated, c.dtype = d, c.length = 100, c.key_dim = 48, c.value_dim = 32, c.chunk = 64;
      c.with_initial_state = true, c.seed = 7;
      const HostInputs in = make_inputs(c);
      const Cotangents cot = make_cotangents(c);
      const auto rep = check_backward_stages(c, in, cot, run_backward_and_training_forward(c, in, cot));
      std::cout << describe(c) << "\n  max err/bound: " << calibration(rep) << "\n";
      EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
    }
}

TEST(DeltaRuleBackwardGpu, StageChecksCatchPlantedBugsOnTheKernel) {
  DELTAPROOF_REQUIRE_GPU();
  for (bool gated : {false, true}) {
    const DeltaCase c = planted_bug_case(gated);
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const BackwardResult good = run_backward(c, in, cot);
    const auto rep = check_backward_stages(c, in, cot, good);
    ASSERT_TRUE(all_agree(rep)) << failures(c, rep);
    Cotangents dropped = cot;
    dropped.d_final_state.reset();
    expect_planted_bugs_caught(c, in, cot, good, run_backward(c, in, dropped));
  }
}

// ---------------------------------------------------------------------------------------
// Named regimes.

std::vector<Comparison> backward_stages_for(const DeltaCase& c, const HostInputs& in) {
  const Cotangents cot = make_cotangents(c);
  return check_backward_stages(c, in, cot, run_backward_and_training_forward(c, in, cot));
}
std::vector<Comparison> backward_stages_for(const DeltaCase& c) { return backward_stages_for(c, make_inputs(c)); }

TEST(DeltaRuleBackwardGpu, RegimeChunk64ShortSequences) {  // C = 64 on Hopper with L <= 8 and L < C (fla's failing case)
  DELTAPROOF_REQUIRE_GPU();
  for (Index L : {1, 2, 3, 5, 8, 33, 63})
    for (bool gated : {false, true})
      for (DType d : {DType::bf16, DType::f32}) {
        DeltaCase c;
        c.gated = gated, c.dtype = d, c.length = L, c.chunk = 64, c.key_dim = 32, c.value_dim = 24, c.with_initial_state = true;
        c.seed = 100 + L;
        const auto rep = backward_stages_for(c);
        EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
      }
}

TEST(DeltaRuleBackwardGpu, RegimePartialLastChunk) {  // L % C != 0 for every C; both paths (DK = 20: fp32 FMA, 24: tensor cores)
  DELTAPROOF_REQUIRE_GPU();
  for (Index C : {16, 32, 64})
    for (Index L : {C + 1, 2 * C - 1, 3 * C + 7})
      for (bool gated : {false, true}) {
        DeltaCase c;
        c.gated = gated, c.length = L, c.chunk = C, c.key_dim = gated ? 20 : 24, c.value_dim = 40, c.with_initial_state = L % 2 == 1;
        c.seed = 200 + L;
        const auto rep = backward_stages_for(c);
        EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
      }
}

TEST(DeltaRuleBackwardGpu, RegimeHeadDims) {  // 1, 15, 100, 256 (shared-memory and lane-loop limits); 8, 120, 128 (tensor cores)
  DELTAPROOF_REQUIRE_GPU();
  for (DType d : {DType::bf16, DType::f64})
    for (auto [dk, dv] : {std::pair<Index, Index>{1, 1}, {15, 100}, {100, 15}, {256, 256}, {128, 128}, {8, 120}}) {
      DeltaCase c;
      c.gated = dk == 100, c.dtype = d, c.length = 70, c.chunk = 64, c.key_dim = dk, c.value_dim = dv, c.seed = 300 + dk;
      c.with_initial_state = true;
      const auto rep = backward_stages_for(c);
      EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
    }
}

// Decays underflow to 0 (g down to −128 per token): nothing non-finite, every stage in bound.
TEST(DeltaRuleBackwardGpu, RegimeVeryNegativeGates) {
  DELTAPROOF_REQUIRE_GPU();
  for (double step : {1.0, 8.0})
    for (DType d : {DType::bf16, DType::f32}) {
      DeltaCase c;
      c.gated = true, c.dtype = d, c.gate_step = step, c.length = 90, c.chunk = 64, c.key_dim = 16, c.value_dim = 16;
      c.with_initial_state = true, c.seed = 500;
      const auto rep = backward_stages_for(c);  // download() rejects any non-finite entry
      EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
    }
}

// dG's longest chain, <G', S>, where it cannot hide (the emulation suite's StateInnerProductReachesTheGateGradient):
// one chunk, S_0 and dS_L of one sign, dO = 0 and zero gates, so that <dS_L, S_0> enters the last token's dG whole.
TEST(DeltaRuleBackwardGpu, RegimeStateInnerProductInTheGateGradient) {
  DELTAPROOF_REQUIRE_GPU();
  for (Index C : {32, 64}) {
    DeltaCase c;
    c.gated = true, c.zero_gates = true, c.length = C - 3, c.chunk = C, c.key_dim = 128, c.value_dim = 64;
    c.with_initial_state = true, c.seed = 560;
    HostInputs in = make_inputs(c);
    Cotangents cot = make_cotangents(c);
    make_state_inner_product_dominant(in, cot);
    const auto rep = check_backward_stages(c, in, cot, run_backward_and_training_forward(c, in, cot));
    EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
  }
}

// β = 0 (no write: T = I, dβ alone carries the signal) and β = 1 (full erase).
TEST(DeltaRuleBackwardGpu, RegimeBetaZeroAndOne) {
  DELTAPROOF_REQUIRE_GPU();
  for (int beta : {0, 1})
    for (bool gated : {false, true}) {
      DeltaCase c;
      c.gated = gated, c.length = 50, c.chunk = 32, c.key_dim = 24, c.value_dim = 20, c.with_initial_state = true, c.seed = 550;
      HostInputs in = make_inputs(c);
      for (Exact& x : in.beta.data) x = beta;
      const auto rep = backward_stages_for(c, in);
      EXPECT_TRUE(all_agree(rep)) << failures(c, rep) << " beta=" << beta;
    }
}

// Unnormalized keys make A ill-conditioned: the stage bounds (which scale with (I − |N̂|)⁻¹) must
// hold; the gradients' error against float64 grows, and is printed, not hidden.
TEST(DeltaRuleBackwardGpu, RegimeUnnormalizedKeysErrorGrowth) {
  DELTAPROOF_REQUIRE_GPU();
  std::cout << "unnormalized keys (bf16, L=64, DK=DV=16, C=16): key entries n/2^(3+shift), |n|<=8\n";
  for (int shift : {2, 1, 0}) {
    DeltaCase c;
    c.length = 64, c.chunk = 16, c.key_dim = 16, c.value_dim = 16, c.key_shift = shift, c.seed = 600;
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const BackwardResult r = run_backward(c, in, cot);
    const auto rep = check_backward_stages(c, in, cot, r);
    EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
    double t_max = 0;
    for (const Exact& x : r.t.data) t_max = std::max(t_max, std::abs(ref::to_double(x)));
    std::cout << "  key_shift " << shift << ": max |T| " << t_max << ", gradient rel L2 vs float64:";
    for (const auto& [name, err] : gradient_relative_l2(c, r, double_gradients(c, in, cot))) std::cout << " " << name << " " << err;
    std::cout << "\n  max err/bound per stage: " << calibration(rep) << "\n";
  }
}

// ---------------------------------------------------------------------------------------
// Gradients end to end.

// C = 16, 32, 64 each agree with the float64 recurrence's gradients, and with each other.
TEST(DeltaRuleBackwardGpu, ChunkSizesAgree) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("backward at C = 16, 32, 64 vs float64 and each other", 6, [](void) {
    DeltaCase c = *gen_case(*rc::gen::arbitrary<bool>(), 300, 64);
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const DoubleGradients oracle = double_gradients(c, in, cot);
    std::vector<BackwardResult> runs;
    for (Index C : {16, 32, 64}) {
      c.chunk = C;
      runs.push_back(run_backward(c, in, cot, false));
      for (const Comparison& row : compare_gradients_end_to_end(c, runs.back(), oracle, gradient_tau(c.dtype), &oracle.magnitude))
        if (!row.agrees()) RC_FAIL(describe(c) + ": " + describe(row));
    }
    for (size_t i = 1; i < runs.size(); ++i) {
      GradientTensors first;
      first.dq = heads_of(runs[0].dq), first.dk = heads_of(runs[0].dk), first.dv = heads_of(runs[0].dv);
      first.d_beta = heads_of(runs[0].d_beta), first.d_initial_state = heads_of(runs[0].d_initial_state);
      if (c.gated) first.d_log_gate = heads_of(runs[0].d_log_gate);
      for (const Comparison& row : compare_gradients_end_to_end(c, runs[i], first, 2 * gradient_tau(c.dtype), &oracle.magnitude))
        if (!row.agrees()) RC_FAIL(describe(c) + " C=" + std::to_string(16 << i) + " vs C=16: " + describe(row));
    }
  }));
}

// The fp64 backward against central differences of the backward's own fp64 forward, along a random
// direction in each input (see check_directional_derivative for the allowance).
TEST(DeltaRuleBackwardGpu, Fp64BackwardMatchesCentralDifferences) {
  DELTAPROOF_REQUIRE_GPU();
  for (bool gated : {false, true})
    for (Index C : {16, 64}) {
      DeltaCase c;
      c.gated = gated, c.dtype = DType::f64, c.length = 45, c.chunk = C, c.key_dim = 12, c.value_dim = 10;
      c.with_initial_state = true, c.seed = 650;
      const HostInputs in = make_inputs(c);
      const Cotangents cot = make_cotangents(c);
      std::vector<std::string> tensors = {"q", "k", "v", "beta", "S_0"};
      if (gated) tensors.push_back("g");
      for (size_t i = 0; i < tensors.size(); ++i) {
        const DirectionalCheck d = check_directional_derivative(c, in, cot, tensors[i], 700 + i);
        std::cout << describe(c) << " " << tensors[i] << ": central difference " << d.central_difference << ", backward "
                  << d.backward << ", exact gap " << d.exact_gap << " | " << describe(d.row) << "\n";
        EXPECT_TRUE(d.row.agrees()) << describe(c) << " " << describe(d.row);
      }
    }
}

// The fp64 backward's gradients against the exact reference's (normwise, 2⁻⁴⁰).
TEST(DeltaRuleBackwardGpu, Fp64BackwardMatchesTheExactReference) {
  DELTAPROOF_REQUIRE_GPU();
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.dtype = DType::f64, c.length = 130, c.chunk = 32, c.key_dim = 20, c.value_dim = 12;
    c.with_initial_state = true, c.seed = 660;
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const BackwardResult r = run_backward(c, in, cot, false);
    const BackwardResult exact = reference_gradients(c, in, cot);
    DoubleGradients reference;
    reference.dq = heads_of(exact.dq), reference.dk = heads_of(exact.dk), reference.dv = heads_of(exact.dv);
    reference.d_beta = heads_of(exact.d_beta), reference.d_initial_state = heads_of(exact.d_initial_state);
    if (gated) reference.d_log_gate = heads_of(exact.d_log_gate);
    for (const Comparison& row : compare_gradients_end_to_end(c, r, reference, gradient_tau(DType::f64)))
      EXPECT_TRUE(row.agrees()) << describe(c) << ": " << describe(row);
  }
}

// g = 0: Gated DeltaNet runs DeltaNet's arithmetic (every decay exp(0) = 1), so every byte that
// both write is the same.
TEST(DeltaRuleBackwardGpu, ZeroGatesEqualDeltaNetBitwise) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType d : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    DeltaCase c;
    c.dtype = d, c.length = 77, c.chunk = 32, c.key_dim = 40, c.value_dim = 24, c.with_initial_state = true;
    c.zero_gates = true, c.seed = 400;
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
    BackwardBuffers plain = allocate_backward(c, true);
    cuda::delta_rule::testing::backward(backward_params(c, dev, plain));
    DeltaCase gated_case = c;
    gated_case.gated = true;
    BackwardBuffers gated = allocate_backward(gated_case, true);
    cuda::delta_rule::testing::backward(backward_params(gated_case, dev, gated));
    const auto same = bitwise_equal;
    EXPECT_TRUE(same(plain.dq, gated.dq) && same(plain.dk, gated.dk) && same(plain.dv, gated.dv)) << describe(c);
    EXPECT_TRUE(same(plain.d_beta, gated.d_beta) && same(plain.d_initial_state, gated.d_initial_state)) << describe(c);
    EXPECT_TRUE(same(plain.t, gated.t) && same(plain.w, gated.w) && same(plain.boundary, gated.boundary)) << describe(c);
    EXPECT_TRUE(same(plain.d_v_new, gated.d_v_new) && same(plain.state_gradients, gated.state_gradients)) << describe(c);
  }
}

// Repeated runs give the same bits (fixed-order reductions, no atomics).
TEST(DeltaRuleBackwardGpu, Deterministic) {
  DELTAPROOF_REQUIRE_GPU();
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.batch = 2, c.heads = 3, c.length = 333, c.chunk = 64, c.key_dim = 64, c.value_dim = 64, c.seed = 800;
    c.with_initial_state = true;
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
    BackwardBuffers first = allocate_backward(c, false), second = allocate_backward(c, false);
    cuda::delta_rule::testing::backward(backward_params(c, dev, first));
    cuda::delta_rule::testing::backward(backward_params(c, dev, second));
    for (auto [x, y, name] : {std::tuple{&first.dq, &second.dq, "dq"}, {&first.dk, &second.dk, "dk"}, {&first.dv, &second.dv, "dv"},
                              {&first.d_beta, &second.d_beta, "dbeta"}, {&first.d_initial_state, &second.d_initial_state, "dS_0"}})
      EXPECT_EQ(dt::download_bytes(*x), dt::download_bytes(*y)) << describe(c) << " " << name;
    if (gated) {
      EXPECT_EQ(dt::download_bytes(first.d_log_gate), dt::download_bytes(second.d_log_gate)) << describe(c) << " dg";
    }
  }
}

// Stage 4's persistent blocks: one block taking every (chunk, head) item, or a few taking several each (the next
// item's operands copied in while the current one computes), write the same bits as one block per item.
TEST(DeltaRuleBackwardGpu, ChunkGradientsDoNotDependOnResidentBlocks) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("stage 4 with 1 or a few resident blocks vs one block per item", 10, [] {
    const DeltaCase c = *gen_tensor_core_case(*rc::gen::arbitrary<bool>(), 300);
    const int few = *rc::gen::inRange(1, 6);
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c, *rc::gen::arbitrary<bool>());
    const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
    RC_TAG(c.gated ? "gated" : "DeltaNet");
    BackwardBuffers every = allocate_backward(c, false), shared = allocate_backward(c, false);
    cuda::delta_rule::testing::backward(backward_params(c, dev, every));
    cuda::delta_rule::BackwardStageParams p = backward_params(c, dev, shared);
    p.chunk_gradient_blocks = few;
    cuda::delta_rule::testing::backward(p);
    std::vector<std::pair<const DeviceTensor*, const DeviceTensor*>> pairs{
        {&every.dq, &shared.dq}, {&every.dk, &shared.dk}, {&every.dv, &shared.dv}, {&every.d_beta, &shared.d_beta}};
    if (c.gated) pairs.push_back({&every.d_log_gate, &shared.d_log_gate});
    for (const auto& [x, y] : pairs) RC_ASSERT(bitwise_equal(*x, *y));
  }));
}


// A training step: the backward given a training forward's buffer writes every gradient bit for bit as the one
// that recomputes T, W, U, S_[c] and V̄ (the training forward's output, formed from those, is held to its bound by
// the tensor-core stage suites). A buffer kept for other inputs changes the gradients (the backward does read it).
TEST(DeltaRuleBackwardGpu, TrainingStepEqualsTheRecomputingOneBitwise) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("training forward + backward from saved vs the recomputing backward", 10, [] {
    const DeltaCase c = *gen_tensor_core_case(*rc::gen::arbitrary<bool>(), 200);
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c, *rc::gen::arbitrary<bool>());
    const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
    const auto same = bitwise_equal;
    RC_TAG(c.gated ? "gated" : "DeltaNet");
    DeviceBuffer saved(saved_bytes_of(c));
    public_forward(c, dev, saved.get());
    BackwardBuffers recomputing = allocate_backward(c, false), from_saved = allocate_backward(c, false);
    cuda::delta_rule::backward(backward_params(c, dev, recomputing));
    cuda::delta_rule::BackwardStageParams p = backward_params(c, dev, from_saved);
    p.saved = saved.get();
    cuda::delta_rule::backward(p);
    const auto gradients = [&](BackwardBuffers& b) {
      std::vector<const DeviceTensor*> all{&b.dq, &b.dk, &b.dv, &b.d_beta, &b.d_initial_state};
      if (c.gated) all.push_back(&b.d_log_gate);
      return all;
    };
    const auto expected = gradients(recomputing), got = gradients(from_saved);
    for (std::size_t i = 0; i < expected.size(); ++i) RC_ASSERT(same(*expected[i], *got[i]));

    DeltaCase other = c;  // the same sizes, other values
    other.seed = c.seed + 1;
    const BackwardDeviceInputs other_dev = upload_backward_inputs(other, make_inputs(other), make_cotangents(other));
    DeviceBuffer stale(saved.bytes());
    public_forward(other, other_dev, stale.get());
    BackwardBuffers from_stale = allocate_backward(c, false);
    cuda::delta_rule::BackwardStageParams q = backward_params(c, dev, from_stale);
    q.saved = stale.get();
    cuda::delta_rule::backward(q);
    const auto wrong = gradients(from_stale);
    bool differs = false;
    for (std::size_t i = 0; i < expected.size(); ++i) differs = differs || !same(*expected[i], *wrong[i]);
    RC_ASSERT(differs);
  }));
}

// A training forward whose output the register scan cannot store in pairs (2-byte aligned): the state pass still
// keeps S_[c] and V̄ (the backward from the buffer writes the recomputing one's gradients bit for bit), and the
// fallback scan forms the output and the final state, bit for bit the inference forward's on the same pointer.
TEST(DeltaRuleBackwardGpu, TrainingForwardOffTheRegisterScanStillKeepsTheStatePass) {
  DELTAPROOF_REQUIRE_GPU();
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.dtype = DType::bf16, c.gated = gated, c.length = 100, c.key_dim = 48, c.value_dim = 32, c.chunk = 64;
    c.with_initial_state = true, c.seed = 12;
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c, true);
    const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
    const std::size_t output_bytes = std::size_t(c.batch * c.heads * c.length * c.value_dim) * 2;
    const std::size_t state_bytes = std::size_t(c.batch * c.heads * c.value_dim * c.key_dim) * 4;
    const auto forward_on_a_2_byte_output = [&](void* saved) {
      cuda::delta_rule::ForwardParams p = forward_shape(c);
      DeviceBuffer output(output_bytes + 2), final_state(state_bytes);
      p.q = dev.q.device.data(), p.k = dev.k.device.data(), p.v = dev.v.device.data(), p.beta = dev.beta.device.data();
      p.log_gate = gated ? static_cast<const float*>(dev.log_gate.device.data()) : nullptr;
      p.initial_state = static_cast<const float*>(dev.initial_state.device.data());
      p.output = static_cast<char*>(output.get()) + 2, p.final_state = static_cast<float*>(final_state.get());
      DeviceBuffer workspace(cuda::delta_rule::workspace_bytes(p));
      p.workspace = workspace.get(), p.saved = saved;
      cuda::delta_rule::forward(p);
      std::vector<unsigned char> bytes(output_bytes + state_bytes);
      cuda::check(cudaMemcpy(bytes.data(), p.output, output_bytes, cudaMemcpyDeviceToHost), "output");
      cuda::check(cudaMemcpy(bytes.data() + output_bytes, p.final_state, state_bytes, cudaMemcpyDeviceToHost), "final state");
      return bytes;
    };
    DeviceBuffer saved(saved_bytes_of(c));
    EXPECT_EQ(forward_on_a_2_byte_output(saved.get()), forward_on_a_2_byte_output(nullptr)) << describe(c);
    BackwardBuffers recomputing = allocate_backward(c, false), from_saved = allocate_backward(c, false);
    cuda::delta_rule::backward(backward_params(c, dev, recomputing));
    cuda::delta_rule::BackwardStageParams p = backward_params(c, dev, from_saved);
    p.saved = saved.get();
    ASSERT_TRUE(cuda::delta_rule::tensor_core_backward_applies(p)) << "the backward must read the buffer";
    cuda::delta_rule::backward(p);
    for (auto [x, y] : {std::pair{&recomputing.dq, &from_saved.dq}, {&recomputing.dk, &from_saved.dk}, {&recomputing.dv, &from_saved.dv},
                        {&recomputing.d_beta, &from_saved.d_beta}, {&recomputing.d_initial_state, &from_saved.d_initial_state}})
      EXPECT_TRUE(bitwise_equal(*x, *y)) << describe(c);
    if (gated) {
      EXPECT_TRUE(bitwise_equal(recomputing.d_log_gate, from_saved.d_log_gate)) << describe(c);
    }
  }
}

// The saved buffer's device checks: a host pointer, or one off the 256-byte alignment, is named, nothing written.
TEST(DeltaRuleBackwardGpu, SavedBufferDeviceChecks) {
  DELTAPROOF_REQUIRE_GPU();
  DeltaCase c;
  c.dtype = DType::bf16, c.length = 40, c.chunk = 16, c.key_dim = 8, c.value_dim = 8, c.seed = 901;
  const HostInputs in = make_inputs(c);
  const Cotangents cot = make_cotangents(c);
  const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
  DeviceBuffer saved(saved_bytes_of(c) + 256);
  std::vector<float> host_buffer(saved.bytes() / 4 + 1);
  BackwardBuffers f = allocate_backward(c, false);
  const auto poisoned = dt::download_bytes(f.dq);
  for (const void* bad : {static_cast<const void*>(host_buffer.data()), static_cast<const void*>(static_cast<char*>(saved.get()) + 16)}) {
    cuda::delta_rule::BackwardStageParams p = backward_params(c, dev, f);
    p.saved = bad;
    expect_named("saved", "", [&] { cuda::delta_rule::backward(p); });
    EXPECT_EQ(dt::download_bytes(f.dq), poisoned) << "dq touched after a bad saved";
    expect_named("saved", "", [&] { public_forward(c, dev, const_cast<void*>(bad)); });
  }
}

// Device-pointer and alignment checks, each naming the argument, with nothing written.
TEST(DeltaRuleBackwardGpu, InvalidPointersThrowBeforeAnyLaunch) {
  DELTAPROOF_REQUIRE_GPU();
  DeltaCase c;
  c.length = 40, c.chunk = 16, c.key_dim = 8, c.value_dim = 8, c.seed = 900;
  const HostInputs in = make_inputs(c);
  const Cotangents cot = make_cotangents(c);
  const BackwardDeviceInputs dev = upload_backward_inputs(c, in, cot);
  BackwardBuffers f = allocate_backward(c, false);
  const auto poisoned = dt::download_bytes(f.dq);
  std::vector<float> host_buffer(4096);
  auto expect_rejected = [&](const std::string& argument, auto mutate) {
    cuda::delta_rule::BackwardStageParams p = backward_params(c, dev, f);
    mutate(p);
    expect_named(argument, "", [&] { cuda::delta_rule::testing::backward(p); });
    EXPECT_EQ(dt::download_bytes(f.dq), poisoned) << "dq touched after a bad " << argument;
  };
  expect_rejected("k", [&](auto& p) { p.k = host_buffer.data(); });
  expect_rejected("beta", [](auto& p) { p.beta = static_cast<const char*>(p.beta) + 1; });
  expect_rejected("d_output", [&](auto& p) { p.d_output = host_buffer.data(); });
  expect_rejected("dq", [](auto& p) { p.dq = static_cast<char*>(p.dq) + 1; });
  expect_rejected("workspace", [](auto& p) { p.workspace = static_cast<char*>(p.workspace) + 16; });
  expect_rejected("d_initial_state", [&](auto& p) { p.d_initial_state = host_buffer.data(); });
  expect_rejected("chunk_size", [](auto& p) { p.chunk_size = 48; });
}

// ---------------------------------------------------------------------------------------
// Accuracy at the design page's shape: bf16, B=2, H=4, L=512, D=128 (q ~ N(0,1)/√D, k normalized,
// v ~ N(0,1), β = sigmoid(N(0,1)), g = logsigmoid(N(0,1) + 3)), dO ~ n/4 (exact in bf16); relative
// L2 of every gradient against the float64 token recurrence on the same rounded inputs.

void gradient_accuracy_at_design_shape(bool gated, double target, double output_target) {
  DeltaCase c;
  c.gated = gated, c.batch = 2, c.heads = 4, c.length = 512, c.key_dim = 128, c.value_dim = 128, c.chunk = 64;
  c.seed = 42;
  const HostInputs in = design_inputs(c);
  const Cotangents cot = make_cotangents(c);
  const BackwardResult r = run_backward(c, in, cot, false);
  std::cout << (gated ? "Gated DeltaNet" : "DeltaNet")
            << " backward accuracy (bf16, B=2, H=4, L=512, D=128, C=64): relative L2 vs float64:";
  testing::expect_gradient_relative_l2_within(c, in, cot, r, target);
  std::cout << " (target <= " << target << ")\n";
  // The training forward's output (from S_[c] rounded once and V̄'s pair), to the inference forward's target.
  BackwardResult training;
  attach_training_forward(c, in, cot, training);
  const double output_err = relative_l2_all(heads_of(training.output), double_oracle(c, in).output);
  std::cout << (gated ? "Gated DeltaNet" : "DeltaNet") << " training forward accuracy: output rel L2 vs float64 = " << output_err
            << " (target <= " << output_target << ")\n";
  EXPECT_LE(output_err, output_target);
}

TEST(DeltaRuleBackwardGpu, AccuracyAtDesignShapeDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  gradient_accuracy_at_design_shape(false, 3.5e-3, 4.1e-3);
}

TEST(DeltaRuleBackwardGpu, AccuracyAtDesignShapeGatedDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  gradient_accuracy_at_design_shape(true, 3.5e-3, 3.7e-3);
}

}  // namespace
}  // namespace deltaproof::delta_rule_gpu_suite
