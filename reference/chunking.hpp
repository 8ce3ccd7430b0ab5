// Chunk boundaries and causal masks shared by every chunkwise form.
#pragma once

#include "reference/scalar.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace deltaproof::ref {

// Chunk c covers tokens [begin, begin + size); chunks are zero-based, C tokens each, and the
// last one may be partial (L % C != 0) or the only one (C > L).
struct Chunk {
  Index index, begin, size;
};

inline std::vector<Chunk> chunks_of(Index length, Index chunk_size) {
  if (chunk_size < 1) throw std::invalid_argument("chunk_size must be >= 1, got " + std::to_string(chunk_size));
  std::vector<Chunk> out;
  for (Index begin = 0, c = 0; begin < length; begin += chunk_size, ++c)
    out.push_back({c, begin, std::min(chunk_size, length - begin)});
  return out;
}

// M_ij = 1 if j <= i else 0 (the diagonal is inside: token i sees itself).
template <class Scalar>
Matrix<Scalar> causal_mask(Index n) {
  Matrix<Scalar> m = Matrix<Scalar>::Zero(n, n);
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j <= i; ++j) m(i, j) = Scalar(1);
  return m;
}

}  // namespace deltaproof::ref
