// [B, H, L, D] tensors, contiguous as the kernels store them, and per-head views.
//
// Every form in reference/ is written for one (batch, head) sequence; a batched call maps it
// over the B·H heads. This header is the one place that knows the memory layout.
#pragma once

#include "reference/parallel.hpp"
#include "reference/scalar.hpp"

#include <optional>
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

template <class Scalar>
bool has_shape(const Tensor4<Scalar>& t, Index batch, Index heads, Index rows, Index cols) {
  return t.batch == batch && t.heads == heads && t.rows == rows && t.cols == cols;
}

// A per-token coefficient [B, H, L, 1] as the shape check sees it.
template <class Scalar>
struct PerTokenTensor {
  std::string name;
  const Tensor4<Scalar>* tensor;
};

// The batched counterpart of SequenceInputs (sequence_inputs.hpp): q, k, v as [B, H, L, D]
// tensors. A family's BatchInputs derives from BatchSequenceInputs<Scalar, BatchInputs> and adds
// its per-token coefficients [B, H, L, 1] (listed by per_token()) and its initial state
// [B, H, DV, DK]; head(b, h) builds that head's Inputs with head_inputs.
template <class Scalar, class Derived>
struct BatchSequenceInputs {
  Tensor4<Scalar> q, k, v;  // [B, H, L, DK], [B, H, L, DK], [B, H, L, DV]

  std::vector<PerTokenTensor<Scalar>> per_token() const { return {}; }

  // k like q; v, every per-token coefficient and S_0 of the same B, H, L (and DK, DV): a head is
  // read from each at the same offsets.
  void validate() const {
    const Index B = q.batch, H = q.heads, L = q.rows, DK = q.cols, DV = v.cols;
    require(has_shape(k, B, H, L, DK), "k must be [B, H, L, DK] like q");
    require(v.batch == B && v.heads == H && v.rows == L, "v must be [B, H, L, DV]");
    for (const PerTokenTensor<Scalar>& c : derived().per_token())
      require(has_shape(*c.tensor, B, H, L, 1), c.name + " must be [B, H, L, 1]");
    const auto& s0 = derived().initial_state;
    require(!s0 || has_shape(*s0, B, H, DV, DK), "initial_state must be [B, H, DV, DK]");
  }

  // Head (b, h) as one sequence's In{q, k, v, per-token coefficients…, S_0}.
  template <class In, class... PerTokenTensors>
  In head_inputs(Index b, Index h, const PerTokenTensors&... coefficients) const {
    In in{q.head(b, h), k.head(b, h), v.head(b, h), coefficients.head(b, h).col(0)..., std::nullopt};
    if (derived().initial_state) in.initial_state = derived().initial_state->head(b, h);
    return in;
  }

 private:
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
};

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

// Runs per_head(b, h) on every head of `in`, heads spread over the cores, and stores each result
// in that head's slab of `out` (out.set_head(b, h, result)): the loop of every batched form.
template <class Out, class BatchIn, class PerHead>
Out for_every_head(Out out, const BatchIn& in, PerHead&& per_head) {
  for_each_head_in_parallel(in.q.batch, in.q.heads, [&](Index b, Index h) { out.set_head(b, h, per_head(b, h)); });
  return out;
}

}  // namespace deltaproof::ref
