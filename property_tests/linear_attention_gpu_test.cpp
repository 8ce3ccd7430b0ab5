// Linear attention kernels (cuda/linear_attention.h) against the exact oracle
// (reference/linear_attention.hpp), on the exact values of the kernels' rounded inputs.
//
// The cases, kernel runs, bounds and comparisons are kernel_checks/linear_attention_kernel_checks.hpp's
// (the bound itself is derived in kernel_checks/linear_attention_kernel_bound.hpp: inputs rounded once on
// the host, fp32/fp64 accumulation along chains of depth m = L + ceil(L/C) + DK + DV + C + 8, one
// final rounding of a bf16/fp16 output). This file holds the generators and the assertions over the
// verify::Comparison rows: a property fails when any row (one tensor of one head) is outside its
// bound, and prints the case, then each such row's worst index, error, bound, max and RMS error.
#include "cuda/linear_attention.h"
#include "cuda/testing/linear_attention_planted.h"
#include "property_tests/support/gpu.hpp"
#include "reference/error_report.hpp"
#include "reference/linear_attention.hpp"
#include "property_tests/support/case_rules.hpp"
#include "kernel_checks/device_tensors.hpp"
#include "kernel_checks/linear_attention_kernel_checks.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>

namespace deltaproof::testing {
namespace {

using namespace deltaproof::verify;                      // device tensors, Comparison rows, case rules
using namespace deltaproof::verify::linear_attention;    // the kernels' cases, runs and checks
namespace la = ref::linear_attention;
namespace kla = cuda::linear_attention;
using cuda::DType;
using ref::Exact;
using ref::Index;
using ref::Matrix;
using ref::Tensor4;

// ---------------------------------------------------------------------------------------
// Cases: shapes first, then the tensors of that shape from a seed (verify's make_case)

struct GpuLimits {
  Index max_length = 140, max_dim = 40, max_heads = 2;
  bool fp64_only = false;
};

rc::Gen<DType> gen_dtype() { return rc::gen::element(DType::f32, DType::bf16, DType::f16, DType::f64); }

// C ∈ {16, 32, 64}; L ∈ {1, 2, C−1, C, C+1, 2C+3} or anything up to the cap; awkward head dims
// (property_tests/support/case_rules.hpp). Shrinking reduces the shape; the seed is printed with it.
rc::Gen<CudaCase> gen_gpu_case(GpuLimits limits = {}) {
  auto shape = rc::gen::mapcat(rc::gen::elementOf(kernel_chunk_sizes()), [limits](Index C) {
    auto length = rc::gen::oneOf(rc::gen::elementOf(boundary_and_partial_lengths(C)),
                                 rc::gen::inRange<Index>(1, limits.max_length + 1));
    auto dim = rc::gen::oneOf(rc::gen::elementOf(awkward_head_dims(limits.max_dim)),
                              rc::gen::inRange<Index>(1, limits.max_dim + 1));
    return rc::gen::build<CudaShape>(
        rc::gen::set(&CudaShape::batch, rc::gen::inRange<Index>(1, 3)),
        rc::gen::set(&CudaShape::heads, rc::gen::inRange<Index>(1, limits.max_heads + 1)),
        rc::gen::set(&CudaShape::length, length), rc::gen::set(&CudaShape::key_dim, dim),
        rc::gen::set(&CudaShape::value_dim, dim), rc::gen::set(&CudaShape::chunk_size, rc::gen::just(C)),
        rc::gen::set(&CudaShape::with_initial_state, rc::gen::arbitrary<bool>()),
        rc::gen::set(&CudaShape::dtype, limits.fp64_only ? rc::gen::just(DType::f64) : gen_dtype()));
  });
  return rc::gen::mapcat(shape, [](const CudaShape& s) {
    return rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [s](std::uint64_t seed) { return make_case(s, seed); });
  });
}

// ---------------------------------------------------------------------------------------
// Assertions over verify's rows (the planted-bug tests run the same checks on broken kernels)

// Empty when every row agrees; otherwise the case, then each row outside its bound. A check that
// throws (a kernel that left an entry unwritten reads back as non-finite) fails with the exception.
std::string failures(const CudaShape& s, const std::function<std::vector<Comparison>()>& check) {
  try {
    const std::vector<Comparison> rows = check();
    if (all_agree(rows)) return {};
    return describe(s) + "\n" + describe_failures(rows);
  } catch (const std::exception& e) {
    return describe(s) + ": exception: " + e.what();
  }
}

std::string forward_failures(const CudaCase& c, const Kernels& kernels = {}) {
  return failures(c.shape, [&] { return check_forward(c, true, kernels); });
}
std::string backward_failures(const CudaCase& c, const Kernels& kernels = {}) {
  return failures(c.shape, [&] { return check_backward(c, kernels); });
}
std::string decode_failures(const CudaCase& c, const Kernels& kernels = {}) {
  return failures(c.shape, [&] { return check_decode(c, kernels); });
}
std::string chunk_size_failures(const CudaCase& c) { return failures(c.shape, [&] { return check_chunk_sizes_agree(c); }); }
std::string prefill_failures(const CudaCase& c, Index prefill) {
  return failures(c.shape, [&] { return check_decode_after_prefill(c, prefill); });
}

// The fp64 kernels' central difference against their backward along a direction drawn from
// `direction_seed` (every input moves; verify's check_directional_derivative).
std::string directional_failure(const CudaCase& c, std::uint64_t direction_seed, const Kernels& kernels = {}) {
  CudaShape s = c.shape;
  s.dtype = DType::f64;
  try {
    const DirectionalCheck d = check_directional_derivative(c, make_case(s, direction_seed).inputs, "directional derivative", kernels);
    if (d.row.agrees()) return {};
    std::ostringstream os;
    os << describe(s) << ": central difference " << d.central_difference << " vs backward " << d.backward << ", gap "
       << d.row.error << " > allowed " << d.row.bound << " (truncation " << d.truncation << ")";
    return os.str();
  } catch (const std::exception& e) {
    return describe(s) + ": exception: " + e.what();
  }
}

#define DELTAPROOF_PROPERTY_OK(expr)          \
  do {                                        \
    const std::string failure_ = (expr);      \
    if (!failure_.empty()) RC_FAIL(failure_); \
  } while (0)


// ---------------------------------------------------------------------------------------
// GPU properties (rc::check inside TEST, so that the test can skip first)

TEST(LinearAttentionGpu, ForwardMatchesOracleWithinRoundingBound) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("chunkwise forward vs oracle", [] { DELTAPROOF_PROPERTY_OK(forward_failures(*gen_gpu_case())); }));
}

// The forward over R segments (sums, their exclusive scan, each segment from its incoming state), R ∈ {1, 2, 3,
// 8, 13} on lengths that are mostly not multiples of R·C, some segments empty, judged as the one walk is.
TEST(LinearAttentionGpu, SegmentedForwardMatchesOracleWithinRoundingBound) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("segmented forward vs oracle", [] {
    const CudaCase c = *gen_gpu_case({.max_length = 300});
    const int segments = *rc::gen::element(1, 2, 3, 8, 13);
    Kernels kernels;
    kernels.forward = [segments](kla::ForwardParams p) {
      p.segments = segments;
      kla::forward(p);
    };
    RC_TAG(segments);
    DELTAPROOF_PROPERTY_OK(failures(c.shape, [&] { return check_forward(c, false, kernels); }));
  }));
}

// The backward's three passes over R segments (the dK and dV passes scanning the runs' sums from the end).
TEST(LinearAttentionGpu, SegmentedBackwardMatchesOracleWithinRoundingBound) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("segmented backward vs oracle", [] {
    const CudaCase c = *gen_gpu_case({.max_length = 200, .max_dim = 32});
    const int segments = *rc::gen::element(1, 2, 3, 8, 13);
    Kernels kernels;
    kernels.backward = [segments](kla::BackwardParams p) {
      p.segments = segments;
      kla::backward(p);
    };
    RC_TAG(segments);
    DELTAPROOF_PROPERTY_OK(backward_failures(c, kernels));
  }));
}

TEST(LinearAttentionGpu, BackwardMatchesOracleWithinRoundingBound) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("chunkwise backward vs oracle", [] {
    DELTAPROOF_PROPERTY_OK(backward_failures(*gen_gpu_case({.max_length = 100, .max_dim = 32})));
  }));
}

TEST(LinearAttentionGpu, ChunkSizesAgree) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("C = 16, 32, 64 agree", [] {
    DELTAPROOF_PROPERTY_OK(chunk_size_failures(*gen_gpu_case({.max_length = 150, .max_dim = 32})));
  }));
}

TEST(LinearAttentionGpu, DecodeMatchesTokenRecurrence) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("decode vs token recurrence", [] {
    const CudaCase c = *gen_gpu_case({.max_length = 8, .max_dim = 64, .max_heads = 3});
    DELTAPROOF_PROPERTY_OK(decode_failures(c));
  }));
}

TEST(LinearAttentionGpu, DecodeAfterPrefillEqualsOneChunkwisePass) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("prefill + decode == one pass", [] {
    const CudaCase c = *gen_gpu_case({.max_length = 120, .max_dim = 32});
    RC_PRE(c.shape.length >= 2);
    const Index prefill = *rc::gen::inRange<Index>(1, c.shape.length);
    DELTAPROOF_PROPERTY_OK(prefill_failures(c, prefill));
  }));
}

// Directional central difference of the kernel's own fp64 forward against its fp64 backward (the
// derivation is above verify::linear_attention::check_directional_derivative).
TEST(LinearAttentionGpu, Fp64CentralDifferenceMatchesBackward) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("fp64 central difference vs backward", [] {
    const CudaCase c = *gen_gpu_case({.max_length = 70, .max_dim = 16, .max_heads = 1, .fp64_only = true});
    DELTAPROOF_PROPERTY_OK(directional_failure(c, *rc::gen::arbitrary<std::uint64_t>()));
  }));
}

// ---------------------------------------------------------------------------------------
// Fixed shapes the generators rarely reach: head dims up to 256, B·H = 4096.

TEST(LinearAttentionGpu, AwkwardAndLargeHeadDims) {
  DELTAPROOF_REQUIRE_GPU();
  const CudaShape shapes[] = {
      {1, 1, 20, 256, 256, 16, true, DType::f32},  {1, 1, 18, 128, 256, 16, false, DType::bf16},
      {1, 2, 70, 100, 60, 32, true, DType::bf16},  {1, 1, 129, 128, 128, 64, true, DType::bf16},
      {2, 1, 81, 27, 9, 64, true, DType::f16},     {1, 1, 50, 1, 129, 16, true, DType::f64},
      {1, 1, 65, 64, 128, 64, false, DType::bf16}, {1, 1, 63, 60, 60, 16, true, DType::bf16},
  };
  std::uint64_t seed = 1;
  for (const CudaShape& s : shapes) {
    const CudaCase c = make_case(s, seed++);
    EXPECT_EQ(forward_failures(c), "") << "seed " << seed - 1;
    EXPECT_EQ(backward_failures(c), "") << "seed " << seed - 1;
  }
}

TEST(LinearAttentionGpu, ManyHeads) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f32}) {
    const CudaCase c = make_case({64, 64, 5, 3, 4, 16, true, dtype}, 4096);  // tiny heads: the oracle runs 4096 times
    EXPECT_EQ(forward_failures(c), "");
    EXPECT_EQ(backward_failures(c), "");
    EXPECT_EQ(decode_failures(c), "");
  }
}

// ---------------------------------------------------------------------------------------
// Determinism: repeated runs are bitwise equal (no atomics; fixed reduction orders).

TEST(LinearAttentionGpu, RepeatedRunsAreBitwiseEqual) {
  DELTAPROOF_REQUIRE_GPU();
  for (const CudaShape& s : {CudaShape{2, 3, 333, 128, 128, 64, true, DType::bf16}, CudaShape{1, 2, 201, 100, 36, 32, true, DType::f32}}) {
    const DeviceInputs in = upload_case(make_case(s, 7));
    const auto run_all = [&] {
      std::vector<std::vector<unsigned char>> bytes;
      DeviceTensor out = allocate(s.dtype, s.batch, s.heads, s.length, s.value_dim);
      DeviceTensor fin = allocate(DType::f32, s.batch, s.heads, s.value_dim, s.key_dim);
      kla::ForwardParams f;
      f.dtype = s.dtype, f.batch = int(s.batch), f.heads = int(s.heads), f.length = int(s.length);
      f.key_dim = int(s.key_dim), f.value_dim = int(s.value_dim), f.chunk_size = int(s.chunk_size);
      f.q = in.q.device.data(), f.k = in.k.device.data(), f.v = in.v.device.data(), f.output = out.data();
      f.initial_state = in.initial_state->device.data(), f.final_state = fin.data();
      kla::set_contiguous_strides(f);
      kla::forward(f);
      bytes.push_back(download_bytes(out));
      bytes.push_back(download_bytes(fin));
      DeviceTensor dq = allocate(s.dtype, s.batch, s.heads, s.length, s.key_dim);
      DeviceTensor dk = allocate(s.dtype, s.batch, s.heads, s.length, s.key_dim);
      DeviceTensor dv = allocate(s.dtype, s.batch, s.heads, s.length, s.value_dim);
      kla::BackwardParams bp;
      bp.dtype = s.dtype, bp.batch = int(s.batch), bp.heads = int(s.heads), bp.length = int(s.length);
      bp.key_dim = int(s.key_dim), bp.value_dim = int(s.value_dim), bp.chunk_size = int(s.chunk_size);
      bp.q = f.q, bp.k = f.k, bp.v = f.v, bp.d_output = in.d_output.device.data();
      bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
      bp.initial_state = f.initial_state, bp.d_final_state = in.d_final_state->device.data(), bp.d_initial_state = fin.data();
      kla::set_contiguous_strides(bp);
      kla::backward(bp);
      for (const DeviceTensor* t : {&dq, &dk, &dv, &fin}) bytes.push_back(download_bytes(*t));
      return bytes;
    };
    const auto first = run_all();
    for (int repeat = 0; repeat < 3; ++repeat) EXPECT_TRUE(run_all() == first) << describe(s) << ", repeat " << repeat;
  }
}

// ---------------------------------------------------------------------------------------
// Accuracy at the design page's shape: bf16, B=2, H=4, L=512, DK=DV=128; q ~ N(0,1)/√D,
// k = normalize(N(0,1)), v ~ N(0,1), dO ~ N(0,1). Reference: the oracle in double on the exact
// bf16 values of the inputs (double's error, ~1e-16·L relative, is far below what is measured).

Tensor4<Exact> normal_tensor(std::mt19937_64& rng, Index b, Index h, Index r, Index c, double scale, bool normalize_rows) {
  std::normal_distribution<double> n(0.0, 1.0);
  Tensor4<Exact> t(b, h, r, c);
  std::vector<double> row(static_cast<size_t>(c));
  for (size_t i = 0; i < t.data.size(); i += row.size()) {
    double norm = 0;
    for (double& x : row) x = n(rng) * scale, norm += x * x;
    for (size_t j = 0; j < row.size(); ++j) t.data[i + j] = Exact(normalize_rows ? row[j] / std::sqrt(norm) : row[j]);
  }
  return t;
}

TEST(LinearAttentionGpu, AccuracyAtDesignShape) {
  DELTAPROOF_REQUIRE_GPU();
  const Index B = 2, H = 4, L = 512, D = 128;
  std::mt19937_64 rng(20240601);
  CudaCase c;
  c.shape = {B, H, L, D, D, 64, false, DType::bf16};
  c.inputs.q = normal_tensor(rng, B, H, L, D, 1 / std::sqrt(double(D)), false);
  c.inputs.k = normal_tensor(rng, B, H, L, D, 1, true);
  c.inputs.v = normal_tensor(rng, B, H, L, D, 1, false);
  c.cotangents.d_output = normal_tensor(rng, B, H, L, D, 1, false);
  const DeviceInputs in = upload_case(c);
  const auto as_double = [](const Tensor4<Exact>& t) { return ref::tensor_cast<double>(t); };
  la::BatchInputs<double> ref_in{as_double(in.exact.q), as_double(in.exact.k), as_double(in.exact.v), std::nullopt};
  la::BatchCotangents<double> ref_cot{as_double(in.exact_cot.d_output), std::nullopt};
  const auto reference = la::batched(ref_in, [](const la::Inputs<double>& x) { return la::chunkwise(x, 64); });
  const auto reference_grad = la::batched_backward(
      ref_in, ref_cot, [](const la::Inputs<double>& x, const la::Cotangents<double>& g) { return la::chunkwise_backward(x, g, 64); });
  const auto flat = [](const Tensor4<double>& t) {
    return Matrix<double>(Eigen::Map<const Matrix<double>>(t.data.data(), Index(t.data.size()), 1));
  };
  const auto rounded_to_bf16 = [](const Matrix<double>& m) {
    return Matrix<double>(m.unaryExpr([](double x) { return double(static_cast<float>(Eigen::bfloat16(static_cast<float>(x)))); }));
  };
  std::printf("accuracy at B=2 H=4 L=512 D=128 bf16 (relative L2 vs float64 oracle on the rounded inputs)\n");
  std::printf("  bf16 rounding of the exact output alone: %.3e\n",
              ref::relative_l2(rounded_to_bf16(flat(reference.output)), flat(reference.output)));
  for (int C : kla::supported_chunk_sizes) {
    CudaShape s = c.shape;
    s.chunk_size = C;
    const KernelForward k = run_forward(s, in, C, false);
    const auto g = run_backward(s, in);
    const double errors[] = {
        ref::relative_l2(flat(ref::tensor_cast<double>(k.output)), flat(reference.output)),
        ref::relative_l2(flat(ref::tensor_cast<double>(g.dq)), flat(reference_grad.dq)),
        ref::relative_l2(flat(ref::tensor_cast<double>(g.dk)), flat(reference_grad.dk)),
        ref::relative_l2(flat(ref::tensor_cast<double>(g.dv)), flat(reference_grad.dv)),
    };
    std::printf("  C=%2d  o %.3e  dq %.3e  dk %.3e  dv %.3e\n", C, errors[0], errors[1], errors[2], errors[3]);
    for (double e : errors) EXPECT_LE(e, 2.35e-3) << "C=" << C;
  }
}

// ---------------------------------------------------------------------------------------
// Argument validation. The first group needs no device: sizes and null pointers are checked
// before any CUDA call, so these run (and pass) on CI too.

kla::ForwardParams valid_shape_forward() {
  kla::ForwardParams p;
  p.dtype = DType::bf16, p.batch = 2, p.heads = 3, p.length = 100, p.key_dim = 64, p.value_dim = 64, p.chunk_size = 64;
  kla::set_contiguous_strides(p);
  return p;
}

TEST(LinearAttentionGpuArguments, RejectsBadSizesBeforeAnyCudaCall) {
  const auto message = [](auto edit) {
    kla::ForwardParams p = valid_shape_forward();
    edit(p);
    return rejection([&] { kla::forward(p); });
  };
  EXPECT_TRUE(starts_with(message([](auto& p) { p.chunk_size = 48; }), "chunk_size")) << message([](auto& p) { p.chunk_size = 48; });
  EXPECT_TRUE(starts_with(message([](auto& p) { p.key_dim = 0; kla::set_contiguous_strides(p); }), "key_dim"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.value_dim = 257; kla::set_contiguous_strides(p); }), "value_dim"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.length = 0; }), "length"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.batch = 0; }), "batch"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.batch = 300, p.heads = 300; kla::set_contiguous_strides(p); }), "batch*heads"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.q_strides.row = 32; }), "q_strides.row"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.output_strides.head = 10; }), "output_strides.head"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.dtype = static_cast<DType>(42); }), "dtype"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.segments = -1; }), "segments"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.segments = 2, p.boundary_states = &p; }), "segments"));
  EXPECT_TRUE(starts_with(message([](auto& p) { p.batch = 2, p.heads = 2, p.segments = 20000; kla::set_contiguous_strides(p); }),
                          "segments"));
}

TEST(LinearAttentionGpuArguments, RejectsNullPointersBeforeAnyCudaCall) {
  kla::ForwardParams f = valid_shape_forward();  // every pointer null
  EXPECT_TRUE(starts_with(rejection([&] { kla::forward(f); }), "q: must not be null"));
  kla::BackwardParams b;
  b.batch = 1, b.heads = 1, b.length = 5, b.key_dim = 3, b.value_dim = 4, b.chunk_size = 16;
  kla::set_contiguous_strides(b);
  EXPECT_TRUE(starts_with(rejection([&] { kla::backward(b); }), "q: must not be null"));
  b.chunk_size = 8;
  EXPECT_TRUE(starts_with(rejection([&] { kla::backward(b); }), "chunk_size"));
  kla::DecodeParams d;
  d.batch = 1, d.heads = 1, d.tokens = 1, d.key_dim = 3, d.value_dim = 4;
  kla::set_contiguous_strides(d);
  EXPECT_TRUE(starts_with(rejection([&] { kla::decode(d); }), "q: must not be null"));
  d.tokens = 0;
  kla::set_contiguous_strides(d);
  EXPECT_TRUE(starts_with(rejection([&] { kla::decode(d); }), "tokens"));
}

// With a device: host pointers and misalignment are rejected, and a rejected call touches nothing.
TEST(LinearAttentionGpuArguments, RejectsHostAndMisalignedPointersAndTouchesNothing) {
  DELTAPROOF_REQUIRE_GPU();
  kla::ForwardParams p = valid_shape_forward();
  DeviceTensor q = allocate(DType::bf16, 2, 3, 100, 64), k = allocate(DType::bf16, 2, 3, 100, 64),
               v = allocate(DType::bf16, 2, 3, 100, 64), out = allocate(DType::bf16, 2, 3, 100, 64);
  std::vector<unsigned char> host(64);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.output = out.data();
  const auto before = download_bytes(out);
  p.k = host.data();
  EXPECT_TRUE(starts_with(rejection([&] { kla::forward(p); }), "k: must be a device pointer"));
  p.k = k.data();
  // Misaligned pointers inside buffers of their own, one row longer: the shifted extents overlap nothing
  // (validate refuses an output that shares a byte with another tensor before it looks at alignment).
  DeviceTensor v_spare = allocate(DType::bf16, 2, 3, 101, 64), state_spare = allocate(DType::f32, 2, 3, 65, 64);
  p.v = static_cast<const unsigned char*>(v_spare.data()) + 1;
  EXPECT_TRUE(starts_with(rejection([&] { kla::forward(p); }), "v: must be aligned"));
  p.v = v.data();
  p.final_state = static_cast<unsigned char*>(state_spare.data()) + 2;  // fp32 state needs 4 bytes
  EXPECT_TRUE(starts_with(rejection([&] { kla::forward(p); }), "final_state: must be aligned"));
  p.final_state = nullptr;
  p.chunk_size = 128;
  EXPECT_TRUE(starts_with(rejection([&] { kla::forward(p); }), "chunk_size"));
  EXPECT_TRUE(download_bytes(out) == before) << "a rejected call wrote its output";
}

// ---------------------------------------------------------------------------------------
// Planted bugs: each property above must fail on a kernel broken on purpose (the test-only
// target's mutants, cuda/testing/linear_attention_planted.h).

Kernels with_bug(kla::testing::PlantedBug bug) {
  return {[bug](const kla::ForwardParams& p) { kla::testing::forward(bug, p); },
          [bug](const kla::BackwardParams& p) { kla::testing::backward(bug, p); },
          [bug](const kla::DecodeParams& p) { kla::testing::decode(bug, p); }};
}

TEST(LinearAttentionGpuPlantedBugs, EachBugIsCaught) {
  DELTAPROOF_REQUIRE_GPU();
  using Bug = kla::testing::PlantedBug;
  const CudaCase tc = make_case({1, 2, 77, 64, 64, 32, true, DType::bf16}, 11);      // tensor-core pass
  const CudaCase generic = make_case({1, 2, 77, 20, 12, 32, true, DType::f32}, 12);  // CUDA-core pass
  const CudaCase fp64 = make_case({1, 1, 37, 6, 5, 16, true, DType::f64}, 13);
  // The faithful kernels pass the very checks the mutants fail.
  for (const CudaCase* c : {&tc, &generic}) {
    ASSERT_EQ(forward_failures(*c), "");
    ASSERT_EQ(backward_failures(*c), "");
    ASSERT_EQ(decode_failures(*c), "");
  }
  ASSERT_EQ(directional_failure(fp64, 5), "");
  {
    const Kernels bug = with_bug(Bug::strict_causal_mask);
    for (const CudaCase* c : {&tc, &generic}) {
      EXPECT_NE(forward_failures(*c, bug), "") << c->shape;
      EXPECT_NE(backward_failures(*c, bug), "") << c->shape;
    }
  }
  {
    const Kernels bug = with_bug(Bug::dropped_partial_chunk);
    for (const CudaCase* c : {&tc, &generic}) EXPECT_NE(forward_failures(*c, bug), "") << c->shape;
  }
  {
    const Kernels bug = with_bug(Bug::lost_initial_state);
    for (const CudaCase* c : {&tc, &generic}) {
      EXPECT_NE(forward_failures(*c, bug), "") << c->shape;
      EXPECT_NE(backward_failures(*c, bug), "") << c->shape;
      EXPECT_NE(decode_failures(*c, bug), "") << c->shape;
    }
    // The central-difference check sees a backward that disagrees with the kernel's own forward:
    // with this bug the forward drops S_0 but its S_L still depends on k and v, while the backward
    // also drops dS_L, so the dS_L terms of dK and dV are missing.
    EXPECT_NE(directional_failure(fp64, 5, bug), "");
  }
  {
    // Rounding S and P to bf16 once is a precision bug, not a logic bug: the bound must see it.
    const Kernels bug = with_bug(Bug::single_bf16_operands);
    EXPECT_NE(forward_failures(tc, bug), "");
    EXPECT_NE(backward_failures(tc, bug), "");
  }
  {
    const Kernels bug = with_bug(Bug::decode_reads_stale_state);
    for (const CudaCase* c : {&tc, &generic}) EXPECT_NE(decode_failures(*c, bug), "") << c->shape;
  }
}

}  // namespace
}  // namespace deltaproof::testing
