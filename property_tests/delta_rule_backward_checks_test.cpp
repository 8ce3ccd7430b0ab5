// The DeltaNet and Gated DeltaNet backward's checker itself, without a device: it accepts the exact
// oracle, also stored as the kernel stores it; the oracle chain it judges by equals the reference's
// backward over ℚ; it catches planted bugs; and the launchers' validation (arguments, workspace,
// the training forward's saved buffer) fails before any CUDA call. Kept apart from
// delta_rule_backward_gpu_test.cpp, whose DeltaRuleBackwardGpu.* skip without a device; the stage
// checks and their bounds live in kernel_checks/delta_rule_backward_stages.hpp.
#include "cuda/delta_rule.h"
#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "property_tests/support/delta_rule_backward_planted_bugs.hpp"
#include "property_tests/support/delta_rule_gpu_suite.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace deltaproof::delta_rule_gpu_suite {
namespace {

// The kernel's algorithm run exactly (verify's chain, intermediates and all) equals the reference's
// chunkwise backward: == over ℚ for DeltaNet; for Gated DeltaNet (100 digits, both irrational)
// within 1e-80 relative. Also its forward (output, final state) equals the reference's.
TEST(DeltaRuleBackwardChecks, OracleChainEqualsTheReferenceBackward) {
  for (bool gated : {false, true})
    for (auto [C, L, s0, dsl] : {std::tuple<Index, Index, bool, bool>{16, 1, true, true}, {16, 15, false, true},
                                 {16, 17, true, false}, {16, 35, true, true}, {32, 33, false, false}, {64, 70, true, true}}) {
      DeltaCase c;
      c.gated = gated, c.chunk = C, c.length = L, c.key_dim = 5, c.value_dim = 3, c.with_initial_state = s0, c.seed = 21 + L;
      c.batch = 1, c.heads = 2;
      const HostInputs in = make_inputs(c);
      const Cotangents cot = make_cotangents(c, dsl);
      const BackwardResult chain = oracle_backward_as_kernel(c, in, cot);
      const BackwardResult reference = reference_gradients(c, in, cot);
      std::vector<std::pair<std::string, std::pair<const Tensor4<Exact>*, const Tensor4<Exact>*>>> pairs = {
          {"dq", {&chain.dq, &reference.dq}},       {"dk", {&chain.dk, &reference.dk}},
          {"dv", {&chain.dv, &reference.dv}},       {"dbeta", {&chain.d_beta, &reference.d_beta}},
          {"dS_0", {&chain.d_initial_state, &reference.d_initial_state}}};
      if (gated) pairs.push_back({"dg", {&chain.d_log_gate, &reference.d_log_gate}});
      for (const auto& [name, pair] : pairs) {
        ASSERT_EQ(pair.first->data.size(), pair.second->data.size()) << name;
        Exact worst(0), scale(0);
        for (size_t i = 0; i < pair.first->data.size(); ++i) {
          worst = std::max<Exact>(worst, abs(Exact(pair.first->data[i] - pair.second->data[i])));
          scale = std::max<Exact>(scale, abs(pair.second->data[i]));
        }
        if (gated) EXPECT_LE(ref::to_double(worst), 1e-80 * ref::to_double(scale)) << describe(c) << " " << name;
        else EXPECT_EQ(worst, 0) << describe(c) << " " << name << " (over Q)";
        EXPECT_GT(scale, 0) << describe(c) << " " << name << ": an all-zero gradient proves nothing";
      }
    }
}

// The exact oracle's intermediates are accepted with ratio ~0 (DeltaNet: exactly 0 over ℚ; gated:
// the 100-digit chain's own 1e-90), and every planted bug is caught.
TEST(DeltaRuleBackwardChecks, AcceptTheExactOracleAndCatchPlantedBugs) {
  for (bool gated : {false, true}) {
    const DeltaCase c = planted_bug_case(gated);
    const HostInputs in = make_inputs(c);
    const Cotangents cot = make_cotangents(c);
    const BackwardResult exact = oracle_backward_as_kernel(c, in, cot);
    const auto rep = check_backward_stages(c, in, cot, exact);
    ASSERT_TRUE(all_agree(rep)) << failures(c, rep);
    for (const Comparison& row : rep) EXPECT_LT(row.ratio, 1e-50) << describe(row);
    std::cout << describe(c) << ": " << rep.size() << " stage rows, all at ratio < 1e-50\n";
    Cotangents dropped = cot;
    dropped.d_final_state.reset();
    expect_planted_bugs_caught(c, in, cot, exact, oracle_backward_as_kernel(c, in, dropped));
  }
}

// The same oracle with its gradients stored as the kernel stores them (rounded to the input dtype;
// fp16 and bf16 add u_out|x| + η) is accepted, over the regimes the checker has code paths for:
// L < C, L = C + 1, partial chunks, S_0 absent, dS_L absent, head dims 1 and 15, every dtype.
TEST(DeltaRuleBackwardChecks, AcceptTheOracleStoredAsTheKernelStoresIt) {
  for (bool gated : {false, true})
    for (auto [d, L, C, dk, dv, s0] :
         {std::tuple<DType, Index, Index, Index, Index, bool>{DType::bf16, 1, 64, 15, 1, true}, {DType::f16, 17, 16, 1, 9, false},
          {DType::f32, 33, 32, 9, 15, true}, {DType::f64, 40, 16, 7, 6, true}, {DType::bf16, 33, 16, 4, 12, false}}) {
        DeltaCase c;
        c.gated = gated, c.dtype = d, c.length = L, c.chunk = C, c.key_dim = dk, c.value_dim = dv, c.with_initial_state = s0;
        c.batch = 2, c.seed = 31 + L;
        const HostInputs in = make_inputs(c);
        const Cotangents cot = make_cotangents(c, L != 17);
        BackwardResult stored = oracle_backward_as_kernel(c, in, cot);
        stored.dq = dt::round_to(stored.dq, d), stored.dk = dt::round_to(stored.dk, d);
        stored.dv = dt::round_to(stored.dv, d), stored.d_beta = dt::round_to(stored.d_beta, d);
        const auto rep = check_backward_stages(c, in, cot, stored);
        EXPECT_TRUE(all_agree(rep)) << failures(c, rep);
      }
}

// Bad arguments are named before any CUDA call (so the same messages come without a device): the
// size, chunk, dtype and presence checks. The device-pointer checks come after (GPU test below).
TEST(DeltaRuleBackwardChecks, ValidationNamesTheArgumentBeforeAnyCudaCall) {
  std::vector<float> host(64 * 1024);  // each tensor its own 4 KB (the workspace 176 KB): apart, as outputs must be
  const auto at = [&](int i) { return static_cast<void*>(host.data() + 1024 * i); };
  cuda::delta_rule::BackwardStageParams good;
  good.dtype = DType::bf16, good.batch = 1, good.heads = 2, good.length = 40, good.key_dim = 8, good.value_dim = 8;
  good.chunk_size = 16;
  cuda::delta_rule::set_contiguous_strides(good);
  good.q = at(0), good.k = at(1), good.v = at(2), good.beta = at(3), good.d_output = at(4);
  good.dq = at(5), good.dk = at(6), good.dv = at(7), good.d_beta = at(8);
  good.workspace = at(20);
  auto expect_rejected = [&](const std::string& argument, const std::string& message, auto mutate) {
    cuda::delta_rule::BackwardStageParams p = good;
    mutate(p);
    expect_named(argument, message, [&] { cuda::delta_rule::testing::validate(p); });
  };
  expect_rejected("dtype", "must be fp32, fp64, bf16 or fp16", [](auto& p) { p.dtype = static_cast<DType>(7); });
  expect_rejected("batch", "must be >= 1", [](auto& p) { p.batch = 0; });
  expect_rejected("heads", "must be >= 1", [](auto& p) { p.heads = -1; });
  expect_rejected("batch*heads", "must be <= 65535", [](auto& p) { p.batch = 300, p.heads = 300; });
  expect_rejected("length", "must be in 1..", [](auto& p) { p.length = 0; });
  expect_rejected("key_dim", "must be in 1..256", [](auto& p) { p.key_dim = 257; });
  expect_rejected("value_dim", "must be in 1..256", [](auto& p) { p.value_dim = 0; });
  expect_rejected("chunk_size", "must be 16, 32 or 64", [](auto& p) { p.chunk_size = 48; });
  expect_rejected("chunk_size", "must be 16, 32 or 64", [](auto& p) { p.chunk_size = 8; });
  expect_rejected("q", "must not be null", [](auto& p) { p.q = nullptr; });
  expect_rejected("beta", "must not be null", [](auto& p) { p.beta = nullptr; });
  expect_rejected("d_output", "must not be null", [](auto& p) { p.d_output = nullptr; });
  expect_rejected("dk", "must not be null", [](auto& p) { p.dk = nullptr; });
  expect_rejected("d_beta", "must not be null", [](auto& p) { p.d_beta = nullptr; });
  expect_rejected("d_log_gate", "must be given with log_gate", [&](auto& p) { p.log_gate = at(10); });
  expect_rejected("d_log_gate", "must be null without log_gate", [&](auto& p) { p.d_log_gate = at(10); });
  expect_rejected("workspace", "bytes are needed", [](auto& p) { p.workspace = nullptr; });
  EXPECT_THROW(cuda::delta_rule::testing::workspace_bytes([&] {
                 cuda::delta_rule::BackwardStageParams p = good;
                 p.chunk_size = 12;
                 return p;
               }()),
               std::invalid_argument);
}

// The workspace holds exactly the intermediates left null: none when all are given.
TEST(DeltaRuleBackwardChecks, WorkspaceHoldsOnlyWhatIsNotGiven) {
  float host[4] = {};
  cuda::delta_rule::BackwardStageParams p;
  p.dtype = DType::f64, p.batch = 2, p.heads = 3, p.length = 70, p.key_dim = 5, p.value_dim = 7, p.chunk_size = 32;
  const std::size_t heads = 6, L = 70, N = 3, C = 32, DK = 5, DV = 7;
  const auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t expected = aligned(heads * L * 8) + 2 * aligned(heads * N * C * C * 8) + 2 * aligned(heads * L * DK * 8) +
                               3 * aligned(heads * L * DV * 8) + 2 * aligned(heads * N * DV * DK * 8);
  EXPECT_EQ(cuda::delta_rule::testing::workspace_bytes(p), expected);
  p.gate_sums = p.wy_inverse = p.w = p.u = p.scores = p.boundary_states = p.v_new = p.d_v_new = p.state_gradients = p.d_w = host;
  EXPECT_EQ(cuda::delta_rule::testing::workspace_bytes(p), 0u);
}

// A training forward's saved buffer: its size (T in fp32, W and U as bf16 pairs, each piece 256-byte aligned),
// none where the backward keeps nothing, and a buffer given there, or beside the stage-1 intermediates it
// replaces, named before any CUDA call.
TEST(DeltaRuleBackwardChecks, SavedBufferSizeAndMisuseNamed) {
  cuda::delta_rule::ForwardParams f;
  f.dtype = DType::bf16, f.batch = 2, f.heads = 3, f.length = 70, f.key_dim = 16, f.value_dim = 24, f.chunk_size = 32;
  const std::size_t heads = 6, L = 70, N = 3, C = 32;
  const auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  EXPECT_EQ(cuda::delta_rule::saved_bytes(f), aligned(heads * N * C * C * 4) + 2 * aligned(heads * L * 16 * 2) + 2 * aligned(heads * L * 24 * 2) +
                                                  aligned(heads * N * 24 * 16 * 2) + 2 * aligned(heads * L * 24 * 2));
  for (auto [dtype, key_dim, value_dim] : {std::tuple{DType::f16, 16, 24}, {DType::f32, 16, 24}, {DType::bf16, 12, 24},
                                           {DType::bf16, 16, 136}}) {
    cuda::delta_rule::ForwardParams other = f;
    other.dtype = dtype, other.key_dim = key_dim, other.value_dim = value_dim;
    EXPECT_EQ(cuda::delta_rule::saved_bytes(other), 0u) << cuda::name_of(dtype) << " DK=" << key_dim << " DV=" << value_dim;
  }
  f.chunk_size = 8;
  EXPECT_THROW(cuda::delta_rule::saved_bytes(f), std::invalid_argument);

  std::vector<float> host(64 * 1024);  // each tensor its own 4 KB: apart, as outputs must be
  const auto at = [&](int i) { return static_cast<void*>(host.data() + 1024 * i); };
  cuda::delta_rule::ForwardStageParams forward;
  forward.dtype = DType::f16, forward.batch = 1, forward.heads = 2, forward.length = 40, forward.key_dim = 8;
  forward.value_dim = 8, forward.chunk_size = 16;
  cuda::delta_rule::set_contiguous_strides(forward);
  forward.q = at(0), forward.k = at(1), forward.v = at(2), forward.beta = at(3), forward.output = at(4);
  forward.final_state = static_cast<float*>(at(5)), forward.workspace = at(20), forward.saved = at(40);
  expect_named("saved", "keeps nothing for these inputs", [&] { cuda::delta_rule::testing::validate(forward); });
  forward.dtype = DType::bf16, forward.wy_inverse = static_cast<float*>(at(6));
  expect_named("wy_inverse", "must be null with saved", [&] { cuda::delta_rule::testing::validate(forward); });
  forward.wy_inverse = nullptr, forward.boundary_states = static_cast<float*>(at(6));  // the state pass keeps S_[c]
  expect_named("boundary_states", "must be null with saved", [&] { cuda::delta_rule::testing::validate(forward); });

  cuda::delta_rule::BackwardStageParams backward;
  backward.dtype = DType::f32, backward.batch = 1, backward.heads = 2, backward.length = 40, backward.key_dim = 8;
  backward.value_dim = 8, backward.chunk_size = 16;
  cuda::delta_rule::set_contiguous_strides(backward);
  backward.q = at(0), backward.k = at(1), backward.v = at(2), backward.beta = at(3), backward.d_output = at(4);
  backward.dq = at(5), backward.dk = at(6), backward.dv = at(7), backward.d_beta = at(8), backward.workspace = at(20);
  backward.saved = at(40);
  expect_named("saved", "keeps nothing for these inputs", [&] { cuda::delta_rule::testing::validate(backward); });
  backward.dtype = DType::bf16, backward.w = at(9);
  expect_named("w", "must be null with saved", [&] { cuda::delta_rule::testing::validate(backward); });
  backward.w = nullptr, backward.v_new = at(9);  // stage 2 does not run either
  expect_named("v_new", "must be null with saved", [&] { cuda::delta_rule::testing::validate(backward); });
}

}  // namespace
}  // namespace deltaproof::delta_rule_gpu_suite
