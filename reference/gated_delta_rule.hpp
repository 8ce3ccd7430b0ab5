// Gated DeltaNet: every intermediate form, forward and backward, exact over ℚ in the gates α.
//
//   S_t = α_t S_{t-1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   o_t = S_t q_t
//
// Shapes as in delta_rule.hpp; α (L). The oracle takes α itself so that it stays rational;
// kernels take log-gates g = ln α in fp32, and the log-gate path below (float, double, High)
// computes the decays the way they do: cumulative sums G, then exp(G_e − G_s), causal side only.
//
// Gate decays inside one chunk (tokens 1..C, position 0 = the chunk start):
//   Γ(e, s) = Π_{s<j≤e} α_j   for 0 ≤ s ≤ e ≤ C   (a (C+1, C+1) lower-triangular matrix, Γ(e, e) = 1)
// and, in 0-based token indices r, i of the chunk,
//   γ_r = Γ(r+1, 0)         the decay from the chunk start through token r,
//   D_ri = Γ(r+1, i+1)      the decay from after token i through token r (r ≥ i), 0 above,
//   λ_i = Γ(C, i+1)         the decay from after token i to the chunk end.
// The gate-decayed WY stages (what GPU stage tests compare with; fla's convention):
//   A = I + strictly_lower(diag(β) (K Kᵀ ⊙ D)),  T = A⁻¹,
//   W = T diag(β ⊙ γ) K,  U = T diag(β) V,  V̄ = U − W S_[c]ᵀ,
//   O = diag(γ) Q S_[c]ᵀ + (Q Kᵀ ⊙ D) V̄,  S_[c+1] = γ_C S_[c] + V̄ᵀ diag(λ) K   (γ_C = Γ(C, 0)).
#pragma once

#include "reference/delta_rule.hpp"

#include <cmath>

namespace deltaproof::ref::gated_delta_rule {

using delta_rule::AffineMap;
using delta_rule::ChunkOptions;
using delta_rule::combine;
using delta_rule::invert_unit_lower;
using delta_rule::scale_rows;
using delta_rule::sequential_prefix_scan;
using delta_rule::strictly_lower;
using delta_rule::tree_prefix_scan;
using delta_rule::TriangularSolve;
using delta_rule::WY;

// q, k, v (sequence_inputs.hpp), β, the gates α and S_0.
template <class Scalar>
struct Inputs : SequenceInputs<Scalar, Inputs<Scalar>> {
  Vector<Scalar> beta;                          // (L)
  Vector<Scalar> alpha;                         // (L), the gates α_t
  std::optional<Matrix<Scalar>> initial_state;  // (DV, DK); absent means S_0 = 0

  std::vector<PerToken> per_token() const { return {{"beta", beta.size()}, {"alpha", alpha.size()}}; }
};

// The kernels' parametrization: g_t = ln α_t (float, double, High only).
template <class Scalar>
struct LogGateInputs : SequenceInputs<Scalar, LogGateInputs<Scalar>> {
  Vector<Scalar> beta;                          // (L)
  Vector<Scalar> log_gate;                      // (L), g_t = ln α_t
  std::optional<Matrix<Scalar>> initial_state;  // (DV, DK)

  std::vector<PerToken> per_token() const { return {{"beta", beta.size()}, {"log_gate", log_gate.size()}}; }
};

using delta_rule::Forward;

// ---------------------------------------------------------------------------------------
// Token recurrence, two views.

// Erase–write: S_t = α_t S_{t-1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ
template <class Scalar>
Forward<Scalar> token_recurrence(const Inputs<Scalar>& in) {
  in.validate();
  const Matrix<Scalar> identity = Matrix<Scalar>::Identity(in.key_dim(), in.key_dim());
  Matrix<Scalar> state = in.initial_state_or_zero();  // (DV, DK)
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t) {
    const auto k = in.k.row(t).transpose();
    const auto v = in.v.row(t).transpose();
    const Matrix<Scalar> erase = identity - in.beta(t) * (k * k.transpose());  // (DK, DK)
    state = in.alpha(t) * (state * erase) + in.beta(t) * (v * k.transpose());
    out.output.row(t) = (state * in.q.row(t).transpose()).transpose();
  }
  out.final_state = state;
  return out;
}

// Read–correct–write on the decayed state: S̃ = α_t S_{t-1},  e_t = v_t − S̃ k_t,  S_t = S̃ + β_t e_t k_tᵀ
// (over ℚ by default on integers, exact_recurrence.hpp: the same values)
template <class Scalar, class Evaluation = OnIntegers>
Forward<Scalar> token_recurrence_read_correct_write(const Inputs<Scalar>& in) {
  in.validate();
  if constexpr (is_exact_v<Scalar> && Evaluation::on_integers) {
    Forward<Scalar> out;
    exact::run({in.q, in.k, in.v, &in.beta, &in.alpha, true, in.initial_state}, out.output, out.final_state);
    return out;
  }
  Matrix<Scalar> state = in.initial_state_or_zero();
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t) {
    const auto k = in.k.row(t).transpose();
    state *= in.alpha(t);
    const Matrix<Scalar> error = in.v.row(t).transpose() - state * k;  // (DV, 1)
    state += in.beta(t) * (error * k.transpose());
    out.output.row(t) = (state * in.q.row(t).transpose()).transpose();
  }
  out.final_state = state;
  return out;
}

// ---------------------------------------------------------------------------------------
// Affine-transition view: M_r = α_r (I − β_r k_r k_rᵀ),  X_r = β_r v_r k_rᵀ.

template <class Scalar, class KRows, class VRows>
std::vector<AffineMap<Scalar>> affine_maps(const KRows& k, const VRows& v, const Vector<Scalar>& beta,
                                           const Vector<Scalar>& alpha) {
  std::vector<AffineMap<Scalar>> maps = delta_rule::affine_maps<Scalar>(k, v, beta);
  for (Index r = 0; r < k.rows(); ++r) maps[r].transition *= alpha(r);
  return maps;
}

// o_t = (S_0 P_t + H_t) q_t with the whole sequence's prefixes from the tree scan.
template <class Scalar>
Forward<Scalar> affine_scan(const Inputs<Scalar>& in) {
  in.validate();
  const Matrix<Scalar> s0 = in.initial_state_or_zero();
  const auto prefix = tree_prefix_scan(affine_maps<Scalar>(in.k, in.v, in.beta, in.alpha));
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t)
    out.output.row(t) = (prefix[t].apply(s0) * in.q.row(t).transpose()).transpose();
  out.final_state = prefix.empty() ? s0 : prefix.back().apply(s0);
  return out;
}

// ---------------------------------------------------------------------------------------
// Gate decays of one chunk.

// Γ(e, s) = Π_{s<j≤e} α_j as exact products (no division), (C+1, C+1), zero above the diagonal.
template <class Scalar>
Matrix<Scalar> decay_from_gates(const Vector<Scalar>& alpha) {
  const Index n = alpha.size();
  Matrix<Scalar> decay = Matrix<Scalar>::Zero(n + 1, n + 1);
  for (Index s = 0; s <= n; ++s) {
    decay(s, s) = Scalar(1);
    for (Index e = s + 1; e <= n; ++e) decay(e, s) = decay(e - 1, s) * alpha(e - 1);
  }
  return decay;
}

// The kernels' way: G_e = Σ_{j≤e} g_j (G_0 = 0), Γ(e, s) = exp(G_e − G_s), evaluated only for
// e ≥ s (above the diagonal exp(G_e − G_s) > 1 can overflow; it is never needed).
template <class Scalar>
Matrix<Scalar> decay_from_log_gates(const Vector<Scalar>& log_gate) {
  using std::exp;
  const Index n = log_gate.size();
  Vector<Scalar> cumulative(n + 1);
  cumulative(0) = Scalar(0);
  for (Index j = 1; j <= n; ++j) cumulative(j) = cumulative(j - 1) + log_gate(j - 1);
  Matrix<Scalar> decay = Matrix<Scalar>::Zero(n + 1, n + 1);
  for (Index s = 0; s <= n; ++s)
    for (Index e = s; e <= n; ++e) decay(e, s) = e == s ? Scalar(1) : Scalar(exp(cumulative(e) - cumulative(s)));
  return decay;
}

// γ_r = Γ(r+1, 0), (C)
template <class Scalar>
Vector<Scalar> chunk_gamma(const Matrix<Scalar>& decay) {
  return decay.col(0).tail(decay.rows() - 1);
}
// D_ri = Γ(r+1, i+1) for r ≥ i, 0 above, (C, C)
template <class Scalar>
Matrix<Scalar> token_decay(const Matrix<Scalar>& decay) {
  const Index n = decay.rows() - 1;
  return decay.bottomRightCorner(n, n);
}
// λ_i = Γ(C, i+1), (C)
template <class Scalar>
Vector<Scalar> decay_to_end(const Matrix<Scalar>& decay) {
  const Index n = decay.rows() - 1;
  return decay.row(n).tail(n).transpose();
}

// ---------------------------------------------------------------------------------------
// WY representation with gates.

// Gated Equation 7 (w_r, u_r as in delta_rule, inner sums decayed by D_ri, w_r carrying γ_r):
//   w_r = β_r (γ_r k_r − Σ_{i<r} D_ri w_i (k_iᵀ k_r)),   u_r = β_r (v_r − Σ_{i<r} D_ri u_i (k_iᵀ k_r))
template <class Scalar, class KRows, class VRows>
WY<Scalar> wy_recurrence(const KRows& k, const VRows& v, const Vector<Scalar>& beta, const Matrix<Scalar>& decay) {
  const Vector<Scalar> gamma = chunk_gamma(decay);
  const Matrix<Scalar> d = token_decay(decay);
  WY<Scalar> f{Matrix<Scalar>(k.rows(), k.cols()), Matrix<Scalar>(v.rows(), v.cols())};
  for (Index r = 0; r < k.rows(); ++r) {
    Matrix<Scalar> w = gamma(r) * k.row(r), u = v.row(r);
    for (Index i = 0; i < r; ++i) {
      const Scalar overlap = d(r, i) * k.row(i).dot(k.row(r));
      w -= overlap * f.w.row(i);
      u -= overlap * f.u.row(i);
    }
    f.w.row(r) = beta(r) * w;
    f.u.row(r) = beta(r) * u;
  }
  return f;
}

// γ_r P_r = γ_r I − Σ_{i≤r} D_ri w_i k_iᵀ,   H_r = Σ_{i≤r} D_ri u_i k_iᵀ: prefix (transition, write)
// pairs rebuilt from the WY factors, to be checked against the dense affine prefix products.
template <class Scalar, class KRows>
std::vector<AffineMap<Scalar>> wy_prefix_products(const WY<Scalar>& f, const KRows& k, const Matrix<Scalar>& decay) {
  const Vector<Scalar> gamma = chunk_gamma(decay);
  const Matrix<Scalar> d = token_decay(decay);
  std::vector<AffineMap<Scalar>> prefix;
  for (Index r = 0; r < k.rows(); ++r) {
    Matrix<Scalar> p = gamma(r) * Matrix<Scalar>::Identity(k.cols(), k.cols());
    Matrix<Scalar> h = Matrix<Scalar>::Zero(f.u.cols(), k.cols());
    for (Index i = 0; i <= r; ++i) {
      p -= d(r, i) * (f.w.row(i).transpose() * k.row(i));
      h += d(r, i) * (f.u.row(i).transpose() * k.row(i));
    }
    prefix.push_back({p, h});
  }
  return prefix;
}

// A = I + strictly_lower(diag(β) (K Kᵀ ⊙ D))   (C, C)
template <class Scalar, class KRows>
Matrix<Scalar> wy_system(const KRows& k, const Vector<Scalar>& beta, const Matrix<Scalar>& decay) {
  const Matrix<Scalar> gram = scale_rows<Scalar>(beta, (k * k.transpose()).cwiseProduct(token_decay(decay)));
  return Matrix<Scalar>::Identity(k.rows(), k.rows()) + strictly_lower(gram);
}

// Seams for planted-bug tests; the default is faithful.
struct Faithful : delta_rule::Faithful {
  // W = T diag(β ⊙ γ) K,  U = T diag(β) V
  template <class Scalar, class KRows, class VRows>
  static WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta,
                               const Vector<Scalar>& gamma) {
    return {t * scale_rows<Scalar>(beta.cwiseProduct(gamma), k), t * scale_rows<Scalar>(beta, v)};
  }
};

template <class Scalar, class KRows, class VRows>
WY<Scalar> wy_factors(const Matrix<Scalar>& t, const KRows& k, const VRows& v, const Vector<Scalar>& beta,
                      const Vector<Scalar>& gamma) {
  return Faithful::wy_factors<Scalar>(t, k, v, beta, gamma);
}

// ---------------------------------------------------------------------------------------
// Chunkwise form.

template <class Scalar>
struct ChunkIntermediates {
  Matrix<Scalar> a;      // A = I + strictly_lower(diag(β)(K Kᵀ ⊙ D)), (C, C)
  Matrix<Scalar> t;      // T = A⁻¹, (C, C)
  Matrix<Scalar> w;      // W = T diag(β ⊙ γ) K, (C, DK)
  Matrix<Scalar> u;      // U = T diag(β) V, (C, DV)
  Matrix<Scalar> v_new;  // V̄ = U − W S_[c]ᵀ, (C, DV)
  Matrix<Scalar> decay;  // Γ, (C+1, C+1); γ = chunk_gamma(decay), D = token_decay(decay), λ = decay_to_end(decay)
};

template <class Scalar>
struct ChunkwiseForward : Forward<Scalar> {
  std::vector<Matrix<Scalar>> boundary_states;      // S_[c], each (DV, DK)
  std::vector<ChunkIntermediates<Scalar>> chunks;  // one per chunk
};

namespace detail {
// The chunkwise form for any source of decays (exact products of α, or exp of log-gate sums).
template <class Scalar, class Policy, class In, class DecayOf>
ChunkwiseForward<Scalar> chunkwise_with_decay(const In& in, Index chunk_size, ChunkOptions options, DecayOf&& decay_of) {
  in.validate();
  ChunkwiseForward<Scalar> out;
  out.output = Matrix<Scalar>::Zero(in.length(), in.value_dim());
  Matrix<Scalar> state = in.initial_state_or_zero();  // (DV, DK)
  for (const Chunk& c : chunks_of(in.length(), chunk_size)) {
    const auto [q, k, v] = in.rows(c);  // (C, DK), (C, DK), (C, DV)
    const Vector<Scalar> beta = in.beta.segment(c.begin, c.size);
    out.boundary_states.push_back(state);
    ChunkIntermediates<Scalar> x;
    x.decay = decay_of(c);
    const Vector<Scalar> gamma = chunk_gamma(x.decay);
    const Matrix<Scalar> d = token_decay(x.decay);
    x.a = wy_system<Scalar>(k, beta, x.decay);
    x.t = invert_unit_lower<Scalar, Policy>(x.a, options.solve, options.base_block);
    WY<Scalar> f = Policy::template wy_factors<Scalar>(x.t, k, v, beta, gamma);
    x.w = std::move(f.w);
    x.u = std::move(f.u);
    x.v_new = x.u - x.w * state.transpose();
    const Matrix<Scalar> scores = (q * k.transpose()).cwiseProduct(d);  // Q Kᵀ ⊙ D, (C, C)
    out.output.middleRows(c.begin, c.size) = scale_rows<Scalar>(gamma, q * state.transpose()) + scores * x.v_new;
    state = x.decay(c.size, 0) * state + x.v_new.transpose() * scale_rows<Scalar>(decay_to_end(x.decay), k);
    out.chunks.push_back(std::move(x));
  }
  out.final_state = state;
  return out;
}
}  // namespace detail

template <class Scalar, class Policy = Faithful>
ChunkwiseForward<Scalar> chunkwise(const Inputs<Scalar>& in, Index chunk_size, ChunkOptions options = {}) {
  return detail::chunkwise_with_decay<Scalar, Policy>(in, chunk_size, options, [&](const Chunk& c) {
    return decay_from_gates<Scalar>(in.alpha.segment(c.begin, c.size));
  });
}

// The whole-sequence parallel form: one chunk of C = L.
template <class Scalar>
ChunkwiseForward<Scalar> parallel_wy(const Inputs<Scalar>& in, ChunkOptions options = {}) {
  return chunkwise(in, std::max<Index>(1, in.length()), options);
}

// The log-gate float path kernels use (float, double, High).
template <class Scalar, class Policy = Faithful>
ChunkwiseForward<Scalar> chunkwise_log_gate(const LogGateInputs<Scalar>& in, Index chunk_size, ChunkOptions options = {}) {
  return detail::chunkwise_with_decay<Scalar, Policy>(in, chunk_size, options, [&](const Chunk& c) {
    return decay_from_log_gates<Scalar>(in.log_gate.segment(c.begin, c.size));
  });
}

// α = exp(g) and the gated recurrence; the log-gate path's own baseline.
template <class Scalar>
Inputs<Scalar> with_gates(const LogGateInputs<Scalar>& in) {
  using std::exp;
  Vector<Scalar> alpha(in.length());
  for (Index t = 0; t < in.length(); ++t) alpha(t) = Scalar(exp(in.log_gate(t)));
  return {in.q, in.k, in.v, in.beta, alpha, in.initial_state};
}

// ---------------------------------------------------------------------------------------
// Backward paths. Each returns dL for L = <dO, O> + <dS_L, S_L>.

using delta_rule::Cotangents;
using delta_rule::final_state_cotangent;

template <class Scalar>
struct Gradients {
  Matrix<Scalar> dq, dk, dv;       // (L, DK), (L, DK), (L, DV)
  Vector<Scalar> d_beta;           // (L)
  Vector<Scalar> d_alpha;          // (L): dL/dα, or dL/dg (= α dL/dα) from the log-gate path
  Matrix<Scalar> d_initial_state;  // (DV, DK)
};

// Reverse sweep with G = dL/dS_t, S̃ = α_t S_{t-1}, e_t = v_t − S̃ k_t:
//   G ← G + do_t q_tᵀ;  dq_t = S_tᵀ do_t;  dv_t = β_t G k_t;  dβ_t = e_tᵀ G k_t;
//   dk_t = β_t (Gᵀ e_t − S̃ᵀ G k_t);  dS̃ = G (I − β_t k_t k_tᵀ);  dα_t = <dS̃, S_{t-1}>;  G ← α_t dS̃
template <class Scalar>
Gradients<Scalar> token_recurrence_backward(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot) {
  in.validate();
  const Index L = in.length();
  std::vector<Matrix<Scalar>> states{in.initial_state_or_zero()};  // S_0 .. S_L
  for (Index t = 0; t < L; ++t) {
    const auto k = in.k.row(t).transpose();
    const Matrix<Scalar> decayed = in.alpha(t) * states.back();
    const Matrix<Scalar> error = in.v.row(t).transpose() - decayed * k;
    states.push_back(decayed + in.beta(t) * (error * k.transpose()));
  }
  Matrix<Scalar> grad = final_state_cotangent(cot, in.value_dim(), in.key_dim());
  Gradients<Scalar> g;
  g.dq.resize(L, in.key_dim());
  g.dk.resize(L, in.key_dim());
  g.dv.resize(L, in.value_dim());
  g.d_beta.resize(L);
  g.d_alpha.resize(L);
  for (Index t = L - 1; t >= 0; --t) {
    const Matrix<Scalar> k = in.k.row(t).transpose();
    const Matrix<Scalar> decayed = in.alpha(t) * states[t];  // S̃
    const Matrix<Scalar> d_out = cot.d_output.row(t).transpose();
    grad += d_out * in.q.row(t);
    const Matrix<Scalar> error = in.v.row(t).transpose() - decayed * k;
    const Matrix<Scalar> gk = grad * k;
    g.dq.row(t) = (states[t + 1].transpose() * d_out).transpose();
    g.dv.row(t) = (in.beta(t) * gk).transpose();
    g.d_beta(t) = error.col(0).dot(gk.col(0));
    g.dk.row(t) = (in.beta(t) * (grad.transpose() * error - decayed.transpose() * gk)).transpose();
    const Matrix<Scalar> d_decayed = grad - in.beta(t) * (gk * k.transpose());
    g.d_alpha(t) = d_decayed.cwiseProduct(states[t]).sum();
    grad = in.alpha(t) * d_decayed;
  }
  g.d_initial_state = grad;
  return g;
}

// One chunk's backward through the gated WY form, given S = S_[c], G' = dL/dS_[c+1]. With
// E_o = (dO V̄ᵀ) ⊙ D and P = Q Kᵀ ⊙ D:
//   dQ = diag(γ) dO S + E_o K,   dK = E_oᵀ Q + diag(λ) V̄ G',   dV̄ = Pᵀ dO + diag(λ) K G'ᵀ
//   dS = γ_C G' + dOᵀ diag(γ) Q − dV̄ᵀ W,   dU = dV̄,   dW = −dV̄ S
//   dV = diag(β) Tᵀ dU,   dK += diag(β ⊙ γ) Tᵀ dW,   dβ = rowsum(Tᵀ dU ⊙ V) + γ ⊙ rowsum(Tᵀ dW ⊙ K)
//   dT = dU (diag(β) V)ᵀ + dW (diag(β ⊙ γ) K)ᵀ,   E = strictly_lower(−Tᵀ dT Tᵀ)
//   dβ += rowsum(E ⊙ D ⊙ K Kᵀ),   F = diag(β)(E ⊙ D),   dK += (F + Fᵀ) K
// and the decays' cotangent dΓ collects dγ_r = <dO_r, S q_r> + β_r <(Tᵀ dW)_r, k_r>,
// dγ_C += <G', S>, dλ_i = v̄_iᵀ G' k_i, dD = (dO V̄ᵀ ⊙ Q Kᵀ) + E ⊙ diag(β) K Kᵀ.
template <class Scalar>
struct ChunkGradients {
  Matrix<Scalar> dq, dk, dv;  // (C, DK), (C, DK), (C, DV)
  Vector<Scalar> d_beta;      // (C)
  Matrix<Scalar> d_decay;     // dL/dΓ(e, s) for s < e, (C+1, C+1)
  Matrix<Scalar> d_state;     // dL/dS_[c], (DV, DK)
};

template <class Scalar, class QRows, class KRows, class VRows, class DRows>
ChunkGradients<Scalar> chunk_backward(const QRows& q, const KRows& k, const VRows& v, const Vector<Scalar>& beta,
                                      const ChunkIntermediates<Scalar>& x, const Matrix<Scalar>& state,
                                      const DRows& d_out, const Matrix<Scalar>& d_next_state) {
  const Index n = q.rows();
  const Vector<Scalar> gamma = chunk_gamma(x.decay);
  const Matrix<Scalar> d = token_decay(x.decay);
  const Vector<Scalar> lambda = decay_to_end(x.decay);
  const Matrix<Scalar> qk = q * k.transpose();                   // (C, C)
  const Matrix<Scalar> kk = k * k.transpose();                   // (C, C)
  const Matrix<Scalar> do_vnew = d_out * x.v_new.transpose();    // dO V̄ᵀ, (C, C)
  const Matrix<Scalar> e_out = do_vnew.cwiseProduct(d);           // E_o
  ChunkGradients<Scalar> g;
  const Matrix<Scalar> d_v_new = qk.cwiseProduct(d).transpose() * d_out + scale_rows<Scalar>(lambda, k * d_next_state.transpose());
  g.dq = scale_rows<Scalar>(gamma, d_out * state) + e_out * k;
  g.dk = e_out.transpose() * q + scale_rows<Scalar>(lambda, x.v_new * d_next_state);
  g.d_state = x.decay(n, 0) * d_next_state + d_out.transpose() * scale_rows<Scalar>(gamma, q) - d_v_new.transpose() * x.w;
  const Matrix<Scalar>& d_u = d_v_new;
  const Matrix<Scalar> d_w = -(d_v_new * state);
  const Matrix<Scalar> t_du = x.t.transpose() * d_u;  // (C, DV)
  const Matrix<Scalar> t_dw = x.t.transpose() * d_w;  // (C, DK)
  const Vector<Scalar> beta_gamma = beta.cwiseProduct(gamma);
  const Vector<Scalar> t_dw_k = t_dw.cwiseProduct(k).rowwise().sum();  // <(Tᵀ dW)_r, k_r>
  g.dv = scale_rows<Scalar>(beta, t_du);
  g.dk += scale_rows<Scalar>(beta_gamma, t_dw);
  g.d_beta = t_du.cwiseProduct(v).rowwise().sum() + gamma.cwiseProduct(t_dw_k);
  const Matrix<Scalar> d_t = d_u * scale_rows<Scalar>(beta, v).transpose() + d_w * scale_rows<Scalar>(beta_gamma, k).transpose();
  const Matrix<Scalar> e = strictly_lower<Scalar>(-(x.t.transpose() * d_t * x.t.transpose()));
  const Matrix<Scalar> e_decayed = e.cwiseProduct(d);
  g.d_beta += e_decayed.cwiseProduct(kk).rowwise().sum();
  const Matrix<Scalar> f = scale_rows<Scalar>(beta, e_decayed);
  g.dk += (f + f.transpose()) * k;

  // Cotangents of the decays, placed at Γ(e, s).
  const Matrix<Scalar> d_token_decay = do_vnew.cwiseProduct(qk) + e.cwiseProduct(scale_rows<Scalar>(beta, kk));
  const Matrix<Scalar> q_state = q * state.transpose();  // row r: (S q_r)ᵀ
  const Vector<Scalar> d_gamma = d_out.cwiseProduct(q_state).rowwise().sum() + beta.cwiseProduct(t_dw_k);
  const Vector<Scalar> d_lambda = (x.v_new * d_next_state).cwiseProduct(k).rowwise().sum();
  g.d_decay = Matrix<Scalar>::Zero(n + 1, n + 1);
  for (Index r = 0; r < n; ++r) {
    for (Index i = 0; i < r; ++i) g.d_decay(r + 1, i + 1) += d_token_decay(r, i);
    g.d_decay(r + 1, 0) += d_gamma(r);
    g.d_decay(n, r + 1) += d_lambda(r);  // Γ(C, C) = 1 is a constant: its entry is never read
  }
  g.d_decay(n, 0) += d_next_state.cwiseProduct(state).sum();
  return g;
}

// dα_j = Σ_{s<j≤e} dΓ(e, s) ∂Γ(e, s)/∂α_j with ∂Γ(e, s)/∂α_j = Γ(j−1, s) Γ(e, j): no division.
template <class Scalar>
Vector<Scalar> gate_gradient_from_decay(const Matrix<Scalar>& decay, const Matrix<Scalar>& d_decay) {
  const Index n = decay.rows() - 1;
  Vector<Scalar> d_alpha = Vector<Scalar>::Zero(n);
  for (Index j = 1; j <= n; ++j)
    for (Index s = 0; s < j; ++s)
      for (Index e = j; e <= n; ++e) d_alpha(j - 1) += d_decay(e, s) * decay(j - 1, s) * decay(e, j);
  return d_alpha;
}

// dg_j = Σ_{s<j≤e} dΓ(e, s) Γ(e, s), since Γ(e, s) = exp(G_e − G_s) and ∂(G_e − G_s)/∂g_j = 1.
template <class Scalar>
Vector<Scalar> log_gate_gradient_from_decay(const Matrix<Scalar>& decay, const Matrix<Scalar>& d_decay) {
  const Index n = decay.rows() - 1;
  Vector<Scalar> d_log_gate = Vector<Scalar>::Zero(n);
  for (Index j = 1; j <= n; ++j)
    for (Index s = 0; s < j; ++s)
      for (Index e = j; e <= n; ++e) d_log_gate(j - 1) += d_decay(e, s) * decay(e, s);
  return d_log_gate;
}

// Chunkwise backward through the WY form (delta_rule's reverse scan over chunks, this family's
// chunk_backward): d_alpha holds dL/dα.
template <class Scalar, class Policy = Faithful>
Gradients<Scalar> chunkwise_backward(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot, Index chunk_size,
                                     ChunkOptions options = {}) {
  return delta_rule::detail::reverse_chunk_scan<Gradients<Scalar>>(
      in, chunkwise<Scalar, Policy>(in, chunk_size, options), cot, chunk_size,
      [](const auto&... x) { return chunk_backward<Scalar>(x...); }, gate_gradient_from_decay<Scalar>);
}

// The log-gate path's backward: d_alpha holds dL/dg.
template <class Scalar, class Policy = Faithful>
Gradients<Scalar> chunkwise_log_gate_backward(const LogGateInputs<Scalar>& in, const Cotangents<Scalar>& cot,
                                              Index chunk_size, ChunkOptions options = {}) {
  return delta_rule::detail::reverse_chunk_scan<Gradients<Scalar>>(
      in, chunkwise_log_gate<Scalar, Policy>(in, chunk_size, options), cot, chunk_size,
      [](const auto&... x) { return chunk_backward<Scalar>(x...); }, log_gate_gradient_from_decay<Scalar>);
}

// ---------------------------------------------------------------------------------------
// The additive case with a scalar gate:  S_t = α_t S_{t-1} + v_t k_tᵀ,  o_t = S_t q_t.

template <class Scalar>
struct ScalarGateInputs : SequenceInputs<Scalar, ScalarGateInputs<Scalar>> {
  Vector<Scalar> alpha;                         // (L)
  std::optional<Matrix<Scalar>> initial_state;  // (DV, DK)

  std::vector<PerToken> per_token() const { return {{"alpha", alpha.size()}}; }
};

// S_t = α_t S_{t-1} + v_t k_tᵀ
template <class Scalar>
Forward<Scalar> additive_token_recurrence(const ScalarGateInputs<Scalar>& in) {
  in.validate();
  Matrix<Scalar> state = in.initial_state_or_zero();
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t) {
    state = in.alpha(t) * state + in.v.row(t).transpose() * in.k.row(t);
    out.output.row(t) = (state * in.q.row(t).transpose()).transpose();
  }
  out.final_state = state;
  return out;
}

// O = diag(γ) Q S_[c]ᵀ + (Q Kᵀ ⊙ D) V,   S_[c+1] = γ_C S_[c] + Vᵀ diag(λ) K
template <class Scalar>
delta_rule::ChunkwiseForward<Scalar> additive_chunkwise(const ScalarGateInputs<Scalar>& in, Index chunk_size) {
  in.validate();
  delta_rule::ChunkwiseForward<Scalar> out;
  out.output = Matrix<Scalar>::Zero(in.length(), in.value_dim());
  Matrix<Scalar> state = in.initial_state_or_zero();
  for (const Chunk& c : chunks_of(in.length(), chunk_size)) {
    const auto [q, k, v] = in.rows(c);  // (C, DK), (C, DK), (C, DV)
    out.boundary_states.push_back(state);
    const Matrix<Scalar> decay = decay_from_gates<Scalar>(in.alpha.segment(c.begin, c.size));
    const Matrix<Scalar> scores = (q * k.transpose()).cwiseProduct(token_decay(decay));
    out.output.middleRows(c.begin, c.size) = scale_rows<Scalar>(chunk_gamma(decay), q * state.transpose()) + scores * v;
    state = decay(c.size, 0) * state + v.transpose() * scale_rows<Scalar>(decay_to_end(decay), k);
  }
  out.final_state = state;
  return out;
}

// ---------------------------------------------------------------------------------------
// Conversions and named parameter lists (pairing and Cotangents' cast are delta_rule's).

using delta_rule::cast;
using delta_rule::pairing;
using delta_rule::vector_cast;

template <class To, class From>
Inputs<To> cast(const Inputs<From>& in) {
  Inputs<To> out{matrix_cast<To>(in.q),         matrix_cast<To>(in.k),          matrix_cast<To>(in.v),
                 vector_cast<To>(in.beta), vector_cast<To>(in.alpha), std::nullopt};
  if (in.initial_state) out.initial_state = matrix_cast<To>(*in.initial_state);
  return out;
}

// (q, k, v, β, α, S_0 when given), β and α as (L, 1) matrices.
template <class Scalar>
Params<Scalar> params_of(const Inputs<Scalar>& in) {
  Params<Scalar> p{{"q", in.q}, {"k", in.k}, {"v", in.v}, {"beta", in.beta}, {"alpha", in.alpha}};
  if (in.initial_state) p.push_back({"S_0", *in.initial_state});
  return p;
}

template <class Scalar>
Inputs<Scalar> inputs_of(const Params<Scalar>& p) {
  Inputs<Scalar> in{p.at(0).value, p.at(1).value, p.at(2).value, p.at(3).value.col(0), p.at(4).value.col(0), std::nullopt};
  if (p.size() > 5) in.initial_state = p[5].value;
  return in;
}

template <class Scalar>
Params<Scalar> params_of(const Gradients<Scalar>& g, bool with_initial_state) {
  Params<Scalar> p{{"q", g.dq}, {"k", g.dk}, {"v", g.dv}, {"beta", g.d_beta}, {"alpha", g.d_alpha}};
  if (with_initial_state) p.push_back({"S_0", g.d_initial_state});
  return p;
}

// ---------------------------------------------------------------------------------------
// [B, H, L, D] batches. β and α are stored [B, H, L, 1].

template <class Scalar>
struct BatchInputs : BatchSequenceInputs<Scalar, BatchInputs<Scalar>> {
  Tensor4<Scalar> beta, alpha;                   // [B, H, L, 1]
  std::optional<Tensor4<Scalar>> initial_state;  // [B, H, DV, DK]

  std::vector<PerTokenTensor<Scalar>> per_token() const { return {{"beta", &beta}, {"alpha", &alpha}}; }
  Inputs<Scalar> head(Index b, Index h) const { return this->template head_inputs<Inputs<Scalar>>(b, h, beta, alpha); }
};

using delta_rule::BatchCotangents;
using delta_rule::BatchForward;
using delta_rule::batched;

template <class Scalar>
struct BatchGradients : delta_rule::BatchGradients<Scalar> {
  Tensor4<Scalar> d_alpha;  // [B, H, L, 1]

  static BatchGradients zeros_like(const BatchInputs<Scalar>& in) {
    return {delta_rule::BatchGradients<Scalar>::zeros_like(in), Tensor4<Scalar>(in.q.batch, in.q.heads, in.q.rows, 1)};
  }
  void set_head(Index b, Index h, const Gradients<Scalar>& g) {
    delta_rule::BatchGradients<Scalar>::set_head(b, h, g);
    d_alpha.set_head(b, h, g.d_alpha);
  }
};

template <class Scalar, class Backward>
BatchGradients<Scalar> batched_backward(const BatchInputs<Scalar>& in, const BatchCotangents<Scalar>& cot,
                                        Backward&& backward) {
  return linear_attention::backward_every_head(BatchGradients<Scalar>::zeros_like(in), in, cot, backward);
}

}  // namespace deltaproof::ref::gated_delta_rule
