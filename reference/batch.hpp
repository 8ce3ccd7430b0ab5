// [B, H, L, D] tensors, contiguous as the kernels store them, and per-head views.
//
// Every form in reference/ is written for one (batch, head) sequence; a batched call maps it
// over the B·H heads. This header is the one place that knows the memory layout.
#pragma once

#include "reference/parallel.hpp"
#include "reference/scalar.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace deltaproof::ref {

template <class Scalar>
struct Tensor4 {
  Index batch = 0, heads = 0, rows = 0, cols = 0;  // [B, H, rows, cols]
  std::vector<Scalar> data;

  Tensor4() = default;
  Tensor4(Index b, Index h, Index r, Index c)
      : batch(b), heads(h), rows(r), cols(c), data(static_cast<size_t>(b * h * r * c), Scalar(0)) {}

  Index head_count() const { return batch * heads; }
  size_t offset(Index b, Index h) const { return static_cast<size_t>(((b * heads) + h) * rows * cols); }

  // (rows, cols) of head (b, h), copied out of the row-major slab.
  Matrix<Scalar> head(Index b, Index h) const {
    Matrix<Scalar> m(rows, cols);
    const Scalar* p = data.data() + offset(b, h);
    for (Index i = 0; i < rows; ++i)
      for (Index j = 0; j < cols; ++j) m(i, j) = p[i * cols + j];
    return m;
  }

  void set_head(Index b, Index h, const Matrix<Scalar>& m) {
    if (m.rows() != rows || m.cols() != cols)
      throw std::invalid_argument("Tensor4::set_head: matrix is " + std::to_string(m.rows()) + "x" +
                                  std::to_string(m.cols()) + ", expected " + std::to_string(rows) +
                                  "x" + std::to_string(cols));
    Scalar* p = data.data() + offset(b, h);
    for (Index i = 0; i < rows; ++i)
      for (Index j = 0; j < cols; ++j) p[i * cols + j] = m(i, j);
  }
};

template <class To, class From>
Tensor4<To> tensor_cast(const Tensor4<From>& t) {
  Tensor4<To> out;
  out.batch = t.batch, out.heads = t.heads, out.rows = t.rows, out.cols = t.cols;
  out.data.reserve(t.data.size());
  for (const From& x : t.data) out.data.push_back(scalar_cast<To>(x));
  return out;
}

// Calls f(b, h) for every head in order.
template <class F>
void for_each_head(Index batch, Index heads, F&& f) {
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h) f(b, h);
}

// Calls f(b, h) for every head, heads spread over the cores (parallel.hpp): f must touch only
// what belongs to its head (the batched forms read one head and write its slab of the outputs).
template <class F>
void for_each_head_in_parallel(Index batch, Index heads, F&& f) {
  parallel_for(batch * heads, [&](Index i) { f(i / heads, i % heads); });
}

}  // namespace deltaproof::ref
