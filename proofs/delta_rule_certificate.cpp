// Certificate for proofs/delta_rule.md: for each listed shape, every DeltaNet form of
// reference/delta_rule.hpp equals its neighbours for ALL inputs of that shape (q, k, v, β, S_0,
// and for the backward the cotangents and a direction), by Schwartz–Zippel identity testing
// (proofs/identity_testing.hpp). One shape uses the derivation's 16 → 32 → 64 block merges.
//
// Built twice: faithful, and with DELTAPROOF_PLANTED (the block merge's off-diagonal with the
// wrong sign, T21 = +T22 A21 T11), which ctest expects to fail (WILL_FAIL).
#include "proofs/delta_claims.hpp"

#include <optional>
#include <string>

namespace {

using namespace deltaproof::proofs;
namespace ref = deltaproof::ref;

#ifdef DELTAPROOF_PLANTED
// Planted bug: [[A11, 0], [A21, A22]]⁻¹ merged with T21 = +T22 A21 T11.
constexpr const char* kPlanted = "block merge with T21 = +T22 A21 T11";
struct Policy : dr::Faithful {
  template <class Scalar>
  static Matrix<Scalar> merged_off_diagonal(const Matrix<Scalar>& t11, const Matrix<Scalar>& a21, const Matrix<Scalar>& t22) {
    return t22 * a21 * t11;
  }
};
#else
constexpr const char* kPlanted = nullptr;
using Policy = dr::Faithful;
#endif

template <class Source>
auto delta_claims(const DeltaShape& sh, Source& src) {
  using S = std::decay_t<decltype(src.matrix(1, 1)(0, 0))>;
  dr::Inputs<S> in{src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DV), src.vector(sh.L), std::nullopt};
  if (sh.initial_state) in.initial_state = src.matrix(sh.DV, sh.DK);
  Claims<S> out;

  const auto erase_write = claim_token_views(out, "", in);
  const auto maps = dr::affine_maps<S>(in.k, in.v, in.beta);
  equal_maps(out.add("combine is associative: tree-scan prefixes = sequential prefixes (every P_t, H_t)  [tree_prefix_scan]"),
             dr::tree_prefix_scan(maps), dr::sequential_prefix_scan(maps));
  const std::vector<Matrix<S>> states = recurrence_states(in.initial_state_or_zero(), maps);

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
    equal_maps(wy_prefix, dr::wy_prefix_products<S>(constructive, k), dense);
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

  claim_chunkwise_forms<Policy>(out, "", in, sh, erase_write, states);
  const dr::Cotangents<S> cot{src.matrix(sh.L, sh.DV), src.matrix(sh.DV, sh.DK)};
  const auto recurrent = dr::token_recurrence_backward(in, cot);
  claim_backward_paths<Policy>(out, "", in, cot, sh, recurrent);
  claim_formal_gradient(out, "", in, cot, recurrent, src, [](const auto& p) { return dr::inputs_of(p); });
  return out;
}

}  // namespace

int main() {
  return certify_shapes("DeltaNet certificate (proofs/delta_rule.md): token views = affine tree scan = WY prefix products ="
                        " chunkwise (three triangular solves) = parallel form; backward through WY = recurrence backward ="
                        " formal gradient",
                        kPlanted,
                        {{1, 4, 1, 1, false, 1}, {2, 1, 2, 1, true, 1}, {5, 2, 3, 2, true, 1}, {7, 4, 2, 3, false, 2},
                         {8, 8, 3, 1, true, 2}, {9, 8, 1, 2, true, 3}, {17, 16, 2, 2, true, 4}, {40, 48, 1, 1, true, 16},
                         {70, 64, 2, 2, true, 16}},
                        [](const DeltaShape& sh, auto& source) { return delta_claims(sh, source); });
}
