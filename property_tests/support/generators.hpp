// rapidcheck generators shared by every property suite: shapes first, then tensors of that
// shape (gen::mapcat), so that shrinking reduces the shape before the values.
#pragma once

#include "reference/scalar.hpp"

#include <rapidcheck.h>

#include <ostream>

namespace deltaproof::testing {

using ref::Exact;
using ref::Index;
using ref::Matrix;

// One (batch, head) problem: lengths, head dims, chunk size and whether S_0 is given.
struct Shape {
  Index length = 1, key_dim = 1, value_dim = 1, chunk_size = 1;
  bool with_initial_state = false;
};
std::ostream& operator<<(std::ostream& os, const Shape& s);

// Caps on the generated sizes; rapidcheck's size parameter (0..100) scales up to them, and
// the regimes that break kernels (L ∈ {1, 2, C−1, C, C+1}, C > L, odd dims) come up often.
struct ShapeLimits {
  Index max_length = 200, max_dim = 40, max_chunk = 201;  // C is capped at max_length + 1 as well
};
rc::Gen<Shape> gen_shape(ShapeLimits limits = {});

// How entries are drawn. coarse: n/4 with |n| <= 8, exact in bf16, fp16, float, double and ℚ
// alike, and small enough that exact arithmetic stays cheap. fine: n/2^22 with |n| < 2^22,
// exact in float and double but with full-width mantissas, so that float forms really round.
enum class Entries { coarse, fine };
rc::Gen<Exact> gen_entry(Entries entries = Entries::coarse);
rc::Gen<Matrix<Exact>> gen_matrix(Index rows, Index cols, Entries entries = Entries::coarse);

}  // namespace deltaproof::testing

namespace rc {
template <>
struct Arbitrary<deltaproof::testing::Shape> {
  static Gen<deltaproof::testing::Shape> arbitrary() { return deltaproof::testing::gen_shape(); }
};
}  // namespace rc
