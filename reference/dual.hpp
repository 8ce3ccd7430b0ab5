// Dual numbers a + b·ε with ε² = 0: forward-mode derivatives, exact over ℚ.
//
// Evaluating a form on x + ε·u gives f(x) + ε·(∇f(x)·u), so with Dual<Exact> the directional
// derivative of any rational form comes out exactly. It is also a deliberately plain scalar
// (no conversion from double, no comparisons of its own, no sqrt): a form that compiles and runs with it
// is generic on purpose, not by accident (the idea of Eigen's AnnoyingScalar).
#pragma once

#include "reference/scalar.hpp"

namespace deltaproof::ref {

template <class Scalar>
struct Dual {
  using dual_of = Scalar;
  Scalar value{0}, tangent{0};

  Dual() = default;
  explicit Dual(int constant) : value(constant), tangent(0) {}  // Eigen writes Scalar(0), Scalar(1)
  explicit Dual(const Scalar& v, const Scalar& t = Scalar(0)) : value(v), tangent(t) {}

  Dual& operator+=(const Dual& o) { value += o.value, tangent += o.tangent; return *this; }
  Dual& operator-=(const Dual& o) { value -= o.value, tangent -= o.tangent; return *this; }
  // Zero tangents (constants, unseeded weights) are skipped: they would only add exact zeros.
  Dual& operator*=(const Dual& o) {
    const bool constant = tangent == Scalar(0), other_constant = o.tangent == Scalar(0);
    if (constant && !other_constant) tangent = value * o.tangent;
    else if (!constant && other_constant) tangent *= o.value;
    else if (!constant) tangent = tangent * o.value + value * o.tangent;
    value *= o.value;
    return *this;
  }
  Dual& operator/=(const Dual& o) {
    tangent = (tangent * o.value - value * o.tangent) / (o.value * o.value);
    value /= o.value;
    return *this;
  }
  friend Dual operator+(Dual a, const Dual& b) { return a += b; }
  friend Dual operator-(Dual a, const Dual& b) { return a -= b; }
  friend Dual operator*(Dual a, const Dual& b) { return a *= b; }
  friend Dual operator/(Dual a, const Dual& b) { return a /= b; }
  friend Dual operator-(const Dual& a) { return Dual(-a.value, -a.tangent); }
  friend bool operator==(const Dual& a, const Dual& b) { return a.value == b.value && a.tangent == b.tangent; }
  friend bool operator!=(const Dual& a, const Dual& b) { return !(a == b); }
};

}  // namespace deltaproof::ref

namespace Eigen {
template <class Scalar>
struct NumTraits<deltaproof::ref::Dual<Scalar>>
    : deltaproof::ref::OwnScalarTraits<deltaproof::ref::Dual<Scalar>, 2 * NumTraits<Scalar>::ReadCost,
                                       2 * NumTraits<Scalar>::AddCost, 3 * NumTraits<Scalar>::MulCost> {};
}  // namespace Eigen
