// Certificate for proofs/delta_rule.md: for each listed shape, every DeltaNet form of
// reference/delta_rule.hpp equals its neighbours for ALL inputs of that shape (q, k, v, β, S_0,
// and for the backward the cotangents and a direction), by Schwartz–Zippel identity testing
// (proofs/identity_testing.hpp). One shape uses the article's 16 → 32 → 64 block merges.
//
// Built twice: faithful, and with DELTAPROOF_PLANTED (the block merge's off-diagonal with the
// wrong sign, T21 = +T22 A21 T11), which ctest expects to fail (WILL_FAIL).
#include "proofs/identity_testing.hpp"
#include "reference/delta_rule.hpp"

#include <optional>
#include <string>

namespace {

using namespace deltaproof::proofs;
namespace dr = deltaproof::ref::delta_rule;
namespace ref = deltaproof::ref;
using dr::TriangularSolve;

#ifdef DELTAPROOF_PLANTED
// Planted bug: [[A11, 0], [A21, A22]]⁻¹ merged with T21 = +T22 A21 T11.
struct Policy : dr::Faithful {
  template <class Scalar>
  static Matrix<Scalar> merged_off_diagonal(const Matrix<Scalar>& t11, const Matrix<Scalar>& a21, const Matrix<Scalar>& t22) {
    return t22 * a21 * t11;
  }
};
#else
using Policy = dr::Faithful;
#endif

struct Shape {
  Index L, C, DK, DV;
  bool initial_state;
  Index base;     // base block of the blocked and recursive solves
  bool backward;  // also certify the backward paths
  std::string name() const {
    return "L=" + std::to_string(L) + " C=" + std::to_string(C) + " DK=" + std::to_string(DK) + " DV=" + std::to_string(DV) +
           (initial_state ? " S_0 given" : " S_0 = 0") + ", base block " + std::to_string(base);
  }
};

template <class S>
std::vector<Matrix<S>> maps_as_matrices(const std::vector<dr::AffineMap<S>>& maps) {
  std::vector<Matrix<S>> out;
  for (const auto& m : maps) out.push_back(m.transition), out.push_back(m.write);
  return out;
}

template <class S>
void equal_all(Claim<S>& claim, const std::vector<Matrix<S>>& a, const std::vector<Matrix<S>>& b) {
  if (a.size() != b.size()) {  // a structural mismatch: make the claim fail
    claim.equal(Matrix<S>::Zero(1, 1), Matrix<S>::Zero(1, 2));
    return;
  }
  for (size_t i = 0; i < a.size(); ++i) claim.equal(a[i], b[i]);
}

// O, S_L and every boundary state S_[c] of a chunkwise run against the recurrence's.
template <class S>
void equal_to_recurrence(Claim<S>& claim, const dr::ChunkwiseForward<S>& chunked, const dr::Forward<S>& recurrent,
                         const std::vector<Matrix<S>>& states, Index chunk_size) {
  claim.equal(chunked.output, recurrent.output).equal(chunked.final_state, recurrent.final_state);
  for (size_t c = 0; c < chunked.boundary_states.size(); ++c)
    claim.equal(chunked.boundary_states[c], states[c * static_cast<size_t>(chunk_size)]);
}

template <class S>
void equal_gradients(Claim<S>& claim, const dr::Gradients<S>& a, const dr::Gradients<S>& b) {
  claim.equal(a.dq, b.dq).equal(a.dk, b.dk).equal(a.dv, b.dv).equal(as_matrix(a.d_beta), as_matrix(b.d_beta));
  claim.equal(a.d_initial_state, b.d_initial_state);
}

template <class Source>
auto delta_claims(const Shape& sh, Source& src) {
  using S = std::decay_t<decltype(src.matrix(1, 1)(0, 0))>;
  dr::Inputs<S> in{src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DV), src.vector(sh.L), std::nullopt};
  if (sh.initial_state) in.initial_state = src.matrix(sh.DV, sh.DK);
  Claims<S> out;

  // Token views and the affine scan.
  const auto erase_write = dr::token_recurrence(in);
  const auto rcw = dr::token_recurrence_read_correct_write(in);
  out.add("read-correct-write = erase-write: O, S_L  [token_recurrence_read_correct_write = token_recurrence]")
      .equal(rcw.output, erase_write.output)
      .equal(rcw.final_state, erase_write.final_state);
  const auto affine = dr::affine_scan(in);
  out.add("affine tree scan = erase-write: O, S_L  [affine_scan = token_recurrence]")
      .equal(affine.output, erase_write.output)
      .equal(affine.final_state, erase_write.final_state);
  const auto maps = dr::affine_maps<S>(in.k, in.v, in.beta);
  equal_all(out.add("combine is associative: tree-scan prefixes = sequential prefixes (every P_t, H_t)  [tree_prefix_scan]"),
            maps_as_matrices(dr::tree_prefix_scan(maps)), maps_as_matrices(dr::sequential_prefix_scan(maps)));

  // S_0 … S_L of the recurrence (S_t = state after t tokens).
  std::vector<Matrix<S>> states{in.initial_state_or_zero()};
  for (Index t = 0; t < sh.L; ++t) states.push_back(maps[t].apply(states.back()));

  // Per-chunk stages: the triangular system, its three solves, Equation 7, the WY prefixes, V̄.
  auto& a_t = out.add("A T = I, T by forward substitution, every chunk  [wy_system, invert_unit_lower_forward_substitution]");
  auto& blocked = out.add("blocked solve (base " + std::to_string(sh.base) +
                          "): every diagonal-block inverse and every merged block = that block of (padded A)^-1, T = T_fs"
                          "  [invert_unit_lower_blocked, block_inverse_merge]");
  auto& recursive = out.add("recursive merge (base " + std::to_string(sh.base) + "): T = T_fs  [invert_unit_lower_recursive]");
  auto& eq7 = out.add("Equation 7 = T diag(beta) K, T diag(beta) V; A W = diag(beta) K, A U = diag(beta) V  [wy_recurrence, wy_factors]");
  auto& wy_prefix = out.add("WY prefixes I - sum w_i k_i^T, sum u_i k_i^T = dense products P_r, H_r  [wy_prefix_products]");
  auto& prefix_state = out.add("S_[c] P_r + H_r = recurrence state after token r of chunk c  [sequential_prefix_scan]");
  auto& v_new = out.add("V_new = U - W S_[c]^T and S_[c] + sum_{i<=r} vnew_i k_i^T = recurrence state  [chunkwise]");
  std::vector<int> merge_levels;
  for (const auto& ch : ref::chunks_of(sh.L, sh.C)) {
    const Matrix<S> k = in.k.middleRows(ch.begin, ch.size), v = in.v.middleRows(ch.begin, ch.size);
    const Vector<S> beta = in.beta.segment(ch.begin, ch.size);
    const Matrix<S> a = dr::wy_system<S>(k, beta);
    const Matrix<S> t = dr::invert_unit_lower_forward_substitution<S>(a);
    a_t.equal(a * t, Matrix<S>::Identity(ch.size, ch.size));

    const auto bl = dr::invert_unit_lower_blocked<S, Policy>(a, sh.base);
    const Index padded = static_cast<Index>(bl.diagonal_block_inverses.size()) * sh.base;
    Matrix<S> a_padded = Matrix<S>::Identity(padded, padded);
    a_padded.topLeftCorner(ch.size, ch.size) = a;
    const Matrix<S> t_padded = dr::invert_unit_lower_forward_substitution<S>(a_padded);
    blocked.equal(bl.t, t);
    for (size_t j = 0; j < bl.diagonal_block_inverses.size(); ++j) {
      const Index b = static_cast<Index>(j) * sh.base;
      blocked.equal(bl.diagonal_block_inverses[j], t_padded.block(b, b, sh.base, sh.base));
    }
    Index size = sh.base;
    if (bl.merged_levels.size() > merge_levels.size()) merge_levels.clear();
    for (const auto& level : bl.merged_levels) {
      size *= 2;
      if (merge_levels.size() < bl.merged_levels.size()) merge_levels.push_back(static_cast<int>(size));
      for (size_t j = 0; j < level.size(); ++j) {
        const Index b = static_cast<Index>(j) * size;
        blocked.equal(level[j], t_padded.block(b, b, size, size));
      }
    }
    recursive.equal(dr::invert_unit_lower_recursive<S, Policy>(a, sh.base), t);

    const dr::WY<S> constructive = dr::wy_recurrence<S>(k, v, beta);
    const dr::WY<S> solved = dr::wy_factors<S>(t, k, v, beta);
    eq7.equal(constructive.w, solved.w).equal(constructive.u, solved.u);
    eq7.equal(a * solved.w, dr::scale_rows<S>(beta, k)).equal(a * solved.u, dr::scale_rows<S>(beta, v));

    const auto chunk_maps = dr::affine_maps<S>(k, v, beta);
    const auto dense = dr::sequential_prefix_scan(chunk_maps);
    equal_all(wy_prefix, maps_as_matrices(dr::wy_prefix_products<S>(constructive, k)), maps_as_matrices(dense));
    const Matrix<S>& boundary = states[ch.begin];
    const Matrix<S> vn = solved.u - solved.w * boundary.transpose();  // (C, DV)
    Matrix<S> running = boundary;
    for (Index r = 0; r < ch.size; ++r) {
      prefix_state.equal(dense[r].apply(boundary), states[ch.begin + r + 1]);
      running += vn.row(r).transpose() * k.row(r);
      v_new.equal(running, states[ch.begin + r + 1]);
    }
  }
  if (!merge_levels.empty()) {
    std::string sizes = std::to_string(sh.base);
    for (int s : merge_levels) sizes += "->" + std::to_string(s);
    blocked.statement += "; merges " + sizes;
  }

  // Chunkwise forms with each solve, and the parallel form (one chunk of C = L).
  for (const auto solve : {TriangularSolve::forward_substitution, TriangularSolve::blocked, TriangularSolve::recursive}) {
    const auto chunked = dr::chunkwise<S, Policy>(in, sh.C, {solve, sh.base});
    equal_to_recurrence(out.add("chunkwise (C=" + std::to_string(sh.C) + ", " + dr::to_string(solve) +
                                ") = recurrence: O, S_L, every S_[c]  [chunkwise]"),
                        chunked, erase_write, states, sh.C);
  }
  const auto parallel = dr::chunkwise<S, Policy>(in, std::max<Index>(1, sh.L), {TriangularSolve::blocked, sh.base});
  equal_to_recurrence(out.add("parallel form (one chunk C=L, blocked) = recurrence: O, S_L  [parallel_wy]"), parallel,
                      erase_write, states, std::max<Index>(1, sh.L));

  if (sh.backward) {
    const dr::Cotangents<S> cot{src.matrix(sh.L, sh.DV), src.matrix(sh.DV, sh.DK)};
    const auto recurrent = dr::token_recurrence_backward(in, cot);
    for (const auto solve : {TriangularSolve::forward_substitution, TriangularSolve::blocked, TriangularSolve::recursive})
      equal_gradients(out.add("backward through WY (C=" + std::to_string(sh.C) + ", " + dr::to_string(solve) +
                              ") = recurrence backward: dq, dk, dv, dbeta, dS_0  [chunkwise_backward = token_recurrence_backward]"),
                      dr::chunkwise_backward<S, Policy>(in, cot, sh.C, {solve, sh.base}), recurrent);
    // <grad, u> = d/de L(x + e u) for a symbolic direction u: the backward is the formal gradient
    // of L = <dO, O> + <dS_L, S_L> (a polynomial identity in x, u and the cotangents).
    using D = ref::Dual<S>;
    dr::Inputs<S> u{src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DV), src.vector(sh.L), std::nullopt};
    const Matrix<S> u_s0 = src.matrix(sh.DV, sh.DK);
    const dr::Inputs<D> moved{lift(in.q, u.q), lift(in.k, u.k), lift(in.v, u.v),
                              lift(as_matrix(in.beta), as_matrix(u.beta)).col(0),
                              lift(in.initial_state_or_zero(), u_s0)};
    const dr::Cotangents<D> cot_d{lift(cot.d_output), lift(*cot.d_final_state)};
    const S directional = dr::pairing(dr::token_recurrence(moved), cot_d).tangent;
    const auto& at = recurrent;  // dS_0 is taken at S_0 = 0 when S_0 is absent, where u_s0 moves it
    S analytic = ref::frobenius_inner(at.dq, u.q) + ref::frobenius_inner(at.dk, u.k) + ref::frobenius_inner(at.dv, u.v) +
                 ref::frobenius_inner(as_matrix(at.d_beta), as_matrix(u.beta)) + ref::frobenius_inner(at.d_initial_state, u_s0);
    out.add("<backward, u> = d/de L(x + e u) through the recurrence (dual numbers): backward = formal gradient of L")
        .equal(as_matrix(analytic), as_matrix(directional));
  }
  return out;
}

}  // namespace

int main() {
  Certificate cert("DeltaNet certificate (proofs/delta_rule.md): token views = affine tree scan = WY prefix products ="
                   " chunkwise (three triangular solves) = parallel form; backward through WY = recurrence backward ="
                   " formal gradient"
#ifdef DELTAPROOF_PLANTED
                   "\nPLANTED BUG: block merge with T21 = +T22 A21 T11 (this run must fail)"
#endif
  );
  const Shape shapes[] = {
      {1, 4, 1, 1, false, 1, true},  {2, 1, 2, 1, true, 1, true},   {5, 2, 3, 2, true, 1, true},
      {7, 4, 2, 3, false, 2, true},  {8, 8, 3, 1, true, 2, true},   {9, 8, 1, 2, true, 3, true},
      {17, 16, 2, 2, true, 4, true}, {40, 48, 1, 1, true, 16, true}, {70, 64, 2, 2, true, 16, true},
  };
  for (const Shape& sh : shapes) cert.shape(sh.name(), [&](auto& source) { return delta_claims(sh, source); });
  return cert.finish();
}
