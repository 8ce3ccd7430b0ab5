// Gradient checking: exact directional derivatives over ℚ and central differences in High.
//
// A form's differentiable inputs are a named list of matrices (`Params`). A loss is any
// callable that is generic in the scalar type, `loss(const Params<T>&) -> T`; here it is
// always the pairing L = Σ <cotangent, output> that the backward paths differentiate.
#pragma once

#include "reference/dual.hpp"
#include "reference/error_report.hpp"
#include "reference/scalar.hpp"

#include <ostream>
#include <string>
#include <vector>

namespace deltaproof::ref {

template <class Scalar>
struct Param {
  std::string name;
  Matrix<Scalar> value;
};
template <class Scalar>
using Params = std::vector<Param<Scalar>>;

template <class Scalar>
std::ostream& operator<<(std::ostream& os, const Param<Scalar>& p) {
  return os << p.name << " (" << p.value.rows() << "x" << p.value.cols() << ") =\n" << format_matrix(p.value);
}

template <class To, class From>
Params<To> params_cast(const Params<From>& p) {
  Params<To> out;
  for (const auto& x : p) out.push_back({x.name, matrix_cast<To>(x.value)});
  return out;
}

// Σ_p <a_p, b_p> (Frobenius).
template <class Scalar>
Scalar inner(const Params<Scalar>& a, const Params<Scalar>& b) {
  require(a.size() == b.size(), "inner: parameter lists differ in length");
  Scalar sum(0);
  for (size_t p = 0; p < a.size(); ++p) sum += a[p].value.cwiseProduct(b[p].value).sum();
  return sum;
}

template <class Scalar>
Scalar frobenius_inner(const Matrix<Scalar>& a, const Matrix<Scalar>& b) {
  return a.cwiseProduct(b).sum();
}

// x + t·u
template <class Scalar>
Params<Scalar> along(const Params<Scalar>& x, const Scalar& t, const Params<Scalar>& u) {
  Params<Scalar> out = x;
  for (size_t p = 0; p < x.size(); ++p) out[p].value += t * u[p].value;
  return out;
}

// ∇L(x)·u, exactly: L evaluated on dual numbers x + ε·u.
template <class Loss>
Exact exact_directional_derivative(Loss&& loss, const Params<Exact>& x, const Params<Exact>& u) {
  Params<Dual<Exact>> lifted;
  for (size_t p = 0; p < x.size(); ++p) {
    Matrix<Dual<Exact>> m(x[p].value.rows(), x[p].value.cols());
    for (Index i = 0; i < m.rows(); ++i)
      for (Index j = 0; j < m.cols(); ++j) m(i, j) = Dual<Exact>(x[p].value(i, j), u[p].value(i, j));
    lifted.push_back({x[p].name, m});
  }
  return loss(lifted).tangent;
}

// (L(x + h·u) − L(x − h·u)) / 2h. For a loss that is a polynomial of degree n in t ↦ x + t·u,
// the truncation error is h²/6·|L'''| + O(h⁴); rounding adds about 10⁻¹⁰⁰·|L|/h.
template <class Loss>
High central_difference(Loss&& loss, const Params<High>& x, const Params<High>& u, const High& step) {
  return (loss(along(x, step, u)) - loss(along(x, High(-step), u))) / (2 * step);
}

// Every partial derivative by central differences, one element at a time.
template <class Loss>
Params<High> central_difference_gradient(Loss&& loss, const Params<High>& x, const High& step) {
  Params<High> grad = x;
  Params<High> unit = x;
  for (auto& p : unit) p.value.setZero();
  for (size_t p = 0; p < x.size(); ++p)
    for (Index i = 0; i < x[p].value.rows(); ++i)
      for (Index j = 0; j < x[p].value.cols(); ++j) {
        unit[p].value(i, j) = High(1);
        grad[p].value(i, j) = central_difference(loss, x, unit, step);
        unit[p].value(i, j) = High(0);
      }
  return grad;
}

}  // namespace deltaproof::ref
