// Bad inputs to both kernel families (cuda/linear_attention.h, cuda/delta_rule.h), each a named test
// of what their headers state:
//   aliasing   an output overlapping any other tensor is refused by validate, naming both, before any
//              CUDA call (these run on CI: the pointers are host addresses that are never read);
//              decode's state updated in place is the one exception;
//   pointers   host and misaligned pointers are refused, nothing is written (device);
//   NaN, Inf   computed, not refused: each reaches exactly the outputs the header names (device);
//   range      β outside [0, 1] and g > 0 (α > 1) are computed: within the stage bounds for β > 1 and
//              g > 0, and like the float64 recurrence for β < 0 (device).
#include "cuda/delta_rule.h"
#include "cuda/linear_attention.h"
#include "property_tests/support/gpu.hpp"
#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "kernel_checks/delta_rule_stages.hpp"
#include "kernel_checks/device_tensors.hpp"
#include "kernel_checks/linear_attention_kernel_checks.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <utility>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace deltaproof;
using namespace deltaproof::testing;
using cuda::DType;
using cuda::Strides;
using ref::Exact;
using ref::Index;
namespace dt = deltaproof::verify;
namespace vdr = deltaproof::verify::delta_rule;
namespace vla = deltaproof::verify::linear_attention;
namespace kla = deltaproof::cuda::linear_attention;
namespace kdr = deltaproof::cuda::delta_rule;

// The refusal message of `call` on `base` changed by an edit: refused(edit).
template <class Params, class Call>
auto refusal_of(const Params& base, Call call) {
  return [base, call](auto edit) {
    Params p = base;
    edit(p);
    return rejection([&] { call(p); });
  };
}

// Each edit of `base` must be refused with a message starting with its prefix.
template <class Params>
using Refusals = std::vector<std::pair<std::function<void(Params&)>, std::string>>;
template <class Params, class Call>
void expect_refusals(const Params& base, Call call, const Refusals<Params>& refusals) {
  const auto message = refusal_of(base, call);
  for (const auto& [edit, prefix] : refusals) EXPECT_TRUE(starts_with(message(edit), prefix));
}

// ---------------------------------------------------------------------------------------
// Aliasing (no device needed). Every tensor gets its own 64 KB of one host arena; a test moves one
// pointer onto another tensor's bytes. Past the aliasing check, validation stops at the first
// device-pointer check (kPassesAliasing): the arena is host memory.

struct Arena {
  std::vector<unsigned char> bytes = std::vector<unsigned char>(8 << 20);
  void* slot(int i) { return bytes.data() + (std::size_t(i) << 16); }
};
constexpr const char* kPassesAliasing = "q: must be a device pointer";
template <class Params>
void unchanged(Params&) {}

kla::ForwardParams la_forward(Arena& a) {
  kla::ForwardParams p;
  p.dtype = DType::bf16, p.batch = 2, p.heads = 3, p.length = 20, p.key_dim = 8, p.value_dim = 8, p.chunk_size = 16;
  kla::set_contiguous_strides(p);
  p.q = a.slot(0), p.k = a.slot(1), p.v = a.slot(2), p.output = a.slot(3), p.initial_state = a.slot(4);
  p.final_state = a.slot(5), p.boundary_states = a.slot(6);
  return p;
}
kla::BackwardParams la_backward(Arena& a) {
  kla::BackwardParams p;
  p.dtype = DType::f32, p.batch = 1, p.heads = 2, p.length = 33, p.key_dim = 5, p.value_dim = 7, p.chunk_size = 32;
  kla::set_contiguous_strides(p);
  p.q = a.slot(0), p.k = a.slot(1), p.v = a.slot(2), p.d_output = a.slot(3), p.dq = a.slot(4), p.dk = a.slot(5);
  p.dv = a.slot(6), p.initial_state = a.slot(7), p.d_final_state = a.slot(8), p.d_initial_state = a.slot(9);
  return p;
}
kla::DecodeParams la_decode(Arena& a) {
  kla::DecodeParams p;
  p.dtype = DType::bf16, p.batch = 2, p.heads = 2, p.tokens = 3, p.key_dim = 16, p.value_dim = 8;
  kla::set_contiguous_strides(p);
  p.q = a.slot(0), p.k = a.slot(1), p.v = a.slot(2), p.output = a.slot(3), p.initial_state = a.slot(4);
  p.final_state = a.slot(4);  // in place
  return p;
}
kdr::ForwardParams delta_forward(Arena& a) {
  kdr::ForwardParams p;
  p.dtype = DType::bf16, p.batch = 2, p.heads = 3, p.length = 40, p.key_dim = 16, p.value_dim = 8, p.chunk_size = 32;
  kdr::set_contiguous_strides(p);
  p.q = a.slot(0), p.k = a.slot(1), p.v = a.slot(2), p.beta = a.slot(3), p.log_gate = static_cast<const float*>(a.slot(4));
  p.initial_state = static_cast<const float*>(a.slot(5)), p.output = a.slot(6), p.final_state = static_cast<float*>(a.slot(7));
  p.workspace = a.slot(8);
  return p;
}
kdr::BackwardParams delta_backward(Arena& a) {
  kdr::BackwardParams p;
  p.dtype = DType::f32, p.batch = 1, p.heads = 2, p.length = 33, p.key_dim = 5, p.value_dim = 7, p.chunk_size = 16;
  kdr::set_contiguous_strides(p);
  p.q = a.slot(0), p.k = a.slot(1), p.v = a.slot(2), p.beta = a.slot(3), p.log_gate = a.slot(4), p.d_output = a.slot(5);
  p.dq = a.slot(6), p.dk = a.slot(7), p.dv = a.slot(8), p.d_beta = a.slot(9), p.d_log_gate = a.slot(10);
  p.initial_state = a.slot(11), p.d_final_state = a.slot(12), p.d_initial_state = a.slot(13), p.workspace = a.slot(14);
  return p;
}
kdr::DecodeParams delta_decode(Arena& a) {
  kdr::DecodeParams p;
  p.dtype = DType::f16, p.batch = 3, p.heads = 1, p.tokens = 2, p.key_dim = 16, p.value_dim = 12;
  kdr::set_contiguous_strides(p);
  p.q = a.slot(0), p.k = a.slot(1), p.v = a.slot(2), p.beta = a.slot(3), p.output = a.slot(4);
  p.initial_state = static_cast<const float*>(a.slot(5)), p.final_state = static_cast<float*>(a.slot(5));  // in place
  return p;
}

char* bytes_of(const void* p) { return static_cast<char*>(const_cast<void*>(p)); }

TEST(KernelAliasing, LinearAttentionForwardOutputsOverlapNoOtherTensor) {
  Arena a;
  const std::size_t q_bytes = 2 * 3 * 20 * 8 * 2;
  expect_refusals(la_forward(a), [](const auto& p) { kla::validate(p); },
                  {{unchanged<kla::ForwardParams>, kPassesAliasing},
                   {[&](auto& p) { p.output = a.slot(0); }, "output: overlaps q"},
                   {[&](auto& p) { p.output = bytes_of(a.slot(0)) + q_bytes - 16; }, "output: overlaps q"},  // q's last row
                   {[&](auto& p) { p.output = bytes_of(a.slot(0)) + q_bytes; }, kPassesAliasing},  // adjacent is apart
                   {[&](auto& p) { p.final_state = a.slot(1); }, "final_state: overlaps k"},
                   {[&](auto& p) { p.final_state = a.slot(4); }, "final_state: overlaps initial_state"},
                   {[&](auto& p) { p.boundary_states = a.slot(3); }, "boundary_states: overlaps output"},
                   {[&](auto& p) { p.k = p.q; }, kPassesAliasing}});  // inputs may share memory
}

TEST(KernelAliasing, LinearAttentionBackwardOutputsOverlapNoOtherTensor) {
  Arena a;
  expect_refusals(la_backward(a), [](const auto& p) { kla::backward(p); },
                  {{unchanged<kla::BackwardParams>, kPassesAliasing},
                   {[&](auto& p) { p.dk = p.dq; }, "dk: overlaps dq"},  // two outputs
                   {[&](auto& p) { p.dv = a.slot(3); }, "dv: overlaps d_output"},
                   {[&](auto& p) { p.d_initial_state = a.slot(8); }, "d_initial_state: overlaps d_final_state"},
                   {[&](auto& p) { p.dq = a.slot(7); }, "dq: overlaps initial_state"}});
}

// Decode's state updated in place (initial_state == final_state) is taken; the same pointer with other
// strides is not, nor a final state overlapping the initial one without being it.
template <class Params, class Decode>
void expect_in_place_state_is_the_one_exception(const Params& base, Decode decode) {
  expect_refusals(base, decode,
                  {{unchanged<Params>, kPassesAliasing},
                   {[](auto& p) { p.final_state_strides.row += 4; }, "initial_state_strides"},
                   {[](auto& p) { p.final_state = reinterpret_cast<decltype(p.final_state)>(bytes_of(p.initial_state) + 4); },
                    "final_state: overlaps initial_state"},
                   {[](auto& p) { p.output = const_cast<void*>(p.k); }, "output: overlaps k"}});
}

TEST(KernelAliasing, LinearAttentionDecodeStateInPlaceIsTheOneException) {
  Arena a;
  expect_in_place_state_is_the_one_exception(la_decode(a), [](const auto& p) { kla::decode(p); });
}

TEST(KernelAliasing, DeltaRuleForwardOutputsOverlapNoOtherTensor) {
  Arena a;
  expect_refusals(delta_forward(a), [](const auto& p) { kdr::forward(p); },
                  {{unchanged<kdr::ForwardParams>, kPassesAliasing},
                   {[&](auto& p) { p.output = a.slot(3); }, "output: overlaps beta"},
                   // The forward has no in-place state (decode has).
                   {[&](auto& p) { p.final_state = const_cast<float*>(p.initial_state); }, "final_state: overlaps initial_state"},
                   {[&](auto& p) { p.final_state = static_cast<float*>(a.slot(6)); }, "final_state: overlaps output"},
                   // The workspace (W and U: 2·3·40·(16 + 8) bf16; the scores: 2·3·2 chunks of 32 × 32) is written too.
                   {[&](auto& p) { p.workspace = a.slot(0); }, "workspace: overlaps q"},
                   {[&](auto& p) { p.workspace = bytes_of(a.slot(4)) - 1024; }, "workspace: overlaps log_gate"}});
}

TEST(KernelAliasing, DeltaRuleBackwardOutputsOverlapNoOtherTensor) {
  Arena a;
  expect_refusals(delta_backward(a), [](const auto& p) { kdr::backward(p); },
                  {{unchanged<kdr::BackwardParams>, kPassesAliasing},
                   {[&](auto& p) { p.d_beta = a.slot(3); }, "d_beta: overlaps beta"},
                   {[&](auto& p) { p.d_log_gate = a.slot(7); }, "d_log_gate: overlaps dk"},  // two outputs
                   {[&](auto& p) { p.d_initial_state = a.slot(11); }, "d_initial_state: overlaps initial_state"},
                   {[&](auto& p) { p.workspace = a.slot(8); }, "dv: overlaps workspace"}});
}

TEST(KernelAliasing, DeltaRuleDecodeStateInPlaceIsTheOneException) {
  Arena a;
  expect_in_place_state_is_the_one_exception(delta_decode(a), [](const auto& p) { kdr::decode(p); });
  expect_refusals(delta_decode(a), [](const auto& p) { kdr::decode(p); },
                  {{[&](auto& p) { p.output = a.slot(3); }, "output: overlaps beta"}});
}

// Strides decide the extents: q, k, v interleaved in one fused [B, T, 3, H, D] buffer are inputs and
// may share it; dq, dk, dv interleaved the same way are refused (a range check: documented).
TEST(KernelAliasing, InterleavedInputsAreTakenInterleavedOutputsAreNot) {
  Arena a;
  const int B = 2, H = 3, L = 20, D = 8;
  const Strides fused{std::int64_t{L} * 3 * H * D, D, 3 * H * D};  // [B, T, 3, H, D] viewed as [B, H, T, D]
  kla::BackwardParams p;
  p.dtype = DType::bf16, p.batch = B, p.heads = H, p.length = L, p.key_dim = D, p.value_dim = D, p.chunk_size = 16;
  kla::set_contiguous_strides(p);
  char* qkv = bytes_of(a.slot(0));
  p.q = qkv, p.k = qkv + 2 * H * D, p.v = qkv + 2 * 2 * H * D, p.q_strides = p.k_strides = p.v_strides = fused;
  p.d_output = a.slot(20), p.dq = a.slot(40), p.dk = a.slot(60), p.dv = a.slot(80);
  EXPECT_TRUE(starts_with(rejection([&] { kla::backward(p); }), kPassesAliasing));
  char* dqkv = bytes_of(a.slot(40));
  p.dq = dqkv, p.dk = dqkv + 2 * H * D, p.dv = dqkv + 2 * 2 * H * D, p.dq_strides = p.dk_strides = p.dv_strides = fused;
  EXPECT_TRUE(starts_with(rejection([&] { kla::backward(p); }), "dk: overlaps dq"));
}

// Strides under which two entries would share an address are refused, in either family, naming the
// stride; any order of batch, head and row is taken when entries stay apart.
TEST(KernelStrides, StridesThatRepeatAnEntryAreRefused) {
  Arena a;
  expect_refusals(la_forward(a), [](const auto& p) { kla::validate(p); },
                  {{[](auto& p) { p.k_strides.row = 0; }, "k_strides.row"},
                   {[](auto& p) { p.v_strides.head = -8; }, "v_strides.head: must be >= 0"},
                   {[](auto& p) { p.output_strides.batch = p.output_strides.head; }, "output_strides.batch"},
                   {[](auto& p) { p.q_strides = {20 * 3 * 8, 8, 3 * 8}; }, kPassesAliasing}});  // token-major
  expect_refusals(delta_forward(a), [](const auto& p) { kdr::validate(p); },
                  {{[](auto& p) { p.beta_strides.row = 0; }, "beta_strides.row"},
                   {[](auto& p) { p.log_gate_strides = {40 * 3, 1, 3}; }, kPassesAliasing},  // [B, T, H]
                   {[](auto& p) { p.log_gate_strides = {40 * 3, 1, 2}; }, "log_gate_strides.row"}});
}

// ---------------------------------------------------------------------------------------
// Host and misaligned pointers (device): refused naming the argument, nothing written.

TEST(KernelPointers, LinearAttentionBackwardAndDecodeRefuseHostAndMisalignedPointers) {
  DELTAPROOF_REQUIRE_GPU();
  const vla::CudaCase c = vla::make_case({1, 2, 30, 16, 8, 16, true, DType::bf16}, 3);
  const vla::DeviceInputs in = vla::upload_case(c);
  dt::DeviceTensor dq = dt::allocate(DType::bf16, 1, 2, 30, 16), dk = dt::allocate(DType::bf16, 1, 2, 30, 16),
                   dv = dt::allocate(DType::bf16, 1, 2, 30, 8), state = dt::allocate(DType::f32, 1, 2, 8, 16);
  const auto untouched = dt::download_bytes(dq);
  std::vector<unsigned char> host(1 << 16);
  kla::BackwardParams b;
  b.dtype = DType::bf16, b.batch = 1, b.heads = 2, b.length = 30, b.key_dim = 16, b.value_dim = 8, b.chunk_size = 16;
  kla::set_contiguous_strides(b);
  b.q = in.q.device.data(), b.k = in.k.device.data(), b.v = in.v.device.data(), b.d_output = in.d_output.device.data();
  b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data();
  const auto backward = refusal_of(b, [](const auto& p) { kla::backward(p); });
  EXPECT_TRUE(starts_with(backward([&](auto& p) { p.d_output = host.data(); }), "d_output: must be a device pointer"));
  EXPECT_TRUE(starts_with(backward([&](auto& p) { p.dk = static_cast<char*>(p.dk) + 1; }), "dk: must be aligned"));
  EXPECT_TRUE(starts_with(backward([&](auto& p) { p.d_initial_state = static_cast<char*>(state.data()) + 2; }),
                          "d_initial_state: must be aligned"));
  kla::DecodeParams d;
  d.dtype = DType::bf16, d.batch = 1, d.heads = 2, d.tokens = 30, d.key_dim = 16, d.value_dim = 8;
  kla::set_contiguous_strides(d);
  d.q = in.q.device.data(), d.k = in.k.device.data(), d.v = in.v.device.data(), d.output = dq.data(), d.final_state = state.data();
  const auto decode = refusal_of(d, [](const auto& p) { kla::decode(p); });
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.v = host.data(); }), "v: must be a device pointer"));
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.final_state = host.data(); }), "final_state: must be a device pointer"));
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.q = static_cast<const char*>(p.q) + 1; }), "q: must be aligned"));
  EXPECT_TRUE(dt::download_bytes(dq) == untouched) << "a refused call wrote";
}

TEST(KernelPointers, DeltaRuleDecodeRefusesHostAndMisalignedPointers) {
  DELTAPROOF_REQUIRE_GPU();
  vdr::DeltaCase c;
  c.gated = true, c.length = 4, c.key_dim = 16, c.value_dim = 8, c.heads = 2, c.with_initial_state = true, c.seed = 5;
  const vdr::DeviceInputs in = vdr::upload_inputs(c, vdr::make_inputs(c));
  dt::DeviceTensor out = dt::allocate(c.dtype, 1, 2, 4, 8), state = dt::allocate(DType::f32, 1, 2, 8, 16);
  const dt::DeviceTensor other = dt::allocate(DType::f32, 1, 2, 8, 16);  // apart from every tensor above
  const auto untouched = dt::download_bytes(out);
  std::vector<unsigned char> host(1 << 16);
  kdr::DecodeParams d;
  d.dtype = c.dtype, d.batch = 1, d.heads = 2, d.tokens = 4, d.key_dim = 16, d.value_dim = 8;
  kdr::set_contiguous_strides(d);
  d.q = in.q.device.data(), d.k = in.k.device.data(), d.v = in.v.device.data(), d.beta = in.beta.device.data();
  d.log_gate = static_cast<const float*>(in.log_gate.device.data());
  d.initial_state = static_cast<const float*>(in.initial_state.device.data());
  d.output = out.data(), d.final_state = static_cast<float*>(state.data());
  const auto decode = refusal_of(d, [](const auto& p) { kdr::decode(p); });
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.k = host.data(); }), "k: must be a device pointer"));
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.beta = static_cast<const char*>(p.beta) + 1; }), "beta: must be aligned"));
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.log_gate = reinterpret_cast<const float*>(host.data()); }),
                          "log_gate: must be a device pointer"));
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.initial_state = reinterpret_cast<const float*>(static_cast<const char*>(other.data()) + 2); }),
                          "initial_state: must be aligned"));
  EXPECT_TRUE(starts_with(decode([&](auto& p) { p.output = host.data(); }), "output: must be a device pointer"));
  EXPECT_TRUE(dt::download_bytes(out) == untouched) << "a refused call wrote";
}

// ---------------------------------------------------------------------------------------
// NaN and Inf (device): one entry of one input made non-finite in a copy; every output entry of the
// poisoned run either equals the clean run's bit for bit, or is what the header states.

enum class Expect { same, nan, non_finite, unstated };
using Rule = std::function<Expect(Index b, Index h, Index row, Index col)>;

// Raw outputs of one run: [B, H, L, DV] and [B, H, DV, DK].
struct Raw {
  std::vector<unsigned char> output, final_state;
};

// The entries of `poisoned` that break `rule` (at most five shown, then the count); "" when none.
std::string broken(const std::string& tensor, const std::vector<unsigned char>& clean, const std::vector<unsigned char>& poisoned,
                   DType dtype, Index B, Index H, Index rows, Index cols, const Rule& rule) {
  const std::size_t es = cuda::size_of(dtype);
  std::string shown;
  long count = 0;
  std::size_t i = 0;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index r = 0; r < rows; ++r)
        for (Index c = 0; c < cols; ++c, ++i) {
          const Expect e = rule(b, h, r, c);
          const double x = element(poisoned, dtype, i);
          const bool ok = e == Expect::same       ? std::memcmp(clean.data() + i * es, poisoned.data() + i * es, es) == 0
                          : e == Expect::nan      ? std::isnan(x)
                          : e == Expect::non_finite ? !std::isfinite(x)
                                                  : true;
          if (ok) continue;
          if (count++ < 5)
            shown += "  " + tensor + " (" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(r) + ", " +
                     std::to_string(c) + "): " + std::to_string(x) + ", expected " +
                     (e == Expect::same ? "the clean run's " + std::to_string(element(clean, dtype, i))
                      : e == Expect::nan ? std::string("NaN")
                                         : std::string("NaN or Inf")) +
                     "\n";
        }
  return count ? shown + "  (" + std::to_string(count) + " entries)" : "";
}

void poke(const dt::DeviceTensor& t, Index b, Index h, Index row, Index col, double value) {
  const std::size_t at = std::size_t(((b * t.heads + h) * t.rows + row) * t.cols + col) * cuda::size_of(t.dtype);
  set_device_bytes(static_cast<char*>(t.data()) + at, encode(value, t.dtype));
}

// The poisoned entry: head (b0, h0), token t (in the middle of a 16-token tile), column `col`.
constexpr Index b0 = 0, h0 = 1, t = 37, tile = t / 16 * 16;
bool poisoned_head(Index b, Index h) { return b == b0 && h == h0; }

// Chunkwise output rules (tokens before t's tile unchanged, t's tile before t unstated).
Rule later_tokens(Expect from_t) {
  return [=](Index b, Index h, Index r, Index) {
    if (!poisoned_head(b, h) || r < tile) return Expect::same;
    return r < t ? Expect::unstated : from_t;
  };
}
// Decode runs token by token: no tile.
Rule later_tokens_decode(Expect from_t) {
  return [=](Index b, Index h, Index r, Index) { return poisoned_head(b, h) && r >= t ? from_t : Expect::same; };
}
Rule only_token_t = [](Index b, Index h, Index r, Index) { return poisoned_head(b, h) && r == t ? Expect::non_finite : Expect::same; };
Rule everything_same = [](Index, Index, Index, Index) { return Expect::same; };
Rule poisoned_head_nan = [](Index b, Index h, Index, Index) { return poisoned_head(b, h) ? Expect::nan : Expect::same; };

// Linear attention runs through the public API, packed.
Raw la_run(const vla::CudaShape& s, const vla::DeviceInputs& in, bool decode) {
  const int B = int(s.batch), H = int(s.heads), L = int(s.length), DK = int(s.key_dim), DV = int(s.value_dim);
  dt::DeviceTensor out = dt::allocate(s.dtype, B, H, L, DV), fin = dt::allocate(kla::state_dtype(s.dtype), B, H, DV, DK);
  const void* s0 = in.initial_state ? in.initial_state->device.data() : nullptr;
  if (decode) {
    kla::DecodeParams p;
    p.dtype = s.dtype, p.batch = B, p.heads = H, p.tokens = L, p.key_dim = DK, p.value_dim = DV;
    kla::set_contiguous_strides(p);
    p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.output = out.data();
    p.initial_state = s0, p.final_state = fin.data();
    kla::decode(p);
  } else {
    kla::ForwardParams p;
    p.dtype = s.dtype, p.batch = B, p.heads = H, p.length = L, p.key_dim = DK, p.value_dim = DV, p.chunk_size = int(s.chunk_size);
    kla::set_contiguous_strides(p);
    p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.output = out.data();
    p.initial_state = s0, p.final_state = fin.data();
    kla::forward(p);
  }
  return {dt::download_bytes(out), dt::download_bytes(fin)};
}

// Tensor cores (bf16, D = 64) and the CUDA-core pass (fp32, odd dims).
const vla::CudaShape kLinearShapes[] = {{1, 2, 77, 64, 64, 32, true, DType::bf16}, {1, 2, 77, 20, 12, 32, true, DType::f32}};

enum class LinearInput { q, k, v };

// Poisons entry (b0, h0, t, col) of one input with `value`, runs forward and decode, checks the rules.
void expect_linear(LinearInput input, Index col, double value, const Rule& forward_output, const Rule& decode_output,
                   const Rule& final_state) {
  for (const vla::CudaShape& s : kLinearShapes) {
    const vla::CudaCase c = vla::make_case(s, 21);
    const vla::DeviceInputs clean = vla::upload_case(c), poisoned = vla::upload_case(c);
    poke(input == LinearInput::q ? poisoned.q.device : input == LinearInput::k ? poisoned.k.device : poisoned.v.device, b0, h0, t,
         col, value);
    for (bool decode : {false, true}) {
      const Raw x = la_run(s, clean, decode), y = la_run(s, poisoned, decode);
      const std::string what = vla::describe(s) + (decode ? " decode" : " forward");
      EXPECT_EQ(broken("output", x.output, y.output, s.dtype, s.batch, s.heads, s.length, s.value_dim,
                       decode ? decode_output : forward_output),
                "")
          << what;
      EXPECT_EQ(broken("final state", x.final_state, y.final_state, kla::state_dtype(s.dtype), s.batch, s.heads, s.value_dim,
                       s.key_dim, final_state),
                "")
          << what;
    }
  }
}

TEST(NonFiniteInputs, LinearAttentionInfInQReachesOnlyThatTokensOutput) {
  DELTAPROOF_REQUIRE_GPU();
  expect_linear(LinearInput::q, 3, INFINITY, only_token_t, only_token_t, everything_same);
  expect_linear(LinearInput::q, 5, NAN, only_token_t, only_token_t, everything_same);
}

// k_t[d] NaN: column d of every later state, hence every entry of o_s for s ≥ t.
TEST(NonFiniteInputs, LinearAttentionNaNInKReachesEveryLaterOutput) {
  DELTAPROOF_REQUIRE_GPU();
  constexpr Index d = 2;
  const Rule state_column = [](Index b, Index h, Index, Index c) {
    if (!poisoned_head(b, h)) return Expect::same;
    return c == d ? Expect::nan : Expect::unstated;
  };
  expect_linear(LinearInput::k, d, NAN, later_tokens(Expect::nan), later_tokens_decode(Expect::nan), state_column);
}

// v_t[r] NaN: row r of every later state, column r of o_s for s ≥ t; every other entry unchanged.
TEST(NonFiniteInputs, LinearAttentionNaNInVStaysInItsValueRow) {
  DELTAPROOF_REQUIRE_GPU();
  constexpr Index r = 4;
  const auto column_r = [](const Rule& rule) {
    return Rule([rule](Index b, Index h, Index row, Index c) { return c == r ? rule(b, h, row, c) : Expect::same; });
  };
  const Rule state_row = [](Index b, Index h, Index row, Index) {
    return poisoned_head(b, h) && row == r ? Expect::nan : Expect::same;
  };
  expect_linear(LinearInput::v, r, NAN, column_r(later_tokens(Expect::nan)), column_r(later_tokens_decode(Expect::nan)), state_row);
}

// DeltaNet / Gated DeltaNet through the public API, packed: the forward, the training forward (given a saved
// buffer where the inputs have one: it forms its output from the state pass's S_[c] and V̄), or decode.
enum class DeltaRun { forward, training_forward, decode };
Raw delta_run(const vdr::DeltaCase& c, const vdr::DeviceInputs& in, DeltaRun run) {
  const bool decode = run == DeltaRun::decode;
  const int B = int(c.batch), H = int(c.heads), L = int(c.length), DK = int(c.key_dim), DV = int(c.value_dim);
  dt::DeviceTensor out = dt::allocate(c.dtype, B, H, L, DV), fin = dt::allocate(DType::f32, B, H, DV, DK);
  const auto* g = c.gated ? static_cast<const float*>(in.log_gate.device.data()) : nullptr;
  const auto* s0 = c.with_initial_state ? static_cast<const float*>(in.initial_state.device.data()) : nullptr;
  if (decode) {
    kdr::DecodeParams p;
    p.dtype = c.dtype, p.batch = B, p.heads = H, p.tokens = L, p.key_dim = DK, p.value_dim = DV;
    kdr::set_contiguous_strides(p);
    p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.beta = in.beta.device.data();
    p.log_gate = g, p.initial_state = s0, p.output = out.data(), p.final_state = static_cast<float*>(fin.data());
    kdr::decode(p);
  } else {
    kdr::ForwardParams p;
    p.dtype = c.dtype, p.batch = B, p.heads = H, p.length = L, p.key_dim = DK, p.value_dim = DV, p.chunk_size = int(c.chunk);
    kdr::set_contiguous_strides(p);
    p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.beta = in.beta.device.data();
    p.log_gate = g, p.initial_state = s0, p.output = out.data(), p.final_state = static_cast<float*>(fin.data());
    dt::DeviceBuffer workspace(kdr::workspace_bytes(p)), saved(run == DeltaRun::training_forward ? kdr::saved_bytes(p) : 0);
    p.workspace = workspace.get(), p.saved = saved.bytes() ? saved.get() : nullptr;
    kdr::forward(p);
  }
  return {dt::download_bytes(out), dt::download_bytes(fin)};
}

// The register scan (bf16, D = 64, gated), the fallback (fp32; bf16 with DK = 60 at C = 16).
std::vector<vdr::DeltaCase> delta_cases() {
  std::vector<vdr::DeltaCase> cases;
  for (auto [dtype, dk, dv, chunk, gated] : {std::tuple{DType::bf16, 64, 64, 64, true}, {DType::f32, 24, 24, 32, false},
                                             {DType::bf16, 60, 36, 16, true}}) {
    vdr::DeltaCase c;
    c.dtype = dtype, c.batch = 1, c.heads = 2, c.length = 100, c.key_dim = dk, c.value_dim = dv, c.chunk = chunk;
    c.gated = gated, c.with_initial_state = true, c.seed = 31;
    cases.push_back(c);
  }
  return cases;
}

enum class DeltaInput { q, k, v, beta, log_gate };

void expect_delta(DeltaInput input, Index col, double value, const Rule& forward_output, const Rule& forward_state,
                  const Rule& decode_output, const Rule& decode_state) {
  for (vdr::DeltaCase c : delta_cases()) {
    if (input == DeltaInput::log_gate) c.gated = true;
    const vdr::HostInputs host = vdr::make_inputs(c);
    const vdr::DeviceInputs clean = vdr::upload_inputs(c, host), poisoned = vdr::upload_inputs(c, host);
    const dt::DeviceTensor& target = input == DeltaInput::q      ? poisoned.q.device
                                     : input == DeltaInput::k    ? poisoned.k.device
                                     : input == DeltaInput::v    ? poisoned.v.device
                                     : input == DeltaInput::beta ? poisoned.beta.device
                                                                 : poisoned.log_gate.device;
    poke(target, b0, h0, t, col, value);
    for (DeltaRun run : {DeltaRun::forward, DeltaRun::training_forward, DeltaRun::decode}) {
      const bool decode = run == DeltaRun::decode;
      const Raw x = delta_run(c, clean, run), y = delta_run(c, poisoned, run);
      const std::string what = vdr::describe(c) + (decode ? " decode" : run == DeltaRun::forward ? " forward" : " training forward");
      EXPECT_EQ(broken("output", x.output, y.output, c.dtype, c.batch, c.heads, c.length, c.value_dim,
                       decode ? decode_output : forward_output),
                "")
          << what;
      EXPECT_EQ(broken("final state", x.final_state, y.final_state, DType::f32, c.batch, c.heads, c.value_dim, c.key_dim,
                       decode ? decode_state : forward_state),
                "")
          << what;
    }
  }
}

TEST(NonFiniteInputs, DeltaRuleInfInQReachesOnlyThatTokensOutput) {
  DELTAPROOF_REQUIRE_GPU();
  expect_delta(DeltaInput::q, 3, INFINITY, only_token_t, everything_same, only_token_t, everything_same);
  expect_delta(DeltaInput::q, 7, -INFINITY, only_token_t, everything_same, only_token_t, everything_same);
}

TEST(NonFiniteInputs, DeltaRuleNaNInKBetaOrLogGateReachesEveryLaterState) {
  DELTAPROOF_REQUIRE_GPU();
  for (DeltaInput input : {DeltaInput::k, DeltaInput::beta, DeltaInput::log_gate})
    expect_delta(input, input == DeltaInput::k ? 5 : 0, NAN, later_tokens(Expect::nan), poisoned_head_nan,
                 later_tokens_decode(Expect::nan), poisoned_head_nan);
}

TEST(NonFiniteInputs, DeltaRuleNaNInVStaysInItsValueRow) {
  DELTAPROOF_REQUIRE_GPU();
  constexpr Index r = 6;
  const auto column_r = [](const Rule& rule) {
    return Rule([rule](Index b, Index h, Index row, Index c) { return c == r ? rule(b, h, row, c) : Expect::same; });
  };
  const Rule state_row = [](Index b, Index h, Index row, Index) {
    return poisoned_head(b, h) && row == r ? Expect::nan : Expect::same;
  };
  expect_delta(DeltaInput::v, r, NAN, column_r(later_tokens(Expect::nan)), state_row, column_r(later_tokens_decode(Expect::nan)),
               state_row);
}

// g_t = −∞ (α_t = 0): the chunkwise forward meets −∞ − (−∞) = NaN in its in-chunk decays, so it
// acts as a NaN there; decode computes α_t = 0, a reset: from t on it equals, value for value, a decode
// of tokens t.. from a zero state (α_t · S = ±0 whatever S is: only the sign of a zero may differ).
TEST(NonFiniteInputs, DeltaRuleMinusInfinityLogGateIsNaNInTheChunkwiseFormAndAResetInDecode) {
  DELTAPROOF_REQUIRE_GPU();
  for (vdr::DeltaCase c : delta_cases()) {
    c.gated = true;
    const vdr::HostInputs host = vdr::make_inputs(c);
    const vdr::DeviceInputs clean = vdr::upload_inputs(c, host), poisoned = vdr::upload_inputs(c, host);
    poke(poisoned.log_gate.device, b0, h0, t, 0, -INFINITY);
    for (DeltaRun run : {DeltaRun::forward, DeltaRun::training_forward}) {
      const Raw x = delta_run(c, clean, run), y = delta_run(c, poisoned, run);
      const std::string what = vdr::describe(c) + (run == DeltaRun::forward ? " forward" : " training forward");
      EXPECT_EQ(broken("output", x.output, y.output, c.dtype, c.batch, c.heads, c.length, c.value_dim, later_tokens(Expect::nan)), "")
          << what;
      EXPECT_EQ(broken("final state", x.final_state, y.final_state, DType::f32, c.batch, c.heads, c.value_dim, c.key_dim,
                       poisoned_head_nan),
                "")
          << what;
    }

    // Decode: tokens t.. of the poisoned head from a zero state (a one-head case) are the reference.
    const Raw decoded = delta_run(c, poisoned, DeltaRun::decode);
    vdr::DeltaCase tail = c;
    tail.batch = 1, tail.heads = 1, tail.length = c.length - t, tail.with_initial_state = false;
    vdr::HostInputs tail_host;
    const auto rows_of = [&](const ref::Tensor4<Exact>& from) {
      ref::Tensor4<Exact> to(1, 1, tail.length, from.cols);
      to.set_head(0, 0, from.head(b0, h0).middleRows(t, tail.length));
      return to;
    };
    tail_host.q = rows_of(host.q), tail_host.k = rows_of(host.k), tail_host.v = rows_of(host.v);
    tail_host.beta = rows_of(host.beta), tail_host.log_gate = rows_of(host.log_gate);
    const Raw fresh = delta_run(tail, vdr::upload_inputs(tail, tail_host), DeltaRun::decode);
    const std::size_t head = std::size_t(b0 * c.heads + h0), outputs = std::size_t(tail.length * c.value_dim);
    const std::size_t states = std::size_t(c.value_dim * c.key_dim);
    for (std::size_t i = 0; i < outputs; ++i)
      ASSERT_EQ(element(fresh.output, c.dtype, i), element(decoded.output, c.dtype, (head * c.length + t) * c.value_dim + i))
          << vdr::describe(c) << ": decode output " << i << " from token t on";
    for (std::size_t i = 0; i < states; ++i)
      ASSERT_EQ(element(fresh.final_state, DType::f32, i), element(decoded.final_state, DType::f32, head * states + i))
          << vdr::describe(c) << ": decode final state entry " << i;
  }
}

// ---------------------------------------------------------------------------------------
// β outside [0, 1] and g > 0 (device): computed, as the oracle takes any real β and g.

// β in (1, 2] and g in [0, 1/4] (α up to e^{1/4}): every stage within its bound, forward, decode and
// backward (the bounds take β and the decays as magnitudes, which these are).
TEST(InputRange, DeltaRuleBetaAboveOneAndPositiveLogGatesAreWithinTheStageBounds) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool gated : {false, true}) {
      vdr::DeltaCase c;
      c.dtype = dtype, c.gated = gated, c.batch = 1, c.heads = 2, c.length = 40, c.chunk = 16, c.key_dim = 16, c.value_dim = 16;
      c.with_initial_state = true, c.seed = 77;
      vdr::HostInputs in = vdr::make_inputs(c);
      for (std::size_t i = 0; i < in.beta.data.size(); ++i) in.beta.data[i] = Exact(int(9 + i % 8)) / 8;  // 9/8 .. 2
      for (std::size_t i = 0; i < in.log_gate.data.size(); ++i) in.log_gate.data[i] = Exact(int(i % 5)) / 16;  // 0 .. 1/4
      const auto forward = vdr::check_stages(c, in, vdr::run_forward(c, in));
      EXPECT_TRUE(dt::all_agree(forward)) << vdr::describe(c) << "\n" << dt::describe_failures(forward);
      const std::optional<ref::Tensor4<Exact>> s0 = in.initial_state;
      const auto decode = vdr::check_decode(c, in, vdr::run_decode(c, in, s0), s0);
      EXPECT_TRUE(dt::all_agree(decode)) << vdr::describe(c) << "\n" << dt::describe_failures(decode);
      const vdr::Cotangents cot = vdr::make_cotangents(c);
      const auto backward = vdr::check_backward_stages(c, in, cot, vdr::run_backward(c, in, cot));
      EXPECT_TRUE(dt::all_agree(backward)) << vdr::describe(c) << "\n" << dt::describe_failures(backward);
    }
}

// β < 0 (I − β k kᵀ expands): the stage bounds take β as a magnitude, so the forward and decode are
// held to the float64 token recurrence instead, with the end-to-end thresholds of the chunk-size test.
TEST(InputRange, DeltaRuleNegativeBetaFollowsTheFloat64Recurrence) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool gated : {false, true}) {
      vdr::DeltaCase c;
      c.dtype = dtype, c.gated = gated, c.batch = 1, c.heads = 2, c.length = 48, c.chunk = 16, c.key_dim = 16, c.value_dim = 16;
      c.with_initial_state = true, c.seed = 78;
      vdr::HostInputs in = vdr::make_inputs(c);
      for (std::size_t i = 0; i < in.beta.data.size(); ++i) in.beta.data[i] = -Exact(int(1 + i % 4)) / 8;  // −1/8 .. −1/2
      const vdr::DoubleForward oracle = vdr::double_oracle(c, in);
      const vdr::ForwardResult r = vdr::run_forward(c, in, false);
      const std::optional<ref::Tensor4<Exact>> s0 = in.initial_state;
      const vdr::DecodeResult d = vdr::run_decode(c, in, s0);
      const double tau = vdr::end_to_end_tau(c.dtype);
      for (const auto& [name, candidate, reference] :
           {std::tuple{"forward output", vdr::heads_of(r.output), oracle.output},
            {"forward final state", vdr::heads_of(r.final_state), oracle.final_state},
            {"decode output", vdr::heads_of(d.output), oracle.output},
            {"decode final state", vdr::heads_of(d.final_state), oracle.final_state}}) {
        const dt::Comparison row = vdr::compare_end_to_end(name, c, candidate, reference, tau);
        EXPECT_TRUE(row.agrees()) << vdr::describe(c) << ": " << dt::describe(row);
      }
    }
}

}  // namespace
