// The oracle's fast arithmetic equals the arithmetic as written: Eigen's products over Exact and
// High (reference/eigen_products.hpp) against explicit loops of + and ×, and the rank-one token
// recurrences on integers (reference/exact_recurrence.hpp) against their generic loops, equal
// over ℚ. Entries with assorted denominators (not only powers of two) and zeros, shapes on both
// sides of Eigen's switch from the coefficient-wise product to GEMM (rows + cols + depth >= 20).
#include "property_tests/support/assertions.hpp"
#include "property_tests/support/generators.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/linear_attention.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <limits>

namespace deltaproof::testing {
namespace {

namespace dr = ref::delta_rule;
namespace gd = ref::gated_delta_rule;
namespace la = ref::linear_attention;
using ref::AsWritten;
using ref::High;
using ref::Vector;

// n/d with |n| <= 30 and d in 1..12 or a power of two up to 2^40 (the oracle's usual dyadic
// entries), zero one time in four.
rc::Gen<Exact> gen_rational() {
  return rc::gen::map(rc::gen::tuple(rc::gen::inRange(-30, 31), rc::gen::inRange(1, 13), rc::gen::inRange(0, 41),
                                     rc::gen::inRange(0, 8)),
                      [](const std::tuple<int, int, int, int>& x) {
                        const auto [n, small, power, kind] = x;
                        if (kind < 2) return Exact(0);
                        if (kind < 5) return Exact(n) / Exact(small);
                        return Exact(n) / Exact(boost::multiprecision::pow(boost::multiprecision::mpz_int(2), power));
                      });
}

Matrix<Exact> gen_rationals(Index rows, Index cols) {
  Matrix<Exact> m(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) m(i, j) = *gen_rational();
  return m;
}

// Σ_k a_ik b_kj with the scalar's own + and ×, k in order.
template <class Scalar>
Matrix<Scalar> product_as_written(const Matrix<Scalar>& a, const Matrix<Scalar>& b) {
  Matrix<Scalar> c(a.rows(), b.cols());
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < b.cols(); ++j) {
      Scalar sum(0);
      for (Index k = 0; k < a.cols(); ++k) sum += a(i, k) * b(k, j);
      c(i, j) = sum;
    }
  return c;
}

struct ProductShape {
  Index rows, depth, cols;
};

std::ostream& operator<<(std::ostream& os, const ProductShape& s) {
  return os << "(" << s.rows << " x " << s.depth << ") (" << s.depth << " x " << s.cols << ")";
}

rc::Gen<ProductShape> gen_product_shape() {
  return rc::gen::map(rc::gen::tuple(rc::gen::inRange<Index>(0, 34), rc::gen::inRange<Index>(0, 34),
                                     rc::gen::inRange<Index>(0, 34)),
                      [](const std::tuple<Index, Index, Index>& s) {
                        return ProductShape{std::get<0>(s), std::get<1>(s), std::get<2>(s)};
                      });
}

RC_GTEST_PROP(ReferenceArithmetic, ExactProductsEqualLoops, ()) {
  const ProductShape s = *gen_product_shape();
  const Matrix<Exact> a = gen_rationals(s.rows, s.depth), b = gen_rationals(s.depth, s.cols);
  const Matrix<Exact> c = gen_rationals(s.rows, s.cols);
  const Matrix<Exact> ab = product_as_written(a, b);
  require_equal("A B", Matrix<Exact>(a * b), ab);
  const Matrix<Exact> at = a.transpose(), bt = b.transpose();
  require_equal("(A^T)^T (B^T)^T, row-major operands", Matrix<Exact>(at.transpose() * bt.transpose()), ab);
  require_equal("B^T A^T", Matrix<Exact>(bt * at), Matrix<Exact>(ab.transpose()));
  if (s.depth >= 2) {
    const Matrix<Exact> tail_a = a.rightCols(s.depth - 1), tail_b = b.bottomRows(s.depth - 1);
    require_equal("blocks with outer strides", Matrix<Exact>(a.rightCols(s.depth - 1) * b.bottomRows(s.depth - 1)),
                  product_as_written(tail_a, tail_b));
  }
  const Exact alpha = *gen_rational();
  Matrix<Exact> accumulated = c;
  accumulated.noalias() -= alpha * (a * b);
  require_equal("C - alpha A B", accumulated, Matrix<Exact>(c - alpha * ab));
  if (s.cols > 0) {
    const Vector<Exact> x = b.col(0);
    require_equal("A x (GEMV)", Matrix<Exact>(a * x), product_as_written<Exact>(a, x));
    const Matrix<Exact> row = a.topRows(std::min<Index>(1, s.rows));
    require_equal("x^T B (row-major GEMV)", Matrix<Exact>(row * b), product_as_written(row, b));
  }
  const Index n = std::min(s.rows, s.depth);
  // Eigen's triangular solve takes &coeffRef(0, 0) of its operands: UB on an empty one (UBSan).
  if (n == 0 || s.cols == 0) return;
  Matrix<Exact> unit_lower = a.topLeftCorner(n, n);
  unit_lower.diagonal().setOnes();
  const Matrix<Exact> rhs = c.topRows(n);
  const Matrix<Exact> solved = unit_lower.triangularView<Eigen::UnitLower>().solve(rhs);
  const Matrix<Exact> lower = unit_lower.triangularView<Eigen::UnitLower>();
  require_equal("L (L^-1 C) == C (triangular solve through GEMV/GEMM)", product_as_written(lower, solved), rhs);
}

// In High each entry of the product is a sum of `depth` products, rounded once per term here and
// twice per term as written: both within 2·depth·u·Σ|a||b| of the exact sum (u = 2^-333).
RC_GTEST_PROP(ReferenceArithmetic, HighProductsWithinRoundingOfExact, ()) {
  const ProductShape s = *gen_product_shape();
  const Matrix<Exact> a = gen_rationals(s.rows, s.depth), b = gen_rationals(s.depth, s.cols);
  const Matrix<High> ha = ref::matrix_cast<High>(a), hb = ref::matrix_cast<High>(b);
  const Matrix<Exact> exact = product_as_written(a, b);
  const Matrix<Exact> magnitude = product_as_written<Exact>(a.cwiseAbs(), b.cwiseAbs());
  // matrix_cast already rounded a and b (each by u): 2(depth + 2)u covers that as well.
  const Exact u = Exact(1) / Exact(boost::multiprecision::pow(boost::multiprecision::mpz_int(2), 333));
  const Matrix<Exact> bound = magnitude * (Exact(2 * (s.depth + 2)) * u);
  require_within("A B in High", Matrix<High>(ha * hb), exact, bound);
  require_within("A B in High, as written", product_as_written(ha, hb), exact, bound);
  const Matrix<Exact> c = gen_rationals(s.rows, s.cols);
  const Exact alpha = *gen_rational();
  Matrix<High> accumulated = ref::matrix_cast<High>(c);
  accumulated.noalias() -= ref::scalar_cast<High>(alpha) * (ha * hb);
  // one more rounding per entry for alpha·sum and the subtraction, on top of the product's
  const Matrix<Exact> c_bound = (magnitude * (Exact(2 * (s.depth + 4)) * u)) * abs(alpha) + c.cwiseAbs() * (Exact(4) * u);
  require_within("C - alpha A B in High", accumulated, Matrix<Exact>(c - alpha * exact), c_bound);
  if (s.cols > 0) {
    const Vector<High> x = hb.col(0);
    require_within("A x in High (GEMV)", Matrix<High>(ha * x), Matrix<Exact>(exact.col(0)), Matrix<Exact>(bound.col(0)));
  }
}

// With exponents close together a dot product is summed exactly and rounded once: the product
// in High is the exact product of its (rounded) factors, rounded to nearest, bit for bit (for the
// GEMM/GEMV shapes: rows + cols + depth >= 20; below that Eigen's own loop runs). Spread by up to
// 2^±800, sums take the term-by-term path in part; they stay within the bound.
RC_GTEST_PROP(ReferenceArithmetic, HighProductsCorrectlyRounded, ()) {
  const ProductShape s = *rc::gen::suchThat(gen_product_shape(), [](const ProductShape& p) {
    return p.rows + p.cols + p.depth >= 20;
  });
  const bool spread = *rc::gen::arbitrary<bool>();
  auto draw = [&](Index rows, Index cols) {
    Matrix<High> m = ref::matrix_cast<High>(gen_rationals(rows, cols));
    if (spread)
      for (Index i = 0; i < rows; ++i)
        for (Index j = 0; j < cols; ++j) m(i, j) = ldexp(m(i, j), *rc::gen::inRange(-800, 801));
    return m;
  };
  const Matrix<High> a = draw(s.rows, s.depth), b = draw(s.depth, s.cols);
  const Matrix<Exact> exact = product_as_written<Exact>(ref::matrix_cast<Exact>(a), ref::matrix_cast<Exact>(b));
  const Matrix<High> got = a * b;
  if (!spread) {
    RC_ASSERT(got == ref::matrix_cast<High>(exact));
  } else {
    const Exact u = Exact(1) / Exact(boost::multiprecision::pow(boost::multiprecision::mpz_int(2), 333));
    const Matrix<Exact> magnitude =
        product_as_written<Exact>(ref::matrix_cast<Exact>(a).cwiseAbs(), ref::matrix_cast<Exact>(b).cwiseAbs());
    require_within("A B in High, exponents spread", got, exact, Matrix<Exact>(magnitude * (Exact(2 * s.depth + 2) * u)));
  }
}

TEST(ReferenceArithmetic, HighKeepsItsPrecision) {
  EXPECT_EQ(std::numeric_limits<High>::digits, 334);  // 100 decimal digits, as mpfr_float_100
  using HeapHigh = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<100>,
                                                 boost::multiprecision::et_off>;
  const High third = High(1) / 3;
  const HeapHigh heap_third = HeapHigh(1) / 3;
  EXPECT_EQ(Exact(third), Exact(heap_third));
}

struct RecurrenceCase {
  Matrix<Exact> q, k, v;
  Vector<Exact> beta, alpha;
  std::optional<Matrix<Exact>> initial_state;
};

rc::Gen<RecurrenceCase> gen_recurrence_case() {
  return rc::gen::exec([] {
    const Index L = *rc::gen::inRange<Index>(0, 30), DK = *rc::gen::inRange<Index>(1, 12),
                DV = *rc::gen::inRange<Index>(1, 12);
    RecurrenceCase c{gen_rationals(L, DK), gen_rationals(L, DK), gen_rationals(L, DV), gen_rationals(L, 1).col(0),
                     gen_rationals(L, 1).cwiseAbs().col(0), std::nullopt};
    if (*rc::gen::arbitrary<bool>()) c.initial_state = gen_rationals(DV, DK);
    if (*rc::gen::inRange(0, 4) == 0) c.beta.setOnes();
    return c;
  });
}

RC_GTEST_PROP(ReferenceArithmetic, IntegerRecurrencesEqualLoopsAsWritten, ()) {
  const RecurrenceCase c = *gen_recurrence_case();
  const dr::Inputs<Exact> delta{c.q, c.k, c.v, c.beta, c.initial_state};
  const auto d_fast = dr::token_recurrence_read_correct_write(delta);
  const auto d_loop = dr::token_recurrence_read_correct_write<Exact, AsWritten>(delta);
  require_equal("DeltaNet read-correct-write output", d_fast.output, d_loop.output);
  require_equal("DeltaNet read-correct-write final state", d_fast.final_state, d_loop.final_state);
  const gd::Inputs<Exact> gated{c.q, c.k, c.v, c.beta, c.alpha, c.initial_state};
  const auto g_fast = gd::token_recurrence_read_correct_write(gated);
  const auto g_loop = gd::token_recurrence_read_correct_write<Exact, AsWritten>(gated);
  require_equal("Gated DeltaNet read-correct-write output", g_fast.output, g_loop.output);
  require_equal("Gated DeltaNet read-correct-write final state", g_fast.final_state, g_loop.final_state);
  const la::Inputs<Exact> linear{c.q, c.k, c.v, c.initial_state};
  const auto l_fast = la::token_recurrence(linear);
  const auto l_loop = la::token_recurrence<Exact, AsWritten>(linear);
  require_equal("linear attention recurrence output", l_fast.output, l_loop.output);
  require_equal("linear attention recurrence final state", l_fast.final_state, l_loop.final_state);
}

}  // namespace
}  // namespace deltaproof::testing
