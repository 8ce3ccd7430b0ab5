// The decode kernels' own source (cuda/decode_kernels.cuh: DeltaNet / Gated DeltaNet and linear
// attention) executed on the CPU emulation of CUDA blocks (support/cuda_emulation.hpp), launched as
// the product's launchers launch them (the same view, row shape and grid), and judged by the GPU
// suites' decode checks: verify::delta_rule::check_decode and verify::linear_attention::judge_decode
// (check_decode's verdict). NOT a GPU result: fmaf and expf are glibc's, shuffles are warp collectives,
// memory is NaN-poisoned and fenced. What it shows before GPU time is spent: indices, the lane-to-column
// mapping, the group butterflies' participation, the token loop, S_0 and in-place updates, that every
// output and state entry is written and nothing outside the buffers is, and that the bits depend
// neither on the thread order nor on the access width. Planted bugs go in through the kernels' Policy.
#include "property_tests/support/cuda_emulation.hpp"

#include "cuda/delta_rule.h"
#include "cuda/linear_attention.h"
#include "verify/delta_rule_stages.hpp"
#include "verify/device_tensors.hpp"
#include "verify/linear_attention_kernel_checks.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

// The kernels' source, compiled here under its own namespace (never the nvcc build's launch stubs).
#define DELTAPROOF_FORWARD_KERNELS decode_kernels_emulated
#include "cuda/decode_kernels.cuh"

namespace {

using namespace deltaproof;
using cuda::DType;
using emulation::read;
using emulation::Tensor;
using emulation::ThreadOrder;
using emulation::write;
using ref::Exact;
using ref::Index;
using ref::Tensor4;
using verify::Comparison;
namespace dk = deltaproof::cuda::decode_kernels_emulated::decoding;
namespace vd = deltaproof::verify::delta_rule;
namespace vl = deltaproof::verify::linear_attention;
namespace kla = deltaproof::cuda::linear_attention;

// The product's seams (dk::Faithful) and the two bugs planted through them.
using Faithful = dk::Faithful;
struct LostInitialState : Faithful {
  static constexpr bool reads_initial_state = false;
};
struct StaleOutput : Faithful {
  static constexpr bool decode_reads_updated_state = false;
};

struct RunOptions {
  ThreadOrder order = ThreadOrder::shuffled;
  bool allow_vector = true;  // false: the scalar path even where runs of 4 could move as one access
  bool in_place = false;     // S_0 read from, and S_t written to, one buffer
  std::uint64_t seed = 1;
};

// Picks the row shape and launches kernel_of(shape) over the view's grid, as the product's launchers do.
template <class KernelOf>
void launch_decode(dk::DecodeView view, const RunOptions& o, std::size_t input_bytes, std::size_t state_bytes,
                   KernelOf&& kernel_of) {
  dk::set_vector_access(view, input_bytes, state_bytes);
  view.vector = view.vector && o.allow_vector;
  dk::with_row_shape(view, [&](auto shape) {
    emulation::launch({dk::grid_of(view, decltype(shape)::kLanes), dim3(dk::kThreads), 0, o.order, o.seed}, kernel_of(shape),
                      view);
  });
}

// The state buffers of a run: S_0 (when given) in its own tensor or in the output state's (in place).
struct States {
  Tensor initial, final;
  const void* initial_data() { return initial.buffer.empty() ? (final_holds_initial ? final.data() : nullptr) : initial.data(); }
  bool final_holds_initial = false;
};
States make_states(const std::optional<Tensor4<Exact>>& s0, DType d, Index B, Index H, Index DV, Index DK, bool in_place) {
  States s;
  if (s0 && in_place) s.final = write("state (in place)", *s0, d), s.final_holds_initial = true;
  else s.final = Tensor("final_state", d, B, H, DV, DK);
  if (s0 && !in_place) s.initial = write("initial_state", *s0, d);
  return s;
}

// ---------------------------------------------------------------------------------------
// DeltaNet / Gated DeltaNet

template <class Policy = Faithful>
vd::DecodeResult emulate_delta(const vd::DeltaCase& c, const vd::HostInputs& in, const RunOptions& o = {}) {
  const DType d = c.dtype;
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim;
  Tensor q = write("q", in.q, d), k = write("k", in.k, d), v = write("v", in.v, d), beta = write("beta", in.beta, d);
  Tensor gate = c.gated ? write("log_gate", in.log_gate, DType::f32) : Tensor();
  Tensor out("output", d, B, H, L, DV);
  std::optional<Tensor4<Exact>> s0;
  if (c.with_initial_state) s0 = in.initial_state;
  States states = make_states(s0, DType::f32, B, H, DV, DK, o.in_place);
  cuda::DeltaRuleDecodeParams p;
  p.dtype = d, p.batch = int(B), p.heads = int(H), p.tokens = int(L), p.key_dim = int(DK), p.value_dim = int(DV);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.beta = beta.data(), p.output = out.data();
  p.log_gate = static_cast<const float*>(gate.data());
  p.initial_state = static_cast<const float*>(states.initial_data());
  p.final_state = static_cast<float*>(states.final.data());
  const auto run = [&](auto type_tag) {
    using T = decltype(type_tag);
    launch_decode(dk::view_of(p), o, sizeof(T), sizeof(float),
                  [](auto shape) { return &dk::delta_rule_decode_kernel<T, decltype(shape), Policy>; });
  };
  if (d == DType::bf16) run(__nv_bfloat16{});
  else if (d == DType::f16) run(__half{});
  else run(float{});
  for (const Tensor* input : {&q, &k, &v, &beta, &gate, &states.initial}) input->buffer.check_guards();
  return {read(out), read(states.final)};
}

std::vector<Comparison> judge_delta(const vd::DeltaCase& c, const vd::HostInputs& in, const vd::DecodeResult& r) {
  std::optional<Tensor4<Exact>> s0;
  if (c.with_initial_state) s0 = in.initial_state;
  return vd::check_decode(c, in, r, s0);
}

// T = 1 (the benchmark's decode), a few tokens and 17; S_0 given or not (in place or
// not); gated or not; DK, DV 128 and awkward (1, odd, past 128 and 256: every row shape, the scalar
// path wherever DK % 4 != 0); bf16, fp16, fp32.
std::vector<vd::DeltaCase> delta_cases() {
  const struct {
    Index dk, dv;
  } dims[] = {{128, 128}, {1, 1}, {15, 60}, {100, 7}, {64, 33}, {129, 20}, {256, 9}, {36, 128}, {32, 3}};
  const Index lengths[] = {1, 2, 5, 1, 3, 1, 2, 17, 1};
  std::vector<vd::DeltaCase> cases;
  for (int i = 0; i < 18; ++i) {
    vd::DeltaCase c;
    c.key_dim = dims[i % 9].dk, c.value_dim = dims[i % 9].dv, c.length = lengths[(i + i / 9) % 9];
    c.dtype = i % 3 == 0 ? DType::bf16 : i % 3 == 1 ? DType::f16 : DType::f32;
    c.gated = i % 2, c.with_initial_state = i / 2 % 2 == 0 || i % 9 == 0;
    c.batch = 1 + i % 2, c.heads = 1 + i / 9, c.seed = 7000 + std::uint64_t(i);
    cases.push_back(c);
  }
  return cases;
}

std::string worst_ratios(const std::vector<Comparison>& rows) {
  std::string text;
  for (const Comparison& row : verify::worst_per_tensor(rows)) text += row.tensor + " " + verify::number_text(row.ratio) + "  ";
  return text;
}

TEST(DecodeCpuEmulation, DeltaRuleMatchesTheOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  int i = 0;
  for (const vd::DeltaCase& c : delta_cases()) {
    const vd::HostInputs in = vd::make_inputs(c);
    RunOptions o;
    o.in_place = i++ % 3 == 0, o.seed = c.seed;
    const auto rep = judge_delta(c, in, emulate_delta(c, in, o));
    EXPECT_TRUE(verify::all_agree(rep)) << vd::describe(c) << "\n" << verify::describe_failures(rep);
    std::cout << vd::describe(c) << (o.in_place ? " in place" : "") << "\n  max err/bound: " << worst_ratios(rep) << "\n";
  }
}

// DESIGN.md's accuracy inputs (normalized keys, sigmoid β, gates near 1, real-valued q, v) at the
// benchmark's head dims, S_0 taken from a random state: values that are not small dyadic integers.
TEST(DecodeCpuEmulation, DeltaRuleMatchesTheOracleOnDesignInputs) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (bool gated : {false, true}) {
    vd::DeltaCase c;
    c.gated = gated, c.length = 3, c.key_dim = 128, c.value_dim = 128, c.seed = 99;
    vd::HostInputs in = vd::design_inputs(c);
    vd::DeltaCase with_state = c;
    with_state.with_initial_state = true;
    in.initial_state = vd::make_inputs(with_state).initial_state;
    c.with_initial_state = true;
    const auto rep = judge_delta(c, in, emulate_delta(c, in));
    EXPECT_TRUE(verify::all_agree(rep)) << vd::describe(c) << "\n" << verify::describe_failures(rep);
    std::cout << vd::describe(c) << " (design inputs)\n  max err/bound: " << worst_ratios(rep) << "\n";
  }
}

// ---------------------------------------------------------------------------------------
// Linear attention

struct LinearRun {
  Tensor4<Exact> output, final_state;
};

// The case's inputs rounded to its dtype (S_0 to the state dtype): the exact values the kernel sees.
kla::DecodeParams linear_params(const vl::CudaShape& s) {
  kla::DecodeParams p;
  p.dtype = s.dtype, p.batch = int(s.batch), p.heads = int(s.heads), p.tokens = int(s.length);
  p.key_dim = int(s.key_dim), p.value_dim = int(s.value_dim);
  kla::set_contiguous_strides(p);
  return p;
}
ref::linear_attention::BatchInputs<Exact> rounded(const vl::CudaCase& c) {
  const DType d = c.shape.dtype;
  ref::linear_attention::BatchInputs<Exact> in{verify::round_to(c.inputs.q, d), verify::round_to(c.inputs.k, d),
                                               verify::round_to(c.inputs.v, d), std::nullopt};
  if (c.inputs.initial_state) in.initial_state = verify::round_to(*c.inputs.initial_state, kla::state_dtype(d));
  return in;
}

template <class Policy = Faithful>
LinearRun emulate_linear(const vl::CudaShape& s, const ref::linear_attention::BatchInputs<Exact>& in, const RunOptions& o = {}) {
  const DType d = s.dtype, sd = kla::state_dtype(d);
  Tensor q = write("q", in.q, d), k = write("k", in.k, d), v = write("v", in.v, d);
  Tensor out("output", d, s.batch, s.heads, s.length, s.value_dim);
  States states = make_states(in.initial_state, sd, s.batch, s.heads, s.value_dim, s.key_dim, o.in_place);
  kla::DecodeParams p = linear_params(s);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.output = out.data();
  p.initial_state = states.initial_data(), p.final_state = states.final.data();
  const auto run = [&](auto type_tag, auto accumulator_tag) {
    using T = decltype(type_tag);
    using A = decltype(accumulator_tag);
    launch_decode(dk::view_of(p), o, sizeof(T), sizeof(A),
                  [](auto shape) { return &kla::decode_rows_kernel<T, A, decltype(shape), Policy>; });
  };
  switch (d) {
    case DType::bf16: run(__nv_bfloat16{}, float{}); break;
    case DType::f16: run(__half{}, float{}); break;
    case DType::f32: run(float{}, float{}); break;
    case DType::f64: run(double{}, double{}); break;
  }
  for (const Tensor* input : {&q, &k, &v, &states.initial}) input->buffer.check_guards();
  return {read(out), read(states.final)};
}

std::vector<Comparison> judge_linear(const vl::CudaShape& s, const ref::linear_attention::BatchInputs<Exact>& in,
                                     const LinearRun& r) {
  return vl::judge_decode(s, in, r.output, r.final_state);
}

std::vector<vl::CudaShape> linear_shapes() {
  const struct {
    Index dk, dv;
  } dims[] = {{128, 128}, {1, 1}, {15, 60}, {100, 7}, {64, 33}, {129, 20}, {256, 9}, {36, 128}, {27, 3}, {2, 256}};
  const Index lengths[] = {1, 3, 1, 8, 2, 1, 5, 1, 17, 2};
  const DType dtypes[] = {DType::bf16, DType::f32, DType::f16, DType::f64};
  std::vector<vl::CudaShape> shapes;
  for (int i = 0; i < 20; ++i) {
    vl::CudaShape s;
    s.key_dim = dims[i % 10].dk, s.value_dim = dims[i % 10].dv, s.length = lengths[(i + i / 10) % 10];
    s.dtype = dtypes[(i + i / 10) % 4], s.with_initial_state = i % 3 != 1;
    s.batch = 1 + i % 2, s.heads = 1 + i / 10, s.chunk_size = 1;
    shapes.push_back(s);
  }
  return shapes;
}

TEST(DecodeCpuEmulation, LinearAttentionMatchesTheOracle) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  std::uint64_t seed = 8000;
  for (const vl::CudaShape& s : linear_shapes()) {
    const auto in = rounded(vl::make_case(s, seed));
    RunOptions o;
    o.in_place = seed % 2 == 0, o.seed = seed++;
    const auto rep = judge_linear(s, in, emulate_linear(s, in, o));
    EXPECT_TRUE(verify::all_agree(rep)) << s << "\n" << verify::describe_failures(rep);
    std::cout << s << (o.in_place ? " in place" : "") << "\n  max err/bound: " << worst_ratios(rep) << "\n";
  }
}

// ---------------------------------------------------------------------------------------
// Bits: thread order, access width, token splits, zero gates.

// The same bits whatever order threads run in, with 16-byte runs or entry by entry (DK % 4 == 0 cases).
TEST(DecodeCpuEmulation, BitsDependNeitherOnThreadOrderNorOnAccessWidth) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const vd::DeltaCase& c : delta_cases()) {
    if (c.key_dim % 4 != 0) continue;
    const vd::HostInputs in = vd::make_inputs(c);
    RunOptions ascending;
    ascending.order = ThreadOrder::ascending;
    const vd::DecodeResult reference = emulate_delta(c, in, ascending);
    for (ThreadOrder order : {ThreadOrder::descending, ThreadOrder::shuffled})
      for (bool vector : {true, false}) {
        RunOptions o;
        o.order = order, o.allow_vector = vector, o.seed = c.seed;
        const vd::DecodeResult r = emulate_delta(c, in, o);
        EXPECT_TRUE(r.output.data == reference.output.data && r.final_state.data == reference.final_state.data)
            << vd::describe(c) << (vector ? " vector" : " scalar");
      }
  }
  std::uint64_t seed = 8000;
  for (const vl::CudaShape& s : linear_shapes()) {
    const auto in = rounded(vl::make_case(s, seed++));
    if (s.key_dim % 4 != 0) continue;
    RunOptions scalar;
    scalar.allow_vector = false, scalar.order = ThreadOrder::descending;
    const LinearRun a = emulate_linear(s, in), b = emulate_linear(s, in, scalar);
    EXPECT_TRUE(a.output.data == b.output.data && a.final_state.data == b.final_state.data) << s;
  }
}

// Decoding T tokens at once and in two calls (the first call's state fed, in place, to the second) give
// the same bits: the state leaves the registers exactly as the next token would have used it.
TEST(DecodeCpuEmulation, SplitDecodeEqualsOneDecode) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (bool gated : {false, true}) {
    vd::DeltaCase c;
    c.gated = gated, c.length = 6, c.key_dim = 128, c.value_dim = 40, c.with_initial_state = true, c.seed = 31;
    c.dtype = gated ? DType::f16 : DType::bf16;
    const vd::HostInputs in = vd::make_inputs(c);
    const vd::DecodeResult whole = emulate_delta(c, in);
    vd::DeltaCase first = c, rest = c;
    first.length = 2, rest.length = 4;
    vd::HostInputs in_first = in, in_rest = in;
    for (auto [a, b, t] : {std::tuple{&in_first.q, &in_rest.q, &in.q}, {&in_first.k, &in_rest.k, &in.k}, {&in_first.v, &in_rest.v, &in.v},
                           {&in_first.beta, &in_rest.beta, &in.beta}, {&in_first.log_gate, &in_rest.log_gate, &in.log_gate}}) {
      *a = Tensor4<Exact>(t->batch, t->heads, 2, t->cols), *b = Tensor4<Exact>(t->batch, t->heads, 4, t->cols);
      a->set_head(0, 0, t->head(0, 0).topRows(2)), b->set_head(0, 0, t->head(0, 0).bottomRows(4));
    }
    const vd::DecodeResult head = emulate_delta(first, in_first);
    in_rest.initial_state = head.final_state;
    RunOptions o;
    o.in_place = true;
    const vd::DecodeResult tail = emulate_delta(rest, in_rest, o);
    EXPECT_TRUE(tail.final_state.data == whole.final_state.data) << vd::describe(c);
    EXPECT_TRUE(Tensor4<Exact>(whole.output).head(0, 0).bottomRows(4) == tail.output.head(0, 0)) << vd::describe(c);
  }
}

// Gated DeltaNet with g = 0 is DeltaNet bit for bit (α = exp(0) = 1 exactly).
TEST(DecodeCpuEmulation, ZeroGatesGiveDeltaNetsBits) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  vd::DeltaCase c;
  c.length = 4, c.key_dim = 128, c.value_dim = 24, c.with_initial_state = true, c.zero_gates = true, c.seed = 5;
  const vd::HostInputs in = vd::make_inputs(c);
  vd::DeltaCase gated = c;
  gated.gated = true;
  const vd::DecodeResult a = emulate_delta(c, in), b = emulate_delta(gated, in);
  EXPECT_TRUE(a.output.data == b.output.data && a.final_state.data == b.final_state.data);
}

// ---------------------------------------------------------------------------------------
// Planted bugs: the decode checks reject each (and accept the faithful kernel on the same case).

TEST(DecodeCpuEmulation, PlantedBugsAreCaught) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (bool gated : {false, true}) {
    vd::DeltaCase c;
    c.gated = gated, c.length = 3, c.key_dim = 128, c.value_dim = 20, c.with_initial_state = true, c.seed = 77;
    const vd::HostInputs in = vd::make_inputs(c);
    ASSERT_TRUE(verify::all_agree(judge_delta(c, in, emulate_delta(c, in)))) << vd::describe(c);
    const auto stale = judge_delta(c, in, emulate_delta<StaleOutput>(c, in));
    EXPECT_FALSE(verify::all_agree(stale)) << "DeltaNet, output from S_{t-1}: " << vd::describe(c);
    const auto lost = judge_delta(c, in, emulate_delta<LostInitialState>(c, in));
    EXPECT_FALSE(verify::all_agree(lost)) << "DeltaNet, S_0 lost: " << vd::describe(c);
    std::cout << vd::describe(c) << "\n  output from S_{t-1}: " << worst_ratios(stale) << "\n  S_0 lost: " << worst_ratios(lost)
              << "\n";
  }
  for (DType d : {DType::bf16, DType::f32}) {
    vl::CudaShape s;
    s.key_dim = 128, s.value_dim = 20, s.length = 3, s.with_initial_state = true, s.dtype = d, s.chunk_size = 1;
    const auto in = rounded(vl::make_case(s, 123));
    ASSERT_TRUE(verify::all_agree(judge_linear(s, in, emulate_linear(s, in)))) << s;
    const auto stale = judge_linear(s, in, emulate_linear<StaleOutput>(s, in));
    EXPECT_FALSE(verify::all_agree(stale)) << "linear attention, output from S_{t-1}: " << s;
    const auto lost = judge_linear(s, in, emulate_linear<LostInitialState>(s, in));
    EXPECT_FALSE(verify::all_agree(lost)) << "linear attention, S_0 lost: " << s;
    std::cout << s << "\n  output from S_{t-1}: " << worst_ratios(stale) << "\n  S_0 lost: " << worst_ratios(lost) << "\n";
  }
}

}  // namespace
