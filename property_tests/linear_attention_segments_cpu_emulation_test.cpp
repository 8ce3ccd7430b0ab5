// Linear attention over segments (cuda/linear_attention_kernels.cuh: segmented_pass, docs/context_parallel.md)
// executed on the CPU emulation of CUDA blocks: the segments' sums, their exclusive scan and the pass from each
// segment's incoming state, on tensor cores (bf16) and on the generic pass (fp32), judged by the GPU suite's
// verdicts (the oracle on the exact values of the rounded inputs); the backward's three passes likewise (dK and dV
// scanned from the end); context parallelism's ranks (summaries gathered, each rank's prefix, its run). R ∈ {1, 2,
// 3, 8, 13}, segment lengths that are not multiples of C, empty segments, S_0 present and absent. One segment
// through the segment machinery gives the one-walk pass's bits. Planted: an inclusive scan (a segment starting
// from its own sum), a scan in the wrong direction (the segments after it; the backward's dK pass scanned
// forwards) and a rank prefix missing rank 0's summary, each caught. NOT a GPU result (support/cuda_emulation.hpp).
#include "property_tests/support/cuda_emulation.hpp"
#include "property_tests/support/emulation_suite.hpp"

#include "cuda/linear_attention.h"
#include "kernel_checks/linear_attention_kernel_checks.hpp"
#include "verify/comparison.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace deltaproof::cuda::linear_attention {
namespace {
using std::min;
DELTAPROOF_EMULATION_SHARED_MEMORY(smem);      // the tensor-core kernels' extern __shared__
DELTAPROOF_EMULATION_SHARED_MEMORY(smem_raw);  // the generic pass's
}  // namespace
}  // namespace deltaproof::cuda::linear_attention

#define DELTAPROOF_FORWARD_KERNELS linear_attention_segments_emulated
#include "cuda/linear_attention_kernels.cuh"

namespace deltaproof::emulation_suite {
namespace {

using verify::Comparison;
namespace kla = deltaproof::cuda::linear_attention;
namespace vl = deltaproof::verify::linear_attention;

using Faithful = kla::Faithful;
struct InclusiveScan : Faithful {  // a segment starts from the sums up to and including its own
  static constexpr bool exclusive_segment_scan = false;
};

template <class F>
void with_chunk(int chunk, F&& f) {
  switch (chunk) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    default: f(std::integral_constant<int, 64>{}); break;
  }
}

enum class Walk { one, segments, segments_scanned_backwards };

// One pass as the launcher runs it: on tensor cores (bf16, head dims ≤ 128) or the generic kernel (fp32).
template <class Policy>
void run_pass(const vl::CudaShape& s, const kla::Pass& p, bool vec, ThreadOrder order) {
  with_chunk(int(s.chunk_size), [&](auto chunk) {
    constexpr int kC = decltype(chunk)::value;
    const auto with_instance = [&](auto segments) {  // the kernels' segment instantiation, as the launcher picks it
      constexpr bool kSegments = decltype(segments)::value;
      if (kla::tensor_core_pass(s.dtype, p.key_dim, p.value_dim)) {
        const kla::TcLaunch l = kla::tensor_core_launch(p, false);
        emulation::launch({l.grid, dim3(unsigned(l.threads)), l.shared_bytes, order},
                          kla::pass_tensor_core_forward<kC, Policy, kSegments>, p, vec);
      } else {
        const dim3 grid(unsigned((p.value_dim + kla::kGenericTileV - 1) / kla::kGenericTileV), unsigned(p.batch * p.heads * p.segments));
        emulation::launch({grid, dim3(kla::kGenericThreads), kla::generic_smem_bytes<float>(p.key_dim, kC), order},
                          kla::pass_generic<float, float, kC, Policy, kSegments>, p);
      }
    };
    if (kla::over_segments(p)) with_instance(std::true_type{});
    else with_instance(std::false_type{});
  });
}

// The pass over `segments` as run_segmented launches it: the sums, their scan (planted: in the wrong direction),
// the pass from each incoming state; `sums` and `incoming` hold B·H·R of the pass's states.
template <class Policy>
void run_segmented(const vl::CudaShape& s, const kla::Pass& p, bool vec, int segments, Tensor& sums, Tensor& incoming,
                   ThreadOrder order, bool scan_backwards = false) {
  const cuda::Segmentation seg = cuda::choose_segments(segments, p.batch * p.heads, p.length, p.chunk_size, 1, 1);
  kla::SegmentedPass sp = kla::segmented_pass(p, seg, sums.data(), incoming.data());
  if (scan_backwards) sp.scan.reversed = !sp.scan.reversed;
  run_pass<Policy>(s, sp.sums, vec, order);
  emulation::launch({dim3(kla::scan_blocks(sp.scan)), dim3(kla::kScanThreads), 0, order}, kla::segment_scan_kernel<float, Policy>,
                    sp.scan);
  run_pass<Policy>(s, sp.pass, vec, order);
}

// The forward's outputs, read back (an entry never written throws), and the exact values of the rounded inputs.
struct Emulated {
  vl::KernelForward forward;
  ref::linear_attention::BatchInputs<Exact> exact;
};

// The case's inputs rounded to their dtype (S_0 to fp32) in poisoned buffers, the forward's outputs, and the
// forward's parameters over them (packed strides).
struct ForwardBuffers {
  Tensor q, k, v, s0, out, final_state;
  kla::ForwardParams params;
  explicit ForwardBuffers(const vl::CudaCase& c) {
    const vl::CudaShape& s = c.shape;
    const Index B = s.batch, H = s.heads, L = s.length, DK = s.key_dim, DV = s.value_dim;
    q = write("q", c.inputs.q, s.dtype), k = write("k", c.inputs.k, s.dtype), v = write("v", c.inputs.v, s.dtype);
    if (c.inputs.initial_state) s0 = write("initial_state", *c.inputs.initial_state, DType::f32);
    out = Tensor("output", s.dtype, B, H, L, DV), final_state = Tensor("final_state", DType::f32, B, H, DV, DK);
    params.dtype = s.dtype, params.batch = int(B), params.heads = int(H), params.length = int(L);
    params.key_dim = int(DK), params.value_dim = int(DV), params.chunk_size = int(s.chunk_size);
    params.q = q.data(), params.k = k.data(), params.v = v.data(), params.output = out.data();
    params.final_state = final_state.data(), params.initial_state = c.inputs.initial_state ? s0.data() : nullptr;
    kla::set_contiguous_strides(params);
  }
  Emulated read_back(const vl::CudaCase& c) {
    Emulated e;
    e.forward = {read(out), read(final_state), {}};
    e.exact = {read(q), read(k), read(v), std::nullopt};
    if (c.inputs.initial_state) e.exact.initial_state = read(s0);
    return e;
  }
};

// The forward of case c as the launcher runs it with `segments` (Walk::one: the one-walk pass alone).
template <class Policy = Faithful>
Emulated emulate(const vl::CudaCase& c, int segments, Walk walk, ThreadOrder order) {
  const vl::CudaShape& s = c.shape;
  ForwardBuffers b(c);
  Tensor sums("segment_sums", DType::f32, s.batch, s.heads, segments * s.value_dim, s.key_dim),
      incoming("incoming", DType::f32, s.batch, s.heads, segments * s.value_dim, s.key_dim);
  const kla::ForwardPass f = kla::forward_pass(b.params);
  if (walk == Walk::one) run_pass<Policy>(s, f.pass, f.vec, order);
  else run_segmented<Policy>(s, f.pass, f.vec, segments, sums, incoming, order, walk == Walk::segments_scanned_backwards);
  return b.read_back(c);
}

// The backward's three passes, each over `segments` (the dK and dV passes scanned from the end), on tensor
// cores as two scans where the one-walk launcher fuses them.
ref::linear_attention::BatchGradients<Exact> emulate_backward(const vl::CudaCase& c, int segments, ThreadOrder order,
                                                              bool plant_dk_scan_backwards = false) {
  const vl::CudaShape& s = c.shape;
  const Index B = s.batch, H = s.heads, L = s.length, DK = s.key_dim, DV = s.value_dim, D = std::max(DK, DV);
  Tensor q = write("q", c.inputs.q, s.dtype), k = write("k", c.inputs.k, s.dtype), v = write("v", c.inputs.v, s.dtype);
  Tensor d_out = write("d_output", c.cotangents.d_output, s.dtype);
  Tensor s0, d_sl;
  if (c.inputs.initial_state) s0 = write("initial_state", *c.inputs.initial_state, DType::f32);
  if (c.cotangents.d_final_state) d_sl = write("d_final_state", *c.cotangents.d_final_state, DType::f32);
  Tensor dq("dq", s.dtype, B, H, L, DK), dk("dk", s.dtype, B, H, L, DK), dv("dv", s.dtype, B, H, L, DV),
      ds0("d_initial_state", DType::f32, B, H, DV, DK);
  kla::BackwardParams bp;
  bp.dtype = s.dtype, bp.batch = int(B), bp.heads = int(H), bp.length = int(L), bp.key_dim = int(DK), bp.value_dim = int(DV);
  bp.chunk_size = int(s.chunk_size), bp.segments = segments;
  bp.q = q.data(), bp.k = k.data(), bp.v = v.data(), bp.d_output = d_out.data();
  bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data(), bp.d_initial_state = ds0.data();
  bp.initial_state = c.inputs.initial_state ? s0.data() : nullptr;
  bp.d_final_state = c.cotangents.d_final_state ? d_sl.data() : nullptr;
  kla::set_contiguous_strides(bp);
  const kla::BackwardPasses b = kla::backward_passes(bp);
  for (const kla::Pass* p : {&b.dq, &b.dk, &b.dv}) {
    Tensor sums("segment_sums", DType::f32, B, H, segments * D, D), incoming("incoming", DType::f32, B, H, segments * D, D);
    run_segmented<Faithful>(s, *p, b.vec, segments, sums, incoming, order, plant_dk_scan_backwards && p == &b.dk);
  }
  return {read(dq), read(dk), read(dv), read(ds0)};
}

// Context parallelism's logic (cuda/context_parallel.h) with R ranks, each holding ⌈L/R⌉ tokens of every sequence
// (the last fewer): every rank's summary written straight into its slot of the gathered buffer (the exchange, in
// process), each rank's incoming state from the slots before it, each rank's run from it (S_0 on rank 0).
Emulated emulate_ranks(const vl::CudaCase& c, int ranks, ThreadOrder order, bool plant_prefix_without_rank_0 = false) {
  const vl::CudaShape& s = c.shape;
  const Index L = s.length;
  ForwardBuffers b(c);
  Tensor gathered("gathered", DType::f32, ranks, s.batch * s.heads, s.value_dim, s.key_dim),
      incoming("incoming", DType::f32, ranks, s.batch * s.heads, s.value_dim, s.key_dim);
  const std::size_t element = cuda::size_of(s.dtype), state_bytes = std::size_t(s.batch * s.heads * s.value_dim * s.key_dim) * 4;
  const Index run = (L + ranks - 1) / ranks;
  std::vector<kla::ForwardParams> local;
  for (int r = 0; r < ranks && r * run < L; ++r) {
    kla::ForwardParams fp = b.params;  // the full tensors' strides; the run's rows from its first token
    const auto at = [&](const void* t, std::int64_t row) { return static_cast<const char*>(t) + r * run * row * std::int64_t(element); };
    fp.q = at(fp.q, fp.q_strides.row), fp.k = at(fp.k, fp.k_strides.row), fp.v = at(fp.v, fp.v_strides.row);
    fp.output = const_cast<char*>(at(fp.output, fp.output_strides.row));
    fp.length = int(std::min(run, L - r * run)), fp.segments = 1, fp.final_state = nullptr;
    local.push_back(fp);
  }
  const int R = int(local.size());
  local.back().final_state = b.final_state.data();
  for (int r = 0; r < R; ++r) {
    const kla::ForwardPass sum = kla::rank_summary_pass(local[r], r, static_cast<char*>(gathered.data()) + r * state_bytes);
    run_pass<Faithful>(s, sum.pass, sum.vec, order);
  }
  for (int r = 0; r < R; ++r) {
    kla::ForwardParams fp = local[r];
    if (r > 0) {
      void* in = static_cast<char*>(incoming.data()) + r * state_bytes;
      kla::RankPrefix prefix = kla::rank_prefix(fp, r, gathered.data(), in);
      if (plant_prefix_without_rank_0) prefix.gathered = static_cast<char*>(gathered.data()) + state_bytes, --prefix.rank;
      emulation::launch({dim3(kla::prefix_blocks(prefix)), dim3(kla::kScanThreads), 0, order}, kla::rank_prefix_kernel<float>, prefix);
      fp.initial_state = in, fp.initial_state_strides = kla::contiguous(int(s.heads), int(s.value_dim), int(s.key_dim));
    }
    const kla::ForwardPass f = kla::forward_pass(fp);
    run_pass<Faithful>(s, f.pass, f.vec, order);
  }
  return b.read_back(c);
}

bool agrees(const vl::CudaCase& c, const Emulated& e, const std::string& label) {
  const std::vector<Comparison> rows = vl::judge_forward(c.shape, e.exact, e.forward, false);
  std::cout << label << "\n" << verify::format_table(verify::Verdict{verify::worst_per_tensor(rows)});
  return verify::all_agree(rows);
}

std::string label(const vl::CudaShape& s, int segments) { return vl::describe(s) + " segments=" + std::to_string(segments); }

// bf16 on tensor cores (16-byte and element-wise copies) and fp32 on the generic pass; lengths that no segment
// count divides into whole chunks.
const vl::CudaShape kShapes[] = {
    {1, 2, 100, 64, 32, 16, true, DType::bf16},
    {1, 1, 70, 128, 128, 32, false, DType::bf16},
    {2, 1, 45, 24, 40, 16, true, DType::f32},
    {1, 1, 53, 60, 100, 16, true, DType::bf16},  // head dims no multiple of 8: the element-wise copies
};

TEST(LinearAttentionSegmentsCpuEmulation, SegmentsMatchOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  std::uint64_t seed = 31;
  for (const vl::CudaShape& s : kShapes)
    for (int segments : {2, 3, 8, 13}) {
      const vl::CudaCase c = vl::make_case(s, seed++);
      const ThreadOrder order = segments % 2 ? ThreadOrder::shuffled : ThreadOrder::ascending;
      EXPECT_TRUE(agrees(c, emulate(c, segments, Walk::segments, order), label(s, segments))) << label(s, segments);
    }
}

// One segment through the segment machinery (its sum, the scan from S_0, the pass from S_0 + 0) gives the bits
// of the one walk, which the launcher runs for segments = 1.
TEST(LinearAttentionSegmentsCpuEmulation, OneSegmentIsTheOneWalkBitForBit) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const vl::CudaShape& s : kShapes) {
    const vl::CudaCase c = vl::make_case(s, 3);
    const Emulated one = emulate(c, 1, Walk::one, ThreadOrder::ascending);
    const Emulated segmented = emulate(c, 1, Walk::segments, ThreadOrder::ascending);
    EXPECT_TRUE(one.forward.output.data == segmented.forward.output.data) << vl::describe(s);  // == over ℚ
    EXPECT_TRUE(one.forward.final_state.data == segmented.forward.final_state.data) << vl::describe(s);
  }
}

// The backward's gradients judged against the oracle on the exact values of the case's rounded inputs.
bool backward_agrees(const vl::CudaCase& c, const ref::linear_attention::BatchGradients<Exact>& gradients, const std::string& label) {
  const vl::CudaShape& s = c.shape;
  const auto exact = [&](const Tensor4<Exact>& x, DType dtype) { return read(write("exact", x, dtype)); };  // as rounded
  ref::linear_attention::BatchInputs<Exact> in{exact(c.inputs.q, s.dtype), exact(c.inputs.k, s.dtype), exact(c.inputs.v, s.dtype),
                                               std::nullopt};
  if (c.inputs.initial_state) in.initial_state = exact(*c.inputs.initial_state, DType::f32);
  ref::linear_attention::BatchCotangents<Exact> cot{exact(c.cotangents.d_output, s.dtype), std::nullopt};
  if (c.cotangents.d_final_state) cot.d_final_state = exact(*c.cotangents.d_final_state, DType::f32);
  const std::vector<Comparison> rows = vl::judge_backward(s, in, cot, gradients);
  std::cout << label << " backward\n" << verify::format_table(verify::Verdict{verify::worst_per_tensor(rows)});
  return verify::all_agree(rows);
}

TEST(LinearAttentionSegmentsCpuEmulation, SegmentedBackwardMatchesOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  std::uint64_t seed = 71;
  for (const vl::CudaShape& s : kShapes)
    for (int segments : {1, 3, 8}) {
      const vl::CudaCase c = vl::make_case(s, seed++);
      EXPECT_TRUE(backward_agrees(c, emulate_backward(c, segments, ThreadOrder::shuffled), label(s, segments))) << label(s, segments);
    }
}

TEST(LinearAttentionSegmentsCpuEmulation, RanksOfAContextParallelForwardMatchOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  std::uint64_t seed = 91;
  for (const vl::CudaShape& s : kShapes)
    for (int ranks : {1, 2, 3, 8}) {
      const vl::CudaCase c = vl::make_case(s, seed++);
      EXPECT_TRUE(agrees(c, emulate_ranks(c, ranks, ThreadOrder::shuffled), vl::describe(s) + " ranks=" + std::to_string(ranks)));
    }
}

TEST(LinearAttentionSegmentsCpuEmulation, PlantedScanBugsAreCaught) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const vl::CudaShape& s : kShapes) {
    const vl::CudaCase c = vl::make_case(s, 5);
    EXPECT_FALSE(agrees(c, emulate<InclusiveScan>(c, 3, Walk::segments, ThreadOrder::ascending), "planted: inclusive scan"))
        << vl::describe(s);
    EXPECT_FALSE(agrees(c, emulate(c, 3, Walk::segments_scanned_backwards, ThreadOrder::ascending), "planted: scan backwards"))
        << vl::describe(s);
    EXPECT_FALSE(backward_agrees(c, emulate_backward(c, 3, ThreadOrder::ascending, true), "planted: dK pass scanned forwards"))
        << vl::describe(s);
    EXPECT_FALSE(agrees(c, emulate_ranks(c, 3, ThreadOrder::ascending, true), "planted: rank prefix without rank 0"))
        << vl::describe(s);
  }
}

}  // namespace
}  // namespace deltaproof::emulation_suite
