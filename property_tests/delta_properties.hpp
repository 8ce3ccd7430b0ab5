// DeltaNet and Gated DeltaNet properties, as functions of a case templated on a Policy, so that
// the planted-bug suite can run each of them against a broken form.
#pragma once

#include "property_tests/support/assertions.hpp"
#include "property_tests/support/delta_cases.hpp"
#include "reference/dual.hpp"

#include <string>

namespace deltaproof::testing {

using dr::TriangularSolve;
using ref::Dual;
using ref::High;

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
// DeltaNet forward forms.

// Erase–write == read–correct–write == tree-scan affine view, outputs and final state.
inline void check_delta_token_views_agree(const DeltaCase& c) {
  const auto erase_write = dr::token_recurrence(c.inputs);
  const auto read_correct_write = dr::token_recurrence_read_correct_write(c.inputs);
  const auto affine = dr::affine_scan(c.inputs);
  require_equal("read-correct-write output vs erase-write", read_correct_write.output, erase_write.output);
  require_equal("read-correct-write final state vs erase-write", read_correct_write.final_state, erase_write.final_state);
  require_equal("affine tree scan output vs erase-write", affine.output, erase_write.output);
  require_equal("affine tree scan final state vs erase-write", affine.final_state, erase_write.final_state);
}

// Per chunk: tree scan == sequential scan of the affine maps; S^r = S_[c] P_r + H_r is the
// recurrence's state after token r; the WY recurrences (Equation 7) equal the triangular
// solve, satisfy A W = diag(β) K and A U = diag(β) V, and rebuild the dense prefixes.
template <class Policy = dr::Faithful>
void check_delta_chunk_stages(const DeltaCase& c, TriangularSolve solve, Index base_block) {
  const auto chunked = dr::chunkwise<Exact, Policy>(c.inputs, c.shape.chunk_size, {solve, base_block});
  const auto chunks = ref::chunks_of(c.shape.length, c.shape.chunk_size);
  RC_ASSERT(chunked.chunks.size() == chunks.size());
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const auto& ch = chunks[ci];
    const Matrix<Exact> k = c.inputs.k.middleRows(ch.begin, ch.size);
    const Matrix<Exact> v = c.inputs.v.middleRows(ch.begin, ch.size);
    const Vector<Exact> beta = c.inputs.beta.segment(ch.begin, ch.size);
    const auto& x = chunked.chunks[ci];
    const auto maps = dr::affine_maps<Exact>(k, v, beta);
    const auto dense = dr::sequential_prefix_scan(maps);
    require_equal_maps(at_chunk("tree scan vs sequential", ci), dr::tree_prefix_scan(maps), dense);

    // The recurrence's states through this chunk.
    Matrix<Exact> state = c.inputs.initial_state_or_zero();
    for (Index t = 0; t < ch.begin + ch.size; ++t) {
      const auto kt = c.inputs.k.row(t).transpose();
      state += c.inputs.beta(t) * ((c.inputs.v.row(t).transpose() - state * kt) * kt.transpose());
      if (t >= ch.begin)
        require_equal(at_chunk("S_[c] P_r + H_r vs recurrence state at token " + std::to_string(t), ci),
                      dense[t - ch.begin].apply(chunked.boundary_states[ci]), state);
    }

    const dr::WY<Exact> constructive = dr::wy_recurrence<Exact>(k, v, beta);
    require_equal(at_chunk("A", ci), x.a, dr::wy_system<Exact>(k, beta));
    require_equal(at_chunk("W (Equation 7) vs T diag(beta) K", ci), x.w, constructive.w);
    require_equal(at_chunk("U (Equation 7) vs T diag(beta) V", ci), x.u, constructive.u);
    require_equal(at_chunk("A W vs diag(beta) K", ci), Matrix<Exact>(x.a * x.w), dr::scale_rows<Exact>(beta, k));
    require_equal(at_chunk("A U vs diag(beta) V", ci), Matrix<Exact>(x.a * x.u), dr::scale_rows<Exact>(beta, v));
    require_equal_maps(at_chunk("WY prefixes vs dense products", ci), dr::wy_prefix_products<Exact>(constructive, k), dense);
    require_equal(at_chunk("V_new = U - W S_[c]^T", ci), x.v_new,
                  Matrix<Exact>(constructive.u - constructive.w * chunked.boundary_states[ci].transpose()));
  }
}

// chunkwise == token recurrence: outputs, final state and every boundary state S_[c].
template <class Policy = dr::Faithful>
void check_delta_chunkwise_matches_recurrence(const DeltaCase& c, TriangularSolve solve, Index base_block) {
  const auto recurrent = dr::token_recurrence_read_correct_write(c.inputs);
  const auto chunked = dr::chunkwise<Exact, Policy>(c.inputs, c.shape.chunk_size, {solve, base_block});
  const std::string how = " (" + dr::to_string(solve) + ", base " + std::to_string(base_block) + ")";
  require_equal("chunkwise output vs recurrence" + how, chunked.output, recurrent.output);
  require_equal("chunkwise final state vs recurrence" + how, chunked.final_state, recurrent.final_state);
  for (size_t ci = 0; ci < chunked.boundary_states.size(); ++ci) {
    const Index before = static_cast<Index>(ci) * c.shape.chunk_size;
    dr::Inputs<Exact> prefix{c.inputs.q.topRows(before), c.inputs.k.topRows(before), c.inputs.v.topRows(before),
                             c.inputs.beta.head(before), c.inputs.initial_state};
    require_equal("boundary state S_[" + std::to_string(ci) + "]", chunked.boundary_states[ci],
                  dr::token_recurrence_read_correct_write(prefix).final_state);
  }
}

// ---------------------------------------------------------------------------------------
// DeltaNet backward.

template <class Scalar>
void require_equal_gradients(const std::string& what, const dr::Gradients<Scalar>& a, const dr::Gradients<Scalar>& b) {
  require_equal(what + " dq", a.dq, b.dq);
  require_equal(what + " dk", a.dk, b.dk);
  require_equal(what + " dv", a.dv, b.dv);
  require_equal_vector(what + " dbeta", a.d_beta, b.d_beta);
  require_equal(what + " dS_0", a.d_initial_state, b.d_initial_state);
}

// Chunkwise backward through WY == token-recurrence backward, exactly.
template <class Policy = dr::Faithful>
void check_delta_backward_paths_agree(const DeltaCase& c, TriangularSolve solve, Index base_block) {
  const auto recurrent = dr::token_recurrence_backward(c.inputs, c.cotangents);
  const auto chunked = dr::chunkwise_backward<Exact, Policy>(c.inputs, c.cotangents, c.shape.chunk_size, {solve, base_block});
  require_equal_gradients("chunkwise vs recurrence", chunked, recurrent);
}

// <∇L, u> from the analytic backward == d/dε L(x + ε u) over ℚ (dual numbers), for both the
// chunkwise form and the token recurrence.
template <class Policy = dr::Faithful>
void check_delta_exact_directional_derivative(const DeltaCase& c, const ref::Params<Exact>& direction) {
  const Index chunk = c.shape.chunk_size;
  const auto grad = dr::chunkwise_backward<Exact, Policy>(c.inputs, c.cotangents, chunk);
  const Exact analytic = ref::inner(delta_params(grad, c.inputs.initial_state.has_value()), direction);
  const auto x = delta_params(c.inputs);
  const Exact through_chunkwise = ref::exact_directional_derivative(
      [&](const ref::Params<Dual<Exact>>& p) { return pairing(c.cotangents, dr::chunkwise<Dual<Exact>, Policy>(delta_inputs(p), chunk)); },
      x, direction);
  const Exact through_recurrence = ref::exact_directional_derivative(
      [&](const ref::Params<Dual<Exact>>& p) { return pairing(c.cotangents, dr::token_recurrence(delta_inputs(p))); }, x,
      direction);
  if (analytic != through_chunkwise || analytic != through_recurrence)
    RC_FAIL("directional derivative: analytic " + analytic.str() + ", dual chunkwise " + through_chunkwise.str() +
            ", dual recurrence " + through_recurrence.str());
}

// Central differences in High along u agree with <∇L, u> to a relative error below 1e-25.
inline void check_delta_finite_differences(const DeltaCase& c, const ref::Params<Exact>& direction) {
  const auto grad = dr::chunkwise_backward(c.inputs, c.cotangents, c.shape.chunk_size);
  const High analytic(ref::inner(delta_params(grad, c.inputs.initial_state.has_value()), direction));
  const High numeric = ref::central_difference(
      [&](const ref::Params<High>& p) { return pairing(c.cotangents, dr::token_recurrence_read_correct_write(delta_inputs(p))); },
      ref::params_cast<High>(delta_params(c.inputs)), ref::params_cast<High>(direction), High("1e-30"));
  const High scale = std::max(High(1), High(abs(analytic)));
  const High relative = High(abs(numeric - analytic)) / scale;
  if (!(relative < High("1e-25")))
    RC_FAIL("finite difference " + numeric.str(30) + " vs analytic " + analytic.str(30) + ", relative error " + relative.str(5));
}

// ---------------------------------------------------------------------------------------
// Gated DeltaNet.

inline void check_gated_token_views_agree(const GatedDeltaCase& c) {
  const auto erase_write = gd::token_recurrence(c.inputs);
  const auto read_correct_write = gd::token_recurrence_read_correct_write(c.inputs);
  const auto affine = gd::affine_scan(c.inputs);
  require_equal("read-correct-write output vs erase-write", read_correct_write.output, erase_write.output);
  require_equal("read-correct-write final state vs erase-write", read_correct_write.final_state, erase_write.final_state);
  require_equal("affine tree scan output vs erase-write", affine.output, erase_write.output);
  require_equal("affine tree scan final state vs erase-write", affine.final_state, erase_write.final_state);
}

template <class Policy = gd::Faithful>
void check_gated_chunk_stages(const GatedDeltaCase& c, TriangularSolve solve, Index base_block) {
  const auto chunked = gd::chunkwise<Exact, Policy>(c.inputs, c.shape.chunk_size, {solve, base_block});
  const auto chunks = ref::chunks_of(c.shape.length, c.shape.chunk_size);
  RC_ASSERT(chunked.chunks.size() == chunks.size());
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const auto& ch = chunks[ci];
    const Matrix<Exact> k = c.inputs.k.middleRows(ch.begin, ch.size);
    const Matrix<Exact> v = c.inputs.v.middleRows(ch.begin, ch.size);
    const Vector<Exact> beta = c.inputs.beta.segment(ch.begin, ch.size);
    const Vector<Exact> alpha = c.inputs.alpha.segment(ch.begin, ch.size);
    const auto& x = chunked.chunks[ci];
    require_equal(at_chunk("decays", ci), x.decay, gd::decay_from_gates(alpha));
    const auto maps = gd::affine_maps<Exact>(k, v, beta, alpha);
    const auto dense = dr::sequential_prefix_scan(maps);
    require_equal_maps(at_chunk("tree scan vs sequential", ci), dr::tree_prefix_scan(maps), dense);
    Matrix<Exact> state = chunked.boundary_states[ci];
    for (Index r = 0; r < ch.size; ++r) {
      state = maps[r].apply(state);
      require_equal(at_chunk("S_[c] P_r + H_r vs stepped state at token " + std::to_string(r), ci),
                    dense[r].apply(chunked.boundary_states[ci]), state);
    }
    const dr::WY<Exact> constructive = gd::wy_recurrence<Exact>(k, v, beta, x.decay);
    const Vector<Exact> gamma = gd::chunk_gamma(x.decay);
    require_equal(at_chunk("A", ci), x.a, gd::wy_system<Exact>(k, beta, x.decay));
    require_equal(at_chunk("W (gated Equation 7) vs T diag(beta gamma) K", ci), x.w, constructive.w);
    require_equal(at_chunk("U (gated Equation 7) vs T diag(beta) V", ci), x.u, constructive.u);
    require_equal(at_chunk("A W vs diag(beta gamma) K", ci), Matrix<Exact>(x.a * x.w),
                  dr::scale_rows<Exact>(Vector<Exact>(beta.cwiseProduct(gamma)), k));
    require_equal(at_chunk("A U vs diag(beta) V", ci), Matrix<Exact>(x.a * x.u), dr::scale_rows<Exact>(beta, v));
    require_equal_maps(at_chunk("gated WY prefixes vs dense products", ci), gd::wy_prefix_products<Exact>(constructive, k, x.decay),
                       dense);
    require_equal(at_chunk("V_new = U - W S_[c]^T", ci), x.v_new,
                  Matrix<Exact>(constructive.u - constructive.w * chunked.boundary_states[ci].transpose()));
  }
}

template <class Policy = gd::Faithful>
void check_gated_chunkwise_matches_recurrence(const GatedDeltaCase& c, TriangularSolve solve, Index base_block) {
  const auto recurrent = gd::token_recurrence_read_correct_write(c.inputs);
  const auto chunked = gd::chunkwise<Exact, Policy>(c.inputs, c.shape.chunk_size, {solve, base_block});
  const std::string how = " (" + dr::to_string(solve) + ", base " + std::to_string(base_block) + ")";
  require_equal("chunkwise output vs recurrence" + how, chunked.output, recurrent.output);
  require_equal("chunkwise final state vs recurrence" + how, chunked.final_state, recurrent.final_state);
  for (size_t ci = 0; ci < chunked.boundary_states.size(); ++ci) {
    const Index before = static_cast<Index>(ci) * c.shape.chunk_size;
    gd::Inputs<Exact> prefix{c.inputs.q.topRows(before), c.inputs.k.topRows(before), c.inputs.v.topRows(before),
                             c.inputs.beta.head(before), c.inputs.alpha.head(before), c.inputs.initial_state};
    require_equal("boundary state S_[" + std::to_string(ci) + "]", chunked.boundary_states[ci],
                  gd::token_recurrence_read_correct_write(prefix).final_state);
  }
}

template <class Scalar>
void require_equal_gradients(const std::string& what, const gd::Gradients<Scalar>& a, const gd::Gradients<Scalar>& b) {
  require_equal(what + " dq", a.dq, b.dq);
  require_equal(what + " dk", a.dk, b.dk);
  require_equal(what + " dv", a.dv, b.dv);
  require_equal_vector(what + " dbeta", a.d_beta, b.d_beta);
  require_equal_vector(what + " dalpha", a.d_alpha, b.d_alpha);
  require_equal(what + " dS_0", a.d_initial_state, b.d_initial_state);
}

template <class Policy = gd::Faithful>
void check_gated_backward_paths_agree(const GatedDeltaCase& c, TriangularSolve solve, Index base_block) {
  const auto recurrent = gd::token_recurrence_backward(c.inputs, c.cotangents);
  const auto chunked = gd::chunkwise_backward<Exact, Policy>(c.inputs, c.cotangents, c.shape.chunk_size, {solve, base_block});
  require_equal_gradients("chunkwise vs recurrence", chunked, recurrent);
}

template <class Policy = gd::Faithful>
void check_gated_exact_directional_derivative(const GatedDeltaCase& c, const ref::Params<Exact>& direction) {
  const Index chunk = c.shape.chunk_size;
  const auto grad = gd::chunkwise_backward<Exact, Policy>(c.inputs, c.cotangents, chunk);
  const Exact analytic = ref::inner(gated_params(grad, c.inputs.initial_state.has_value()), direction);
  const auto x = gated_params(c.inputs);
  const Exact through_chunkwise = ref::exact_directional_derivative(
      [&](const ref::Params<Dual<Exact>>& p) { return pairing(c.cotangents, gd::chunkwise<Dual<Exact>, Policy>(gated_inputs(p), chunk)); },
      x, direction);
  const Exact through_recurrence = ref::exact_directional_derivative(
      [&](const ref::Params<Dual<Exact>>& p) { return pairing(c.cotangents, gd::token_recurrence(gated_inputs(p))); }, x,
      direction);
  if (analytic != through_chunkwise || analytic != through_recurrence)
    RC_FAIL("directional derivative: analytic " + analytic.str() + ", dual chunkwise " + through_chunkwise.str() +
            ", dual recurrence " + through_recurrence.str());
}

inline void check_gated_finite_differences(const GatedDeltaCase& c, const ref::Params<Exact>& direction) {
  const auto grad = gd::chunkwise_backward(c.inputs, c.cotangents, c.shape.chunk_size);
  const High analytic(ref::inner(gated_params(grad, c.inputs.initial_state.has_value()), direction));
  const High numeric = ref::central_difference(
      [&](const ref::Params<High>& p) { return pairing(c.cotangents, gd::token_recurrence_read_correct_write(gated_inputs(p))); },
      ref::params_cast<High>(gated_params(c.inputs)), ref::params_cast<High>(direction), High("1e-30"));
  const High scale = std::max(High(1), High(abs(analytic)));
  const High relative = High(abs(numeric - analytic)) / scale;
  if (!(relative < High("1e-25")))
    RC_FAIL("finite difference " + numeric.str(30) + " vs analytic " + analytic.str(30) + ", relative error " + relative.str(5));
}

}  // namespace deltaproof::testing
