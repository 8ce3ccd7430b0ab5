// DeltaNet and Gated DeltaNet properties, each written once for both families (a DeltaCase or a
// GatedDeltaCase) and templated on a Policy, so that the planted-bug suite can run each of them
// against a broken form.
//
// Unqualified calls to the oracle (chunkwise, token_recurrence, params_of, …) find the case's
// family through its inputs by argument-dependent lookup: delta_rule's forms for a DeltaCase,
// gated_delta_rule's for a GatedDeltaCase. Family<Case> holds what no argument names.
#pragma once

#include "property_tests/support/assertions.hpp"
#include "property_tests/support/delta_cases.hpp"
#include "reference/dual.hpp"

#include <string>
#include <type_traits>

namespace deltaproof::testing {

using dr::TriangularSolve;
using ref::Dual;
using ref::High;

template <class Case>
struct Family;
template <>
struct Family<DeltaCase> {
  using Faithful = dr::Faithful;
  template <class Scalar>
  static dr::Inputs<Scalar> inputs_of(const ref::Params<Scalar>& p) { return dr::inputs_of(p); }
};
template <>
struct Family<GatedDeltaCase> {
  using Faithful = gd::Faithful;
  template <class Scalar>
  static gd::Inputs<Scalar> inputs_of(const ref::Params<Scalar>& p) { return gd::inputs_of(p); }
};

// The forms a property runs: the case's faithful family, or a planted bug.
template <class Planted, class Case>
using PolicyOr = std::conditional_t<std::is_void_v<Planted>, typename Family<Case>::Faithful, Planted>;

inline std::string at_chunk(const std::string& what, size_t c) { return what + " (chunk " + std::to_string(c) + ")"; }

template <class Scalar>
void require_equal_vector(const std::string& what, const Vector<Scalar>& a, const Vector<Scalar>& b) {
  require_equal<Scalar>(what, Matrix<Scalar>(a), Matrix<Scalar>(b));
}

template <class Scalar>
void require_equal_maps(const std::string& what, const std::vector<dr::AffineMap<Scalar>>& a,
                        const std::vector<dr::AffineMap<Scalar>>& b) {
  RC_ASSERT(a.size() == b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    require_equal(what + " transition at token " + std::to_string(r), a[r].transition, b[r].transition);
    require_equal(what + " write at token " + std::to_string(r), a[r].write, b[r].write);
  }
}

// dq, dk, dv, dβ, dα (gated), dS_0 equal.
template <class Gradients>
void require_equal_gradients(const std::string& what, const Gradients& a, const Gradients& b) {
  require_equal(what + " dq", a.dq, b.dq);
  require_equal(what + " dk", a.dk, b.dk);
  require_equal(what + " dv", a.dv, b.dv);
  require_equal_vector(what + " dbeta", a.d_beta, b.d_beta);
  if constexpr (requires { a.d_alpha; }) require_equal_vector(what + " dalpha", a.d_alpha, b.d_alpha);
  require_equal(what + " dS_0", a.d_initial_state, b.d_initial_state);
}

// The first n tokens of a sequence: q, k, v and every per-token coefficient cut together.
template <class In>
In first_tokens(const In& in, Index n) {
  In out = in;
  out.q = in.q.topRows(n), out.k = in.k.topRows(n), out.v = in.v.topRows(n), out.beta = in.beta.head(n);
  if constexpr (requires { in.alpha; }) out.alpha = in.alpha.head(n);
  return out;
}

// S_t from S_{t-1} as the read–correct–write recurrence writes it (the decay α_t first, gated).
template <class In>
Matrix<Exact> recurrence_step(const In& in, Matrix<Exact> state, Index t) {
  if constexpr (requires { in.alpha; }) state *= in.alpha(t);
  const auto k = in.k.row(t).transpose();
  return state + in.beta(t) * ((in.v.row(t).transpose() - state * k) * k.transpose());
}

inline rc::Gen<TriangularSolve> gen_solve() {
  return rc::gen::element(TriangularSolve::forward_substitution, TriangularSolve::blocked, TriangularSolve::recursive);
}
inline rc::Gen<Index> gen_base_block() { return rc::gen::element<Index>(1, 2, 3, 4, 8, 16); }

// ---------------------------------------------------------------------------------------
// The triangular system (shared by both families: only A differs).

// A T = I for forward substitution; the blocked schedule and the recursive merge equal it, and
// every merged block of the blocked schedule is the matching diagonal block of (padded A)⁻¹.
template <class Policy = dr::Faithful>
void check_triangular_solves_agree(const Matrix<Exact>& a, Index blocked_base, Index recursive_base) {
  const Index n = a.rows();
  const Matrix<Exact> t = dr::invert_unit_lower_forward_substitution(a);
  require_equal("A T", Matrix<Exact>(a * t), Matrix<Exact>(Matrix<Exact>::Identity(n, n)));
  const auto blocked = dr::invert_unit_lower_blocked<Exact, Policy>(a, blocked_base);
  require_equal("blocked T vs forward substitution", blocked.t, t);
  const Index padded = blocked.diagonal_block_inverses.size() * blocked_base;
  Matrix<Exact> a_padded = Matrix<Exact>::Identity(padded, padded);
  a_padded.topLeftCorner(n, n) = a;
  const Matrix<Exact> t_padded = dr::invert_unit_lower_forward_substitution(a_padded);
  for (size_t j = 0; j < blocked.diagonal_block_inverses.size(); ++j) {
    const Index b = static_cast<Index>(j) * blocked_base;
    require_equal("diagonal block inverse " + std::to_string(j), blocked.diagonal_block_inverses[j],
                  Matrix<Exact>(t_padded.block(b, b, blocked_base, blocked_base)));
  }
  Index size = blocked_base;
  for (size_t level = 0; level < blocked.merged_levels.size(); ++level) {
    size *= 2;
    for (size_t j = 0; j < blocked.merged_levels[level].size(); ++j) {
      const Index b = static_cast<Index>(j) * size;
      require_equal("merged block " + std::to_string(j) + " of size " + std::to_string(size),
                    blocked.merged_levels[level][j], Matrix<Exact>(t_padded.block(b, b, size, size)));
    }
  }
  require_equal("recursive T vs forward substitution", dr::invert_unit_lower_recursive<Exact, Policy>(a, recursive_base), t);
}

// ---------------------------------------------------------------------------------------
// Forward forms.

// Erase–write == read–correct–write == tree-scan affine view, outputs and final state.
template <class Case>
void check_token_views_agree(const Case& c) {
  const auto erase_write = token_recurrence(c.inputs);
  const auto read_correct_write = token_recurrence_read_correct_write(c.inputs);
  const auto affine = affine_scan(c.inputs);
  require_equal("read-correct-write output vs erase-write", read_correct_write.output, erase_write.output);
  require_equal("read-correct-write final state vs erase-write", read_correct_write.final_state, erase_write.final_state);
  require_equal("affine tree scan output vs erase-write", affine.output, erase_write.output);
  require_equal("affine tree scan final state vs erase-write", affine.final_state, erase_write.final_state);
}

// One chunk by the family's own formulas, for the stage checks: the affine maps of its tokens,
// Equation 7 (gated: decayed), A, the row scale of K in A W = diag(·) K, the WY prefixes.
struct ChunkForms {
  std::vector<dr::AffineMap<Exact>> maps;
  dr::WY<Exact> constructive;
  Matrix<Exact> a;
  Vector<Exact> w_scale;  // β, or β ⊙ γ with gates
  std::vector<dr::AffineMap<Exact>> wy_prefixes;
  std::string w_scale_name;
};

inline ChunkForms chunk_forms(const dr::Inputs<Exact>& in, const ref::Chunk& ch, const dr::ChunkIntermediates<Exact>&) {
  const Matrix<Exact> k = in.k.middleRows(ch.begin, ch.size), v = in.v.middleRows(ch.begin, ch.size);
  const Vector<Exact> beta = in.beta.segment(ch.begin, ch.size);
  const dr::WY<Exact> constructive = dr::wy_recurrence<Exact>(k, v, beta);
  return {dr::affine_maps<Exact>(k, v, beta), constructive, dr::wy_system<Exact>(k, beta), beta,
          dr::wy_prefix_products<Exact>(constructive, k), "beta"};
}

inline ChunkForms chunk_forms(const gd::Inputs<Exact>& in, const ref::Chunk& ch, const gd::ChunkIntermediates<Exact>& x) {
  const Matrix<Exact> k = in.k.middleRows(ch.begin, ch.size), v = in.v.middleRows(ch.begin, ch.size);
  const Vector<Exact> beta = in.beta.segment(ch.begin, ch.size), alpha = in.alpha.segment(ch.begin, ch.size);
  const dr::WY<Exact> constructive = gd::wy_recurrence<Exact>(k, v, beta, x.decay);
  return {gd::affine_maps<Exact>(k, v, beta, alpha), constructive, gd::wy_system<Exact>(k, beta, x.decay),
          beta.cwiseProduct(gd::chunk_gamma(x.decay)), gd::wy_prefix_products<Exact>(constructive, k, x.decay), "beta gamma"};
}

// Per chunk: tree scan == sequential scan of the affine maps; S^r = S_[c] P_r + H_r is the
// recurrence's state after token r; the WY recurrences (Equation 7) equal the triangular
// solve, satisfy A W = diag(β [⊙ γ]) K and A U = diag(β) V, and rebuild the dense prefixes.
template <class Planted = void, class Case>
void check_chunk_stages(const Case& c, TriangularSolve solve, Index base_block) {
  const auto chunked = chunkwise<Exact, PolicyOr<Planted, Case>>(c.inputs, c.shape.chunk_size, {solve, base_block});
  const auto chunks = ref::chunks_of(c.shape.length, c.shape.chunk_size);
  RC_ASSERT(chunked.chunks.size() == chunks.size());
  Matrix<Exact> state = c.inputs.initial_state_or_zero();  // the recurrence's, token by token
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const auto& ch = chunks[ci];
    const Matrix<Exact> k = c.inputs.k.middleRows(ch.begin, ch.size);
    const Matrix<Exact> v = c.inputs.v.middleRows(ch.begin, ch.size);
    const Vector<Exact> beta = c.inputs.beta.segment(ch.begin, ch.size);
    const auto& x = chunked.chunks[ci];
    if constexpr (requires { x.decay; })  // every gated formula reads the decays: the gate products Γ
      require_equal(at_chunk("decays", ci), x.decay, gd::decay_from_gates<Exact>(c.inputs.alpha.segment(ch.begin, ch.size)));
    const ChunkForms f = chunk_forms(c.inputs, ch, x);
    const auto dense = dr::sequential_prefix_scan(f.maps);
    require_equal_maps(at_chunk("tree scan vs sequential", ci), dr::tree_prefix_scan(f.maps), dense);
    for (Index r = 0; r < ch.size; ++r) {
      state = recurrence_step(c.inputs, state, ch.begin + r);
      require_equal(at_chunk("S_[c] P_r + H_r vs recurrence state at token " + std::to_string(ch.begin + r), ci),
                    dense[r].apply(chunked.boundary_states[ci]), state);
    }
    require_equal(at_chunk("A", ci), x.a, f.a);
    require_equal(at_chunk("W (Equation 7) vs T diag(" + f.w_scale_name + ") K", ci), x.w, f.constructive.w);
    require_equal(at_chunk("U (Equation 7) vs T diag(beta) V", ci), x.u, f.constructive.u);
    require_equal(at_chunk("A W vs diag(" + f.w_scale_name + ") K", ci), Matrix<Exact>(x.a * x.w), dr::scale_rows<Exact>(f.w_scale, k));
    require_equal(at_chunk("A U vs diag(beta) V", ci), Matrix<Exact>(x.a * x.u), dr::scale_rows<Exact>(beta, v));
    require_equal_maps(at_chunk("WY prefixes vs dense products", ci), f.wy_prefixes, dense);
    require_equal(at_chunk("V_new = U - W S_[c]^T", ci), x.v_new,
                  Matrix<Exact>(f.constructive.u - f.constructive.w * chunked.boundary_states[ci].transpose()));
  }
}

// chunkwise == token recurrence: outputs, final state and every boundary state S_[c].
template <class Planted = void, class Case>
void check_chunkwise_matches_recurrence(const Case& c, TriangularSolve solve, Index base_block) {
  const auto recurrent = token_recurrence_read_correct_write(c.inputs);
  const auto chunked = chunkwise<Exact, PolicyOr<Planted, Case>>(c.inputs, c.shape.chunk_size, {solve, base_block});
  const std::string how = " (" + dr::to_string(solve) + ", base " + std::to_string(base_block) + ")";
  require_equal("chunkwise output vs recurrence" + how, chunked.output, recurrent.output);
  require_equal("chunkwise final state vs recurrence" + how, chunked.final_state, recurrent.final_state);
  for (size_t ci = 0; ci < chunked.boundary_states.size(); ++ci)
    require_equal("boundary state S_[" + std::to_string(ci) + "]", chunked.boundary_states[ci],
                  token_recurrence_read_correct_write(first_tokens(c.inputs, static_cast<Index>(ci) * c.shape.chunk_size))
                      .final_state);
}

// C = L: the whole-sequence parallel form equals the recurrence.
template <class Case>
void check_parallel_form_matches_recurrence(const Case& c, dr::ChunkOptions options) {
  const auto parallel = parallel_wy(c.inputs, options);
  const auto recurrent = token_recurrence(c.inputs);
  require_equal("parallel output vs recurrence", parallel.output, recurrent.output);
  require_equal("parallel final state vs recurrence", parallel.final_state, recurrent.final_state);
}

// ---------------------------------------------------------------------------------------
// Backward.

// Chunkwise backward through WY == token-recurrence backward, exactly.
template <class Planted = void, class Case>
void check_backward_paths_agree(const Case& c, TriangularSolve solve, Index base_block) {
  const auto recurrent = token_recurrence_backward(c.inputs, c.cotangents);
  const auto chunked =
      chunkwise_backward<Exact, PolicyOr<Planted, Case>>(c.inputs, c.cotangents, c.shape.chunk_size, {solve, base_block});
  require_equal_gradients("chunkwise vs recurrence", chunked, recurrent);
}

// <∇L, u> from the analytic backward == d/dε L(x + ε u) over ℚ (dual numbers), for both the
// chunkwise form and the token recurrence.
template <class Planted = void, class Case>
void check_exact_directional_derivative(const Case& c, const ref::Params<Exact>& direction) {
  using Policy = PolicyOr<Planted, Case>;
  const Index chunk = c.shape.chunk_size;
  const auto grad = chunkwise_backward<Exact, Policy>(c.inputs, c.cotangents, chunk);
  const Exact analytic = ref::inner(params_of(grad, c.inputs.initial_state.has_value()), direction);
  const auto through = [&](const auto& form) {
    return ref::exact_directional_derivative(
        [&](const ref::Params<Dual<Exact>>& p) { return loss_with_exact_cotangents(c.cotangents, form(Family<Case>::inputs_of(p))); },
        params_of(c.inputs), direction);
  };
  const Exact through_chunkwise = through([&](const auto& in) { return chunkwise<Dual<Exact>, Policy>(in, chunk); });
  const Exact through_recurrence = through([](const auto& in) { return token_recurrence(in); });
  if (analytic != through_chunkwise || analytic != through_recurrence)
    RC_FAIL("directional derivative: analytic " + analytic.str() + ", dual chunkwise " + through_chunkwise.str() +
            ", dual recurrence " + through_recurrence.str());
}

// Central differences in High along u agree with <∇L, u> to a relative error below 1e-25.
template <class Case>
void check_finite_differences(const Case& c, const ref::Params<Exact>& direction) {
  const auto grad = chunkwise_backward(c.inputs, c.cotangents, c.shape.chunk_size);
  const High analytic(ref::inner(params_of(grad, c.inputs.initial_state.has_value()), direction));
  const High numeric = ref::central_difference(
      [&](const ref::Params<High>& p) {
        return loss_with_exact_cotangents(c.cotangents, token_recurrence_read_correct_write(Family<Case>::inputs_of(p)));
      },
      ref::params_cast<High>(params_of(c.inputs)), ref::params_cast<High>(direction), High("1e-30"));
  const High scale = std::max(High(1), High(abs(analytic)));
  const High relative = High(abs(numeric - analytic)) / scale;
  if (!(relative < High("1e-25")))
    RC_FAIL("finite difference " + numeric.str(30) + " vs analytic " + analytic.str(30) + ", relative error " + relative.str(5));
}

// Every partial derivative on its own by central differences of the erase–write recurrence in
// High, against the chunkwise backward: relative error below 1e-25 (tiny shapes: two High
// evaluations per entry).
template <class Case>
void check_every_partial_by_central_differences(const Case& c) {
  const auto analytic = params_of(chunkwise_backward(c.inputs, c.cotangents, c.shape.chunk_size), c.inputs.initial_state.has_value());
  const auto numeric = ref::central_difference_gradient(
      [&](const ref::Params<High>& p) { return loss_with_exact_cotangents(c.cotangents, token_recurrence(Family<Case>::inputs_of(p))); },
      ref::params_cast<High>(params_of(c.inputs)), High("1e-30"));
  for (size_t p = 0; p < numeric.size(); ++p)
    for (Index i = 0; i < numeric[p].value.rows(); ++i)
      for (Index j = 0; j < numeric[p].value.cols(); ++j) {
        const High exact(analytic[p].value(i, j));
        const High err = abs(numeric[p].value(i, j) - exact) / std::max(High(1), High(abs(exact)));
        if (!(err < High("1e-25")))
          RC_FAIL("d" + numeric[p].name + "(" + std::to_string(i) + ", " + std::to_string(j) + "): relative error " + err.str(5));
      }
}

// ---------------------------------------------------------------------------------------
// The properties both families' suites run, stamped once per family: Suite names the GoogleTest
// suite (DeltaRuleForms, GatedDeltaRuleGradients, …), gen_case the case generator.

#define DELTAPROOF_DELTA_FORM_PROPERTIES(Suite, gen_case, dense_limits, stage_limits, form_limits)                \
  RC_GTEST_PROP(Suite, TokenViewsAndAffineScanAgree, ()) { check_token_views_agree(*gen_case(dense_limits)); } \
                                                                                                                \
  RC_GTEST_PROP(Suite, ChunkStagesMatchDenseProducts, ()) {                                                     \
    const auto c = *gen_case(stage_limits);                                                                     \
    check_chunk_stages(c, *gen_solve(), *gen_base_block());                                                     \
  }                                                                                                             \
                                                                                                                \
  RC_GTEST_PROP(Suite, ChunkwiseMatchesRecurrenceForEverySolve, ()) {                                           \
    const auto c = *gen_case(form_limits);                                                                      \
    check_chunkwise_matches_recurrence(c, *gen_solve(), *gen_base_block());                                     \
  }                                                                                                             \
                                                                                                                \
  /* C = L: the whole-sequence parallel form. */                                                                \
  RC_GTEST_PROP(Suite, ParallelFormMatchesRecurrence, ()) {                                                     \
    const auto c = *gen_case({.max_length = 40, .max_dim = 10, .max_chunk = 40});                               \
    check_parallel_form_matches_recurrence(c, {*gen_solve(), *gen_base_block()});                               \
  }

#define DELTAPROOF_DELTA_GRADIENT_PROPERTIES(Suite, gen_case, backward_limits, dual_limits, high_limits)          \
  RC_GTEST_PROP(Suite, BackwardPathsEqualOverRationals, ()) {                                                   \
    const auto c = *gen_case(backward_limits);                                                                  \
    check_backward_paths_agree(c, *gen_solve(), *gen_base_block());                                             \
  }                                                                                                             \
                                                                                                                \
  RC_GTEST_PROP(Suite, ExactDirectionalDerivative, ()) {                                                        \
    const auto c = *gen_case(dual_limits);                                                                      \
    check_exact_directional_derivative(c, *gen_direction(params_of(c.inputs)));                                 \
  }                                                                                                             \
                                                                                                                \
  RC_GTEST_PROP(Suite, CentralDifferencesInHighBelow1e25, ()) {                                                 \
    const auto c = *gen_case(high_limits);                                                                      \
    check_finite_differences(c, *gen_direction(params_of(c.inputs)));                                           \
  }                                                                                                             \
                                                                                                                \
  RC_GTEST_PROP(Suite, EveryPartialByCentralDifferences, ()) {                                                  \
    check_every_partial_by_central_differences(*gen_case({.max_length = 5, .max_dim = 3, .max_chunk = 4}));     \
  }

}  // namespace deltaproof::testing
