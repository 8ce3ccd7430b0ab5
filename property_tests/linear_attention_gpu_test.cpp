// Linear attention kernels (cuda/linear_attention.h) against the exact oracle
// (reference/linear_attention.hpp), on the exact values of the kernels' rounded inputs.
//
// The rounding bound (DESIGN.md, numerical policy 2) is derived in
// reference/linear_attention_kernel_bound.hpp: inputs rounded once on the host (the oracle sees
// their exact values), fp32/fp64 accumulation along chains of depth m = L + ceil(L/C) + DK + DV +
// C + 8 (γ_m·magnitude; u = 2⁻²³ for tensor cores, which truncate, plus 2⁻¹⁶ for the hi/lo bf16
// operands), and one final rounding of a bf16/fp16 output (u_out·|o|). It is elementwise; a
// comparison fails when any one entry exceeds it, and prints the case, max and RMS error, the
// bound and the worst index.
#include "cuda/linear_attention.h"
#include "property_tests/support/device_tensors.hpp"
#include "property_tests/support/gpu.hpp"
#include "reference/error_report.hpp"
#include "reference/gradcheck.hpp"
#include "reference/linear_attention.hpp"
#include "reference/linear_attention_kernel_bound.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <string>

namespace deltaproof::testing {
namespace {

namespace la = ref::linear_attention;
namespace kla = cuda::linear_attention;
using cuda::DType;
using ref::Matrix;

// ---------------------------------------------------------------------------------------
// Cases

struct GpuShape {
  Index batch = 1, heads = 1, length = 1, key_dim = 1, value_dim = 1, chunk_size = 16;
  bool with_initial_state = false;
  DType dtype = DType::f32;
};
std::ostream& operator<<(std::ostream& os, const GpuShape& s) {
  return os << "{B=" << s.batch << ", H=" << s.heads << ", L=" << s.length << ", DK=" << s.key_dim
            << ", DV=" << s.value_dim << ", C=" << s.chunk_size << ", S_0=" << (s.with_initial_state ? "given" : "absent")
            << ", dtype=" << cuda::name_of(s.dtype)
            << (kla::uses_tensor_cores(s.dtype, s.key_dim, s.value_dim) ? " (tensor cores)" : "") << "}";
}
std::string describe(const GpuShape& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Inputs before rounding: q, k, v, S_0, dO, dS_L (the last two for the backward).
struct GpuCase {
  GpuShape shape;
  la::BatchInputs<Exact> inputs;
  la::BatchCotangents<Exact> cotangents;
};
std::ostream& operator<<(std::ostream& os, const GpuCase& c) { return os << "GPU case " << c.shape; }

// Entries n/64 with |n| <= 512: up to 10 significant bits, so bf16 rounds some of them (fp16,
// fp32, fp64 hold them exactly) and the "exact values of the rounded inputs" differ from the draw.
Exact entry_of(int n) { return Exact(n) / 64; }

Tensor4<Exact> random_tensor(std::mt19937_64& rng, Index b, Index h, Index r, Index c) {
  std::uniform_int_distribution<int> pick(-512, 512);
  Tensor4<Exact> t(b, h, r, c);
  for (Exact& x : t.data) x = entry_of(pick(rng));
  return t;
}

GpuCase make_case(const GpuShape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  GpuCase c;
  c.shape = s;
  c.inputs.q = random_tensor(rng, s.batch, s.heads, s.length, s.key_dim);
  c.inputs.k = random_tensor(rng, s.batch, s.heads, s.length, s.key_dim);
  c.inputs.v = random_tensor(rng, s.batch, s.heads, s.length, s.value_dim);
  c.cotangents.d_output = random_tensor(rng, s.batch, s.heads, s.length, s.value_dim);
  if (s.with_initial_state) {
    c.inputs.initial_state = random_tensor(rng, s.batch, s.heads, s.value_dim, s.key_dim);
    c.cotangents.d_final_state = random_tensor(rng, s.batch, s.heads, s.value_dim, s.key_dim);
  }
  return c;
}

struct GpuLimits {
  Index max_length = 140, max_dim = 40, max_heads = 2;
  bool fp64_only = false;
};

rc::Gen<DType> gen_dtype() { return rc::gen::element(DType::f32, DType::bf16, DType::f16, DType::f64); }

// Shapes first (C ∈ {16, 32, 64}; L ∈ {1, 2, C−1, C, C+1, …}; awkward head dims), then the
// tensors of that shape from a seed (shrinking reduces the shape; the seed is printed with it).
rc::Gen<GpuCase> gen_gpu_case(GpuLimits limits = {}) {
  auto shape = rc::gen::mapcat(rc::gen::element<Index>(16, 32, 64), [limits](Index C) {
    auto length = rc::gen::oneOf(rc::gen::element<Index>(1, 2, C - 1, C, C + 1, 2 * C + 3),
                                 rc::gen::inRange<Index>(1, limits.max_length + 1));
    auto dim = rc::gen::oneOf(rc::gen::element<Index>(1, 15, 16, 32, std::min<Index>(60, limits.max_dim)),
                              rc::gen::inRange<Index>(1, limits.max_dim + 1));
    return rc::gen::build<GpuShape>(
        rc::gen::set(&GpuShape::batch, rc::gen::inRange<Index>(1, 3)),
        rc::gen::set(&GpuShape::heads, rc::gen::inRange<Index>(1, limits.max_heads + 1)),
        rc::gen::set(&GpuShape::length, length), rc::gen::set(&GpuShape::key_dim, dim),
        rc::gen::set(&GpuShape::value_dim, dim), rc::gen::set(&GpuShape::chunk_size, rc::gen::just(C)),
        rc::gen::set(&GpuShape::with_initial_state, rc::gen::arbitrary<bool>()),
        rc::gen::set(&GpuShape::dtype, limits.fp64_only ? rc::gen::just(DType::f64) : gen_dtype()));
  });
  return rc::gen::mapcat(shape, [](const GpuShape& s) {
    return rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [s](std::uint64_t seed) { return make_case(s, seed); });
  });
}

// ---------------------------------------------------------------------------------------
// The bound

using Precision = la::KernelPrecision;

Precision precision_of(const GpuShape& s, bool is_state, Index depth_length = -1, Index depth_chunk = -1) {
  const Index L = depth_length > 0 ? depth_length : s.length, C = depth_chunk > 0 ? depth_chunk : s.chunk_size;
  const double u_out = is_state ? 0 : s.dtype == DType::bf16 ? std::ldexp(1.0, -8) : s.dtype == DType::f16 ? std::ldexp(1.0, -11) : 0;
  return la::kernel_precision(la::kernel_rounding_depth(L, C, s.key_dim, s.value_dim), s.dtype == DType::f64,
                              kla::uses_tensor_cores(s.dtype, s.key_dim, s.value_dim), u_out);
}

Matrix<Exact> bound_of(const Matrix<Exact>& magnitude, const Matrix<Exact>& exact, const Precision& p, int copies = 1) {
  return la::kernel_bound(magnitude, exact, p) * Exact(copies);
}

// Empty when within bound; otherwise the full description of the failure.
std::string within(const std::string& what, const GpuShape& s, Index b, Index h, const Matrix<Exact>& candidate,
                   const Matrix<Exact>& exact, const Matrix<Exact>& bound) {
  const auto summary = ref::compare<Exact>(what, candidate, exact, bound);
  if (summary.within_bound) return {};
  std::ostringstream os;
  os << describe(s) << " head (" << b << ", " << h << "): " << summary.describe();
  return os.str();
}

#define DELTAPROOF_PROPERTY_OK(expr)        \
  do {                                      \
    const std::string failure_ = (expr);    \
    if (!failure_.empty()) RC_FAIL(failure_); \
  } while (0)

// ---------------------------------------------------------------------------------------
// Running the kernels

DType state_dtype(const GpuShape& s) { return kla::state_dtype(s.dtype); }

struct DeviceInputs {
  Uploaded q, k, v, d_output;
  std::optional<Uploaded> initial_state, d_final_state;
  la::BatchInputs<Exact> exact;         // the rounded values: the oracle's inputs
  la::BatchCotangents<Exact> exact_cot;
};

DeviceInputs upload_case(const GpuCase& c) {
  const DType d = c.shape.dtype;
  DeviceInputs in{upload(c.inputs.q, d), upload(c.inputs.k, d), upload(c.inputs.v, d), upload(c.cotangents.d_output, d),
                  std::nullopt, std::nullopt, {}, {}};
  if (c.inputs.initial_state) in.initial_state = upload(*c.inputs.initial_state, state_dtype(c.shape));
  if (c.cotangents.d_final_state) in.d_final_state = upload(*c.cotangents.d_final_state, state_dtype(c.shape));
  in.exact = {in.q.exact, in.k.exact, in.v.exact, std::nullopt};
  if (in.initial_state) in.exact.initial_state = in.initial_state->exact;
  in.exact_cot = {in.d_output.exact, std::nullopt};
  if (in.d_final_state) in.exact_cot.d_final_state = in.d_final_state->exact;
  return in;
}

struct KernelForward {
  Tensor4<Exact> output, final_state, boundary_states;  // boundary: [B, H, N·DV, DK]
};

KernelForward run_forward(const GpuShape& s, const DeviceInputs& in, Index chunk_size, bool with_boundary = true) {
  const Index N = (s.length + chunk_size - 1) / chunk_size;
  DeviceTensor out = allocate(s.dtype, s.batch, s.heads, s.length, s.value_dim);
  DeviceTensor final_state = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
  DeviceTensor boundary = allocate(state_dtype(s), s.batch, s.heads, N * s.value_dim, s.key_dim);
  kla::ForwardParams p;
  p.dtype = s.dtype;
  p.batch = int(s.batch), p.heads = int(s.heads), p.length = int(s.length), p.key_dim = int(s.key_dim),
  p.value_dim = int(s.value_dim), p.chunk_size = int(chunk_size);
  p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.output = out.data();
  p.initial_state = in.initial_state ? in.initial_state->device.data() : nullptr;
  p.final_state = final_state.data();
  p.boundary_states = with_boundary ? boundary.data() : nullptr;
  kla::set_contiguous_strides(p);
  kla::forward(p);
  KernelForward r{download(out), download(final_state), {}};
  if (with_boundary) r.boundary_states = download(boundary);
  return r;
}

la::BatchGradients<Exact> run_backward(const GpuShape& s, const DeviceInputs& in) {
  DeviceTensor dq = allocate(s.dtype, s.batch, s.heads, s.length, s.key_dim);
  DeviceTensor dk = allocate(s.dtype, s.batch, s.heads, s.length, s.key_dim);
  DeviceTensor dv = allocate(s.dtype, s.batch, s.heads, s.length, s.value_dim);
  DeviceTensor ds0 = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
  kla::BackwardParams p;
  p.dtype = s.dtype;
  p.batch = int(s.batch), p.heads = int(s.heads), p.length = int(s.length), p.key_dim = int(s.key_dim),
  p.value_dim = int(s.value_dim), p.chunk_size = int(s.chunk_size);
  p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.d_output = in.d_output.device.data();
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.initial_state = in.initial_state ? in.initial_state->device.data() : nullptr;
  p.d_final_state = in.d_final_state ? in.d_final_state->device.data() : nullptr;
  p.d_initial_state = ds0.data();
  kla::set_contiguous_strides(p);
  kla::backward(p);
  return {download(dq), download(dk), download(dv), download(ds0)};
}

// Decode of the given tokens from a device state (null: S_0 = 0), in place in `state`.
Tensor4<Exact> run_decode(DType dtype, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                          const void* initial_state, DeviceTensor& state) {
  DeviceTensor out = allocate(dtype, q.batch, q.heads, q.rows, v.cols);
  kla::DecodeParams p;
  p.dtype = dtype;
  p.batch = int(q.batch), p.heads = int(q.heads), p.tokens = int(q.rows), p.key_dim = int(q.cols), p.value_dim = int(v.cols);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.output = out.data();
  p.initial_state = initial_state;
  p.final_state = state.data();
  kla::set_contiguous_strides(p);
  kla::decode(p);
  return download(out);
}

Tensor4<Exact> rows_of(const Tensor4<Exact>& t, Index begin, Index count) {
  Tensor4<Exact> out(t.batch, t.heads, count, t.cols);
  ref::for_each_head(t.batch, t.heads, [&](Index b, Index h) { out.set_head(b, h, t.head(b, h).middleRows(begin, count)); });
  return out;
}

template <class F>
std::string guarded(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  }
}

// ---------------------------------------------------------------------------------------
// Properties, as functions of a case (the planted-bug tests run them on broken kernels)

// Chunkwise forward: output, final state and every boundary state S_[c] vs the oracle.
std::string check_forward(const GpuCase& c) {
  return guarded([&]() -> std::string {
    const GpuShape& s = c.shape;
    const DeviceInputs in = upload_case(c);
    const KernelForward k = run_forward(s, in, s.chunk_size);
    const Precision out_p = precision_of(s, false), state_p = precision_of(s, true);
    std::string failure;
    ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
      if (!failure.empty()) return;
      const auto head = in.exact.head(b, h);
      const auto exact = la::chunkwise(head, s.chunk_size);
      const auto mag = la::forward_magnitude(head);
      failure = within("output", s, b, h, k.output.head(b, h), exact.output, bound_of(mag.output, exact.output, out_p));
      if (failure.empty())
        failure = within("final state", s, b, h, k.final_state.head(b, h), exact.final_state,
                         bound_of(mag.final_state, exact.final_state, state_p));
      // S_[c]'s terms are a subset of S_L's: the final-state magnitude bounds them all.
      const Matrix<Exact> boundary = k.boundary_states.head(b, h);
      for (size_t n = 0; failure.empty() && n < exact.boundary_states.size(); ++n)
        failure = within("boundary state S_[" + std::to_string(n) + "]", s, b, h,
                         boundary.middleRows(Index(n) * s.value_dim, s.value_dim), exact.boundary_states[n],
                         bound_of(mag.final_state, exact.boundary_states[n], state_p));
    });
    return failure;
  });
}

// Chunkwise backward: dQ, dK, dV, dS_0 vs the oracle's chunkwise backward on the same inputs.
std::string check_backward(const GpuCase& c) {
  return guarded([&]() -> std::string {
    const GpuShape& s = c.shape;
    const DeviceInputs in = upload_case(c);
    const auto g = run_backward(s, in);
    const Precision p = precision_of(s, false), state_p = precision_of(s, true);
    std::string failure;
    ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
      if (!failure.empty()) return;
      const auto head = in.exact.head(b, h);
      const auto cot = in.exact_cot.head(b, h);
      const auto exact = la::chunkwise_backward(head, cot, s.chunk_size);
      const auto mag = la::backward_magnitude(head, cot);
      failure = within("dq", s, b, h, g.dq.head(b, h), exact.dq, bound_of(mag.dq, exact.dq, p));
      if (failure.empty()) failure = within("dk", s, b, h, g.dk.head(b, h), exact.dk, bound_of(mag.dk, exact.dk, p));
      if (failure.empty()) failure = within("dv", s, b, h, g.dv.head(b, h), exact.dv, bound_of(mag.dv, exact.dv, p));
      if (failure.empty())
        failure = within("dS_0", s, b, h, g.d_initial_state.head(b, h), exact.d_initial_state,
                         bound_of(mag.d_initial_state, exact.d_initial_state, state_p));
    });
    return failure;
  });
}

// C = 16, 32, 64 agree with each other: |o_C − o_C'| <= bound_C + bound_C' (both are within their
// bound of the same exact value).
std::string check_chunk_sizes_agree(const GpuCase& c) {
  return guarded([&]() -> std::string {
    const DeviceInputs in = upload_case(c);
    std::vector<GpuShape> shapes;
    std::vector<KernelForward> runs;
    for (int C : kla::supported_chunk_sizes) {
      GpuShape s = c.shape;
      s.chunk_size = C;
      shapes.push_back(s);
      runs.push_back(run_forward(s, in, C, false));
    }
    std::string failure;
    ref::for_each_head(c.shape.batch, c.shape.heads, [&](Index b, Index h) {
      const auto head = in.exact.head(b, h);
      const auto exact = la::parallel_masked(head);
      const auto mag = la::forward_magnitude(head);
      for (size_t x = 0; x < runs.size() && failure.empty(); ++x)
        for (size_t y = x + 1; y < runs.size() && failure.empty(); ++y) {
          const Matrix<Exact> out_bound = bound_of(mag.output, exact.output, precision_of(shapes[x], false)) +
                                          bound_of(mag.output, exact.output, precision_of(shapes[y], false));
          const Matrix<Exact> state_bound = bound_of(mag.final_state, exact.final_state, precision_of(shapes[x], true)) +
                                            bound_of(mag.final_state, exact.final_state, precision_of(shapes[y], true));
          const std::string pair = "C=" + std::to_string(shapes[x].chunk_size) + " vs C=" + std::to_string(shapes[y].chunk_size);
          failure = within("output " + pair, shapes[x], b, h, runs[x].output.head(b, h), runs[y].output.head(b, h), out_bound);
          if (failure.empty())
            failure = within("final state " + pair, shapes[x], b, h, runs[x].final_state.head(b, h),
                             runs[y].final_state.head(b, h), state_bound);
        }
    });
    return failure;
  });
}

// Decode of T tokens from S_0 (or zero) vs the token recurrence.
std::string check_decode(const GpuCase& c) {
  return guarded([&]() -> std::string {
    const GpuShape& s = c.shape;
    const DeviceInputs in = upload_case(c);
    DeviceTensor state = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
    const auto out = run_decode(s.dtype, in.q.device, in.k.device, in.v.device,
                                in.initial_state ? in.initial_state->device.data() : nullptr, state);
    const auto final_state = download(state);
    const Precision out_p = precision_of(s, false, s.length, 1), state_p = precision_of(s, true, s.length, 1);
    std::string failure;
    ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
      if (!failure.empty()) return;
      const auto head = in.exact.head(b, h);
      const auto exact = la::token_recurrence(head);
      const auto mag = la::forward_magnitude(head);
      failure = within("decode output", s, b, h, out.head(b, h), exact.output, bound_of(mag.output, exact.output, out_p));
      if (failure.empty())
        failure = within("decode final state", s, b, h, final_state.head(b, h), exact.final_state,
                         bound_of(mag.final_state, exact.final_state, state_p));
    });
    return failure;
  });
}

// Chunkwise prefill of the first P tokens, then decode of the rest (in place on the state),
// equals one chunkwise pass over all L tokens. Both are within bound of the same exact values
// (the decode's chains continue the prefill's and stay within depth m(L, C)), so they differ by
// at most twice the bound.
std::string check_decode_after_prefill(const GpuCase& c, Index prefill) {
  return guarded([&]() -> std::string {
    const GpuShape& s = c.shape;
    const Index rest = s.length - prefill;
    const DeviceInputs whole = upload_case(c);
    const KernelForward one_pass = run_forward(s, whole, s.chunk_size, false);

    GpuCase head_case = c;
    head_case.shape.length = prefill;
    head_case.inputs.q = rows_of(c.inputs.q, 0, prefill);
    head_case.inputs.k = rows_of(c.inputs.k, 0, prefill);
    head_case.inputs.v = rows_of(c.inputs.v, 0, prefill);
    head_case.cotangents.d_output = rows_of(c.cotangents.d_output, 0, prefill);
    const DeviceInputs head_in = upload_case(head_case);
    DeviceTensor state = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
    {
      DeviceTensor out = allocate(s.dtype, s.batch, s.heads, prefill, s.value_dim);
      kla::ForwardParams p;
      p.dtype = s.dtype;
      p.batch = int(s.batch), p.heads = int(s.heads), p.length = int(prefill), p.key_dim = int(s.key_dim),
      p.value_dim = int(s.value_dim), p.chunk_size = int(s.chunk_size);
      p.q = head_in.q.device.data(), p.k = head_in.k.device.data(), p.v = head_in.v.device.data(), p.output = out.data();
      p.initial_state = head_in.initial_state ? head_in.initial_state->device.data() : nullptr;
      p.final_state = state.data();
      kla::set_contiguous_strides(p);
      kla::forward(p);
    }
    const auto tail = [&](const Tensor4<Exact>& t) { return upload(rows_of(t, prefill, rest), s.dtype); };
    const Uploaded q = tail(c.inputs.q), k = tail(c.inputs.k), v = tail(c.inputs.v);
    const auto decoded = run_decode(s.dtype, q.device, k.device, v.device, state.data(), state);
    const auto decoded_state = download(state);

    const Precision out_p = precision_of(s, false), state_p = precision_of(s, true);
    std::string failure;
    ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
      if (!failure.empty()) return;
      const auto head = whole.exact.head(b, h);
      const auto exact = la::token_recurrence(head);
      const auto mag = la::forward_magnitude(head);
      const Matrix<Exact> out_bound = bound_of(mag.output, exact.output, out_p, 2).bottomRows(rest);
      failure = within("decode after prefill, output", s, b, h, decoded.head(b, h),
                       Matrix<Exact>(one_pass.output.head(b, h).bottomRows(rest)), out_bound);
      if (failure.empty())
        failure = within("decode after prefill, final state", s, b, h, decoded_state.head(b, h),
                         one_pass.final_state.head(b, h), bound_of(mag.final_state, exact.final_state, state_p, 2));
    });
    return failure;
  });
}

// ---------------------------------------------------------------------------------------
// GPU properties (rc::check inside TEST, so that the test can skip first)

TEST(LinearAttentionGpu, ForwardMatchesOracleWithinRoundingBound) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("chunkwise forward vs oracle", [] { DELTAPROOF_PROPERTY_OK(check_forward(*gen_gpu_case())); }));
}

TEST(LinearAttentionGpu, BackwardMatchesOracleWithinRoundingBound) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("chunkwise backward vs oracle", [] {
    DELTAPROOF_PROPERTY_OK(check_backward(*gen_gpu_case({.max_length = 100, .max_dim = 32})));
  }));
}

TEST(LinearAttentionGpu, ChunkSizesAgree) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("C = 16, 32, 64 agree", [] {
    DELTAPROOF_PROPERTY_OK(check_chunk_sizes_agree(*gen_gpu_case({.max_length = 150, .max_dim = 32})));
  }));
}

TEST(LinearAttentionGpu, DecodeMatchesTokenRecurrence) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("decode vs token recurrence", [] {
    const GpuCase c = *gen_gpu_case({.max_length = 8, .max_dim = 64, .max_heads = 3});
    DELTAPROOF_PROPERTY_OK(check_decode(c));
  }));
}

TEST(LinearAttentionGpu, DecodeAfterPrefillEqualsOneChunkwisePass) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("prefill + decode == one pass", [] {
    const GpuCase c = *gen_gpu_case({.max_length = 120, .max_dim = 32});
    RC_PRE(c.shape.length >= 2);
    const Index prefill = *rc::gen::inRange<Index>(1, c.shape.length);
    DELTAPROOF_PROPERTY_OK(check_decode_after_prefill(c, prefill));
  }));
}

// Directional central difference of the kernel's own fp64 forward against its fp64 backward.
// The pairing L(x) = <dO, o(x)> + <dS_L, S_L(x)> is a cubic in t along x + t·u, so
//   (L(x+hu) − L(x−hu)) / 2h = L'(0) + h²/6·L'''(0)
// exactly; that truncation term is computed over ℚ with the oracle. The kernel may differ from
// exact arithmetic by its rounding bound at each point (divided by 2h) and in each gradient entry
// (times |u|); the check is that the kernel's two sides agree within the sum of those.
std::string check_directional_derivative(const GpuCase& c, std::uint64_t direction_seed) {
  return guarded([&]() -> std::string {
    GpuShape s = c.shape;
    s.dtype = DType::f64;
    const Exact step = Exact(1) / 64;
    GpuCase direction = make_case(s, direction_seed);  // u: same shapes as the inputs
    const auto shifted = [&](const Exact& t) {
      GpuCase x = c;
      x.shape = s;
      for (size_t i = 0; i < x.inputs.q.data.size(); ++i) x.inputs.q.data[i] += t * direction.inputs.q.data[i];
      for (size_t i = 0; i < x.inputs.k.data.size(); ++i) x.inputs.k.data[i] += t * direction.inputs.k.data[i];
      for (size_t i = 0; i < x.inputs.v.data.size(); ++i) x.inputs.v.data[i] += t * direction.inputs.v.data[i];
      if (x.inputs.initial_state)
        for (size_t i = 0; i < x.inputs.initial_state->data.size(); ++i)
          x.inputs.initial_state->data[i] += t * direction.inputs.initial_state->data[i];
      return x;
    };
    const Precision out_p = precision_of(s, false), state_p = precision_of(s, true);
    // Kernel pairing at a point, and its bound: Σ|cot|·bound.
    const auto pairing = [&](const GpuCase& x, Exact& kernel_value, Exact& exact_value, Exact& error_bound) {
      const DeviceInputs in = upload_case(x);  // fp64 holds every entry: no rounding
      const KernelForward k = run_forward(s, in, s.chunk_size, false);
      kernel_value = exact_value = error_bound = 0;
      ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
        const auto head = in.exact.head(b, h);
        const auto cot = in.exact_cot.head(b, h);
        const auto exact = la::parallel_masked(head);
        const auto mag = la::forward_magnitude(head);
        kernel_value += ref::frobenius_inner(cot.d_output, Matrix<Exact>(k.output.head(b, h)));
        exact_value += ref::frobenius_inner(cot.d_output, exact.output);
        error_bound += ref::frobenius_inner(Matrix<Exact>(cot.d_output.cwiseAbs()), bound_of(mag.output, exact.output, out_p));
        if (cot.d_final_state) {
          kernel_value += ref::frobenius_inner(*cot.d_final_state, Matrix<Exact>(k.final_state.head(b, h)));
          exact_value += ref::frobenius_inner(*cot.d_final_state, exact.final_state);
          error_bound += ref::frobenius_inner(Matrix<Exact>(cot.d_final_state->cwiseAbs()),
                                              bound_of(mag.final_state, exact.final_state, state_p));
        }
      });
    };
    Exact k_plus, e_plus, b_plus, k_minus, e_minus, b_minus;
    pairing(shifted(step), k_plus, e_plus, b_plus);
    pairing(shifted(-step), k_minus, e_minus, b_minus);
    const Exact kernel_difference = (k_plus - k_minus) / (2 * step);
    const Exact exact_difference = (e_plus - e_minus) / (2 * step);

    GpuCase at = c;
    at.shape = s;
    const DeviceInputs in = upload_case(at);
    const auto g = run_backward(s, in);
    Exact kernel_derivative = 0, exact_derivative = 0, gradient_bound = 0;
    const Precision grad_p = precision_of(s, false);
    ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
      const auto head = in.exact.head(b, h);
      const auto cot = in.exact_cot.head(b, h);
      const auto exact = la::parallel_masked_backward(head, cot);
      const auto mag = la::backward_magnitude(head, cot);
      const auto pair = [&](const Matrix<Exact>& u, const Matrix<Exact>& kernel, const Matrix<Exact>& ex,
                            const Matrix<Exact>& m, const Precision& p) {
        kernel_derivative += ref::frobenius_inner(u, kernel);
        exact_derivative += ref::frobenius_inner(u, ex);
        gradient_bound += ref::frobenius_inner(Matrix<Exact>(u.cwiseAbs()), bound_of(m, ex, p));
      };
      pair(direction.inputs.q.head(b, h), g.dq.head(b, h), exact.dq, mag.dq, grad_p);
      pair(direction.inputs.k.head(b, h), g.dk.head(b, h), exact.dk, mag.dk, grad_p);
      pair(direction.inputs.v.head(b, h), g.dv.head(b, h), exact.dv, mag.dv, grad_p);
      if (head.initial_state)
        pair(direction.inputs.initial_state->head(b, h), g.d_initial_state.head(b, h), exact.d_initial_state,
             mag.d_initial_state, precision_of(s, true));
    });
    const Exact truncation = abs(exact_difference - exact_derivative);
    const Exact allowed = truncation + (b_plus + b_minus) / (2 * step) + gradient_bound;
    const Exact gap = abs(kernel_difference - kernel_derivative);
    if (gap <= allowed) return {};
    std::ostringstream os;
    os << describe(s) << ": central difference " << ref::to_double(kernel_difference) << " vs backward "
       << ref::to_double(kernel_derivative) << ", gap " << ref::to_double(gap) << " > allowed "
       << ref::to_double(allowed) << " (truncation " << ref::to_double(truncation) << ")";
    return os.str();
  });
}

TEST(LinearAttentionGpu, Fp64CentralDifferenceMatchesBackward) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("fp64 central difference vs backward", [] {
    const GpuCase c = *gen_gpu_case({.max_length = 70, .max_dim = 16, .max_heads = 1, .fp64_only = true});
    DELTAPROOF_PROPERTY_OK(check_directional_derivative(c, *rc::gen::arbitrary<std::uint64_t>()));
  }));
}

// ---------------------------------------------------------------------------------------
// Fixed shapes the generators rarely reach: head dims up to 256, B·H = 4096.

TEST(LinearAttentionGpu, AwkwardAndLargeHeadDims) {
  DELTAPROOF_REQUIRE_GPU();
  const GpuShape shapes[] = {
      {1, 1, 20, 256, 256, 16, true, DType::f32},  {1, 1, 18, 128, 256, 16, false, DType::bf16},
      {1, 2, 70, 100, 60, 32, true, DType::bf16},  {1, 1, 129, 128, 128, 64, true, DType::bf16},
      {2, 1, 81, 27, 9, 64, true, DType::f16},     {1, 1, 50, 1, 129, 16, true, DType::f64},
      {1, 1, 65, 64, 128, 64, false, DType::bf16}, {1, 1, 63, 60, 60, 16, true, DType::bf16},
  };
  std::uint64_t seed = 1;
  for (const GpuShape& s : shapes) {
    const GpuCase c = make_case(s, seed++);
    EXPECT_EQ(check_forward(c), "") << "seed " << seed - 1;
    EXPECT_EQ(check_backward(c), "") << "seed " << seed - 1;
  }
}

TEST(LinearAttentionGpu, ManyHeads) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f32}) {
    const GpuCase c = make_case({64, 64, 5, 3, 4, 16, true, dtype}, 4096);  // tiny heads: the oracle runs 4096 times
    EXPECT_EQ(check_forward(c), "");
    EXPECT_EQ(check_backward(c), "");
    EXPECT_EQ(check_decode(c), "");
  }
}

// ---------------------------------------------------------------------------------------
// Determinism: repeated runs are bitwise equal (no atomics; fixed reduction orders).

TEST(LinearAttentionGpu, RepeatedRunsAreBitwiseEqual) {
  DELTAPROOF_REQUIRE_GPU();
  for (const GpuShape& s : {GpuShape{2, 3, 333, 128, 128, 64, true, DType::bf16}, GpuShape{1, 2, 201, 100, 36, 32, true, DType::f32}}) {
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
// Accuracy at the DESIGN.md shape: bf16, B=2, H=4, L=512, DK=DV=128; q ~ N(0,1)/√D,
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
  GpuCase c;
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
    GpuShape s = c.shape;
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

template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument thrown)";
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(LinearAttentionGpuArguments, RejectsBadSizesBeforeAnyCudaCall) {
  const auto message = [](auto edit) {
    kla::ForwardParams p = valid_shape_forward();
    edit(p);
    return invalid_argument_message([&] { kla::forward(p); });
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
}

TEST(LinearAttentionGpuArguments, RejectsNullPointersBeforeAnyCudaCall) {
  kla::ForwardParams f = valid_shape_forward();  // every pointer null
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::forward(f); }), "q: must not be null"));
  kla::BackwardParams b;
  b.batch = 1, b.heads = 1, b.length = 5, b.key_dim = 3, b.value_dim = 4, b.chunk_size = 16;
  kla::set_contiguous_strides(b);
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::backward(b); }), "q: must not be null"));
  b.chunk_size = 8;
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::backward(b); }), "chunk_size"));
  kla::DecodeParams d;
  d.batch = 1, d.heads = 1, d.tokens = 1, d.key_dim = 3, d.value_dim = 4;
  kla::set_contiguous_strides(d);
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::decode(d); }), "q: must not be null"));
  d.tokens = 0;
  kla::set_contiguous_strides(d);
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::decode(d); }), "tokens"));
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
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::forward(p); }), "k: must be a device pointer"));
  p.k = k.data();
  p.v = static_cast<const unsigned char*>(v.data()) + 1;
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::forward(p); }), "v: must be aligned"));
  p.v = v.data();
  p.final_state = static_cast<unsigned char*>(out.data()) + 2;  // fp32 state needs 4 bytes
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::forward(p); }), "final_state: must be aligned"));
  p.final_state = nullptr;
  p.chunk_size = 128;
  EXPECT_TRUE(starts_with(invalid_argument_message([&] { kla::forward(p); }), "chunk_size"));
  EXPECT_TRUE(download_bytes(out) == before) << "a rejected call wrote its output";
}

// ---------------------------------------------------------------------------------------
// Planted bugs: each property above must fail on a kernel broken on purpose.

struct PlantedBugScope {
  explicit PlantedBugScope(kla::PlantedBug bug) { kla::plant_bug(bug); }
  ~PlantedBugScope() { kla::plant_bug(kla::PlantedBug::none); }
};

TEST(LinearAttentionGpuPlantedBugs, EachBugIsCaught) {
  DELTAPROOF_REQUIRE_GPU();
  using Bug = kla::PlantedBug;
  const GpuCase tc = make_case({1, 2, 77, 64, 64, 32, true, DType::bf16}, 11);      // tensor-core pass
  const GpuCase generic = make_case({1, 2, 77, 20, 12, 32, true, DType::f32}, 12);  // CUDA-core pass
  const GpuCase fp64 = make_case({1, 1, 37, 6, 5, 16, true, DType::f64}, 13);
  // The faithful kernels pass the very checks the mutants fail.
  for (const GpuCase* c : {&tc, &generic}) {
    ASSERT_EQ(check_forward(*c), "");
    ASSERT_EQ(check_backward(*c), "");
    ASSERT_EQ(check_decode(*c), "");
  }
  ASSERT_EQ(check_directional_derivative(fp64, 5), "");
  {
    PlantedBugScope bug(Bug::strict_causal_mask);
    for (const GpuCase* c : {&tc, &generic}) {
      EXPECT_NE(check_forward(*c), "") << c->shape;
      EXPECT_NE(check_backward(*c), "") << c->shape;
    }
  }
  {
    PlantedBugScope bug(Bug::dropped_partial_chunk);
    for (const GpuCase* c : {&tc, &generic}) EXPECT_NE(check_forward(*c), "") << c->shape;
  }
  {
    PlantedBugScope bug(Bug::lost_initial_state);
    for (const GpuCase* c : {&tc, &generic}) {
      EXPECT_NE(check_forward(*c), "") << c->shape;
      EXPECT_NE(check_backward(*c), "") << c->shape;
      EXPECT_NE(check_decode(*c), "") << c->shape;
    }
  }
  {
    // Rounding S and P to bf16 once is a precision bug, not a logic bug: the bound must see it.
    PlantedBugScope bug(Bug::single_bf16_operands);
    EXPECT_NE(check_forward(tc), "");
    EXPECT_NE(check_backward(tc), "");
  }
  {
    PlantedBugScope bug(Bug::decode_reads_stale_state);
    for (const GpuCase* c : {&tc, &generic}) EXPECT_NE(check_decode(*c), "") << c->shape;
  }
  {
    // The central-difference check sees a backward that disagrees with the kernel's own forward:
    // with this bug the forward drops S_0 but its S_L still depends on k and v, while the backward
    // also drops dS_L, so the dS_L terms of dK and dV are missing.
    PlantedBugScope bug(Bug::lost_initial_state);
    EXPECT_NE(check_directional_derivative(fp64, 5), "");
  }
}

}  // namespace
}  // namespace deltaproof::testing
