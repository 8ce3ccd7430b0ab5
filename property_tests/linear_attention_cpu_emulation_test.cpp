// The linear-attention tensor-core passes' own source (cuda/linear_attention_passes.cuh:
// pass_tensor_core_forward for the forward and the backward's dQ pass, pass_tensor_core_dk_dv for the
// fused dK/dV pass) executed on the CPU emulation of CUDA blocks (support/cuda_emulation.hpp), with the
// passes the product's launchers build (forward_pass, backward_passes), and judged by the GPU suite's
// verdicts (verify::linear_attention::judge_forward, judge_backward: the oracle on the exact values of the
// rounded inputs, within kernel_checks/linear_attention_kernel_bound.hpp). NOT a GPU result: mma.sync sums
// exactly and truncates once, threads run in a chosen order between barriers, memory is NaN-poisoned.
// What it shows before GPU time is spent: fragment layouts, the transposed output and its exchange between
// the key halves, partial chunks, both copy paths (16-byte and element-wise), S_0 and every entry written.
// Planted bugs go in through the kernels' Policy.
#include "property_tests/support/cuda_emulation.hpp"
#include "property_tests/support/emulation_suite.hpp"

#include "cuda/linear_attention.h"
#include "verify/comparison.hpp"
#include "kernel_checks/linear_attention_kernel_checks.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

namespace deltaproof::cuda::linear_attention {
namespace {
using std::min;
DELTAPROOF_EMULATION_SHARED_MEMORY(smem);  // the kernels' extern __shared__
}  // namespace
}  // namespace deltaproof::cuda::linear_attention

// The kernels' source (decode_kernels.cuh, which it includes, under its own namespace): never the nvcc
// build's launch stubs.
#define DELTAPROOF_FORWARD_KERNELS linear_attention_emulated
#include "cuda/linear_attention_kernels.cuh"

namespace deltaproof::emulation_suite {
namespace {

using verify::Comparison;
namespace kla = deltaproof::cuda::linear_attention;
namespace vl = deltaproof::verify::linear_attention;
namespace la = deltaproof::ref::linear_attention;

using Faithful = kla::Faithful;
// S and P enter the tensor cores as one bf16 rounding (no lo part).
struct OneRounding : Faithful {
  static constexpr bool splits_operands = false;
};
// The causal mask lets each token see the next one (inside a 16 × 16 score block).
struct SeesNextToken : Faithful {
  __device__ __forceinline__ static constexpr bool in_causal_mask(int i, int j) { return j <= i + 1; }
};

// Runs f(std::integral_constant<int, C>) for the chunk size C of the kernels.
template <class F>
void with_chunk(int chunk, F&& f) {
  switch (chunk) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    default: throw std::invalid_argument("chunk size " + std::to_string(chunk));
  }
}

struct Emulated {
  vl::KernelForward forward;
  la::BatchGradients<Exact> gradients;
  la::BatchInputs<Exact> exact;  // the exact values of the rounded inputs
  la::BatchCotangents<Exact> exact_cot;
};

// The case's inputs rounded to bf16 (S_0, dS_L to fp32) in poisoned buffers, the forward and the backward
// launched as the product's launchers launch them on tensor cores, every output read back (an entry never
// written throws).
template <class Policy = Faithful>
Emulated emulate(const vl::CudaCase& c, ThreadOrder order) {
  const vl::CudaShape& s = c.shape;
  const Index B = s.batch, H = s.heads, L = s.length, DK = s.key_dim, DV = s.value_dim, C = s.chunk_size;
  const Index N = (L + C - 1) / C;
  Tensor q = write("q", c.inputs.q, s.dtype), k = write("k", c.inputs.k, s.dtype), v = write("v", c.inputs.v, s.dtype);
  Tensor d_out = write("d_output", c.cotangents.d_output, s.dtype);
  Tensor s0, d_sl;
  if (c.inputs.initial_state) s0 = write("initial_state", *c.inputs.initial_state, DType::f32);
  if (c.cotangents.d_final_state) d_sl = write("d_final_state", *c.cotangents.d_final_state, DType::f32);
  Tensor out("output", s.dtype, B, H, L, DV), final_state("final_state", DType::f32, B, H, DV, DK),
      boundary("boundary_states", DType::f32, B, H, N * DV, DK);
  Tensor dq("dq", s.dtype, B, H, L, DK), dk("dk", s.dtype, B, H, L, DK), dv("dv", s.dtype, B, H, L, DV),
      ds0("d_initial_state", DType::f32, B, H, DV, DK);

  kla::ForwardParams fp;
  fp.dtype = s.dtype, fp.batch = int(B), fp.heads = int(H), fp.length = int(L), fp.key_dim = int(DK), fp.value_dim = int(DV);
  fp.chunk_size = int(C);
  fp.q = q.data(), fp.k = k.data(), fp.v = v.data(), fp.output = out.data();
  fp.initial_state = c.inputs.initial_state ? s0.data() : nullptr;
  fp.final_state = final_state.data(), fp.boundary_states = boundary.data();
  kla::set_contiguous_strides(fp);
  kla::BackwardParams bp;
  bp.dtype = s.dtype, bp.batch = int(B), bp.heads = int(H), bp.length = int(L), bp.key_dim = int(DK), bp.value_dim = int(DV);
  bp.chunk_size = int(C);
  bp.q = q.data(), bp.k = k.data(), bp.v = v.data(), bp.d_output = d_out.data();
  bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
  bp.initial_state = fp.initial_state;
  bp.d_final_state = c.cotangents.d_final_state ? d_sl.data() : nullptr;
  bp.d_initial_state = ds0.data();
  kla::set_contiguous_strides(bp);
  if (!kla::tensor_core_pass(s.dtype, int(DK), int(DV))) throw std::invalid_argument("not a tensor-core case");

  with_chunk(int(C), [&](auto chunk) {
    constexpr int kC = decltype(chunk)::value;
    const auto launch = [&](const kla::Pass& p, bool fused, auto kernel, auto... args) {
      const kla::TcLaunch l = kla::tensor_core_launch(p, fused);
      emulation::launch({l.grid, dim3(unsigned(l.threads)), l.shared_bytes, order}, kernel, args...);
    };
    const kla::ForwardPass f = kla::forward_pass(fp);
    launch(f.pass, false, kla::pass_tensor_core_forward<kC, Policy>, f.pass, f.vec);
    const kla::BackwardPasses b = kla::backward_passes(bp);
    launch(b.dq, false, kla::pass_tensor_core_forward<kC, Policy>, b.dq, b.vec);
    launch(b.dv, true, kla::pass_tensor_core_dk_dv<kC, Policy>, b.dv, b.dk, b.vec);
  });

  Emulated r;
  r.forward = {read(out), read(final_state), read(boundary)};
  r.gradients = {read(dq), read(dk), read(dv), read(ds0)};
  r.exact = {read(q), read(k), read(v), std::nullopt};
  if (c.inputs.initial_state) r.exact.initial_state = read(s0);
  r.exact_cot = {read(d_out), std::nullopt};
  if (c.cotangents.d_final_state) r.exact_cot.d_final_state = read(d_sl);
  return r;
}

std::vector<Comparison> verdicts(const vl::CudaCase& c, const Emulated& e) {
  std::vector<Comparison> rows = vl::judge_forward(c.shape, e.exact, e.forward, true);
  const std::vector<Comparison> backward = vl::judge_backward(c.shape, e.exact, e.exact_cot, e.gradients);
  rows.insert(rows.end(), backward.begin(), backward.end());
  return rows;
}

// Prints the worst row of each tensor; true when every row agrees.
bool agrees(const std::vector<Comparison>& rows, const std::string& label) {
  std::cout << label << "\n" << verify::format_table(verify::Verdict{verify::worst_per_tensor(rows)});
  return verify::all_agree(rows);
}

// bf16 shapes on tensor cores: the 16-byte copy path (head dims multiples of 8) and the element-wise one
// (100 and 60), every C, partial last chunks, S_0 and dS_L present and absent, several heads.
const vl::CudaShape kShapes[] = {
    {1, 2, 100, 128, 128, 64, true, DType::bf16},
    {1, 1, 70, 100, 60, 32, true, DType::bf16},
    {2, 1, 37, 64, 128, 16, false, DType::bf16},
    {1, 1, 64, 128, 32, 64, false, DType::bf16},
    {1, 1, 45, 72, 96, 16, true, DType::bf16},  // head dims under 128 on the 16-byte copy path
};

TEST(LinearAttentionCpuEmulation, TensorCorePassesMatchOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  std::uint64_t seed = 11;
  for (const vl::CudaShape& s : kShapes)
    for (ThreadOrder order : {ThreadOrder::ascending, ThreadOrder::shuffled}) {
      const vl::CudaCase c = vl::make_case(s, seed++);
      EXPECT_TRUE(agrees(verdicts(c, emulate(c, order)), vl::describe(s))) << vl::describe(s);
    }
}

// Thread order changes no bit: every sum has a fixed order.
TEST(LinearAttentionCpuEmulation, ThreadOrderChangesNoBit) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  const vl::CudaCase c = vl::make_case(kShapes[0], 5);
  const Emulated a = emulate(c, ThreadOrder::ascending), b = emulate(c, ThreadOrder::descending);
  const auto same = [](const Tensor4<Exact>& x, const Tensor4<Exact>& y) { return x.data == y.data; };  // == over ℚ
  EXPECT_TRUE(same(a.forward.output, b.forward.output) && same(a.forward.final_state, b.forward.final_state) &&
              same(a.forward.boundary_states, b.forward.boundary_states));
  EXPECT_TRUE(same(a.gradients.dq, b.gradients.dq) && same(a.gradients.dk, b.gradients.dk) &&
              same(a.gradients.dv, b.gradients.dv) && same(a.gradients.d_initial_state, b.gradients.d_initial_state));
}

// Each planted bug puts some tensor outside its bound.
TEST(LinearAttentionCpuEmulation, PlantedBugsAreCaught) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  const vl::CudaCase c = vl::make_case(kShapes[0], 7);
  EXPECT_FALSE(agrees(verdicts(c, emulate<OneRounding>(c, ThreadOrder::ascending)), "planted: one rounding of S and P"));
  EXPECT_FALSE(agrees(verdicts(c, emulate<SeesNextToken>(c, ThreadOrder::ascending)), "planted: sees the next token"));
}

}  // namespace
}  // namespace deltaproof::emulation_suite
