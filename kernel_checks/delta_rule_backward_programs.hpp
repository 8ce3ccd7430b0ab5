// The backward's stage equations as straight-line programs, shared by the stage checks of both backward
// kernels (kernel_checks/delta_rule_backward_stages.cpp: the fp32 FMA kernels; delta_rule_backward_tensor_core_stages.cpp:
// the tensor-core kernels). Program<S, false> is a stage's value; Program<S, true> on |inputs| is the same
// program with every − turned into +: the magnitude that bounds the stage's rounding error.
#pragma once

#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "kernel_checks/delta_rule_backward_stages.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace deltaproof::verify::delta_rule::backward_programs {

namespace dr = ref::delta_rule;
namespace gdr = ref::gated_delta_rule;

inline bool has(const Tensor4<Exact>& t) { return !t.data.empty(); }

template <class S>
Matrix<S> to(const Matrix<Exact>& m) {
  return ref::matrix_cast<S>(m);
}

template <class S>
Matrix<S> absolute(const Matrix<S>& m) {
  return m.cwiseAbs();
}
template <class S>
Vector<S> absolute(const Vector<S>& v) {
  return v.cwiseAbs();
}

// ---------------------------------------------------------------------------------------
// The gate decays of one chunk from its in-chunk gate sums G (the kernel's Ĝ, or the exact sums).

template <class S>
struct Decays {
  Matrix<S> d;       // (n, n) D_ij = exp(G_i − G_j) on and below the diagonal, 0 above
  Vector<S> gamma;   // (n) γ_i = exp(G_i)
  Vector<S> lambda;  // (n) λ_i = exp(G_{n−1} − G_i)
  S gamma_end;       // γ_{n−1}, the decay over the whole chunk
};

template <class S>
Decays<S> decays_of(const Vector<S>& gsum, bool gated) {
  const Index n = gsum.size();
  Decays<S> x{Matrix<S>::Zero(n, n), Vector<S>::Ones(n), Vector<S>::Ones(n), S(1)};
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j <= i; ++j) x.d(i, j) = S(1);
  if (!gated) return x;
  if constexpr (ref::is_high_v<S>) {
    using std::exp;
    for (Index i = 0; i < n; ++i) {
      for (Index j = 0; j < i; ++j) x.d(i, j) = S(exp(gsum(i) - gsum(j)));
      x.gamma(i) = S(exp(gsum(i)));
      x.lambda(i) = i == n - 1 ? S(1) : S(exp(gsum(n - 1) - gsum(i)));
    }
    x.gamma_end = x.gamma(n - 1);
    return x;
  } else {
    throw std::logic_error("decays_of: Gated DeltaNet's decays are irrational: use High");
  }
}

// ---------------------------------------------------------------------------------------
// Each stage as the equation its kernel loop computes (reference/gated_delta_rule.hpp's
// chunk_backward, split where the kernel writes an intermediate). Program<S, false> is the value;
// Program<S, true> on |inputs| is the same program with every − turned into +: the magnitude that
// bounds the stage's rounding error.

template <class S, bool Mag>
struct Program {
  using M = Matrix<S>;
  using V = Vector<S>;
  static M minus(const M& a, const M& b) {
    if constexpr (Mag) return a + b;
    else return a - b;
  }
  static M negated(const M& a) {
    if constexpr (Mag) return a;
    else return -a;
  }
  static V rowsum(const M& m) { return m.rowwise().sum(); }

  // strictly_lower(diag(β) (K Kᵀ ⊙ D)), the off-diagonal part of A
  static M a_lower(const M& k, const V& beta, const Decays<S>& x) {
    return dr::strictly_lower<S>(dr::scale_rows<S>(beta, M((k * k.transpose()).cwiseProduct(x.d))));
  }
  // P = Q Kᵀ ⊙ D (on and below the diagonal)
  static M scores(const M& q, const M& k, const Decays<S>& x) { return (q * k.transpose()).cwiseProduct(x.d); }
  // W = T diag(β ⊙ γ) K,  U = T diag(β) V
  static M w(const M& t, const M& k, const V& beta, const Decays<S>& x) {
    return t * dr::scale_rows<S>(V(beta.cwiseProduct(x.gamma)), k);
  }
  static M u(const M& t, const M& v, const V& beta) { return t * dr::scale_rows<S>(beta, v); }
  // V̄ = U − W Sᵀ
  static M v_new(const M& u, const M& w, const M& s) { return minus(u, M(w * s.transpose())); }
  // S_[c+1] = γ_{n−1} S + V̄ᵀ diag(λ) K
  static M s_next(const M& s, const M& vbar, const M& k, const Decays<S>& x) {
    return s * x.gamma_end + vbar.transpose() * dr::scale_rows<S>(x.lambda, k);
  }
  // O = diag(γ) Q Sᵀ + P V̄
  static M output(const M& q, const M& s, const M& p, const M& vbar, const Decays<S>& x) {
    return dr::scale_rows<S>(x.gamma, M(q * s.transpose())) + p * vbar;
  }
  // dV̄ = Pᵀ dO + diag(λ) K G'ᵀ
  static M d_v_new(const M& p, const M& d_out, const M& k, const M& g_next, const Decays<S>& x) {
    return p.transpose() * d_out + dr::scale_rows<S>(x.lambda, M(k * g_next.transpose()));
  }
  // G_[c] = γ_{n−1} G' + dOᵀ diag(γ) Q − dV̄ᵀ W
  static M s_grad(const M& g_next, const M& d_out, const M& q, const M& dvbar, const M& w, const Decays<S>& x) {
    return minus(M(g_next * x.gamma_end + d_out.transpose() * dr::scale_rows<S>(x.gamma, q)), M(dvbar.transpose() * w));
  }
  // dW = −dV̄ S
  static M d_w(const M& dvbar, const M& s) { return negated(M(dvbar * s)); }
  // E = strictly_lower(−Tᵀ dT Tᵀ), dT = dU (diag(β) V)ᵀ + dW (diag(β ⊙ γ) K)ᵀ, dU = dV̄
  static M adjoint(const M& t, const M& dvbar, const M& dw, const M& v, const M& k, const V& beta, const Decays<S>& x) {
    const M d_t = dvbar * dr::scale_rows<S>(beta, v).transpose() +
                  dw * dr::scale_rows<S>(V(beta.cwiseProduct(x.gamma)), k).transpose();
    return dr::strictly_lower<S>(negated(M(t.transpose() * d_t * t.transpose())));
  }
  // E_o = (dO V̄ᵀ) ⊙ D
  static M e_out(const M& d_out, const M& vbar, const Decays<S>& x) { return (d_out * vbar.transpose()).cwiseProduct(x.d); }
  // dq = diag(γ) dO S + E_o K
  static M dq(const M& d_out, const M& s, const M& vbar, const M& k, const Decays<S>& x) {
    return dr::scale_rows<S>(x.gamma, M(d_out * s)) + e_out(d_out, vbar, x) * k;
  }
  // dk = E_oᵀ Q + diag(λ) V̄ G' + diag(β ⊙ γ) Tᵀ dW + (F + Fᵀ) K,  F = diag(β) (E ⊙ D)
  static M dk(const M& d_out, const M& vbar, const M& q, const M& g_next, const M& t, const M& dw, const M& e, const M& k,
              const V& beta, const Decays<S>& x) {
    const M f = dr::scale_rows<S>(beta, M(e.cwiseProduct(x.d)));
    return e_out(d_out, vbar, x).transpose() * q + dr::scale_rows<S>(x.lambda, M(vbar * g_next)) +
           dr::scale_rows<S>(V(beta.cwiseProduct(x.gamma)), M(t.transpose() * dw)) + (f + f.transpose()) * k;
  }
  // dv = diag(β) Tᵀ dU
  static M dv(const M& t, const M& dvbar, const V& beta) { return dr::scale_rows<S>(beta, M(t.transpose() * dvbar)); }
  // dβ = rowsum(Tᵀ dU ⊙ V) + γ ⊙ rowsum(Tᵀ dW ⊙ K) + rowsum(E ⊙ D ⊙ K Kᵀ)
  static V d_beta(const M& t, const M& dvbar, const M& v, const M& dw, const M& k, const M& e, const Decays<S>& x) {
    return rowsum(M(t.transpose() * dvbar).cwiseProduct(v)) + x.gamma.cwiseProduct(rowsum(M(t.transpose() * dw).cwiseProduct(k))) +
           rowsum(e.cwiseProduct(x.d).cwiseProduct(k * k.transpose()));
  }
  // dG_r = dγ_r γ_r + Σ_{i<r} Z_ri − Σ_{i>r} Z_ir − dλ_r λ_r, and the last token also
  // Σ_i dλ_i λ_i + <G', S> γ_{n−1}, where (gated_delta_rule.hpp's decay cotangents)
  //   dγ_r = <dO_r, S q_r> + β_r <(Tᵀ dW)_r, k_r>,  dλ_i = <(V̄ G')_i, k_i>,
  //   Z = dL/dD ⊙ D = (dO V̄ᵀ) ⊙ P + (E ⊙ D) ⊙ diag(β) K Kᵀ   (strictly lower).
  static V d_gate_sums(const M& d_out, const M& s, const M& q, const M& t, const M& dw, const M& k, const M& vbar,
                       const M& g_next, const M& p, const M& e, const V& beta, const Decays<S>& x) {
    const Index n = q.rows();
    const V d_gamma = rowsum(M(d_out * s).cwiseProduct(q)) + beta.cwiseProduct(rowsum(M(t.transpose() * dw).cwiseProduct(k)));
    const V d_lambda = rowsum(M(vbar * g_next).cwiseProduct(k));
    const M z = dr::strictly_lower<S>(M((d_out * vbar.transpose()).cwiseProduct(p))) +
                e.cwiseProduct(x.d).cwiseProduct(dr::scale_rows<S>(beta, M(k * k.transpose())));
    V out(n);
    for (Index r = 0; r < n; ++r) {
      S sum = d_gamma(r) * x.gamma(r);
      for (Index i = 0; i < r; ++i) sum += z(r, i);
      for (Index i = r + 1; i < n; ++i) sum = Mag ? S(sum + z(i, r)) : S(sum - z(i, r));
      out(r) = Mag ? S(sum + d_lambda(r) * x.lambda(r)) : S(sum - d_lambda(r) * x.lambda(r));
    }
    out(n - 1) += d_lambda.cwiseProduct(x.lambda).sum() + g_next.cwiseProduct(s).sum() * x.gamma_end;
    return out;
  }
  // dg_j = Σ_{r ≥ j in the chunk} dG_r
  static V dg(const V& d_gsum) {
    V out(d_gsum.size());
    S running(0);
    for (Index r = d_gsum.size() - 1; r >= 0; --r) out(r) = running += d_gsum(r);
    return out;
  }
};

template <class S>
using Value = Program<S, false>;
template <class S>
using Magnitude = Program<S, true>;

// ---------------------------------------------------------------------------------------
// Units and bounds.

struct BackwardUnits {
  double acc;    // unit roundoff of the accumulation type
  double exp;    // relative error of its exp (expf: 2 ulp, exp: 1 ulp)
  double out;    // rounding of a stored gradient to the input dtype (0: stored exactly)
  double eta;    // half the dtype's smallest subnormal (absolute error of a tiny stored gradient)
  double floor;  // underflow floor, times max(magnitude) (as the forward stages')
  double eta_acc;  // half the accumulation type's smallest subnormal: the absolute part of one rounding
                   // (fp64's half, 2⁻¹⁰⁷⁵, is no double: its smallest subnormal 2⁻¹⁰⁷⁴ stands in, an upper bound)
};

inline BackwardUnits backward_units(DType d) {
  switch (d) {
    case DType::f64: return {0x1p-53, 0x1p-52, 0, 0, 0x1p-1000, 0x1p-1074};
    case DType::f32: return {0x1p-24, 0x1p-22, 0, 0, 0x1p-110, 0x1p-150};
    case DType::bf16: return {0x1p-24, 0x1p-22, 0x1p-8, 0x1p-134, 0x1p-110, 0x1p-150};
    default: return {0x1p-24, 0x1p-22, 0x1p-11, 0x1p-25, 0x1p-110, 0x1p-150};
  }
}

// A warp's row · row dot product of length D: ⌈D/32⌉ sequential FMAs per lane, then 5 butterfly adds.
inline long dot_depth(Index length) { return long((length + 31) / 32 + 5); }

// (1 + γ_m(u)) (1 + ε)^k − 1, rounded up.
inline double rho(long m, int k, double u, double eps) {
  return ((1 + ref::gamma(m, u)) * std::pow(1 + eps, k) - 1) * (1 + 1e-12);
}

// ρ·magnitude, or for a gradient stored in the dtype u_out|value| + (1 + u_out) ρ·magnitude + η; plus the floor.
// Every rounding in the accumulation type is |fl(x) − x| ≤ u_acc|x| + η_acc (η_acc for results in its
// subnormal range: very negative gates make W and dS_0 entries of 1e-46 in fp32, which the H200 run
// showed rounded to 0 outside the purely relative bound). ρ ≥ (m + k)·u_acc for m roundings and k
// exps, so ρ/u_acc · η_acc bounds their absolute parts.
template <class S>
Matrix<S> bound_of(const Matrix<S>& magnitude, const Matrix<S>& value, double r, bool stored, const BackwardUnits& un) {
  Matrix<S> b = magnitude * S(r) + Matrix<S>::Constant(magnitude.rows(), magnitude.cols(), S(r / un.acc * un.eta_acc));
  if (stored)
    b = value.cwiseAbs() * S(un.out) + b * S(1 + un.out) + Matrix<S>::Constant(magnitude.rows(), magnitude.cols(), S(un.eta));
  const S floor = magnitude.size() ? S(magnitude.maxCoeff() * S(un.floor)) : S(0);
  return b + Matrix<S>::Constant(magnitude.rows(), magnitude.cols(), floor);
}

template <class S>
Matrix<S> column(const Vector<S>& v) {
  return Matrix<S>(v);
}

// One chunk's gate sums: the kernel's Ĝ against G_i = Σ_{t ≤ i} g_t (exact), within r relative to
// Σ_{t ≤ i} |g_t|; DeltaNet's (no gates) must be exactly 0. `add(stage, candidate, oracle, bound)`.
template <class S, class Add>
void check_gate_sums(Add&& add, const Vector<S>& candidate, const Vector<S>& g, Index t0, bool gated, double r,
                     const BackwardUnits& un) {
  const Index n = candidate.size();
  if (!gated) return add("G", column(candidate), Matrix<S>(Matrix<S>::Zero(n, 1)), Matrix<S>(Matrix<S>::Zero(n, 1)));
  Vector<S> exact_sums(n), magnitude(n);
  S running(0), running_abs(0);
  for (Index i = 0; i < n; ++i) {
    running += g(t0 + i), running_abs += abs(g(t0 + i));
    exact_sums(i) = running, magnitude(i) = running_abs;
  }
  add("G", column(candidate), column(exact_sums), bound_of<S>(column(magnitude), column(exact_sums), r, false, un));
}


}  // namespace deltaproof::verify::delta_rule::backward_programs
