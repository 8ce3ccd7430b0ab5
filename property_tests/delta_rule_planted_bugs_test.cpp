// Planted bugs: each broken variant must make a DeltaNet / Gated DeltaNet property fail.
//
// rc::check runs the same property functions the suites use, on the mutant Policy, and the
// test passes only when rapidcheck finds (and shrinks) a counterexample.
#include "property_tests/delta_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

// T21 = −T11 A21 T22 instead of −T22 A21 T11 when two inverted blocks merge.
struct SwappedMerge : dr::Faithful {
  template <class Scalar>
  static Matrix<Scalar> merged_off_diagonal(const Matrix<Scalar>& t11, const Matrix<Scalar>& a21, const Matrix<Scalar>& t22) {
    return -(t11 * a21 * t22);
  }
};

// W and U exchanged (shapes agree only when DK = DV; the suite generates those).
struct SwappedWU : dr::Faithful {
  template <class Scalar, class KRows, class VRows>
  static dr::WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta) {
    return {t * dr::scale_rows<Scalar>(beta, v), t * dr::scale_rows<Scalar>(beta, k)};
  }
};

// β applied twice: W = T diag(β)² K, U = T diag(β)² V.
struct BetaTwice : dr::Faithful {
  template <class Scalar, class KRows, class VRows>
  static dr::WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta) {
    const Vector<Scalar> twice = beta.cwiseProduct(beta);
    return {t * dr::scale_rows<Scalar>(twice, k), t * dr::scale_rows<Scalar>(twice, v)};
  }
};

// Gated: the in-chunk decay γ left out of W (W = T diag(β) K).
struct GatedWithoutGammaInW : gd::Faithful {
  template <class Scalar, class KRows, class VRows>
  static dr::WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta,
                                   const Vector<Scalar>& /*gamma*/) {
    return {t * dr::scale_rows<Scalar>(beta, k), t * dr::scale_rows<Scalar>(beta, v)};
  }
};

constexpr ShapeLimits kSmall{.max_length = 24, .max_dim = 6, .max_chunk = 24};

// Square heads (DK = DV), so that a W/U swap is well-formed.
rc::Gen<DeltaCase> gen_square_delta_case() {
  return rc::gen::suchThat(gen_delta_case(kSmall), [](const DeltaCase& c) { return c.shape.key_dim == c.shape.value_dim; });
}

TEST(DeltaPlantedBugs, MergeWithT11AndT22SwappedIsCaught) {
  // Power-of-two sizes and bases: every merge joins equal halves, so the mutant is well-formed.
  EXPECT_FALSE(rc::check("triangular solves agree (mutant: T11 and T22 swapped in a merge)", [] {
    const Index n = *rc::gen::element<Index>(2, 4, 8, 16, 32);
    const auto regime = *gen_delta_regime();
    const Matrix<Exact> k = *gen_keys(n, *rc::gen::inRange<Index>(1, 4), regime.keys);
    const Index base = *rc::gen::element<Index>(1, 2, 4);
    check_triangular_solves_agree<SwappedMerge>(dr::wy_system<Exact>(k, *gen_gates(n, regime.beta)), base, base);
  }));
  EXPECT_FALSE(rc::check("chunkwise == recurrence, blocked solve (mutant: T11 and T22 swapped)", [] {
    const auto c = *gen_delta_case(kSmall);
    check_chunkwise_matches_recurrence<SwappedMerge>(c, TriangularSolve::blocked, 1);
  }));
}

TEST(DeltaPlantedBugs, WAndUSwappedIsCaught) {
  EXPECT_FALSE(rc::check("chunkwise == recurrence (mutant: W and U swapped)", [] {
    check_chunkwise_matches_recurrence<SwappedWU>(*gen_square_delta_case(), TriangularSolve::forward_substitution, 16);
  }));
  EXPECT_FALSE(rc::check("WY stages (mutant: W and U swapped)", [] {
    check_chunk_stages<SwappedWU>(*gen_square_delta_case(), TriangularSolve::forward_substitution, 16);
  }));
}

TEST(DeltaPlantedBugs, BetaAppliedTwiceIsCaught) {
  EXPECT_FALSE(rc::check("chunkwise == recurrence (mutant: beta applied twice)", [] {
    check_chunkwise_matches_recurrence<BetaTwice>(*gen_delta_case(kSmall), TriangularSolve::forward_substitution, 16);
  }));
  EXPECT_FALSE(rc::check("backward paths agree (mutant: beta applied twice)", [] {
    check_backward_paths_agree<BetaTwice>(*gen_delta_case(kSmall), TriangularSolve::recursive, 2);
  }));
  EXPECT_FALSE(rc::check("dual directional derivative (mutant: beta applied twice)", [] {
    const auto c = *gen_delta_case({.max_length = 12, .max_dim = 4, .max_chunk = 12});
    check_exact_directional_derivative<BetaTwice>(c, *gen_direction(dr::params_of(c.inputs)));
  }));
}

TEST(DeltaPlantedBugs, GatedDecayMissingFromWIsCaught) {
  EXPECT_FALSE(rc::check("gated chunkwise == recurrence (mutant: gamma missing from W)", [] {
    check_chunkwise_matches_recurrence<GatedWithoutGammaInW>(*gen_gated_delta_case(kSmall), TriangularSolve::forward_substitution, 16);
  }));
}

// The same properties hold for the faithful forms on the same generators (so the failures
// above are the mutants', not the harness's).
TEST(DeltaPlantedBugs, FaithfulFormsPassTheSameHarness) {
  EXPECT_TRUE(rc::check("chunkwise == recurrence (faithful, square heads)", [] {
    check_chunkwise_matches_recurrence(*gen_square_delta_case(), TriangularSolve::blocked, 1);
  }));
}

}  // namespace
}  // namespace deltaproof::testing
