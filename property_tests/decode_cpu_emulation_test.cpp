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
#include "property_tests/support/emulation_suite.hpp"

#include "cuda/delta_rule.h"
#include "cuda/linear_attention.h"
#include "kernel_checks/delta_rule_stages.hpp"
#include "kernel_checks/device_tensors.hpp"
#include "kernel_checks/linear_attention_kernel_checks.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// The kernels' source, compiled here under its own namespace (never the nvcc build's launch stubs).
#define DELTAPROOF_FORWARD_KERNELS decode_kernels_emulated
#include "cuda/decode_kernels.cuh"

namespace deltaproof::emulation_suite {
namespace {

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

// Where a run's tensors lie. Packed by default; tokens_outer lays q, k, v, o (and β, g) out as fla does,
// [B, T, H, D] viewed as [B, H, T, D]; state_pad leaves that many elements after each state row (4: rows
// stay 16-byte aligned; 1: they do not, so the kernel takes its scalar path).
struct Layout {
  bool tokens_outer = false;
  int state_pad = 0;
};
cuda::Strides token_strides(const Layout& l, Index H, Index T, Index D) {
  return l.tokens_outer ? cuda::Strides{T * H * D, D, H * D} : cuda::contiguous(int(H), int(T), int(D));
}
cuda::Strides state_strides(const Layout& l, Index H, Index DV, Index DK) {
  const Index row = DK + l.state_pad;
  return {H * DV * row, DV * row, row};
}

struct RunOptions {
  ThreadOrder order = ThreadOrder::shuffled;
  bool allow_vector = true;  // false: the scalar path even where runs of 4 could move as one access
  bool in_place = false;     // S_0 read from, and S_t written to, one buffer
  Layout layout;
  std::uint64_t seed = 1;
};

// A [B, H, R, C] tensor at `strides` in a NaN-poisoned buffer: inputs are written entry by entry, outputs
// read back entry by entry; an entry never written, or a byte between the entries written, is an error.
struct Placed {
  Tensor buffer;
  cuda::Strides strides;
  Index batch = 0, heads = 0, rows = 0, cols = 0;

  Placed() = default;
  Placed(const std::string& name, DType d, Index B, Index H, Index R, Index C, cuda::Strides s)
      : buffer(name, d, 1, 1, 1, s.head_offset(int(B - 1), int(H - 1)) + (R - 1) * s.row + C), strides(s), batch(B), heads(H),
        rows(R), cols(C) {}
  void* data() { return buffer.data(); }
  std::size_t at(Index b, Index h, Index i, Index j) const {
    return std::size_t(strides.head_offset(int(b), int(h)) + i * strides.row + j);
  }
  unsigned char* bytes(std::size_t i) { return static_cast<unsigned char*>(buffer.data()) + i * cuda::size_of(buffer.dtype); }
  const unsigned char* bytes(std::size_t i) const {
    return static_cast<const unsigned char*>(buffer.buffer.data()) + i * cuda::size_of(buffer.dtype);
  }

  // Copies entries between this buffer and a packed tensor of the same shape (to_packed: from here).
  void copy(Tensor& packed, bool to_packed) const {
    const std::size_t size = cuda::size_of(buffer.dtype);
    auto* p = static_cast<unsigned char*>(packed.data());
    std::size_t n = 0;
    ref::for_each_head(batch, heads, [&](Index b, Index h) {
      for (Index i = 0; i < rows; ++i)
        for (Index j = 0; j < cols; ++j, ++n) {
          auto* here = const_cast<unsigned char*>(bytes(at(b, h, i, j)));
          if (to_packed) std::memcpy(p + n * size, here, size);
          else std::memcpy(here, p + n * size, size);
        }
    });
  }
  void put(const Tensor4<Exact>& t) {
    Tensor packed = write(buffer.buffer.name(), t, buffer.dtype);
    copy(packed, false);
  }
  Tensor4<Exact> take() const {
    buffer.buffer.check_guards();
    Tensor packed(buffer.buffer.name(), buffer.dtype, batch, heads, rows, cols);
    copy(packed, true);
    std::vector<bool> entry(buffer.count(), false);
    ref::for_each_head(batch, heads, [&](Index b, Index h) {
      for (Index i = 0; i < rows; ++i)
        for (Index j = 0; j < cols; ++j) entry[at(b, h, i, j)] = true;
    });
    for (std::size_t i = 0; i < entry.size(); ++i)
      for (std::size_t byte = 0; !entry[i] && byte < cuda::size_of(buffer.dtype); ++byte)
        if (bytes(i)[byte] != emulation::kPoisonByte) throw std::runtime_error(buffer.buffer.name() + ": written between its entries");
    return read(packed);  // throws on an entry never written (still poison)
  }
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

// What both families' runs share: q, k, v, the output and the states placed by the layout, S_0 (when
// given) in its own buffer or in the final state's (in place); params gets every pointer and stride.
struct Run {
  Placed q, k, v, output, initial, final;
  bool in_place = false;

  template <class Params>
  Run(Params& p, const Tensor4<Exact>& q_in, const Tensor4<Exact>& k_in, const Tensor4<Exact>& v_in,
      const std::optional<Tensor4<Exact>>& s0, DType state_dtype, const RunOptions& o)
      : in_place(s0 && o.in_place) {
    const DType d = p.dtype;
    const Index B = p.batch, H = p.heads, T = p.tokens, DK = p.key_dim, DV = p.value_dim;
    const cuda::Strides key_s = token_strides(o.layout, H, T, DK), value_s = token_strides(o.layout, H, T, DV);
    const cuda::Strides state_s = state_strides(o.layout, H, DV, DK);
    q = Placed("q", d, B, H, T, DK, key_s), k = Placed("k", d, B, H, T, DK, key_s), v = Placed("v", d, B, H, T, DV, value_s);
    q.put(q_in), k.put(k_in), v.put(v_in);
    output = Placed("output", d, B, H, T, DV, value_s);
    final = Placed("final_state", state_dtype, B, H, DV, DK, state_s);
    if (s0 && !in_place) initial = Placed("initial_state", state_dtype, B, H, DV, DK, state_s), initial.put(*s0);
    if (in_place) final.put(*s0);
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.output = output.data();
    p.q_strides = p.k_strides = key_s, p.v_strides = p.output_strides = value_s;
    p.initial_state_strides = p.final_state_strides = state_s;
    using State = std::remove_const_t<std::remove_pointer_t<decltype(p.initial_state)>>;
    p.initial_state = static_cast<const State*>(in_place ? final.data() : s0 ? initial.data() : nullptr);
    p.final_state = static_cast<State*>(final.data());
  }
  void check_inputs() const {
    for (const Placed* input : {&q, &k, &v, &initial}) input->buffer.buffer.check_guards();
  }
};

// ---------------------------------------------------------------------------------------
// DeltaNet / Gated DeltaNet

template <class Policy = Faithful>
vd::DecodeResult emulate_delta(const vd::DeltaCase& c, const vd::HostInputs& in, const RunOptions& o = {}) {
  const DType d = c.dtype;
  const Index B = c.batch, H = c.heads, T = c.length;
  cuda::delta_rule::DecodeParams p;
  p.dtype = d, p.batch = int(B), p.heads = int(H), p.tokens = int(T), p.key_dim = int(c.key_dim), p.value_dim = int(c.value_dim);
  std::optional<Tensor4<Exact>> s0;
  if (c.with_initial_state) s0 = in.initial_state;
  Run run(p, in.q, in.k, in.v, s0, DType::f32, o);
  const cuda::Strides gate_s = token_strides(o.layout, H, T, 1);
  Placed beta("beta", d, B, H, T, 1, gate_s), gate;
  beta.put(in.beta);
  if (c.gated) gate = Placed("log_gate", DType::f32, B, H, T, 1, gate_s), gate.put(in.log_gate);
  p.beta = beta.data(), p.log_gate = static_cast<const float*>(gate.data());
  p.beta_strides = p.log_gate_strides = gate_s;
  const auto launch = [&](auto type_tag) {
    using T = decltype(type_tag);
    launch_decode(dk::view_of(p), o, sizeof(T), sizeof(float),
                  [](auto shape) { return &dk::delta_rule_decode_kernel<T, decltype(shape), Policy>; });
  };
  if (d == DType::bf16) launch(__nv_bfloat16{});
  else if (d == DType::f16) launch(__half{});
  else launch(float{});
  run.check_inputs(), beta.buffer.buffer.check_guards(), gate.buffer.buffer.check_guards();
  return {run.output.take(), run.final.take()};
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

// The design page's accuracy inputs (normalized keys, sigmoid β, gates near 1, real-valued q, v) at the
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

kla::DecodeParams linear_params(const vl::CudaShape& s) {
  kla::DecodeParams p;
  p.dtype = s.dtype, p.batch = int(s.batch), p.heads = int(s.heads), p.tokens = int(s.length);
  p.key_dim = int(s.key_dim), p.value_dim = int(s.value_dim);
  return p;
}
// The case's inputs rounded to its dtype (S_0 to the state dtype): the exact values the kernel sees.
ref::linear_attention::BatchInputs<Exact> rounded(const vl::CudaCase& c) {
  const DType d = c.shape.dtype;
  ref::linear_attention::BatchInputs<Exact> in{verify::round_to(c.inputs.q, d), verify::round_to(c.inputs.k, d),
                                               verify::round_to(c.inputs.v, d), std::nullopt};
  if (c.inputs.initial_state) in.initial_state = verify::round_to(*c.inputs.initial_state, kla::state_dtype(d));
  return in;
}

template <class Policy = Faithful>
LinearRun emulate_linear(const vl::CudaShape& s, const ref::linear_attention::BatchInputs<Exact>& in, const RunOptions& o = {}) {
  kla::DecodeParams p = linear_params(s);
  Run run(p, in.q, in.k, in.v, in.initial_state, kla::state_dtype(s.dtype), o);
  const auto launch = [&](auto type_tag, auto accumulator_tag) {
    using T = decltype(type_tag);
    using A = decltype(accumulator_tag);
    launch_decode(dk::view_of(p), o, sizeof(T), sizeof(A),
                  [](auto shape) { return &kla::decode_rows_kernel<T, A, decltype(shape), Policy>; });
  };
  switch (s.dtype) {
    case DType::bf16: launch(__nv_bfloat16{}, float{}); break;
    case DType::f16: launch(__half{}, float{}); break;
    case DType::f32: launch(float{}, float{}); break;
    case DType::f64: launch(double{}, double{}); break;
  }
  run.check_inputs();
  return {run.output.take(), run.final.take()};
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

// Strided layouts (fla's [B, T, H, D] for q, k, v, o, β, g; state rows padded, 16-byte aligned or not)
// give the packed layout's bits: the kernels read and write exactly the strided entries (Placed checks
// that nothing between them is written) and the access width changes nothing.
TEST(DecodeCpuEmulation, StridedLayoutsGiveThePackedBits) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (const Layout layout : {Layout{true, 4}, Layout{true, 1}, Layout{false, 3}}) {
    vd::DeltaCase c;
    c.batch = 2, c.heads = 3, c.length = 3, c.key_dim = 64, c.value_dim = 20, c.with_initial_state = true, c.seed = 41;
    for (bool gated : {false, true}) {
      c.gated = gated;
      const vd::HostInputs in = vd::make_inputs(c);
      RunOptions o;
      o.layout = layout, o.in_place = gated;
      const vd::DecodeResult packed = emulate_delta(c, in), strided = emulate_delta(c, in, o);
      EXPECT_TRUE(strided.output.data == packed.output.data && strided.final_state.data == packed.final_state.data)
          << vd::describe(c) << " tokens_outer=" << layout.tokens_outer << " state_pad=" << layout.state_pad;
    }
    vl::CudaShape s;
    s.batch = 2, s.heads = 3, s.length = 3, s.key_dim = 128, s.value_dim = 12, s.with_initial_state = true, s.chunk_size = 1;
    for (DType d : {DType::bf16, DType::f64}) {
      s.dtype = d;
      const auto in = rounded(vl::make_case(s, 55));
      RunOptions o;
      o.layout = layout;
      const LinearRun packed = emulate_linear(s, in), strided = emulate_linear(s, in, o);
      EXPECT_TRUE(strided.output.data == packed.output.data && strided.final_state.data == packed.final_state.data)
          << s << " tokens_outer=" << layout.tokens_outer << " state_pad=" << layout.state_pad;
    }
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
}  // namespace deltaproof::emulation_suite
