// Scalar types of the oracle and exact conversions between them.
//
// Every form in reference/ is a template over `Scalar`; these are the instantiations the
// project uses (the design page's scalar types of the oracle). Boost numbers are used with
// expression templates off: Eigen's expression templates and Boost's do not compose.
#pragma once

#include <Eigen/Dense>
#include <boost/multiprecision/eigen.hpp>
#include <boost/multiprecision/gmp.hpp>
#include <boost/multiprecision/mpfr.hpp>

#include "reference/eigen_products.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace deltaproof::ref {

using Index = Eigen::Index;

// Argument checks throughout the oracle: std::invalid_argument with a message naming the argument.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// Exact rationals (GMP mpq): identities are checked with ==.
using Exact = boost::multiprecision::number<boost::multiprecision::gmp_rational,
                                            boost::multiprecision::et_off>;
// 100 decimal digits (MPFR, 334 bits): non-rational steps and finite differences. The limbs live
// inside the number (allocate_stack), so a temporary costs no heap allocation; same precision and
// correctly rounded operations as the heap-allocated mpfr_float_100, hence the same values.
using High = boost::multiprecision::number<
    boost::multiprecision::mpfr_float_backend<100, boost::multiprecision::allocate_stack>,
    boost::multiprecision::et_off>;

}  // namespace deltaproof::ref

// Every product over Exact or High goes through reference/eigen_products.hpp (no temporaries).
DELTAPROOF_EIGEN_PRODUCTS(deltaproof::ref::Exact, exact_gemm, exact_gemv)
DELTAPROOF_EIGEN_PRODUCTS(deltaproof::ref::High, high_gemm, high_gemv)

namespace deltaproof::ref {

template <class Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
template <class Scalar>
using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

// Eigen's NumTraits for the oracle's own scalar types (Dual, Polynomial, and the proofs' Degree
// and LogOr): real, signed, not an integer, needing initialization; only the costs that steer
// Eigen's unrolling differ. Specialize as NumTraits<T> : OwnScalarTraits<T, read, add, mul> {}.
template <class T, int Read, int Add, int Mul>
struct OwnScalarTraits : Eigen::GenericNumTraits<T> {
  using Real = T;
  using NonInteger = T;
  using Nested = T;
  using Literal = T;
  enum { IsComplex = 0, IsInteger = 0, IsSigned = 1, RequireInitialization = 1, ReadCost = Read, AddCost = Add, MulCost = Mul };
};

template <class T>
inline constexpr bool is_exact_v = std::is_same_v<T, Exact>;
template <class T>
inline constexpr bool is_high_v = std::is_same_v<T, High>;
template <class T>
inline constexpr bool is_boost_v = is_exact_v<T> || is_high_v<T>;

// Converts one scalar to another. Hardware floats go to Exact without loss (every binary
// float is a dyadic rational); Exact goes to hardware floats through High, so the result is
// the nearest representable value rather than GMP's truncation.
template <class To, class From>
To scalar_cast(const From& x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (requires { typename To::dual_of; }) {
    return To(scalar_cast<typename To::dual_of>(x));  // a constant: zero tangent
  } else if constexpr (is_boost_v<From> && is_boost_v<To>) {
    return To(x);
  } else if constexpr (is_exact_v<From>) {
    return static_cast<To>(High(x).template convert_to<double>());
  } else if constexpr (is_high_v<From>) {
    if constexpr (std::is_same_v<To, float>) return x.template convert_to<float>();
    else return static_cast<To>(x.template convert_to<double>());
  } else {
    static_assert(std::is_arithmetic_v<From> || std::is_same_v<From, Eigen::bfloat16> ||
                      std::is_same_v<From, Eigen::half>,
                  "scalar_cast: no exact conversion from this type");
    return To(static_cast<double>(x));  // float, double, bfloat16, half: exact in double
  }
}

template <class To, class From>
Matrix<To> matrix_cast(const Matrix<From>& m) {
  return m.unaryExpr([](const From& x) { return scalar_cast<To>(x); });
}

// Lossy, for printing and for error summaries only.
template <class Scalar>
double to_double(const Scalar& x) {
  return scalar_cast<double>(x);
}

template <class Scalar>
std::string scalar_name() {
  if constexpr (is_exact_v<Scalar>) return "exact";
  else if constexpr (is_high_v<Scalar>) return "high";
  else if constexpr (std::is_same_v<Scalar, double>) return "double";
  else if constexpr (std::is_same_v<Scalar, float>) return "float";
  else if constexpr (std::is_same_v<Scalar, Eigen::bfloat16>) return "bf16";
  else if constexpr (std::is_same_v<Scalar, Eigen::half>) return "fp16";
  else return "other";
}

// Unit roundoff u of a floating type (0 for Exact: no rounding at all).
template <class Scalar>
double unit_roundoff() {
  if constexpr (is_exact_v<Scalar>) return 0.0;
  else if constexpr (is_high_v<Scalar>) return std::pow(10.0, -99);
  else if constexpr (std::is_same_v<Scalar, Eigen::bfloat16>) return std::ldexp(1.0, -8);
  else if constexpr (std::is_same_v<Scalar, Eigen::half>) return std::ldexp(1.0, -11);
  else return std::numeric_limits<Scalar>::epsilon() / 2;
}

// γ_m = m·u / (1 − m·u): the relative error bound of m chained roundings (Higham, Lemma 3.1).
inline double gamma(long m, double u) {
  const double mu = static_cast<double>(m) * u;
  return mu < 1 ? std::nextafter(mu / (1 - mu), INFINITY) : INFINITY;  // rounded up
}

}  // namespace deltaproof::ref
