// Sizes past 2³¹: every launcher refuses what its index arithmetic cannot hold — before any CUDA
// call, with a message naming the argument — and takes everything up to that limit. Memory offsets
// are 64-bit in both kernel families (int64 strides for the user's tensors, size_t for DeltaNet's
// packed intermediates); chunk arithmetic is int, hence cuda::max_sequence_length = 2³¹ − 64. Runs without a
// device: all pointers are null, so the first check that passes the sizes stops at "q: must not be
// null" (which needs no CUDA call either).
#include "cuda/delta_rule.h"
#include "cuda/linear_attention.h"
#include "property_tests/support/gpu.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

namespace cu = deltaproof::cuda;
namespace kla = deltaproof::cuda::linear_attention;
namespace kdr = deltaproof::cuda::delta_rule;
using cu::DType;
constexpr int longest = cu::max_sequence_length;

using deltaproof::testing::rejection;

::testing::AssertionResult names(const std::string& message, const std::string& argument) {
  if (message.rfind(argument + ":", 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected an error naming " << argument << ", got: " << message;
}

// One head of `length` tokens (decode: tokens), packed; either family's params (found by ADL).
template <class Params>
Params shape_of(int length, int head_dim) {
  Params p;
  p.dtype = DType::bf16, p.batch = 1, p.heads = 1, p.key_dim = head_dim, p.value_dim = head_dim;
  if constexpr (requires { p.tokens; }) p.tokens = length;
  else p.length = length, p.chunk_size = 64;
  set_contiguous_strides(p);
  return p;
}
template <class Params>
Params linear_attention_shape(int length) {
  return shape_of<Params>(length, 256);
}

TEST(KernelSizeLimits, LongestSequenceIsTwoToThe31MinusChunk) {
  EXPECT_EQ(longest, (std::int64_t{1} << 31) - 64);
  // L + C − 1 for the largest chunk still fits in int.
  EXPECT_LE(std::int64_t{longest} + 64 - 1, INT_MAX);
  EXPECT_EQ(cu::chunk_count(longest, 64), (std::int64_t{longest} + 63) / 64);
}

TEST(KernelSizeLimits, LinearAttentionRefusesLongerSequencesAndTakesTheLongest) {
  for (int length : {longest + 1, INT_MAX}) {
    EXPECT_TRUE(names(rejection([&] { kla::forward(linear_attention_shape<kla::ForwardParams>(length)); }), "length"));
    EXPECT_TRUE(names(rejection([&] { kla::backward(linear_attention_shape<kla::BackwardParams>(length)); }), "length"));
    EXPECT_TRUE(names(rejection([&] { kla::decode(linear_attention_shape<kla::DecodeParams>(length)); }), "tokens"));
  }
  // 2³¹ − 64 tokens of 256 columns: 5.5·10¹¹ elements per tensor, past 2³¹ and accepted.
  EXPECT_TRUE(names(rejection([&] { kla::forward(linear_attention_shape<kla::ForwardParams>(longest)); }), "q"));
  EXPECT_TRUE(names(rejection([&] { kla::backward(linear_attention_shape<kla::BackwardParams>(longest)); }), "q"));
  EXPECT_TRUE(names(rejection([&] { kla::decode(linear_attention_shape<kla::DecodeParams>(longest)); }), "q"));
}

TEST(KernelSizeLimits, LinearAttentionRefusesStridesWhoseOffsetsPassInt64) {
  auto forward_with = [](auto edit) {
    auto p = linear_attention_shape<kla::ForwardParams>(5);
    edit(p);
    return rejection([&] { kla::forward(p); });
  };
  // (rows − 1)·row wraps 64 bits: a check in int64 would see the largest offset as small.
  EXPECT_TRUE(names(forward_with([](auto& p) { p.q_strides.row = std::int64_t{1} << 62; }), "q_strides"));
  // Each stride is consistent, but (B − 1)·batch passes 2⁶³ − 1.
  EXPECT_TRUE(names(forward_with([](auto& p) {
    p.batch = 4;
    kla::set_contiguous_strides(p);
    p.k_strides.batch = std::int64_t{1} << 62;
  }), "k_strides"));
  // The largest representable layout is still taken.
  EXPECT_TRUE(names(forward_with([](auto& p) {
    p.batch = 2;
    kla::set_contiguous_strides(p);
    p.v_strides.batch = INT64_MAX - p.v_strides.head;
  }), "q"));
}

template <class Params>
Params delta_shape(int length) {
  return shape_of<Params>(length, 128);
}

TEST(KernelSizeLimits, DeltaRuleRefusesLongerSequencesAndTakesTheLongest) {
  for (int length : {longest + 1, INT_MAX}) {
    EXPECT_TRUE(names(rejection([&] { kdr::forward(delta_shape<kdr::ForwardParams>(length)); }), "length"));
    EXPECT_TRUE(names(rejection([&] { kdr::backward(delta_shape<kdr::BackwardParams>(length)); }), "length"));
    EXPECT_TRUE(names(rejection([&] { kdr::decode(delta_shape<kdr::DecodeParams>(length)); }), "tokens"));
  }
  // The forward's workspace (W and U, 2·2³¹ rows of 128 bf16, and the scores) is named first, then the tensors.
  EXPECT_TRUE(names(rejection([&] { kdr::forward(delta_shape<kdr::ForwardParams>(longest)); }), "workspace"));
  EXPECT_TRUE(names(rejection([&] {
    auto p = delta_shape<kdr::ForwardParams>(longest);
    p.workspace = reinterpret_cast<void*>(std::uintptr_t{1} << 47);  // never dereferenced: refused before any CUDA call
    kdr::forward(p);
  }), "q"));
  EXPECT_TRUE(names(rejection([&] { kdr::decode(delta_shape<kdr::DecodeParams>(longest)); }), "q"));
}

}  // namespace
