// The rank-one token recurrences over ℚ on integers: the state as one integer matrix over one
// common denominator.
//
//   S_t = α_t S_{t-1} + β_t (v_t − c · α_t S_{t-1} k_t) k_tᵀ,   o_t = S_t q_t
//
// covers additive linear attention (α = β = 1, c = 0), DeltaNet's read–correct–write view
// (α = 1, c = 1) and Gated DeltaNet's (c = 1). Held as S = N / d (N integer (DV, DK), d > 0), a
// token costs integer multiply-adds only: with k_t = K / d_k, v_t = V / d_v, α = a / d_a,
// β = b / d_b (each row over its own common denominator),
//   α S:       N ← a N,  d ← d_a d
//   e = v − S k = E / d_e with d_e = lcm(d_v, d d_k):  E = V (d_e / d_v) − (N K)(d_e / (d d_k))
//   S + β e kᵀ over d' = lcm(d, d_b d_e d_k):  N ← N (d' / d) + (b d' / (d_b d_e d_k)) E Kᵀ
// and the outputs o_t = (N Q) / (d d_q) are reduced once per entry. No gcd per operation (the
// rational type reduces after every + and ×), so over dyadic inputs a token is a few passes over
// the state. The values are those of the generic recurrence, hence the same canonical rationals.
#pragma once

#include "reference/scalar.hpp"

#include <optional>
#include <vector>

namespace deltaproof::ref {

// How a recurrence over Exact is evaluated: on integers over a common denominator (the default,
// where this header has the form) or by the loop as written. The same values either way; the
// second is kept so that tests can check the first against it.
struct OnIntegers {
  static constexpr bool on_integers = true;
};
struct AsWritten {
  static constexpr bool on_integers = false;
};

}  // namespace deltaproof::ref

namespace deltaproof::ref::exact {

using products::CommonDenominator;
using products::Integer;

struct RankOneRecurrence {
  const Matrix<Exact>& q;                       // (L, DK)
  const Matrix<Exact>& k;                       // (L, DK)
  const Matrix<Exact>& v;                       // (L, DV)
  const Vector<Exact>* beta = nullptr;          // (L), or nullptr for β = 1
  const Vector<Exact>* alpha = nullptr;         // (L), or nullptr for α = 1
  bool corrects = false;                        // c = 1: subtract the read S k (delta rule)
  const std::optional<Matrix<Exact>>& initial_state;  // (DV, DK)
};

// o (L, DV) and S_L (DV, DK) of the recurrence above.
inline void run(const RankOneRecurrence& r, Matrix<Exact>& output, Matrix<Exact>& final_state) {
  const Index L = r.q.rows(), DK = r.q.cols(), DV = r.v.cols();
  std::vector<Integer> n(static_cast<size_t>(DV * DK));  // N, row-major
  Integer d(1);
  auto at = [&](Index i, Index j) { return n[static_cast<size_t>(i * DK + j)].backend().data(); };
  if (r.initial_state) {
    CommonDenominator s0;
    s0.assign(DV * DK, [&](Index x) -> const Exact& { return (*r.initial_state)(x / DK, x % DK); });
    mpz_set(d.backend().data(), s0.denominator());
    for (Index x = 0; x < DV * DK; ++x) mpz_set(n[static_cast<size_t>(x)].backend().data(), s0.numerator(x));
  }
  CommonDenominator key, query, value;
  std::vector<Integer> e(static_cast<size_t>(DV));
  Integer sum, read_scale, value_scale, d_e, d_next, state_scale, write_scale, scratch;
  const mpz_ptr dp = d.backend().data();
  output.resize(L, DV);
  for (Index t = 0; t < L; ++t) {
    key.assign(DK, [&](Index j) -> const Exact& { return r.k(t, j); });
    query.assign(DK, [&](Index j) -> const Exact& { return r.q(t, j); });
    value.assign(DV, [&](Index i) -> const Exact& { return r.v(t, i); });
    if (r.alpha && (*r.alpha)(t) != 1) {  // α S
      const mpq_srcptr a = (*r.alpha)(t).backend().data();
      for (auto& x : n) mpz_mul(x.backend().data(), x.backend().data(), mpq_numref(a));
      mpz_mul(dp, dp, mpq_denref(a));
    }
    // e = E / d_e
    if (r.corrects) {
      mpz_mul(scratch.backend().data(), dp, key.denominator());  // d d_k
      mpz_lcm(d_e.backend().data(), value.denominator(), scratch.backend().data());
      mpz_divexact(value_scale.backend().data(), d_e.backend().data(), value.denominator());
      mpz_divexact(read_scale.backend().data(), d_e.backend().data(), scratch.backend().data());
    } else {
      mpz_set(d_e.backend().data(), value.denominator());
      mpz_set_ui(value_scale.backend().data(), 1);
    }
    for (Index i = 0; i < DV; ++i) {
      const mpz_ptr ei = e[static_cast<size_t>(i)].backend().data();
      mpz_mul(ei, value.numerator(i), value_scale.backend().data());
      if (!r.corrects) continue;
      mpz_set_ui(sum.backend().data(), 0);
      for (Index j = 0; j < DK; ++j)
        if (mpz_sgn(key.numerator(j)) != 0) mpz_addmul(sum.backend().data(), at(i, j), key.numerator(j));
      mpz_submul(ei, sum.backend().data(), read_scale.backend().data());
    }
    // S + β e kᵀ over d' = lcm(d, d_b d_e d_k)
    mpz_mul(scratch.backend().data(), d_e.backend().data(), key.denominator());
    if (r.beta) mpz_mul(scratch.backend().data(), scratch.backend().data(), mpq_denref((*r.beta)(t).backend().data()));
    mpz_lcm(d_next.backend().data(), dp, scratch.backend().data());
    mpz_divexact(state_scale.backend().data(), d_next.backend().data(), dp);
    mpz_divexact(write_scale.backend().data(), d_next.backend().data(), scratch.backend().data());
    if (r.beta) mpz_mul(write_scale.backend().data(), write_scale.backend().data(), mpq_numref((*r.beta)(t).backend().data()));
    const bool rescale = mpz_cmp_ui(state_scale.backend().data(), 1) != 0;
    for (Index i = 0; i < DV; ++i) {
      const mpz_ptr ei = e[static_cast<size_t>(i)].backend().data();
      mpz_mul(ei, ei, write_scale.backend().data());
      for (Index j = 0; j < DK; ++j) {
        if (rescale) mpz_mul(at(i, j), at(i, j), state_scale.backend().data());
        if (mpz_sgn(key.numerator(j)) != 0) mpz_addmul(at(i, j), ei, key.numerator(j));
      }
    }
    mpz_swap(dp, d_next.backend().data());
    // o_t = (N Q) / (d d_q)
    mpz_mul(scratch.backend().data(), dp, query.denominator());
    for (Index i = 0; i < DV; ++i) {
      const mpq_ptr o = output(t, i).backend().data();
      mpz_set_ui(mpq_numref(o), 0);
      for (Index j = 0; j < DK; ++j)
        if (mpz_sgn(query.numerator(j)) != 0) mpz_addmul(mpq_numref(o), at(i, j), query.numerator(j));
      mpz_set(mpq_denref(o), scratch.backend().data());
      mpq_canonicalize(o);
    }
  }
  final_state.resize(DV, DK);
  for (Index i = 0; i < DV; ++i)
    for (Index j = 0; j < DK; ++j) {
      const mpq_ptr s = final_state(i, j).backend().data();
      mpz_set(mpq_numref(s), at(i, j));
      mpz_set(mpq_denref(s), dp);
      mpq_canonicalize(s);
    }
}

}  // namespace deltaproof::ref::exact
