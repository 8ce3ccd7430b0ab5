// Polynomial identity testing for the certificate programs (proofs/*_certificate.cpp).
//
// For a fixed shape every form in reference/ is a straight-line program in its input values: the
// operations depend on the shape only, never on a value, and they are +, −, × and division by
// nonzero constants. So each output entry is a polynomial in the inputs (over ℚ), and two forms
// agree for *all* inputs of that shape iff their difference is the zero polynomial. Such a
// difference, if nonzero, of total degree ≤ d, vanishes at a point drawn uniformly from S^n with
// probability ≤ d/|S| (Schwartz–Zippel). Here S = {0, …, 2^k − 1} ⊂ ℤ, the evaluation is exact
// (GMP rationals, `==`), and k = 64 + ⌈log₂ d⌉, so one point gives a failure bound ≤ 2⁻⁶⁴.
//
// The degree bound is not guessed: the same program is run once on `Degree`, a scalar that
// carries an upper bound on the degree of the polynomial it stands for (deg(a ± b) ≤ max,
// deg(a·b) ≤ deg a + deg b, constants 0, the constant zero −∞), with every input a variable of
// degree 1. The proofs/*.md derivations give the closed forms these tracked bounds stay below.
//
// A claim is a list of (lhs, rhs) matrix pairs; its degree is the largest tracked degree of any
// entry on either side, which bounds the degree of every entry of lhs − rhs.
#pragma once

#include "reference/dual.hpp"
#include "reference/scalar.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace deltaproof::proofs {

using ref::Exact;
using ref::Index;
using ref::Matrix;
using ref::Vector;

// An upper bound on the total degree of the polynomial a straight-line program computes.
class Degree {
 public:
  static constexpr int kZero = INT_MIN / 4;  // the zero polynomial: degree −∞

  Degree() = default;
  explicit Degree(int constant) : d_(constant == 0 ? kZero : 0) {}
  explicit Degree(const Exact& constant) : d_(constant == 0 ? kZero : 0) {}
  static Degree variable() { return of(1); }
  static Degree of(int degree) {
    Degree x;
    x.d_ = degree;
    return x;
  }
  int value() const { return d_; }

  Degree& operator+=(const Degree& o) { d_ = std::max(d_, o.d_); return *this; }
  Degree& operator-=(const Degree& o) { return *this += o; }
  Degree& operator*=(const Degree& o) {
    d_ = (d_ == kZero || o.d_ == kZero) ? kZero : d_ + o.d_;
    return *this;
  }
  // Only division by a nonzero constant keeps a polynomial; anything else is refused.
  Degree& operator/=(const Degree& o) {
    if (o.d_ != 0) throw std::domain_error("Degree: division by a non-constant: the form is not a polynomial");
    return *this;
  }
  friend Degree operator+(Degree a, const Degree& b) { return a += b; }
  friend Degree operator-(Degree a, const Degree& b) { return a -= b; }
  friend Degree operator*(Degree a, const Degree& b) { return a *= b; }
  friend Degree operator/(Degree a, const Degree& b) { return a /= b; }
  friend Degree operator-(const Degree& a) { return a; }
  // Eigen's kernels and Dual compare scalars (e.g. alpha against 0); this compares the bounds only.
  friend bool operator==(const Degree& a, const Degree& b) { return a.d_ == b.d_; }
  friend bool operator!=(const Degree& a, const Degree& b) { return a.d_ != b.d_; }

 private:
  int d_ = kZero;
};

}  // namespace deltaproof::proofs

namespace Eigen {
template <>
struct NumTraits<deltaproof::proofs::Degree> : deltaproof::ref::OwnScalarTraits<deltaproof::proofs::Degree, 1, 1, 1> {};
}  // namespace Eigen

namespace deltaproof::proofs {

template <class Scalar>
int max_degree(const Matrix<Scalar>& m) {
  int d = Degree::kZero;
  for (Index i = 0; i < m.rows(); ++i)
    for (Index j = 0; j < m.cols(); ++j) d = std::max(d, m(i, j).value());
  return d;
}

template <class Scalar>
Matrix<Scalar> as_matrix(const Vector<Scalar>& v) { return Matrix<Scalar>(v); }
template <class Scalar>
Matrix<Scalar> as_matrix(const Scalar& x) {
  Matrix<Scalar> m(1, 1);
  m(0, 0) = x;
  return m;
}

// x + ε·u entry by entry (dual numbers), and a constant lifted with zero tangent.
template <class Scalar>
Matrix<ref::Dual<Scalar>> lift(const Matrix<Scalar>& x, const Matrix<Scalar>& u) {
  Matrix<ref::Dual<Scalar>> m(x.rows(), x.cols());
  for (Index i = 0; i < x.rows(); ++i)
    for (Index j = 0; j < x.cols(); ++j) m(i, j) = ref::Dual<Scalar>(x(i, j), u(i, j));
  return m;
}
template <class Scalar>
Matrix<ref::Dual<Scalar>> lift(const Matrix<Scalar>& x) {
  return x.unaryExpr([](const Scalar& e) { return ref::Dual<Scalar>(e); });
}

// "lhs_i == rhs_i for every i", stated in one line.
template <class Scalar>
struct Claim {
  std::string statement;
  std::vector<Matrix<Scalar>> lhs, rhs;

  Claim& equal(const Matrix<Scalar>& a, const Matrix<Scalar>& b) {
    lhs.push_back(a);
    rhs.push_back(b);
    return *this;
  }
};

// A deque, so that a reference to one claim stays valid while more are added.
template <class Scalar>
struct Claims {
  std::deque<Claim<Scalar>> list;
  Claim<Scalar>& add(std::string statement) {
    list.push_back({std::move(statement), {}, {}});
    return list.back();
  }
};

// Where a claim builder takes its inputs: fresh degree-1 variables, or a uniform point of S^n.
struct DegreeSource {
  long variables = 0;
  Matrix<Degree> matrix(Index rows, Index cols) {
    variables += rows * cols;
    return Matrix<Degree>::Constant(rows, cols, Degree::variable());
  }
  Vector<Degree> vector(Index n) { return matrix(n, 1).col(0); }
};

struct PointSource {
  std::mt19937_64* rng;
  int bits;  // k: entries uniform in {0, …, 2^k − 1}
  long variables = 0;

  Exact draw() {
    Exact x(0);
    for (int done = 0; done < bits; done += 32) {
      const int take = std::min(32, bits - done);
      const unsigned long word = static_cast<unsigned long>((*rng)() >> (64 - take));
      x = x * Exact(1UL << take) + Exact(word);
    }
    return x;
  }
  Matrix<Exact> matrix(Index rows, Index cols) {
    variables += rows * cols;
    Matrix<Exact> m(rows, cols);
    for (Index i = 0; i < rows; ++i)
      for (Index j = 0; j < cols; ++j) m(i, j) = draw();
    return m;
  }
  Vector<Exact> vector(Index n) { return matrix(n, 1).col(0); }
};

// The seed of the random points: DELTAPROOF_CERT_SEED if set (to reproduce a run), else fresh.
inline std::uint64_t certificate_seed() {
  if (const char* s = std::getenv("DELTAPROOF_CERT_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

// Runs claim builders shape by shape and prints, per shape, each identity with its method,
// degree bound and failure-probability bound. `failures()` decides the exit status.
class Certificate {
 public:
  explicit Certificate(const std::string& title) : seed_(certificate_seed()) {
    rng_.seed(seed_);
    std::printf("%s\n", title.c_str());
    std::printf("method: Schwartz-Zippel identity test over Q (exact GMP rationals, ==): one point uniform in\n"
                "S^n, S = {0, ..., 2^k - 1}, k = 64 + ceil(log2 d); d = the tracked total-degree bound of the\n"
                "claim (reference/ forms run on a degree-tracking scalar). A nonzero difference of degree <= d\n"
                "vanishes there with probability <= d/2^k <= 2^-64. seed %llu (DELTAPROOF_CERT_SEED=%llu reproduces)\n",
                static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(seed_));
  }

  // builder(source) -> Claims<S>, for source = DegreeSource& and PointSource&.
  template <class Builder>
  void shape(const std::string& name, Builder&& builder) {
    const auto start = std::chrono::steady_clock::now();
    std::printf("\nshape %s\n", name.c_str());
    std::vector<int> degrees;
    long variables = 0;
    try {
      DegreeSource ds;
      const Claims<Degree> tracked = builder(ds);
      variables = ds.variables;
      int d_max = 1;
      for (const auto& c : tracked.list) {
        int d = Degree::kZero;
        for (size_t i = 0; i < c.lhs.size(); ++i) d = std::max({d, max_degree(c.lhs[i]), max_degree(c.rhs[i])});
        degrees.push_back(std::max(d, 0));
        d_max = std::max(d_max, d);
      }
      const int bits = 64 + static_cast<int>(std::ceil(std::log2(static_cast<double>(d_max))));
      PointSource ps{&rng_, bits};
      const Claims<Exact> evaluated = builder(ps);
      std::printf("  %ld input variables, k = %d (|S| = 2^%d), %zu identities\n", variables, bits, bits,
                  evaluated.list.size());
      for (size_t c = 0; c < evaluated.list.size(); ++c) {
        const auto& claim = evaluated.list[c];
        bool holds = claim.lhs.size() == claim.rhs.size();
        for (size_t i = 0; holds && i < claim.lhs.size(); ++i)
          holds = claim.lhs[i].rows() == claim.rhs[i].rows() && claim.lhs[i].cols() == claim.rhs[i].cols() &&
                  claim.lhs[i] == claim.rhs[i];
        const int d = degrees.at(c);
        ++identities_;
        if (holds) {
          // log2(d/2^k), rounded up to the printed tenth so that the printed bound is a bound
          const double log2_bound = d == 0 ? -INFINITY : std::ceil((std::log2(static_cast<double>(d)) - bits) * 10) / 10;
          worst_log2_ = std::max(worst_log2_, log2_bound);
          if (d == 0)
            std::printf("  holds  d = 0 (constants, checked exactly)  %s\n", claim.statement.c_str());
          else
            std::printf("  holds  d = %4d  Pr[miss] <= %d/2^%d <= 2^%.1f  %s\n", d, d, bits, log2_bound,
                        claim.statement.c_str());
        } else {
          ++failures_;
          std::printf("  FAILED d = %4d  (nonzero at the point: identity disproved)  %s\n", d,
                      claim.statement.c_str());
        }
      }
    } catch (const std::exception& e) {
      ++failures_;
      std::printf("  FAILED: %s\n", e.what());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("  (%.2f s)\n", seconds);
    std::fflush(stdout);
  }

  int finish() const {
    std::printf("\n%d identities checked, %d failed. Had any identity reported as holding been false, this run would\n"
                "have missed it with probability <= 2^%.1f (each one, over the random point).\n",
                identities_, failures_, worst_log2_);
    return failures_ ? 1 : 0;
  }

 private:
  std::uint64_t seed_;
  std::mt19937_64 rng_;
  int identities_ = 0, failures_ = 0;
  double worst_log2_ = -INFINITY;
};

}  // namespace deltaproof::proofs
