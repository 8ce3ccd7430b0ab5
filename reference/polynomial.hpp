// Multivariate polynomials with exact rational coefficients, usable as an Eigen scalar.
//
// Evaluating a form on symbolic inputs (one variable per input entry) yields each output as a
// polynomial; two forms that produce equal polynomials agree for *every* input of that shape,
// not only for sampled ones. The proofs/ certificate programs use this.
#pragma once

#include "reference/scalar.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace deltaproof::ref {

class Polynomial {
 public:
  using Monomial = std::vector<int>;  // sorted variable ids, with repetition for powers

  Polynomial() = default;
  explicit Polynomial(int constant) { add_term({}, Exact(constant)); }
  explicit Polynomial(const Exact& constant) { add_term({}, constant); }
  static Polynomial variable(int id) {
    Polynomial p;
    p.add_term({id}, Exact(1));
    return p;
  }

  const std::map<Monomial, Exact>& terms() const { return terms_; }
  std::size_t size() const { return terms_.size(); }

  Polynomial& operator+=(const Polynomial& o) {
    for (const auto& [m, c] : o.terms_) add_term(m, c);
    return *this;
  }
  Polynomial& operator-=(const Polynomial& o) {
    for (const auto& [m, c] : o.terms_) add_term(m, -c);
    return *this;
  }
  friend Polynomial operator*(const Polynomial& a, const Polynomial& b) {
    Polynomial out;
    for (const auto& [ma, ca] : a.terms_)
      for (const auto& [mb, cb] : b.terms_) {
        Monomial m;
        m.reserve(ma.size() + mb.size());
        std::merge(ma.begin(), ma.end(), mb.begin(), mb.end(), std::back_inserter(m));
        out.add_term(m, ca * cb);
      }
    return out;
  }
  Polynomial& operator*=(const Polynomial& o) { return *this = *this * o; }
  friend Polynomial operator+(Polynomial a, const Polynomial& b) { return a += b; }
  friend Polynomial operator-(Polynomial a, const Polynomial& b) { return a -= b; }
  friend Polynomial operator-(const Polynomial& a) { return Polynomial() - a; }
  friend bool operator==(const Polynomial& a, const Polynomial& b) { return a.terms_ == b.terms_; }
  friend bool operator!=(const Polynomial& a, const Polynomial& b) { return !(a == b); }

  // ∂/∂x_id, formally.
  Polynomial derivative(int id) const {
    Polynomial out;
    for (const auto& [m, c] : terms_) {
      const auto power = std::count(m.begin(), m.end(), id);
      if (power == 0) continue;
      Monomial rest = m;
      rest.erase(std::find(rest.begin(), rest.end(), id));
      out.add_term(rest, c * Exact(static_cast<long>(power)));
    }
    return out;
  }

  std::string str(const std::vector<std::string>& names) const {
    if (terms_.empty()) return "0";
    std::ostringstream s;
    bool first = true;
    for (const auto& [m, c] : terms_) {
      s << (first ? "" : " + ") << c.str();
      for (int id : m) s << "*" << names.at(static_cast<size_t>(id));
      first = false;
    }
    return s.str();
  }

 private:
  void add_term(const Monomial& m, const Exact& c) {
    if (c == 0) return;
    auto [it, inserted] = terms_.emplace(m, c);
    if (!inserted && (it->second += c) == 0) terms_.erase(it);
  }
  std::map<Monomial, Exact> terms_;  // no zero coefficients: equality is structural
};

}  // namespace deltaproof::ref

namespace Eigen {
template <>
struct NumTraits<deltaproof::ref::Polynomial> : deltaproof::ref::OwnScalarTraits<deltaproof::ref::Polynomial, 8, 64, 256> {};
}  // namespace Eigen
