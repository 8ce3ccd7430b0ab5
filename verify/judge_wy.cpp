// The delta family's bounds for the WY chunkwise algorithm as production kernels run it (fla's
// chunk_delta_rule, the derivation's Triton kernels, deltaproof's own): per chunk of C tokens,
//   T = (I + strictly-lower(diag(β) K Kᵀ ⊙ Γ))⁻¹ (fp32 solve, stored in the operand dtype),
//   W = T diag(β e^G) K,  U = T diag(β) V,  V̄ = U − W S_[c]ᵀ,
//   O = e^G ⊙ Q S_[c]ᵀ + (Q Kᵀ ⊙ Γ ⊙ M) V̄,   S_[c+1] = e^{G_n} S_[c] + V̄ᵀ diag(e^{G_n − G}) K.
// The rounding errors of V̄_i reach the chunk's end state as δV̄_i k_iᵀ: NOT through the transitions
// I − β_j k_j k_jᵀ of the tokens j > i of the chunk (which the token recurrence applies to them), because
// the WY form realises those transitions by cancellation between the terms V̄_j k_jᵀ, whose errors do
// not cancel. So within a chunk the errors are carried uncontracted, and from the chunk's end on
// through the exact transitions; their size is that of the WY products, |T| (|β V| + |β K| |S_[c]|ᵀ),
// not that of the state. proofs/kernel_error_bounds.md derives it; kernel_model.hpp states the model.
#include "verify/judge_internal.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace deltaproof::verify::judging {
namespace {

std::string text(const char* format, double a, double b = 0, double c = 0) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, format, a, b, c);
  return buffer;
}

// Roundings on a term of T as a blocked fp32 solve computes it: 16×16 forward substitution, then
// merges T21 = −T22 (A21 T11) whose counts add (Higham, Lemma 3.3): D(2s) = 2 D(s) + 2s.
long solve_roundings(Index size) { return size <= 16 ? 15 : 2 * solve_roundings((size + 1) / 2) + size; }

double gamma_of(long m, double u) { return m * u / (1 - m * u); }

}  // namespace

WyMoments wy_moments(const UnitInputs& in, const DeltaSweep& sw, const DeltaModel& m) {
  const Index L = in.q.rows(), DK = in.k.cols();
  WyMoments out;
  out.qcq = VectorD::Zero(L);
  out.v_bar = VectorD::Zero(L);
  out.tr_state = VectorD::Zero(L);
  if (L == 0) return out;
  const double eps = m.eps_op + m.eps_acc;  // one token's products: operands rounded r times, fp32 sums
  // V̄ passes through more roundings than a token's step: β·x and T as operands, W or U stored, S_[c]
  // as an operand, V̄ stored: five, against the r ≥ 3 of eps (kernel_model.hpp).
  const double eps_wy = (1 + eps) * std::pow(1 + m.u_op, 2) - 1;
  for (const long C : m.chunk_sizes) {
    MatrixD carried = MatrixD::Zero(DK, DK);  // key-side second moment of the errors carried into the chunk
    const long solve_depth = solve_roundings(C);
    const double solve_gamma = gamma_of(solve_depth, m.u_acc32);
    for (Index a = 0; a < L; a += C) {
      const Index n = std::min<Index>(C, L - a);
      const MatrixD K = in.k.middleRows(a, n), V = in.v.middleRows(a, n), Q = in.q.middleRows(a, n);
      const VectorD beta = in.beta.segment(a, n);
      VectorD G(n);  // cumulative log-gates within the chunk
      double run = 0;
      for (Index i = 0; i < n; ++i) G(i) = (run += m.gated ? in.log_gate(a + i) : 0.0);
      MatrixD decay = MatrixD::Zero(n, n);  // Γ ⊙ M: e^{G_i − G_j} for j ≤ i
      for (Index i = 0; i < n; ++i)
        for (Index j = 0; j <= i; ++j) decay(i, j) = m.gated ? std::exp(G(i) - G(j)) : 1.0;
      const MatrixD& S_a = sw.chunk_starts[size_t(a / m.chunk_stride)];  // S_[c], (DV, DK)
      MatrixD lower = (beta.asDiagonal() * (K * K.transpose())).cwiseProduct(decay);
      lower.triangularView<Eigen::Upper>().setZero();
      MatrixD X = MatrixD::Identity(n, n) + lower;
      const MatrixD T = X.triangularView<Eigen::UnitLower>().solve(MatrixD::Identity(n, n));
      // The fp32 solve's error: |T̂ − T| ≤ γ_D(u32) |T| |X| |T| to first order (Higham, Thm 8.5 and its
      // blocked variants), valid while γ_D(u32) ‖|T||X|‖∞ < 1/2.
      const MatrixD TX = T.cwiseAbs() * MatrixD(X.cwiseAbs());
      const MatrixD T_solve = TX * T.cwiseAbs();
      // Magnitudes of the WY products: the terms of V̄ = T (βV − βγ K S_[c]ᵀ), entrywise (n, DV).
      VectorD beta_gamma(n);
      for (Index i = 0; i < n; ++i) beta_gamma(i) = std::abs(beta(i)) * std::exp(G(i));
      const MatrixD terms = beta.cwiseAbs().asDiagonal() * V.cwiseAbs() +
                            beta_gamma.asDiagonal() * (K.cwiseAbs() * S_a.cwiseAbs().transpose());
      const MatrixD wy_mag = T.cwiseAbs() * terms;  // |T| |terms|
      // Below the normal range each operand rounding is off by η absolutely: β·x and T (through |T|),
      // W and S_[c] in W S_[c]ᵀ, U and V̄ stored.
      const VectorD t_rows = T.cwiseAbs().rowwise().sum();
      const VectorD w_rows = T.cwiseAbs() * (beta_gamma.asDiagonal() * K.cwiseAbs()).rowwise().sum();
      const double s_max = S_a.size() ? S_a.cwiseAbs().maxCoeff() : 0.0;
      MatrixD v_bar_error = eps_wy * wy_mag + solve_gamma * (T_solve * terms);
      for (Index i = 0; i < n; ++i)
        v_bar_error.row(i).array() += m.eta_op * (3 + 2 * t_rows(i) + double(DK) * s_max + w_rows(i) +
                                                  t_rows(i) * (terms.row(i).size() ? terms.maxCoeff() : 0.0));
      // Premises: the fp32 solve a first-order perturbation of T, and the products representable.
      const double solve_growth = solve_gamma * TX.rowwise().sum().maxCoeff();
      if (solve_growth > 0.5 && out.premises.empty())
        out.premises.push_back({text("the fp32 solve of T = (I + A)⁻¹ is no first-order perturbation: γ_%.0f(u32)·‖|T||I + A|‖∞ "
                                     "over tokens %.0f.. of a %.0f-token chunk",
                                     double(solve_depth), double(a), double(C)),
                                solve_growth, 0.5});
      const double largest = std::max(wy_mag.size() ? wy_mag.maxCoeff() : 0.0, T.cwiseAbs().maxCoeff());
      if (largest > m.operand_max && out.premises.empty())
        out.premises.push_back({text("the WY products (|T|, |W|, |U|, |V̄|) exceed the operand dtype's range over tokens %.0f.. "
                                     "of a %.0f-token chunk",
                                     double(a), double(C)),
                                largest, m.operand_max});
      VectorD sigma2(n);  // ‖δV̄_i‖²
      for (Index i = 0; i < n; ++i) {
        sigma2(i) = v_bar_error.row(i).squaredNorm();
        out.v_bar(a + i) = std::max(out.v_bar(a + i), wy_mag.row(i).norm());
      }
      // Through the chunk: the carried errors by the exact transitions α_t (I − β_t k_t k_tᵀ); the
      // chunk's own V̄ errors uncontracted, weighted by the decay to token t.
      const MatrixD scores = (Q * K.transpose()).cwiseProduct(decay);  // (Q Kᵀ ⊙ Γ ⊙ M)
      MatrixD weighted = MatrixD::Zero(n, DK);  // rows: σ_i k_i e^{G_t − G_i}, rescaled as t moves
      double chunk_trace = 0;
      for (Index t = 0; t < n; ++t) {
        const auto k = K.row(t).transpose();
        const double alpha = m.gated ? std::exp(in.log_gate(a + t)) : 1.0, b = beta(t);
        const VectorD ck = carried * k;
        const double kck = k.dot(ck);
        const VectorD y = b * ck - (0.5 * b * b * kck) * k;
        carried = alpha * alpha * (carried - y * k.transpose() - k * y.transpose());
        double in_chunk = 0;
        chunk_trace = alpha * alpha * chunk_trace + sigma2(t) * k.squaredNorm();
        for (Index i = 0; i <= t; ++i) in_chunk += sigma2(i) * scores(t, i) * scores(t, i);
        const auto q = Q.row(t).transpose();
        out.qcq(a + t) = std::max(out.qcq(a + t), q.dot(carried * q) + in_chunk);
        out.tr_state(a + t) = std::max(out.tr_state(a + t), carried.trace() + chunk_trace);
      }
      // The chunk's end: its V̄ errors, decayed to the end, join the carried errors; so do the update's
      // own roundings (V̄ and λK as operands, fp32 sums over the chunk) and, for a 16-bit running
      // state, its rounding.
      const VectorD tail = (G(n - 1) - G.array()).exp().matrix();  // e^{G_n − G_i}
      for (Index i = 0; i < n; ++i) {
        const VectorD k = K.row(i).transpose() * tail(i);
        carried.noalias() += sigma2(i) * (k * k.transpose());
      }
      const double gamma_end = std::exp(G(n - 1));
      // V̄ and λK enter the update as operands; S_[c] stays in fp32 (only the sums round it).
      const MatrixD update_mag = (1 + m.u_op) * (1 + gamma_of(n + 2, m.u_acc32)) - 1 == 0
                                     ? MatrixD::Zero(S_a.rows(), DK)
                                     : MatrixD(((1 + m.u_op) * (1 + gamma_of(n + 2, m.u_acc32)) - 1) *
                                                   (wy_mag.transpose() * (tail.asDiagonal() * K.cwiseAbs())) +
                                               gamma_of(n + 2, m.u_acc32) * gamma_end * S_a.cwiseAbs());
      const MatrixD& S_b = a + n < L ? sw.chunk_starts[size_t((a + n) / m.chunk_stride)] : sw.final_state;
      for (Index j = 0; j < DK; ++j)
        carried(j, j) += update_mag.col(j).squaredNorm() + m.u_state * m.u_state * S_b.col(j).squaredNorm();
    }
    out.tr_final = std::max(out.tr_final, carried.trace());
  }
  return out;
}

}  // namespace deltaproof::verify::judging
