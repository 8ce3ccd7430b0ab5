// Eigen's dense matrix products (GEMM and GEMV) for the oracle's Boost scalars, without temporaries.
//
// Eigen multiplies a custom scalar type one multiply-add at a time through value-returning
// operators, so every term of every dot product allocates a fresh number (and, for GMP's mpq,
// reduces it by a gcd). These specializations of Eigen's product kernels keep the oracle's
// code as written (`q * k.transpose()`) and compute the same products differently:
//
//   Exact:  Σ_k a_ik b_kj = (Σ_k A_ik B_kj) / (α_i β_j) with A_i· = α_i a_i· and B_·j = β_j b_·j
//           integers over the common denominators α_i of row i and β_j of column j: the sum is
//           one integer dot product (mpz_addmul, no gcd), reduced once. Equal in ℚ, so the
//           result is the same canonical rational as before, bit for bit.
//   High:   Σ_k a_ik b_kj exactly, in fixed point (each product an exact 12-limb integer, all
//           placed by exponent into one wide accumulator), then rounded once: the correctly
//           rounded dot product, then res += alpha·dot. Eigen's loop rounds twice per term. Dot
//           products whose terms spread over more than ~1200 bits of exponent, or meet NaN or
//           infinity, take mpfr_fma term by term instead (in place, one rounding per term).
//
// Eigen chooses the coefficient-wise product for tiny shapes (rows + cols + depth < 20); those
// keep Eigen's loop. Included from scalar.hpp, right after the types, so that every product
// over Exact or High in a translation unit sees these specializations.
#pragma once

#include <Eigen/Dense>
#include <boost/multiprecision/gmp.hpp>
#include <boost/multiprecision/mpfr.hpp>

#include "reference/parallel.hpp"

#include <algorithm>
#include <vector>

namespace deltaproof::ref::products {

namespace mp = boost::multiprecision;
using Integer = mp::number<mp::gmp_int, mp::et_off>;

// x_k = numerators[k] / denominator for the entries of one row or column (denominator > 0).
class CommonDenominator {
 public:
  // entry(k) returns a const reference to the k-th rational (an mpq number).
  template <class Entry>
  void assign(Eigen::Index count, Entry&& entry) {
    numerators_.resize(static_cast<size_t>(count));
    mpz_set_ui(denominator_.backend().data(), 1);
    for (Eigen::Index k = 0; k < count; ++k) {
      const mpz_srcptr den = mpq_denref(entry(k).backend().data());
      if (mpz_cmp_ui(den, 1) != 0) mpz_lcm(denominator_.backend().data(), denominator_.backend().data(), den);
    }
    for (Eigen::Index k = 0; k < count; ++k) {
      const mpq_srcptr x = entry(k).backend().data();
      const mpz_ptr n = numerators_[static_cast<size_t>(k)].backend().data();
      if (mpq_sgn(x) == 0) {
        mpz_set_ui(n, 0);
        continue;
      }
      mpz_divexact(factor_.backend().data(), denominator_.backend().data(), mpq_denref(x));  // α / den(x_k)
      const mpz_srcptr f = factor_.backend().data();
      const mp_bitcnt_t low_bit = mpz_scan1(f, 0);
      if (mpz_sizeinbase(f, 2) == low_bit + 1) mpz_mul_2exp(n, mpq_numref(x), low_bit);  // a power of two: a shift
      else mpz_mul(n, mpq_numref(x), f);
    }
  }
  mpz_srcptr numerator(Eigen::Index k) const { return numerators_[static_cast<size_t>(k)].backend().data(); }
  mpz_srcptr denominator() const { return denominator_.backend().data(); }

 private:
  std::vector<Integer> numerators_;
  Integer denominator_, factor_;
};

// f(j_begin, j_end) over ranges of the columns: one range per thread (parallel.hpp) when the
// product has at least 2^16 multiply-adds, else one range. Each entry is computed the same way.
template <class F>
void over_column_ranges(Eigen::Index rows, Eigen::Index cols, Eigen::Index depth, F&& f) {
  const Eigen::Index ranges = rows * cols * depth >= (Eigen::Index(1) << 16) ? std::min<Eigen::Index>(cols, thread_count()) : 1;
  parallel_for(ranges, [&](Eigen::Index r) { f(r * cols / ranges, (r + 1) * cols / ranges); });
}

// out ← Σ_k a_k b_k / (den_a den_b), canonical.
inline void exact_dot(mpq_ptr out, const CommonDenominator& a, const CommonDenominator& b, Eigen::Index depth,
                      mpz_ptr sum) {
  mpz_set_ui(sum, 0);
  for (Eigen::Index k = 0; k < depth; ++k) {
    const mpz_srcptr x = a.numerator(k), y = b.numerator(k);
    if (mpz_sgn(x) != 0 && mpz_sgn(y) != 0) mpz_addmul(sum, x, y);
  }
  mpz_swap(mpq_numref(out), sum);
  mpz_mul(mpq_denref(out), a.denominator(), b.denominator());
  mpq_canonicalize(out);
}

// res += alpha · term (term is consumed).
inline void exact_accumulate(mpq_ptr res, mpq_ptr term, mpq_srcptr alpha) {
  if (mpq_sgn(term) == 0) return;
  if (mpz_cmp_ui(mpq_numref(alpha), 1) != 0 || mpz_cmp_ui(mpq_denref(alpha), 1) != 0) mpq_mul(term, term, alpha);
  if (mpq_sgn(res) == 0) mpq_swap(res, term);
  else mpq_add(res, res, term);
}

// res(i, j) += alpha Σ_k lhs(i, k) rhs(k, j)
template <bool /*LhsRowMajor*/, class Rational, class LhsMapper, class RhsMapper, class ResMapper>
void exact_gemm(Eigen::Index rows, Eigen::Index cols, Eigen::Index depth, const LhsMapper& lhs, const RhsMapper& rhs,
                const ResMapper& res, const Rational& alpha) {
  if (rows == 0 || cols == 0 || depth == 0 || alpha == 0) return;
  std::vector<CommonDenominator> lhs_rows(static_cast<size_t>(rows));
  over_column_ranges(cols, rows, depth, [&](Eigen::Index begin, Eigen::Index end) {  // rows, split the same way
    for (Eigen::Index i = begin; i < end; ++i)
      lhs_rows[static_cast<size_t>(i)].assign(depth, [&](Eigen::Index k) -> const Rational& { return lhs(i, k); });
  });
  over_column_ranges(rows, cols, depth, [&](Eigen::Index begin, Eigen::Index end) {
    CommonDenominator column;
    Rational term;
    Integer sum;
    for (Eigen::Index j = begin; j < end; ++j) {
      column.assign(depth, [&](Eigen::Index k) -> const Rational& { return rhs(k, j); });
      for (Eigen::Index i = 0; i < rows; ++i) {
        exact_dot(term.backend().data(), lhs_rows[static_cast<size_t>(i)], column, depth, sum.backend().data());
        exact_accumulate(res(i, j).backend().data(), term.backend().data(), alpha.backend().data());
      }
    }
  });
}

// res[i·incr] += alpha Σ_j lhs(i, j) rhs(j)
template <class Rational, class LhsMapper, class RhsMapper>
void exact_gemv(Eigen::Index rows, Eigen::Index cols, const LhsMapper& lhs, const RhsMapper& rhs, Rational* res,
                Eigen::Index incr, const Rational& alpha) {
  if (rows == 0 || cols == 0 || alpha == 0) return;
  CommonDenominator vector, row;
  vector.assign(cols, [&](Eigen::Index j) -> const Rational& { return rhs(j, 0); });
  Rational term;
  Integer sum;
  for (Eigen::Index i = 0; i < rows; ++i) {
    row.assign(cols, [&](Eigen::Index j) -> const Rational& { return lhs(i, j); });
    exact_dot(term.backend().data(), row, vector, cols, sum.backend().data());
    exact_accumulate(res[i * incr].backend().data(), term.backend().data(), alpha.backend().data());
  }
}

// acc ← a·b + acc. A zero a times a finite b adds an exact zero: skipped.
template <class Float>
void high_multiply_add(Float& acc, const Float& a, const Float& b) {
  if (mpfr_zero_p(a.backend().data()) && mpfr_number_p(b.backend().data())) return;
  mpfr_fma(acc.backend().data(), a.backend().data(), b.backend().data(), acc.backend().data(), MPFR_RNDN);
}

// A High number taken apart: value = sign · M · 2^(exponent − 64 n), M an n-limb integer (n = 6
// for 334 bits), or zero. Copied once per row or column of a product, so that dot products read
// contiguous memory.
struct Unpacked {
  static constexpr int max_limbs = 6;  // High's 334 bits
  mpfr_exp_t exponent = 0;
  bool zero = true, negative = false, special = false;  // special: NaN, infinity, or wider than max_limbs
  mp_limb_t limbs[max_limbs];
};

// Exact dot products in fixed point. The products of one dot product are exact 2n-limb integers;
// placed by exponent into one wide integer accumulator (kLimbs limbs, the largest product at the
// top), their sum is exact, and a single rounding (mpfr_set_z_2exp) gives the correctly rounded
// dot product. Where the exponents of the products spread further than the accumulator holds
// (more than 64·(kLimbs − 1) − 128 n bits), or a factor is NaN or infinite, the dot product is
// done with mpfr_fma instead.
template <class Float>
class HighDot {
 public:
  static constexpr int kLimbs = 32;

  HighDot() { n_ = static_cast<int>(mpfr_custom_get_size(mpfr_get_prec(Float().backend().data())) / sizeof(mp_limb_t)); }

  static void unpack(const Float& x, Unpacked& out) {
    const mpfr_srcptr p = x.backend().data();
    const int n = static_cast<int>(mpfr_custom_get_size(mpfr_get_prec(p)) / sizeof(mp_limb_t));
    out.special = !mpfr_number_p(p) || n > Unpacked::max_limbs;
    out.zero = mpfr_zero_p(p);
    if (out.special || out.zero) return;
    out.negative = mpfr_signbit(p);
    out.exponent = mpfr_get_exp(p);
    const auto* m = static_cast<const mp_limb_t*>(mpfr_custom_get_significand(p));
    for (int i = 0; i < n; ++i) out.limbs[i] = m[i];
  }

  // out ← Σ_k a[k] b[k·b_stride] (a, b unpacked), correctly rounded; false where the fixed-point
  // sum does not apply (the caller then uses mpfr_fma).
  bool dot(Float& out, const Unpacked* a, const Unpacked* b, Eigen::Index depth, Eigen::Index b_stride) {
    bool any = false;
    mpfr_exp_t top = 0;
    for (Eigen::Index k = 0; k < depth; ++k) {
      const Unpacked &x = a[k], &y = b[k * b_stride];
      if (x.special || y.special) return false;
      if (x.zero || y.zero) continue;
      const mpfr_exp_t e = x.exponent + y.exponent;
      top = any ? std::max(top, e) : e;
      any = true;
    }
    mpfr_ptr r = out.backend().data();
    if (!any) {
      mpfr_set_zero(r, 1);
      return true;
    }
    const int n = n_, product_limbs = 2 * n;
    // accumulator unit 2^base; the largest product's top bit just under limb kLimbs − 1
    const mpfr_exp_t base = top - 64 * (kLimbs - 1);
    std::fill(positive_, positive_ + kLimbs, 0);
    std::fill(negative_, negative_ + kLimbs, 0);
    for (Eigen::Index k = 0; k < depth; ++k) {
      const Unpacked &x = a[k], &y = b[k * b_stride];
      if (x.zero || y.zero) continue;
      const mpfr_exp_t shift = x.exponent + y.exponent - 128 * n - base;  // product = P · 2^(base + shift)
      if (shift < 0) return false;  // the exponents spread too far for the accumulator
      mpn_mul_n(product_, x.limbs, y.limbs, n);
      const mpfr_exp_t limb = shift / 64;
      const unsigned bit = static_cast<unsigned>(shift % 64);
      product_[product_limbs] = bit ? mpn_lshift(product_, product_, product_limbs, bit) : 0;
      mp_limb_t* acc = (x.negative != y.negative ? negative_ : positive_) + limb;
      const mp_size_t span = kLimbs - limb;  // >= product_limbs + 1 by the choice of base
      mpn_add(acc, acc, span, product_, product_limbs + 1);
    }
    bool negative = false;
    if (mpn_cmp(positive_, negative_, kLimbs) >= 0) {
      mpn_sub_n(positive_, positive_, negative_, kLimbs);
    } else {
      mpn_sub_n(positive_, negative_, positive_, kLimbs);
      negative = true;
    }
    mp_size_t size = kLimbs;
    while (size > 0 && positive_[size - 1] == 0) --size;
    mpz_t sum;
    mpz_roinit_n(sum, positive_, negative ? -size : size);
    mpfr_set_z_2exp(r, sum, base, MPFR_RNDN);
    return true;
  }

 private:
  int n_;
  mp_limb_t positive_[kLimbs], negative_[kLimbs], product_[2 * Unpacked::max_limbs + 1];
};

// res += alpha · acc, in place.
template <class Float>
void high_accumulate(Float& res, const Float& acc, const Float& alpha) {
  if (alpha == 1) mpfr_add(res.backend().data(), res.backend().data(), acc.backend().data(), MPFR_RNDN);
  else mpfr_fma(res.backend().data(), alpha.backend().data(), acc.backend().data(), res.backend().data(), MPFR_RNDN);
}

// res(i, j) += alpha Σ_k lhs(i, k) rhs(k, j): each row of lhs and column of rhs unpacked once.
template <bool /*LhsRowMajor*/, class Float, class LhsMapper, class RhsMapper, class ResMapper>
void high_gemm(Eigen::Index rows, Eigen::Index cols, Eigen::Index depth, const LhsMapper& lhs, const RhsMapper& rhs,
               const ResMapper& res, const Float& alpha) {
  if (rows == 0 || cols == 0 || depth == 0) return;
  std::vector<Unpacked> a(static_cast<size_t>(rows * depth)), b(static_cast<size_t>(depth * cols));
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index k = 0; k < depth; ++k) HighDot<Float>::unpack(lhs(i, k), a[static_cast<size_t>(i * depth + k)]);
  for (Eigen::Index j = 0; j < cols; ++j)
    for (Eigen::Index k = 0; k < depth; ++k) HighDot<Float>::unpack(rhs(k, j), b[static_cast<size_t>(j * depth + k)]);
  over_column_ranges(rows, cols, depth, [&](Eigen::Index begin, Eigen::Index end) {
    HighDot<Float> dot;
    Float acc;
    for (Eigen::Index j = begin; j < end; ++j)
      for (Eigen::Index i = 0; i < rows; ++i) {
        if (!dot.dot(acc, &a[static_cast<size_t>(i * depth)], &b[static_cast<size_t>(j * depth)], depth, 1)) {
          mpfr_set_zero(acc.backend().data(), 1);
          for (Eigen::Index k = 0; k < depth; ++k) high_multiply_add(acc, lhs(i, k), rhs(k, j));
        }
        high_accumulate(res(i, j), acc, alpha);
      }
  });
}

template <class Float, class LhsMapper, class RhsMapper>
void high_gemv(Eigen::Index rows, Eigen::Index cols, const LhsMapper& lhs, const RhsMapper& rhs, Float* res,
               Eigen::Index incr, const Float& alpha) {
  if (rows == 0 || cols == 0) return;
  std::vector<Unpacked> row(static_cast<size_t>(cols)), x(static_cast<size_t>(cols));
  for (Eigen::Index j = 0; j < cols; ++j) HighDot<Float>::unpack(rhs(j, 0), x[static_cast<size_t>(j)]);
  HighDot<Float> dot;
  Float acc;
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (Eigen::Index j = 0; j < cols; ++j) HighDot<Float>::unpack(lhs(i, j), row[static_cast<size_t>(j)]);
    if (!dot.dot(acc, row.data(), x.data(), cols, 1)) {
      mpfr_set_zero(acc.backend().data(), 1);
      for (Eigen::Index j = 0; j < cols; ++j) high_multiply_add(acc, lhs(i, j), rhs(j, 0));
    }
    high_accumulate(res[i * incr], acc, alpha);
  }
}

}  // namespace deltaproof::ref::products

// The specializations, one pair (GEMM, GEMV) per scalar type. A row-major destination is
// transposed by Eigen into this column-major case; both GEMV storage orders are covered.
#define DELTAPROOF_EIGEN_PRODUCTS(SCALAR, GEMM, GEMV)                                                              \
  namespace Eigen::internal {                                                                                      \
  template <typename Index, int LhsStorageOrder, bool ConjugateLhs, int RhsStorageOrder, bool ConjugateRhs,        \
            int ResInnerStride>                                                                                    \
  struct general_matrix_matrix_product<Index, SCALAR, LhsStorageOrder, ConjugateLhs, SCALAR, RhsStorageOrder,      \
                                       ConjugateRhs, ColMajor, ResInnerStride> {                                   \
    typedef gebp_traits<SCALAR, SCALAR> Traits; /* gemm_functor names it */                                        \
    static void run(Index rows, Index cols, Index depth, const SCALAR* lhs, Index lhsStride, const SCALAR* rhs,    \
                    Index rhsStride, SCALAR* res, Index resIncr, Index resStride, SCALAR alpha,                    \
                    level3_blocking<SCALAR, SCALAR>& /*blocking*/, GemmParallelInfo<Index>* /*info*/ = 0) {        \
      const const_blas_data_mapper<SCALAR, Index, LhsStorageOrder> l(lhs, lhsStride);                              \
      const const_blas_data_mapper<SCALAR, Index, RhsStorageOrder> r(rhs, rhsStride);                              \
      const blas_data_mapper<SCALAR, Index, ColMajor, Unaligned, ResInnerStride> out(res, resStride, resIncr);     \
      deltaproof::ref::products::GEMM<LhsStorageOrder == RowMajor>(rows, cols, depth, l, r, out, alpha);                                     \
    }                                                                                                              \
  };                                                                                                               \
  template <typename Index, typename LhsMapper, bool ConjugateLhs, typename RhsMapper, bool ConjugateRhs,          \
            int Version>                                                                                           \
  struct general_matrix_vector_product<Index, SCALAR, LhsMapper, ColMajor, ConjugateLhs, SCALAR, RhsMapper,        \
                                       ConjugateRhs, Version> {                                                    \
    static void run(Index rows, Index cols, const LhsMapper& lhs, const RhsMapper& rhs, SCALAR* res,               \
                    Index resIncr, SCALAR alpha) {                                                                 \
      deltaproof::ref::products::GEMV(rows, cols, lhs, rhs, res, resIncr, alpha);                                  \
    }                                                                                                              \
  };                                                                                                               \
  template <typename Index, typename LhsMapper, bool ConjugateLhs, typename RhsMapper, bool ConjugateRhs,          \
            int Version>                                                                                           \
  struct general_matrix_vector_product<Index, SCALAR, LhsMapper, RowMajor, ConjugateLhs, SCALAR, RhsMapper,        \
                                       ConjugateRhs, Version> {                                                    \
    static void run(Index rows, Index cols, const LhsMapper& lhs, const RhsMapper& rhs, SCALAR* res,               \
                    Index resIncr, SCALAR alpha) {                                                                 \
      deltaproof::ref::products::GEMV(rows, cols, lhs, rhs, res, resIncr, alpha);                                  \
    }                                                                                                              \
  };                                                                                                               \
  }
