// Seeded random entries for command-line cases and benchmarks (property tests use rapidcheck).
//
// Entries are dyadic rationals n/4 with |n| <= 8: exact in every scalar type, bf16 and fp16
// included, so a floating-point form and the exact oracle see the same inputs.
#pragma once

#include "reference/scalar.hpp"

#include <cstdint>
#include <random>

namespace deltaproof::ref {

class RandomDyadic {
 public:
  explicit RandomDyadic(std::uint64_t seed) : engine_(seed) {}

  template <class Scalar>
  Matrix<Scalar> matrix(Index rows, Index cols, int max_numerator = 8, int denominator = 4) {
    std::uniform_int_distribution<int> pick(-max_numerator, max_numerator);
    Matrix<Scalar> m(rows, cols);
    for (Index i = 0; i < rows; ++i)
      for (Index j = 0; j < cols; ++j) m(i, j) = Scalar(pick(engine_)) / Scalar(denominator);
    return m;
  }

  // A value in (0, 1] of the form n/denominator, e.g. for β or α.
  template <class Scalar>
  Scalar unit_interval(int denominator = 8) {
    std::uniform_int_distribution<int> pick(1, denominator);
    return Scalar(pick(engine_)) / Scalar(denominator);
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace deltaproof::ref
