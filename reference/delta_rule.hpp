// DeltaNet: every intermediate form of the derivation (proofs/delta_rule.md), forward and backward.
//
//   S_t = S_{t-1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   o_t = S_t q_t,   S ∈ R^{DV×DK} (value-by-key)
//
// Shapes for one (batch, head) sequence: q, k (L, DK); v, o (L, DV); β (L); states (DV, DK).
// Inside one chunk of C tokens: k (C, DK), v (C, DV), β (C); A, T (C, C); W (C, DK); U, V̄ (C, DV).
//
// Forms, each derived on its own so that neighbours can be checked equal over ℚ:
//   token recurrence, erase–write and read–correct–write views;
//   affine-transition view (M_r, X_r, dense prefix products, associative combine, tree scan);
//   WY representation (constructive recurrences, Equation 7) and its dense prefix products;
//   the triangular system A W = diag(β) K, A U = diag(β) V, solved three ways;
//   chunkwise form (any C, partial last chunk) and the whole-sequence parallel form (C = L);
//   backward of the token recurrence and of the chunkwise form through the WY factors.
#pragma once

#include "reference/batch.hpp"
#include "reference/chunking.hpp"
#include "reference/exact_recurrence.hpp"
#include "reference/gradcheck.hpp"
#include "reference/linear_attention.hpp"
#include "reference/scalar.hpp"
#include "reference/sequence_inputs.hpp"

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace deltaproof::ref::delta_rule {

// q, k, v (sequence_inputs.hpp), β and S_0.
template <class Scalar>
struct Inputs : SequenceInputs<Scalar, Inputs<Scalar>> {
  Vector<Scalar> beta;                          // (L)
  std::optional<Matrix<Scalar>> initial_state;  // (DV, DK); absent means S_0 = 0

  std::vector<PerToken> per_token() const { return {{"beta", beta.size()}}; }
};

// Output (L, DV) and final state (DV, DK): the same pair as linear attention's.
using linear_attention::Forward;

// diag(s) X: row i of X scaled by s_i.
template <class Scalar, class Rows>
Matrix<Scalar> scale_rows(const Vector<Scalar>& s, const Rows& x) {
  Matrix<Scalar> out = x;
  for (Index i = 0; i < out.rows(); ++i) out.row(i) *= s(i);
  return out;
}

template <class Scalar>
Matrix<Scalar> strictly_lower(const Matrix<Scalar>& m) {
  Matrix<Scalar> out = Matrix<Scalar>::Zero(m.rows(), m.cols());
  for (Index i = 0; i < m.rows(); ++i)
    for (Index j = 0; j < i && j < m.cols(); ++j) out(i, j) = m(i, j);
  return out;
}

// ---------------------------------------------------------------------------------------
// Token recurrence, two views of the same update.

// Erase–write: S_t = S_{t-1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   o_t = S_t q_t
template <class Scalar>
Forward<Scalar> token_recurrence(const Inputs<Scalar>& in) {
  in.validate();
  const Matrix<Scalar> identity = Matrix<Scalar>::Identity(in.key_dim(), in.key_dim());  // (DK, DK)
  Matrix<Scalar> state = in.initial_state_or_zero();                                       // (DV, DK)
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t) {
    const auto k = in.k.row(t).transpose();  // (DK, 1)
    const auto v = in.v.row(t).transpose();  // (DV, 1)
    const Matrix<Scalar> erase = identity - in.beta(t) * (k * k.transpose());  // (DK, DK)
    state = state * erase + in.beta(t) * (v * k.transpose());
    out.output.row(t) = (state * in.q.row(t).transpose()).transpose();
  }
  out.final_state = state;
  return out;
}

// Read–correct–write: e_t = v_t − S_{t-1} k_t,  S_t = S_{t-1} + β_t e_t k_tᵀ,  o_t = S_t q_t
// (over ℚ by default on integers, exact_recurrence.hpp: the same values)
template <class Scalar, class Evaluation = OnIntegers>
Forward<Scalar> token_recurrence_read_correct_write(const Inputs<Scalar>& in) {
  in.validate();
  if constexpr (is_exact_v<Scalar> && Evaluation::on_integers) {
    Forward<Scalar> out;
    exact::run({in.q, in.k, in.v, &in.beta, nullptr, true, in.initial_state}, out.output, out.final_state);
    return out;
  }
  Matrix<Scalar> state = in.initial_state_or_zero();  // (DV, DK)
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t) {
    const auto k = in.k.row(t).transpose();                           // (DK, 1)
    const Matrix<Scalar> error = in.v.row(t).transpose() - state * k;  // e_t, (DV, 1)
    state += in.beta(t) * (error * k.transpose());
    out.output.row(t) = (state * in.q.row(t).transpose()).transpose();
  }
  out.final_state = state;
  return out;
}

// ---------------------------------------------------------------------------------------
// Affine-transition view: token r maps S ↦ S M_r + X_r.

template <class Scalar>
struct AffineMap {
  Matrix<Scalar> transition;  // M, (DK, DK)
  Matrix<Scalar> write;       // X, (DV, DK)

  Matrix<Scalar> apply(const Matrix<Scalar>& state) const { return state * transition + write; }
};

// M_r = I − β_r k_r k_rᵀ,   X_r = β_r v_r k_rᵀ
template <class Scalar, class KRows, class VRows>
std::vector<AffineMap<Scalar>> affine_maps(const KRows& k, const VRows& v, const Vector<Scalar>& beta) {
  std::vector<AffineMap<Scalar>> maps;
  const Matrix<Scalar> identity = Matrix<Scalar>::Identity(k.cols(), k.cols());
  for (Index r = 0; r < k.rows(); ++r) {
    const Matrix<Scalar> kr = k.row(r).transpose();  // (DK, 1)
    const Matrix<Scalar> vr = v.row(r).transpose();  // (DV, 1)
    maps.push_back({identity - beta(r) * (kr * kr.transpose()), beta(r) * (vr * kr.transpose())});
  }
  return maps;
}

// "first, then second": S ↦ (S M₁ + X₁) M₂ + X₂ = S (M₁ M₂) + (X₁ M₂ + X₂). Associative.
template <class Scalar>
AffineMap<Scalar> combine(const AffineMap<Scalar>& first, const AffineMap<Scalar>& second) {
  return {first.transition * second.transition, first.write * second.transition + second.write};
}

// Dense prefix products in token order: prefix[r] = (P_r, H_r) with P_r = M_1 ⋯ M_r and
// H_r = Σ_{i≤r} X_i M_{i+1} ⋯ M_r, so that S^r = S_[c] P_r + H_r.
template <class Scalar>
std::vector<AffineMap<Scalar>> sequential_prefix_scan(const std::vector<AffineMap<Scalar>>& maps) {
  std::vector<AffineMap<Scalar>> prefix;
  for (const auto& m : maps) prefix.push_back(prefix.empty() ? m : combine(prefix.back(), m));
  return prefix;
}

// The same prefixes in the order a parallel scan evaluates them: combine neighbouring pairs,
// scan the half-length sequence recursively, then fill the even positions (work-efficient
// tree scan). Equal to sequential_prefix_scan because combine is associative.
template <class Scalar>
std::vector<AffineMap<Scalar>> tree_prefix_scan(const std::vector<AffineMap<Scalar>>& maps) {
  const size_t n = maps.size();
  if (n <= 1) return maps;
  std::vector<AffineMap<Scalar>> pairs;  // pairs[j] = maps[2j] ∘ maps[2j+1]
  for (size_t j = 0; 2 * j + 1 < n; ++j) pairs.push_back(combine(maps[2 * j], maps[2 * j + 1]));
  const std::vector<AffineMap<Scalar>> pair_prefix = tree_prefix_scan(pairs);
  std::vector<AffineMap<Scalar>> prefix(n);
  for (size_t i = 0; i < n; ++i) {
    if (i % 2 == 1) prefix[i] = pair_prefix[i / 2];
    else if (i == 0) prefix[i] = maps[0];
    else prefix[i] = combine(pair_prefix[i / 2 - 1], maps[i]);
  }
  return prefix;
}

// o_t = (S_0 P_t + H_t) q_t with the prefixes of the whole sequence from the tree scan.
template <class Scalar>
Forward<Scalar> affine_scan(const Inputs<Scalar>& in) {
  in.validate();
  const Matrix<Scalar> s0 = in.initial_state_or_zero();  // (DV, DK)
  const auto prefix = tree_prefix_scan(affine_maps<Scalar>(in.k, in.v, in.beta));
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t)
    out.output.row(t) = (prefix[t].apply(s0) * in.q.row(t).transpose()).transpose();
  out.final_state = prefix.empty() ? s0 : prefix.back().apply(s0);
  return out;
}

// ---------------------------------------------------------------------------------------
// WY representation of one chunk.

template <class Scalar>
struct WY {
  Matrix<Scalar> w;  // (C, DK), row r is w_rᵀ
  Matrix<Scalar> u;  // (C, DV), row r is u_rᵀ
};

// Equation 7: w_r = β_r (k_r − Σ_{i<r} w_i (k_iᵀ k_r)),  u_r = β_r (v_r − Σ_{i<r} u_i (k_iᵀ k_r))
template <class Scalar, class KRows, class VRows>
WY<Scalar> wy_recurrence(const KRows& k, const VRows& v, const Vector<Scalar>& beta) {
  WY<Scalar> f{Matrix<Scalar>(k.rows(), k.cols()), Matrix<Scalar>(v.rows(), v.cols())};
  for (Index r = 0; r < k.rows(); ++r) {
    Matrix<Scalar> w = k.row(r), u = v.row(r);  // (1, DK), (1, DV)
    for (Index i = 0; i < r; ++i) {
      const Scalar overlap = k.row(i).dot(k.row(r));  // k_iᵀ k_r
      w -= overlap * f.w.row(i);
      u -= overlap * f.u.row(i);
    }
    f.w.row(r) = beta(r) * w;
    f.u.row(r) = beta(r) * u;
  }
  return f;
}

// P_r = I − Σ_{i≤r} w_i k_iᵀ,  H_r = Σ_{i≤r} u_i k_iᵀ: the prefixes rebuilt from the WY factors.
template <class Scalar, class KRows>
std::vector<AffineMap<Scalar>> wy_prefix_products(const WY<Scalar>& f, const KRows& k) {
  std::vector<AffineMap<Scalar>> prefix;
  Matrix<Scalar> p = Matrix<Scalar>::Identity(k.cols(), k.cols());  // (DK, DK)
  Matrix<Scalar> h = Matrix<Scalar>::Zero(f.u.cols(), k.cols());     // (DV, DK)
  for (Index r = 0; r < k.rows(); ++r) {
    p -= f.w.row(r).transpose() * k.row(r);
    h += f.u.row(r).transpose() * k.row(r);
    prefix.push_back({p, h});
  }
  return prefix;
}

// ---------------------------------------------------------------------------------------
// The triangular system A W = diag(β) K, A U = diag(β) V.

// A = I + strictly_lower(diag(β) K Kᵀ)   (C, C)
template <class Scalar, class KRows>
Matrix<Scalar> wy_system(const KRows& k, const Vector<Scalar>& beta) {
  const Matrix<Scalar> gram = scale_rows<Scalar>(beta, k * k.transpose());  // diag(β) K Kᵀ
  return Matrix<Scalar>::Identity(k.rows(), k.rows()) + strictly_lower(gram);
}

// (i) T = A⁻¹ row by row: t_ii = 1, t_ij = −Σ_{j≤m<i} a_im t_mj (unit diagonal: no division).
template <class Scalar>
Matrix<Scalar> invert_unit_lower_forward_substitution(const Matrix<Scalar>& a) {
  require(a.rows() == a.cols(), "invert_unit_lower: matrix must be square");
  const Index n = a.rows();
  Matrix<Scalar> t = Matrix<Scalar>::Zero(n, n);
  for (Index i = 0; i < n; ++i) {
    t(i, i) = Scalar(1);
    for (Index j = 0; j < i; ++j) {
      Scalar sum(0);
      for (Index m = j; m < i; ++m) sum += a(i, m) * t(m, j);
      t(i, j) = -sum;
    }
  }
  return t;
}

// Seams through which planted-bug tests run broken variants; the default is faithful.
struct Faithful {
  // [[A11, 0], [A21, A22]]⁻¹ = [[T11, 0], [T21, T22]] with T21 = −T22 A21 T11.
  template <class Scalar>
  static Matrix<Scalar> merged_off_diagonal(const Matrix<Scalar>& t11, const Matrix<Scalar>& a21,
                                            const Matrix<Scalar>& t22) {
    return -(t22 * a21 * t11);
  }
  // W = T diag(β) K,  U = T diag(β) V.
  template <class Scalar, class KRows, class VRows>
  static WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta) {
    return {t * scale_rows<Scalar>(beta, k), t * scale_rows<Scalar>(beta, v)};
  }
};

// Merges two inverted diagonal blocks of a unit lower-triangular A at `begin` (sizes n1, n2).
template <class Scalar, class Policy = Faithful>
Matrix<Scalar> block_inverse_merge(const Matrix<Scalar>& a, Index begin, const Matrix<Scalar>& t11,
                                   const Matrix<Scalar>& t22) {
  const Index n1 = t11.rows(), n2 = t22.rows();
  const Matrix<Scalar> a21 = a.block(begin + n1, begin, n2, n1);  // (n2, n1)
  Matrix<Scalar> t = Matrix<Scalar>::Zero(n1 + n2, n1 + n2);
  t.topLeftCorner(n1, n1) = t11;
  t.bottomRightCorner(n2, n2) = t22;
  t.bottomLeftCorner(n2, n1) = Policy::template merged_off_diagonal<Scalar>(t11, a21, t22);
  return t;
}

template <class Scalar>
struct BlockInverse {
  Matrix<Scalar> t;                                    // A⁻¹, (n, n)
  std::vector<Matrix<Scalar>> diagonal_block_inverses;  // level 0: inverses of the base×base diagonal blocks
  // merged_levels[l][j]: inverse of diagonal block j of size base·2^(l+1) (the last level holds one block).
  // Blocks are of A padded with I up to base·2^m >= n, as a kernel's masked loads do.
  std::vector<std::vector<Matrix<Scalar>>> merged_levels;
};

// (ii) The derivation's GPU schedule: invert the base×base diagonal blocks by forward
// substitution, then merge neighbours level by level (16 → 32 → 64 …) with T21 = −T22 A21 T11.
// Any n: A is padded with the identity to base·2^m, which leaves the top-left n×n of A⁻¹ unchanged.
template <class Scalar, class Policy = Faithful>
BlockInverse<Scalar> invert_unit_lower_blocked(const Matrix<Scalar>& a, Index base_block = 16) {
  require(a.rows() == a.cols(), "invert_unit_lower_blocked: matrix must be square");
  require(base_block >= 1, "base_block must be >= 1, got " + std::to_string(base_block));
  const Index n = a.rows();
  Index padded = base_block;
  while (padded < n) padded *= 2;
  Matrix<Scalar> ap = Matrix<Scalar>::Identity(padded, padded);
  ap.topLeftCorner(n, n) = a;

  BlockInverse<Scalar> out;
  for (Index b = 0; b < padded; b += base_block)
    out.diagonal_block_inverses.push_back(
        invert_unit_lower_forward_substitution<Scalar>(ap.block(b, b, base_block, base_block)));
  std::vector<Matrix<Scalar>> level = out.diagonal_block_inverses;
  for (Index size = base_block; size < padded; size *= 2) {
    std::vector<Matrix<Scalar>> next;
    for (size_t j = 0; j + 1 < level.size(); j += 2)
      next.push_back(block_inverse_merge<Scalar, Policy>(ap, static_cast<Index>(j) * size, level[j], level[j + 1]));
    out.merged_levels.push_back(next);
    level = std::move(next);
  }
  out.t = level.front().topLeftCorner(n, n);
  return out;
}

// (iii) General recursive merge: split at n/2, invert both halves recursively, merge; blocks
// of at most base_block rows are inverted by forward substitution. Any n (the derivation's case is
// a power of two) and any base block size >= 1.
template <class Scalar, class Policy = Faithful>
Matrix<Scalar> invert_unit_lower_recursive(const Matrix<Scalar>& a, Index base_block) {
  require(a.rows() == a.cols(), "invert_unit_lower_recursive: matrix must be square");
  require(base_block >= 1, "base_block must be >= 1, got " + std::to_string(base_block));
  const Index n = a.rows();
  if (n <= base_block) return invert_unit_lower_forward_substitution<Scalar>(a);
  const Index n1 = n / 2, n2 = n - n1;
  const Matrix<Scalar> t11 = invert_unit_lower_recursive<Scalar, Policy>(a.topLeftCorner(n1, n1), base_block);
  const Matrix<Scalar> t22 = invert_unit_lower_recursive<Scalar, Policy>(a.bottomRightCorner(n2, n2), base_block);
  return block_inverse_merge<Scalar, Policy>(a, 0, t11, t22);
}

enum class TriangularSolve { forward_substitution, blocked, recursive };

inline std::string to_string(TriangularSolve s) {
  switch (s) {
    case TriangularSolve::forward_substitution: return "forward-substitution";
    case TriangularSolve::blocked: return "blocked";
    case TriangularSolve::recursive: return "recursive";
  }
  return "?";
}

template <class Scalar, class Policy = Faithful>
Matrix<Scalar> invert_unit_lower(const Matrix<Scalar>& a, TriangularSolve solve, Index base_block = 16) {
  switch (solve) {
    case TriangularSolve::forward_substitution: return invert_unit_lower_forward_substitution<Scalar>(a);
    case TriangularSolve::blocked: return invert_unit_lower_blocked<Scalar, Policy>(a, base_block).t;
    case TriangularSolve::recursive: return invert_unit_lower_recursive<Scalar, Policy>(a, base_block);
  }
  throw std::invalid_argument("invert_unit_lower: unknown solve");
}

// W = T diag(β) K,  U = T diag(β) V   ((C, DK), (C, DV))
template <class Scalar, class KRows, class VRows>
WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta) {
  return Faithful::wy_factors<Scalar>(t, k, v, beta);
}

// ---------------------------------------------------------------------------------------
// Chunkwise form.

template <class Scalar>
struct ChunkIntermediates {
  Matrix<Scalar> a;      // A = I + strictly_lower(diag(β) K Kᵀ), (C, C)
  Matrix<Scalar> t;      // T = A⁻¹, (C, C)
  Matrix<Scalar> w;      // W = T diag(β) K, (C, DK)
  Matrix<Scalar> u;      // U = T diag(β) V, (C, DV)
  Matrix<Scalar> v_new;  // V̄ = U − W S_[c]ᵀ, (C, DV)
};

template <class Scalar>
struct ChunkwiseForward : Forward<Scalar> {
  std::vector<Matrix<Scalar>> boundary_states;      // S_[c], the state before chunk c, each (DV, DK)
  std::vector<ChunkIntermediates<Scalar>> chunks;  // one per chunk (C rows, fewer for a partial last chunk)
};

struct ChunkOptions {
  TriangularSolve solve = TriangularSolve::forward_substitution;
  Index base_block = 16;  // for the blocked and recursive solves
};

// Per chunk: A, T = A⁻¹, (W, U), V̄ = U − W S_[c]ᵀ,
//   O_[c] = Q S_[c]ᵀ + (Q Kᵀ ⊙ M_C) V̄,   S_[c+1] = S_[c] + V̄ᵀ K
template <class Scalar, class Policy = Faithful>
ChunkwiseForward<Scalar> chunkwise(const Inputs<Scalar>& in, Index chunk_size, ChunkOptions options = {}) {
  in.validate();
  ChunkwiseForward<Scalar> out;
  out.output = Matrix<Scalar>::Zero(in.length(), in.value_dim());
  Matrix<Scalar> state = in.initial_state_or_zero();  // (DV, DK)
  for (const Chunk& c : chunks_of(in.length(), chunk_size)) {
    const auto [q, k, v] = in.rows(c);  // (C, DK), (C, DK), (C, DV)
    const Vector<Scalar> beta = in.beta.segment(c.begin, c.size);
    out.boundary_states.push_back(state);
    ChunkIntermediates<Scalar> x;
    x.a = wy_system<Scalar>(k, beta);
    x.t = invert_unit_lower<Scalar, Policy>(x.a, options.solve, options.base_block);
    WY<Scalar> f = Policy::template wy_factors<Scalar>(x.t, k, v, beta);
    x.w = std::move(f.w);
    x.u = std::move(f.u);
    x.v_new = x.u - x.w * state.transpose();
    const Matrix<Scalar> scores = (q * k.transpose()).cwiseProduct(causal_mask<Scalar>(c.size));  // (C, C)
    out.output.middleRows(c.begin, c.size) = q * state.transpose() + scores * x.v_new;
    state += x.v_new.transpose() * k;
    out.chunks.push_back(std::move(x));
  }
  out.final_state = state;
  return out;
}

// The whole-sequence parallel form: one chunk of C = L.
template <class Scalar>
ChunkwiseForward<Scalar> parallel_wy(const Inputs<Scalar>& in, ChunkOptions options = {}) {
  return chunkwise(in, std::max<Index>(1, in.length()), options);
}

// ---------------------------------------------------------------------------------------
// Backward paths. Each returns dL for L = <dO, O> + <dS_L, S_L>.

// Incoming gradients on the output and (optionally) the final state, as in linear attention.
using linear_attention::Cotangents;

template <class Scalar>
struct Gradients {
  Matrix<Scalar> dq, dk, dv;       // (L, DK), (L, DK), (L, DV)
  Vector<Scalar> d_beta;           // (L)
  Matrix<Scalar> d_initial_state;  // (DV, DK): dS_0, also when S_0 was absent (then at S_0 = 0)
};

template <class Scalar>
Matrix<Scalar> final_state_cotangent(const Cotangents<Scalar>& cot, Index value_dim, Index key_dim) {
  return cot.d_final_state ? *cot.d_final_state : Matrix<Scalar>::Zero(value_dim, key_dim);
}

// Reverse sweep with G = dL/dS_t, e_t = v_t − S_{t-1} k_t (S_t = S_{t-1} + β_t e_t k_tᵀ):
//   G ← G + do_t q_tᵀ;  dq_t = S_tᵀ do_t;  dv_t = β_t G k_t;  dβ_t = e_tᵀ G k_t;
//   dk_t = β_t (Gᵀ e_t − S_{t-1}ᵀ G k_t);  then G ← G (I − β_t k_t k_tᵀ) for S_{t-1}.
template <class Scalar>
Gradients<Scalar> token_recurrence_backward(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot) {
  in.validate();
  const Index L = in.length();
  std::vector<Matrix<Scalar>> states{in.initial_state_or_zero()};  // S_0 .. S_L
  for (Index t = 0; t < L; ++t) {
    const auto k = in.k.row(t).transpose();
    const Matrix<Scalar> error = in.v.row(t).transpose() - states.back() * k;
    states.push_back(states.back() + in.beta(t) * (error * k.transpose()));
  }
  Matrix<Scalar> grad = final_state_cotangent(cot, in.value_dim(), in.key_dim());  // (DV, DK)
  Gradients<Scalar> g;
  g.dq.resize(L, in.key_dim());
  g.dk.resize(L, in.key_dim());
  g.dv.resize(L, in.value_dim());
  g.d_beta.resize(L);
  for (Index t = L - 1; t >= 0; --t) {
    const Matrix<Scalar> k = in.k.row(t).transpose();  // (DK, 1)
    const Matrix<Scalar>& before = states[t];            // S_{t-1}
    const Matrix<Scalar> d_out = cot.d_output.row(t).transpose();  // (DV, 1)
    grad += d_out * in.q.row(t);
    const Matrix<Scalar> error = in.v.row(t).transpose() - before * k;  // (DV, 1)
    const Matrix<Scalar> gk = grad * k;                                 // (DV, 1)
    g.dq.row(t) = (states[t + 1].transpose() * d_out).transpose();
    g.dv.row(t) = (in.beta(t) * gk).transpose();
    g.d_beta(t) = error.col(0).dot(gk.col(0));
    g.dk.row(t) = (in.beta(t) * (grad.transpose() * error - before.transpose() * gk)).transpose();
    grad -= in.beta(t) * (gk * k.transpose());
  }
  g.d_initial_state = grad;
  return g;
}

// One chunk's backward through the WY form, given S = S_[c] and G' = dL/dS_[c+1]:
//   dV̄ = (Q Kᵀ ⊙ M)ᵀ dO + K G'ᵀ,   dQ = dO S + (dO V̄ᵀ ⊙ M) K,   dK = (dO V̄ᵀ ⊙ M)ᵀ Q + V̄ G'
//   dS = dOᵀ Q + G' − dV̄ᵀ W,   dU = dV̄,   dW = −dV̄ S
//   dV = diag(β) Tᵀ dU,   dK += diag(β) Tᵀ dW,   dβ = rowsum(Tᵀ dU ⊙ V + Tᵀ dW ⊙ K)
//   dT = dU (diag(β) V)ᵀ + dW (diag(β) K)ᵀ,   E = strictly_lower(−Tᵀ dT Tᵀ)   (= dA)
//   dβ += rowsum(E ⊙ K Kᵀ),   F = diag(β) E,   dK += (F + Fᵀ) K
template <class Scalar>
struct ChunkGradients {
  Matrix<Scalar> dq, dk, dv;  // (C, DK), (C, DK), (C, DV)
  Vector<Scalar> d_beta;      // (C)
  Matrix<Scalar> d_state;     // dL/dS_[c], (DV, DK)
};

template <class Scalar, class QRows, class KRows, class VRows, class DRows>
ChunkGradients<Scalar> chunk_backward(const QRows& q, const KRows& k, const VRows& v, const Vector<Scalar>& beta,
                                      const ChunkIntermediates<Scalar>& x, const Matrix<Scalar>& state,
                                      const DRows& d_out, const Matrix<Scalar>& d_next_state) {
  const Index n = q.rows();
  const Matrix<Scalar> mask = causal_mask<Scalar>(n);
  const Matrix<Scalar> scores = (q * k.transpose()).cwiseProduct(mask);             // (C, C)
  const Matrix<Scalar> d_scores = (d_out * x.v_new.transpose()).cwiseProduct(mask);  // (C, C)
  ChunkGradients<Scalar> g;
  const Matrix<Scalar> d_v_new = scores.transpose() * d_out + k * d_next_state.transpose();  // (C, DV)
  g.dq = d_out * state + d_scores * k;
  g.dk = d_scores.transpose() * q + x.v_new * d_next_state;
  g.d_state = d_out.transpose() * q + d_next_state - d_v_new.transpose() * x.w;
  const Matrix<Scalar>& d_u = d_v_new;
  const Matrix<Scalar> d_w = -(d_v_new * state);       // (C, DK)
  const Matrix<Scalar> t_du = x.t.transpose() * d_u;   // (C, DV)
  const Matrix<Scalar> t_dw = x.t.transpose() * d_w;   // (C, DK)
  g.dv = scale_rows<Scalar>(beta, t_du);
  g.dk += scale_rows<Scalar>(beta, t_dw);
  g.d_beta = t_du.cwiseProduct(v).rowwise().sum() + t_dw.cwiseProduct(k).rowwise().sum();
  const Matrix<Scalar> d_t = d_u * scale_rows<Scalar>(beta, v).transpose() + d_w * scale_rows<Scalar>(beta, k).transpose();
  const Matrix<Scalar> e = strictly_lower<Scalar>(-(x.t.transpose() * d_t * x.t.transpose()));  // (C, C)
  g.d_beta += e.cwiseProduct(k * k.transpose()).rowwise().sum();
  const Matrix<Scalar> f = scale_rows<Scalar>(beta, e);
  g.dk += (f + f.transpose()) * k;
  return g;
}

namespace detail {
struct NoGates {};

// The reverse scan over chunks of the chunkwise backward (Gated DeltaNet's too), carrying
// G = dL/dS_[c] from G_[N] = dS_L: per chunk, last first, backward_chunk (the family's
// chunk_backward) at S_[c] and G_[c+1] gives the chunk's gradients and G_[c]. With gates,
// gate_gradient(Γ, dΓ) turns the chunk's decay cotangent into d_alpha (dL/dα or dL/dg).
template <class Gradients, class Scalar, class In, class ChunkedForward, class BackwardChunk, class GateGradient = NoGates>
Gradients reverse_chunk_scan(const In& in, const ChunkedForward& fwd, const Cotangents<Scalar>& cot, Index chunk_size,
                             BackwardChunk&& backward_chunk, GateGradient&& gate_gradient = {}) {
  constexpr bool gated = !std::is_same_v<std::decay_t<GateGradient>, NoGates>;
  const std::vector<Chunk> chunks = chunks_of(in.length(), chunk_size);
  Gradients g;
  g.dq.resize(in.length(), in.key_dim());
  g.dk.resize(in.length(), in.key_dim());
  g.dv.resize(in.length(), in.value_dim());
  g.d_beta.resize(in.length());
  if constexpr (gated) g.d_alpha.resize(in.length());
  Matrix<Scalar> grad = final_state_cotangent(cot, in.value_dim(), in.key_dim());
  for (Index c = static_cast<Index>(chunks.size()) - 1; c >= 0; --c) {
    const Chunk& ch = chunks[c];
    const Vector<Scalar> beta = in.beta.segment(ch.begin, ch.size);
    auto cg = backward_chunk(in.q.middleRows(ch.begin, ch.size), in.k.middleRows(ch.begin, ch.size),
                             in.v.middleRows(ch.begin, ch.size), beta, fwd.chunks[c], fwd.boundary_states[c],
                             cot.d_output.middleRows(ch.begin, ch.size), grad);
    g.dq.middleRows(ch.begin, ch.size) = cg.dq;
    g.dk.middleRows(ch.begin, ch.size) = cg.dk;
    g.dv.middleRows(ch.begin, ch.size) = cg.dv;
    g.d_beta.segment(ch.begin, ch.size) = cg.d_beta;
    if constexpr (gated) g.d_alpha.segment(ch.begin, ch.size) = gate_gradient(fwd.chunks[c].decay, cg.d_decay);
    grad = std::move(cg.d_state);
  }
  g.d_initial_state = grad;
  return g;
}
}  // namespace detail

// Chunkwise backward: forward for S_[c] and the WY intermediates, then the reverse scan over
// chunks carrying G = dL/dS_[c] (G_[N] = dS_L).
template <class Scalar, class Policy = Faithful>
Gradients<Scalar> chunkwise_backward(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot, Index chunk_size,
                                     ChunkOptions options = {}) {
  return detail::reverse_chunk_scan<Gradients<Scalar>>(in, chunkwise<Scalar, Policy>(in, chunk_size, options), cot, chunk_size,
                                                       [](const auto&... x) { return chunk_backward<Scalar>(x...); });
}

// ---------------------------------------------------------------------------------------
// Conversions, the pairing that the backward paths differentiate, named parameter lists.

template <class To, class From>
Vector<To> vector_cast(const Vector<From>& v) {
  return matrix_cast<To>(Matrix<From>(v)).col(0);
}

template <class To, class From>
Inputs<To> cast(const Inputs<From>& in) {
  Inputs<To> out{matrix_cast<To>(in.q), matrix_cast<To>(in.k), matrix_cast<To>(in.v), vector_cast<To>(in.beta), std::nullopt};
  if (in.initial_state) out.initial_state = matrix_cast<To>(*in.initial_state);
  return out;
}

// Cotangents' cast and L = <dO, O> + <dS_L, S_L> are linear attention's.
using linear_attention::cast;
using linear_attention::pairing;

// The differentiable inputs as a named list (q, k, v, β as an (L, 1) matrix, S_0 when given), and back.
template <class Scalar>
Params<Scalar> params_of(const Inputs<Scalar>& in) {
  Params<Scalar> p{{"q", in.q}, {"k", in.k}, {"v", in.v}, {"beta", in.beta}};
  if (in.initial_state) p.push_back({"S_0", *in.initial_state});
  return p;
}

template <class Scalar>
Inputs<Scalar> inputs_of(const Params<Scalar>& p) {
  Inputs<Scalar> in{p.at(0).value, p.at(1).value, p.at(2).value, p.at(3).value.col(0), std::nullopt};
  if (p.size() > 4) in.initial_state = p[4].value;
  return in;
}

template <class Scalar>
Params<Scalar> params_of(const Gradients<Scalar>& g, bool with_initial_state) {
  Params<Scalar> p{{"q", g.dq}, {"k", g.dk}, {"v", g.dv}, {"beta", g.d_beta}};
  if (with_initial_state) p.push_back({"S_0", g.d_initial_state});
  return p;
}

// ---------------------------------------------------------------------------------------
// [B, H, L, D] batches: each head is an independent sequence. β is stored [B, H, L, 1]. The
// batched forward, its output and the cotangents are linear attention's.

template <class Scalar>
struct BatchInputs : BatchSequenceInputs<Scalar, BatchInputs<Scalar>> {
  Tensor4<Scalar> beta;                          // [B, H, L, 1]
  std::optional<Tensor4<Scalar>> initial_state;  // [B, H, DV, DK]

  std::vector<PerTokenTensor<Scalar>> per_token() const { return {{"beta", &beta}}; }
  Inputs<Scalar> head(Index b, Index h) const { return this->template head_inputs<Inputs<Scalar>>(b, h, beta); }
};

using linear_attention::BatchCotangents;
using linear_attention::BatchForward;
using linear_attention::batched;

template <class Scalar>
struct BatchGradients : linear_attention::BatchGradients<Scalar> {
  Tensor4<Scalar> d_beta;  // [B, H, L, 1]

  template <class BatchIn>
  static BatchGradients zeros_like(const BatchIn& in) {
    return {linear_attention::BatchGradients<Scalar>::zeros_like(in), Tensor4<Scalar>(in.q.batch, in.q.heads, in.q.rows, 1)};
  }
  template <class HeadGradients>
  void set_head(Index b, Index h, const HeadGradients& g) {
    linear_attention::BatchGradients<Scalar>::set_head(b, h, g);
    d_beta.set_head(b, h, g.d_beta);
  }
};

// Applies a single-sequence backward path to every head.
template <class Scalar, class Backward>
BatchGradients<Scalar> batched_backward(const BatchInputs<Scalar>& in, const BatchCotangents<Scalar>& cot,
                                        Backward&& backward) {
  return linear_attention::backward_every_head(BatchGradients<Scalar>::zeros_like(in), in, cot, backward);
}

}  // namespace deltaproof::ref::delta_rule
