// verify::judge for DeltaNet and Gated DeltaNet: the double oracle (the token recurrence and its
// reverse sweep, with the bounds' covariances carried in the same passes) and the row-wise bounds of
// kernel_model.hpp. The WY chunkwise algorithm's share of the bounds is in judge_wy.cpp.
#include "verify/judge_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#endif

namespace deltaproof::verify::judging {
namespace {

// Column kernels of the delta sweeps (judge_double_loops.inc), compiled twice from the same source: for
// x86-64's baseline (SSE2) and for AVX2 with FMA, picked once at run time. A run uses one of them
// throughout, and the state update spells out its rounding (updated() in the file), so the
// backward's recomputed states are the forward's bit for bit. The helpers pass 32-byte vectors by
// value; they are internal and inlined, so GCC's note that such calls change ABI with AVX does not
// apply.
// The kernels' arguments (see judge_double_loops.inc).
struct ForwardColumn {
  double alpha, kj;
  const double *bu, *rows;           // (DV)
  double kn, qn;                     // k_{t+1}(j), q_{t+1}(j)
  double *sk, *sq, *abs_sk, *rowsq;  // (DV) accumulators for t + 1
  const double* d_next;              // do_{t+1} (DV)
};

struct BackwardColumn {
  double p_alpha, p_bk;                    // α_p, β_p k_p(j)
  const double *p_gk, *p_rows;             // (DV)
  const double *dout, *abs_do;             // (DV)
  double qj, kj;
  const double *u, *prev;                  // u_t, S_{t−1} column j
  double *gk, *abs_gk, *g_rowsq, *f_rowsq, *f_abs_gq;  // (DV) accumulators
};
struct BackwardColumnSums {
  double g_cross = 0, f_colsq = 0, f_cross = 0, gtu = 0, gs = 0, g_colsq = 0;
};

#pragma GCC diagnostic ignored "-Wpsabi"
namespace baseline {
#include "verify/judge_double_loops.inc"
}  // namespace baseline
// DELTAPROOF_JUDGE_BASELINE_ONLY: the baseline kernels alone (a test build; what a CPU without AVX2 runs).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(DELTAPROOF_JUDGE_BASELINE_ONLY)
#define DELTAPROOF_AVX2_KERNELS 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define DELTAPROOF_KERNELS_FMA 1
namespace avx2 {
#include "verify/judge_double_loops.inc"
}  // namespace avx2
#undef DELTAPROOF_KERNELS_FMA
#pragma GCC pop_options
#endif

struct ColumnKernels {
  using Forward = void (*)(double*, Index, const ForwardColumn&, double&, double&, double&);
  using Backward = BackwardColumnSums (*)(double*, Index, const BackwardColumn&);
  Forward forward[8];    // [Bounds·4 + Next·2 + Grad]
  Backward backward[8];  // [Bounds·4 + Pending·2 + Gated]
  void (*update)(double*, const double*, Index, double, const double*, double);
  void (*covariance)(double*, Index, Index, double, const double*, const double*, const double*, double*,
                     const double*, double*);
};

#define DELTAPROOF_KERNEL_TABLE(ns)                                                                        \
  ColumnKernels {                                                                                          \
    {ns::forward_column<false, false, false>, ns::forward_column<false, false, true>,                      \
     ns::forward_column<false, true, false>,  ns::forward_column<false, true, true>,                       \
     ns::forward_column<true, false, false>,  ns::forward_column<true, false, true>,                       \
     ns::forward_column<true, true, false>,   ns::forward_column<true, true, true>},                       \
        {ns::backward_column<false, false, false>, ns::backward_column<false, false, true>,                \
         ns::backward_column<false, true, false>,  ns::backward_column<false, true, true>,                 \
         ns::backward_column<true, false, false>,  ns::backward_column<true, false, true>,                 \
         ns::backward_column<true, true, false>,   ns::backward_column<true, true, true>},                 \
        ns::update_column, ns::covariance_column                                                           \
  }

const ColumnKernels& column_kernels() {
#ifdef DELTAPROOF_AVX2_KERNELS
  static const ColumnKernels chosen =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? DELTAPROOF_KERNEL_TABLE(avx2) : DELTAPROOF_KERNEL_TABLE(baseline);
#else
  static const ColumnKernels chosen = DELTAPROOF_KERNEL_TABLE(baseline);
#endif
  return chosen;
}
#undef DELTAPROOF_KERNEL_TABLE

// ----------------------------------------------------------------------------------------------
// DeltaNet / Gated DeltaNet: the double oracle and row-wise bounds from the propagated error
// covariance (kernel_model.hpp).
//
// The state error E_t (DV × DK) is a sum of independent entrywise roundings; its key-side
// second-moment proxy C_t = Σ (coefficients²) (DK × DK) follows the transitions exactly:
//   C_t = α_t² A_t C_{t−1} A_t + diag(Σ_i Δ_ij²),   A_t = I − β_t k_t k_tᵀ,
// where Δ bounds the roundings of step t entrywise. Then, except with probability 2e^{−λ²/2},
// ‖E_t q‖ ≤ λ sqrt(qᵀ C_t q) and ‖E_t‖_F ≤ λ sqrt(tr C_t). Seen from the value side (E_tᵀ x,
// as in dq = S_tᵀ do), the diagonal v_t = Σ_s ‖Φ_{s→t}‖² rowsum(Δ_s²) with ‖Φ‖ ≤ Π α‖A‖ gives
// ‖E_tᵀ x‖ ≤ λ sqrt(Σ_i x_i² v_ti); each bound uses the smaller of that and ‖E_t‖_F ‖x‖.
// The cotangent G_t of S_t and its error covariances D_t (key side), w_t (value side) run the
// mirror image backwards.
//
// Δ = a·|X| + (rows ⊗ |k|) bounds one step's roundings entrywise (X the state or cotangent that
// the step reads); its second moments per key column and per value row expand as
//   Σ_i Δ_ij² = a²‖X_j‖² + 2a|k_j| (|X_j|·rows) + k_j²‖rows‖²,
//   Σ_j Δ_ij² = a²‖X_i‖² + 2a rows_i (|X||k|)_i + rows_i²‖k‖²,
// so the pass over X that the oracle makes anyway gives them. The state stored in operand
// precision (|δ| ≤ u|X| entrywise) once per 16 tokens is counted twice: it perturbs both the state
// a chunk kernel carries on and the V̄ it computes from it.


// Sum of x over tokens [t − w + 1, t] (backward window) or [t, t + w − 1] (forward window).
VectorD window_sums(const VectorD& x, long w, bool forward) {
  const Index n = x.size();
  VectorD prefix = VectorD::Zero(n + 1);
  for (Index i = 0; i < n; ++i) prefix(i + 1) = prefix(i) + x(i);
  VectorD out(n);
  for (Index t = 0; t < n; ++t) {
    const Index lo = forward ? t : std::max<Index>(0, t - w + 1), hi = forward ? std::min<Index>(n, t + w) : t + 1;
    out(t) = prefix(hi) - prefix(lo);
  }
  return out;
}


using ConstColumn = Eigen::Map<const VectorD>;

}  // namespace

// The read–correct–write recurrence (reference/ delta_rule and gated_delta_rule:
// token_recurrence_read_correct_write) and its reverse sweep (token_recurrence_backward) in double:
//   u_t = v_t − α_t S_{t−1} k_t,   S_t = α_t S_{t−1} + β_t u_t k_tᵀ,
//   o_t = α_t S_{t−1} q_t + β_t (k_t·q_t) u_t,   dq_t = S_tᵀ do_t = α_t S_{t−1}ᵀ do_t + β_t (u_t·do_t) k_t;
// backwards with G_t = G'_t + do_t q_tᵀ (G'_{L−1} = dS_L):
//   dv_t = β_t G_t k_t,  dβ_t = u_tᵀ G_t k_t,  dk_t = β_t (G_tᵀ u_t − α_t S_{t−1}ᵀ G_t k_t),
//   dα_t = <G_t, S_{t−1}> − β_t (G_t k_t)·(S_{t−1} k_t),   G'_{t−1} = α_t (G_t − β_t (G_t k_t) k_tᵀ),  dS_0 = G'_{−1}.
// One pass over each state-sized matrix per token: the pass that applies token t's update also
// reads what token t + 1 needs; the backward recomputes S_{t−1} from checkpoints. With a model,
// the same passes carry the bounds' covariances into `sweep`. dq, dk are with respect to the q, k
// used (scale and in-kernel normalisation are pulled back by the caller).
Truth delta_oracle(const UnitInputs& in, bool gradients, bool gated, const DeltaModel* model, DeltaSweep& sweep) {
  const Index L = in.q.rows(), DK = in.q.cols(), DV = in.v.cols();
  const bool bounds = model != nullptr;
  const long w = KernelModel::window;
  const MatrixD qT = in.q.transpose(), kT = in.k.transpose(), vT = in.v.transpose();  // (D, L): a token per column
  const MatrixD doT = gradients ? MatrixD(in.d_o->transpose()) : MatrixD();
  const VectorD& alpha = in.alpha;
  const double eps_acc = bounds ? model->eps_acc : 0, eps = bounds ? model->eps_op + model->eps_acc : 0;
  // A running state (and its cotangent) kept in 16 bits is rounded at every chunk boundary, at most
  // every 16 tokens; counted twice: it perturbs the state carried on and the V̄ computed from it.
  const double storage = bounds ? 2 * model->u_state * model->u_state : 0;
  // Gated: the kernel forms decays from fp32 cumulative sums over a chunk: relative error of α_t
  // at most u32·(2 + 64·Σ_{window}|g|).
  const VectorD gate_error =
      bounds && model->gated
          ? VectorD((0x1p-24 * (2.0 + double(w) * window_sums(in.log_gate.cwiseAbs(), w, false).array())).matrix())
          : VectorD::Zero(L);
  auto rho2 = [&](Index t) {  // ‖α_t A_t‖₂²
    return std::pow(alpha(t) * std::max(1.0, std::abs(1 - in.beta(t) * kT.col(t).squaredNorm())), 2);
  };
  DeltaSweep& sw = sweep;
  Truth tr;
  MatrixD oT(DV, L), dqT(DK, gradients ? L : 0);  // a token per column, transposed at the end
  MatrixD corrections(DV, L), s_k(gradients && gated ? DV : 0, L);  // u_t; S_{t−1} k_t
  // Checkpoints for the backward: S_{t−1} at every `interval`-th token, at most 256 of them.
  const Index interval = std::max<Index>(16, (L + 255) / 256);
  std::vector<MatrixD> checkpoints;

  // ---------------- forward
  MatrixD s = in.s0 ? *in.s0 : MatrixD::Zero(DV, DK);  // (DV, DK)
  MatrixD c = MatrixD::Zero(bounds ? DK : 0, bounds ? DK : 0);
  // What token t reads from S_{t−1}, filled by the pass before: S k, S q, |S||k|, row sums of S²,
  // and per column ‖S_j‖², S_jᵀ do. The n* twins are filled for t + 1 while token t's update runs.
  VectorD sk = VectorD::Zero(DV), sq = VectorD::Zero(DV), abs_sk = VectorD::Zero(DV), rowsq = VectorD::Zero(DV);
  VectorD colsq = VectorD::Zero(DK), sdo = VectorD::Zero(DK);
  VectorD nsk(DV), nsq(DV), nabs_sk(DV), nrowsq(DV), ncolsq = VectorD::Zero(DK), nsdo = VectorD::Zero(DK);
  VectorD cross = VectorD::Zero(DK), ck = VectorD::Zero(DK), nck(DK), cq(DK);  // C_{t−1} k_t; C_t k_{t+1}; C_t q_t
  VectorD value_side = VectorD::Zero(DV), rows = VectorD::Zero(DV), local_rows(DV), local_cols(DK), y(DK), u(DV);
  VectorD bu = VectorD::Zero(DV);
  const VectorD zero_k = VectorD::Zero(DK);
  if (bounds) {
    sw.n_state.resize(L + 1), sw.tr_c.resize(L + 1), sw.n_u.resize(L), sw.n_write.resize(L), sw.kck_before.resize(L);
    sw.qcq.resize(L), sw.n_sq.resize(L), sw.do_w.resize(L), sw.value_before.resize(DV, L);
    sw.n_state(0) = s.norm(), sw.tr_c(0) = 0;
  }
  const ColumnKernels& kernels = column_kernels();
  // One pass over S: token t's update (α = 1, βu = 0 for the first reads of S_0) and token t + 1's reads.
  auto s_pass = [&](Index t, double a, double kscale, VectorD& a_sk, VectorD& a_sq, VectorD& a_abs, VectorD& a_rows,
                    VectorD& a_colsq, VectorD& a_sdo) {
    const bool next = t + 1 < L;
    const ColumnKernels::Forward kernel = kernels.forward[(bounds ? 4 : 0) + (next ? 2 : 0) + (gradients ? 1 : 0)];
    a_sk.setZero(), a_sq.setZero(), a_abs.setZero(), a_rows.setZero();
    ForwardColumn f{a, 0, bu.data(), rows.data(), 0, 0, a_sk.data(), a_sq.data(), a_abs.data(), a_rows.data(),
                    next && gradients ? doT.col(t + 1).data() : nullptr};
    for (Index j = 0; j < DK; ++j) {
      f.kj = t >= 0 ? kscale * kT(j, t) : 0.0;
      if (next) f.kn = kT(j, t + 1), f.qn = qT(j, t + 1);
      kernel(s.col(j).data(), DV, f, cross(j), a_colsq(j), a_sdo(j));
    }
  };
  if (L > 0) s_pass(-1, 1.0, 0.0, sk, sq, abs_sk, rowsq, colsq, sdo);
  for (Index t = 0; t < L; ++t) {
    const auto k = kT.col(t), q = qT.col(t), v = vT.col(t);
    const double a = alpha(t), b = in.beta(t);
    const bool next = t + 1 < L;
    if (gradients && t % interval == 0) checkpoints.push_back(s);
    if (bounds && t % model->chunk_stride == 0) sw.chunk_starts.push_back(s);
    if (gradients && gated) s_k.col(t) = sk;
    u = v - a * sk;  // (DV)
    corrections.col(t) = u;
    bu = b * u;
    oT.col(t) = a * sq + (b * k.dot(q)) * u;
    if (gradients) dqT.col(t) = a * sdo + (b * u.dot(doT.col(t))) * k;
    if (bounds) rows = (eps_acc + model->eps_op) * std::abs(b) * (a * abs_sk + v.cwiseAbs());  // ε|β|(α|S_{t−1}||k| + |v|)
    s_pass(t, a, 1.0, nsk, nsq, nabs_sk, nrowsq, ncolsq, nsdo);
    if (bounds) {
      if (!next) nrowsq = s.rowwise().squaredNorm();
      // This step's roundings (accumulation, the write's operands, the decay), then the state
      // stored once per (smallest) chunk of 16 tokens.
      const double local_a = (eps_acc + gate_error(t)) * a, rows2 = rows.squaredNorm();
      for (Index j = 0; j < DK; ++j)
        local_cols(j) = local_a * local_a * colsq(j) + 2 * local_a * std::abs(k(j)) * cross(j) + k(j) * k(j) * rows2;
      local_rows = local_a * local_a * rowsq + 2 * local_a * rows.cwiseProduct(abs_sk) + k.squaredNorm() * rows.cwiseAbs2();
      if (t % 16 == 15) local_cols += storage * ncolsq, local_rows += storage * nrowsq;
      // C_t = α² (C − y kᵀ − k yᵀ) + diag(local), y = β ck − (β² kᵀck / 2) k  (= α² A C A + diag),
      // accumulating C_t q_t and C_t k_{t+1} in the same pass.
      sw.kck_before(t) = k.dot(ck);
      y = b * ck - (0.5 * b * b * sw.kck_before(t)) * k;
      cq.setZero(), nck.setZero();
      double trace = 0;
      const double* k_next = next ? kT.col(t + 1).data() : zero_k.data();
      for (Index j = 0; j < DK; ++j) {
        double* col = c.col(j).data();
        kernels.covariance(col, j, DK, a * a, y.data(), k.data(), q.data(), cq.data(), k_next, nck.data());
        col[j] += local_cols(j), cq(j) += local_cols(j) * q(j), nck(j) += local_cols(j) * k_next[j];
        trace += col[j];
      }
      sw.value_before.col(t) = value_side;
      value_side = rho2(t) * value_side + local_rows;
      sw.do_w(t) = gradients ? doT.col(t).cwiseAbs2().dot(value_side) : 0.0;
      sw.n_state(t + 1) = std::sqrt(ncolsq.sum());
      sw.n_u(t) = u.norm();
      sw.n_write(t) = std::abs(b) * sw.n_u(t) * k.norm();
      sw.tr_c(t + 1) = trace;
      sw.qcq(t) = q.dot(cq);
      sw.n_sq(t) = sw.n_state(t + 1) * q.norm();  // ≥ ‖|S_t||q_t|‖
      std::swap(ck, nck);
    }
    std::swap(sk, nsk), std::swap(sq, nsq), std::swap(abs_sk, nabs_sk), std::swap(rowsq, nrowsq);
    std::swap(colsq, ncolsq), std::swap(sdo, nsdo);
  }
  tr.o = oT.transpose(), tr.ht = s;
  if (bounds) sw.final_state = s;
  if (!gradients) return tr;

  // ---------------- backward, block by block from the checkpoints
  MatrixD g = in.d_st ? *in.d_st : MatrixD::Zero(DV, DK);  // G'_t, then G_t (DV, DK)
  MatrixD d = MatrixD::Zero(bounds ? DK : 0, bounds ? DK : 0);
  VectorD g_value_side = VectorD::Zero(DV);
  tr.dbeta.resize(L), tr.dg = VectorD::Zero(L);
  MatrixD dvT(DV, L), dkT(DK, L);
  if (bounds) {
    sw.n_g.resize(L), sw.tr_d.resize(L), sw.kdk.resize(L), sw.n_gk.resize(L), sw.n_abs_gk.resize(L);
    sw.u_v.resize(L), sw.gk_v.resize(L);
  }
  // Token p's transition G_p → G'_{p−1} waits for the pass of token p − 1, which applies it: its
  // G_p k_p, its local roundings' rows, |G_p||k_p|, per-row and per-column sums of G_p², D_p k_p.
  Index p = -1;
  VectorD p_gk = VectorD::Zero(DV), p_rows = VectorD::Zero(DV), p_abs_gk(DV), p_rowsq(DV), p_colsq(DK), p_dkv(DK);
  VectorD g_cross = VectorD::Zero(DK), gk(DV), abs_gk(DV), g_rowsq(DV), f_rowsq(DV), f_abs_gq(DV), abs_do(DV);
  VectorD formed_rows(DV), pending_rows(DV), f_colsq(DK), f_cross(DK), gtu(DK), g_colsq(DK), s_gk(DK), dkv(DK);
  VectorD formed_cols(DK), pending_cols(DK), yv(DK);
  auto pending_local = [&] {  // the local roundings of token p's transition, once g_cross is known
    const auto kp = kT.col(p);
    const double la = (eps_acc + gate_error(p)) * alpha(p), rows2 = p_rows.squaredNorm();
    for (Index j = 0; j < DK; ++j)
      pending_cols(j) = la * la * p_colsq(j) + 2 * la * std::abs(kp(j)) * g_cross(j) + kp(j) * kp(j) * rows2;
    pending_rows = la * la * p_rowsq + 2 * la * p_rows.cwiseProduct(p_abs_gk) + kp.squaredNorm() * p_rows.cwiseAbs2();
  };
  // D ← α_p² A_p D A_p + diag(pending) + diag(extra) (just + diag(extra) with none pending), with
  // D k_t accumulated in the same pass (t < 0: none). Returns the trace.
  auto d_pass = [&](const VectorD* extra, Index t) {
    const double bp = p >= 0 ? in.beta(p) : 0.0, a2 = p >= 0 ? alpha(p) * alpha(p) : 1.0;
    if (p >= 0) yv = bp * p_dkv - (0.5 * bp * bp * kT.col(p).dot(p_dkv)) * kT.col(p);
    else yv.setZero();
    const double* kp = p >= 0 ? kT.col(p).data() : zero_k.data();
    const double* kt = t >= 0 ? kT.col(t).data() : zero_k.data();
    dkv.setZero();
    double trace = 0;
    for (Index j = 0; j < DK; ++j) {
      double* col = d.col(j).data();
      kernels.covariance(col, j, DK, a2, yv.data(), kp, kt, dkv.data(), nullptr, nullptr);
      const double diag = (p >= 0 ? pending_cols(j) : 0.0) + (extra ? (*extra)(j) : 0.0);
      col[j] += diag, dkv(j) += diag * kt[j];
      trace += col[j];
    }
    return trace;
  };
  std::vector<MatrixD> before(size_t(std::min(interval, std::max<Index>(L, 1))));  // S_{t−1} for the block's t
  for (Index blk = Index(checkpoints.size()) - 1; blk >= 0; --blk) {
    const Index b0 = blk * interval, b1 = std::min(L, b0 + interval);
    before[0] = checkpoints[size_t(blk)];
    for (Index t = b0 + 1; t < b1; ++t) {  // the forward's states again, from the same arithmetic
      const MatrixD& from = before[size_t(t - b0 - 1)];
      MatrixD& to = before[size_t(t - b0)];
      to.resize(DV, DK);
      bu = in.beta(t - 1) * corrections.col(t - 1);
      for (Index j = 0; j < DK; ++j) kernels.update(to.col(j).data(), from.col(j).data(), DV, alpha(t - 1), bu.data(), kT(j, t - 1));
    }
    for (Index t = b1 - 1; t >= b0; --t) {
      const MatrixD& prev = before[size_t(t - b0)];  // S_{t−1}
      const auto k = kT.col(t), q = qT.col(t), dout = doT.col(t);
      const auto ut = std::as_const(corrections).col(t);
      const double a = alpha(t), b = in.beta(t);
      gk.setZero(), abs_gk.setZero(), g_rowsq.setZero(), f_rowsq.setZero(), f_abs_gq.setZero();
      abs_do = dout.cwiseAbs();
      const ColumnKernels::Backward kernel = kernels.backward[(bounds ? 4 : 0) + (p >= 0 ? 2 : 0) + (gated ? 1 : 0)];
      BackwardColumn bc{p >= 0 ? alpha(p) : 1.0, 0, p_gk.data(), p_rows.data(), dout.data(), abs_do.data(), 0, 0,
                        ut.data(), nullptr, gk.data(), abs_gk.data(), g_rowsq.data(), f_rowsq.data(), f_abs_gq.data()};
      double g_s = 0;  // <G_t, S_{t−1}>
      for (Index j = 0; j < DK; ++j) {
        bc.p_bk = p >= 0 ? in.beta(p) * kT(j, p) : 0.0;
        bc.qj = q(j), bc.kj = k(j), bc.prev = prev.col(j).data();
        const BackwardColumnSums r = kernel(g.col(j).data(), DV, bc);
        g_cross(j) = r.g_cross, f_colsq(j) = r.f_colsq, f_cross(j) = r.f_cross;
        gtu(j) = r.gtu, g_colsq(j) = r.g_colsq, g_s += r.gs;
      }
      s_gk.noalias() = prev.transpose() * gk;  // S_{t−1}ᵀ G_t k_t
      dvT.col(t) = b * gk;
      tr.dbeta(t) = ut.dot(gk);
      dkT.col(t) = b * (gtu - a * s_gk);
      if (gated) tr.dg(t) = a * (g_s - b * gk.dot(s_k.col(t)));  // dL/dg = α dL/dα
      if (bounds) {
        // The roundings of forming G_t: Δ = ε_acc|G'_t| + ε|do_t||q_t|ᵀ; the stored cotangent.
        const double e2 = eps * eps, ndo2 = dout.squaredNorm(), nq2 = q.squaredNorm();
        for (Index j = 0; j < DK; ++j)
          formed_cols(j) = eps_acc * eps_acc * f_colsq(j) + 2 * eps_acc * std::abs(q(j)) * eps * f_cross(j) + q(j) * q(j) * e2 * ndo2;
        formed_rows = eps_acc * eps_acc * f_rowsq + 2 * eps_acc * eps * abs_do.cwiseProduct(f_abs_gq) + (e2 * nq2) * dout.cwiseAbs2();
        if (t % 16 == 0) formed_cols += storage * g_colsq, formed_rows += storage * g_rowsq;
        if (p >= 0) {
          pending_local();
          g_value_side = rho2(p) * g_value_side + pending_rows;
        }
        sw.tr_d(t) = d_pass(&formed_cols, t);
        g_value_side += formed_rows;
        sw.u_v(t) = ut.cwiseAbs2().dot(g_value_side);
        sw.n_g(t) = std::sqrt(g_colsq.sum());
        sw.kdk(t) = k.dot(dkv);
        sw.n_gk(t) = gk.norm();
        sw.n_abs_gk(t) = abs_gk.norm();
        sw.gk_v(t) = gk.cwiseAbs2().dot(sw.value_before.col(t));
        p_rows = eps * a * std::abs(b) * abs_gk;
        p_abs_gk = abs_gk, p_rowsq = g_rowsq, p_colsq = g_colsq, p_dkv = dkv;
      }
      p = t, p_gk = gk;
    }
  }
  if (p >= 0) {  // token 0's transition: G'_{−1} = dS_0
    for (Index j = 0; j < DK; ++j) {
      auto col = g.col(j);
      if (bounds) g_cross(j) = col.cwiseAbs().dot(p_rows);
      col = alpha(p) * (col - (in.beta(p) * kT(j, p)) * p_gk);
    }
    if (bounds) {
      pending_local();
      sw.tr_d_initial = d_pass(nullptr, -1);
    }
  }
  tr.dh0 = g;
  tr.dq = dqT.transpose(), tr.dk = dkT.transpose(), tr.dv = dvT.transpose();
  return tr;
}

namespace {

// |q_t·k_s| over a band of tokens, as matrix products of 64-token blocks: for each t,
// Σ_{s ∈ [t − w + 1, t]} weight_s |q_t·k_s| (earlier) or Σ_{s ∈ [t, t + w − 1]} weight_s |q_s·k_t| (later).
VectorD banded_score_sums(const MatrixD& q, const MatrixD& k, const VectorD& weight, long w, bool later) {
  const Index L = q.rows();
  VectorD out = VectorD::Zero(L);
  MatrixD scores;
  for (Index b = 0; b < L; b += w) {
    const Index n = std::min<Index>(w, L - b);
    if (!later) {  // rows t ∈ [b, b + n), columns s ∈ [lo, b + n)
      const Index lo = std::max<Index>(0, b - w + 1);
      scores.noalias() = q.middleRows(b, n) * k.middleRows(lo, b + n - lo).transpose();
      for (Index t = b; t < b + n; ++t)
        for (Index s = std::max<Index>(lo, t - w + 1); s <= t; ++s) out(t) += weight(s) * std::abs(scores(t - b, s - lo));
    } else {  // rows t ∈ [b, b + n) of k, columns s ∈ [b, hi) of q
      const Index hi = std::min<Index>(L, b + n + w - 1);
      scores.noalias() = k.middleRows(b, n) * q.middleRows(b, hi - b).transpose();
      for (Index t = b; t < b + n; ++t)
        for (Index s = t; s < std::min<Index>(hi, t + w); ++s) out(t) += weight(s) * std::abs(scores(t - b, s - b));
    }
  }
  return out;
}

// The state a chunk holding token t carries to t, decayed as the chunk's cumulative gates weigh it
// (e^{G_t} S_[c] + Σ_{s ≤ t} e^{G_t − G_s} v̄_s k_sᵀ), by magnitude, over every chunk start in the
// window: start(t) = max_c ‖S_[c]‖ e^{P_t − P_{c−1}}, writes(t) = Σ_s ‖v̄_s‖‖k_s‖ e^{P_t − P_s} (P the
// prefix sums of the log-gates), and growth(t) = max_{n ∈ [t, t + w)} e^{P_n − P_t} ≥ the decay from t
// to the chunk's end (1 unless a gate exceeds 1).
struct DecayedState {
  VectorD start, writes, growth;
};
DecayedState decayed_state(const DeltaSweep& sw, const VectorD& log_gate, long w, bool gated) {
  const Index L = sw.n_write.size();
  VectorD P(L + 1);  // P(i + 1) = Σ_{j ≤ i} g_j
  P(0) = 0;
  for (Index i = 0; i < L; ++i) P(i + 1) = P(i) + (gated ? log_gate(i) : 0.0);
  DecayedState d{VectorD::Zero(L), VectorD::Zero(L), VectorD::Ones(L)};
  for (Index t = 0; t < L; ++t)
    for (Index c = std::max<Index>(0, t - w + 1); c <= t; ++c) {
      d.start(t) = std::max(d.start(t), sw.n_state(c) * std::exp(P(t + 1) - P(c)));
      d.writes(t) += sw.n_write(c) * std::exp(P(t + 1) - P(c + 1));
    }
  for (Index t = 0; t < L; ++t)
    for (Index n = t; n < std::min<Index>(L, t + w); ++n) d.growth(t) = std::max(d.growth(t), std::exp(P(n + 1) - P(t + 1)));
  return d;
}

}  // namespace

Bounds delta_bounds(const UnitInputs& in, const Truth& truth, const DeltaSweep& sw, const WyMoments& wy, bool gradients,
                    const DeltaModel& m, const OutputRoundoffs& u, double scale, bool normalised) {
  const Index L = in.q.rows();
  const long w = KernelModel::window;
  const VectorD& alpha = in.alpha;
  const double lam = m.lambda, eps = m.eps_op + m.eps_acc;
  const VectorD q_norms = in.q.rowwise().norm(), k_norms = in.k.rowwise().norm();
  Bounds bd;
  bd.o.resize(L, 1);
  // Window magnitudes (kernel_model.hpp): a chunk containing t starts at most w − 1 tokens before
  // it, so the state it starts from is one of S_{t−w} .. S_{t−1}; the chunk's writes before t and
  // reads after t are at most w tokens each, added by the triangle inequality.
  VectorD near_state(L);
  for (Index t = 0; t < L; ++t)
    near_state(t) = sw.n_state.segment(std::max<Index>(0, t + 1 - w), std::min<Index>(w, t + 1)).maxCoeff();
  // The in-chunk part of S_t q_t, Σ_{s ≤ t, within a window} |β_s| ‖u_s‖ |q_t·k_s|: its magnitude.
  const VectorD recent_writes = banded_score_sums(in.q, in.k, in.beta.cwiseAbs().cwiseProduct(sw.n_u), w, false);
  const VectorD o_norms = truth.o.rowwise().norm();
  const VectorD recent_v_bar = window_sums(in.beta.cwiseAbs().cwiseProduct(sw.n_u), w, false);
  // The state error seen by o_t: the token recurrence's (errors through every later transition) or
  // the WY form's (uncontracted within a chunk), whichever is larger; the state read as an operand
  // is the one at the chunk's start (‖S_[c]‖ ≤ near_state) or S_t.
  for (Index t = 0; t < L; ++t) {
    const double local = eps * (std::max(sw.n_sq(t), near_state(t) * q_norms(t)) + recent_writes(t));
    const double stat = lam * std::sqrt(std::max({0.0, sw.qcq(t), wy.qcq(t)})) + local;
    // Below the normal range a rounding is off by η absolutely: o's own store (per entry), the scores
    // and S_[c] as operands (the V̄ operands' η are in the WY moments).
    const double absolute = u.eta * std::sqrt(double(truth.o.cols())) +
                            m.eta_op * (std::sqrt(double(truth.o.cols())) * in.q.row(t).lpNorm<1>() + recent_v_bar(t));
    bd.o(t, 0) = stat + u.o * (o_norms(t) + stat) + absolute;
  }
  const double ht_stat = lam * std::sqrt(std::max({0.0, sw.tr_c(L), wy.tr_final}));
  bd.ht = MatrixD::Constant(1, 1, ht_stat + u.ht * (truth.ht.norm() + ht_stat) + u.eta * std::sqrt(double(truth.ht.size())));
  if (!gradients) return bd;

  const double dh0_stat = lam * std::sqrt(std::max(0.0, sw.tr_d_initial));
  bd.dh0 = MatrixD::Constant(1, 1, dh0_stat + u.dh0 * (truth.dh0.norm() + dh0_stat) + u.eta * std::sqrt(double(truth.dh0.size())));
  // Row bounds of the gradients at token t (kernel_model.hpp; σ are λ·sqrt of the covariances).
  // The in-chunk part of G_t k_t, Σ_{s ≥ t, within a window} ‖do_s‖ |q_s·k_t|: its magnitude.
  const VectorD do_norms = in.d_o->rowwise().norm();
  const VectorD later_reads = banded_score_sums(in.q, in.k, do_norms, w, true);
  VectorD do_q(L);
  for (Index t = 0; t < L; ++t) do_q(t) = do_norms(t) * q_norms(t);
  const VectorD g_mag = sw.n_g + window_sums(do_q, w, true);           // ≥ ‖G‖ at the chunk's end, plus its reads
  const VectorD s_mag = near_state + window_sums(sw.n_write, w, false);  // ≥ ‖S‖ at the chunk's start, plus its writes
  bd.dq.resize(L, 1), bd.dk.resize(L, 1), bd.dv.resize(L, 1), bd.dbeta.resize(L, 1), bd.dg = MatrixD::Zero(L, 1);
  // dg as a chunk kernel forms it: dG_i, the gradient of the chunk's cumulative log-gates, summed over
  // the chunk's later tokens. Each dG_i is a sum of terms that cancel, ⟨q_i, dq_i⟩ − ⟨k_i, dk_i⟩ (+ the
  // WY system's, terms of dk too), and at the chunk's end e^{G_n}⟨S_[c], dS_[c+1]⟩ + Σ_j ⟨k_j, dk_j⟩;
  // their roundings do not cancel, so the bound carries ε times their magnitudes
  // (proofs/kernel_error_bounds.md §7). At one token without h0, dg = 0 while ⟨q, dq⟩ is not.
  const DecayedState gated_state = decayed_state(sw, in.log_gate, w, m.gated);
  VectorD dg_terms(L), gate_terms(L), key_terms(L);
  for (Index t = 0; t < L; ++t) {
    const double nk = k_norms(t), ndo = do_norms(t), a = alpha(t), b = std::abs(in.beta(t));
    const double s_prev = sw.n_state(t);
    // The forward state's error before token t (S_{t−1}) and after it: token recurrence or WY form.
    const double wy_prev = t > 0 ? wy.tr_state(t - 1) : 0.0, wy_now = wy.tr_state(t);
    const double sig_prev = lam * std::sqrt(std::max({0.0, sw.tr_c(t), wy_prev}));
    const double sig_u = lam * a * std::max(std::sqrt(std::max(0.0, sw.kck_before(t))), std::sqrt(wy_prev) * nk);
    const double sig_g = lam * std::sqrt(std::max(0.0, sw.tr_d(t))), sig_gk = lam * std::sqrt(std::max(0.0, sw.kdk(t)));
    // Local magnitudes: |G_t| k_t with its in-chunk reads; G and S with the chunk's reads and writes.
    const double gk_mag = sw.n_abs_gk(t) + later_reads(t);
    const double sig_state_do =
        std::max(std::min(lam * std::sqrt(std::max(0.0, sw.tr_c(t + 1))) * ndo, lam * std::sqrt(std::max(0.0, sw.do_w(t)))),
                 lam * std::sqrt(wy_now) * ndo);
    const double dq_mag = s_mag(t) * ndo;  // what dq's and dk's local roundings act on
    const double dk_mag = b * (g_mag(t) * sw.n_u(t) + a * (s_prev * gk_mag + s_mag(t) * sw.n_abs_gk(t)));
    const double dq = sig_state_do + eps * dq_mag;
    const double dv = b * sig_gk + eps * b * gk_mag;
    const double dbeta = sw.n_u(t) * sig_gk + sig_u * sw.n_gk(t) + eps * (sw.n_u(t) + a * s_prev * nk) * gk_mag;
    // Value-side forms where they are smaller: F_tᵀ u_t, and E_{t−1}ᵀ (G_t k_t) (each ≤ its Frobenius form).
    const double sig_gu = std::min(sig_g * sw.n_u(t), lam * std::sqrt(std::max(0.0, sw.u_v(t))));
    const double sig_prev_gk = std::max(std::min(sig_prev * sw.n_gk(t), lam * std::sqrt(std::max(0.0, sw.gk_v(t)))),
                                        lam * std::sqrt(wy_prev) * sw.n_gk(t));
    const double dk = b * (sig_gu + sw.n_g(t) * sig_u + a * (sig_prev_gk + s_prev * sig_gk)) + eps * dk_mag;
    dg_terms(t) = a * (1 + b * nk * nk) * (sig_g * s_prev + sw.n_g(t) * sig_prev);
    const double dg_local = eps * a * s_prev * sw.n_g(t) * (1 + b * nk * nk);  // one token's term of the chunk sum
    key_terms(t) = eps * nk * dk_mag;  // dG_t's terms: ⟨q_t, dq_t⟩ and ⟨k_t, dk_t⟩'s magnitudes
    gate_terms(t) = dg_local + eps * q_norms(t) * ndo * (gated_state.start(t) + gated_state.writes(t)) + key_terms(t);
    bd.dq(t, 0) = dq;
    bd.dk(t, 0) = dk;
    bd.dv(t, 0) = dv;
    bd.dbeta(t, 0) = dbeta;
  }
  if (m.gated) {
    // dg_t sums dG_i over the following tokens of its chunk (a window after t), and every token of the
    // chunk receives the chunk's end terms: ⟨S_[c], G_[c+1]⟩ and Σ_j ⟨k_j, dk_j⟩ over a window each side.
    const VectorD chunk_keys = window_sums(key_terms, w, false) + window_sums(key_terms, w, true) - key_terms;
    bd.dg.col(0) = dg_terms + window_sums(gate_terms, w, true) + chunk_keys;
    for (Index t = 0; t < L; ++t) bd.dg(t, 0) += eps * gated_state.start(t) * gated_state.growth(t) * g_mag(t);
  }
  // Through scale and the in-kernel normalisation (rows of q, k): ‖J‖₂ ≤ |s|·r.
  bd.dq *= std::abs(scale);
  if (normalised) {
    bd.dq.array() /= (in.q_raw.rowwise().squaredNorm().array() + l2norm_eps).sqrt();
    bd.dk.array() /= (in.k_raw.rowwise().squaredNorm().array() + l2norm_eps).sqrt();
  }
  auto add_output_rounding = [&](MatrixD& bound, const MatrixD& truth, double u_out) {
    bound.col(0).array() += u.eta * std::sqrt(double(truth.cols()));
    bound.col(0).array() += u_out * (truth.rowwise().norm().array() + bound.col(0).array());
  };
  add_output_rounding(bd.dq, truth.dq, u.dq);
  add_output_rounding(bd.dk, truth.dk, u.dk);
  add_output_rounding(bd.dv, truth.dv, u.dv);
  add_output_rounding(bd.dbeta, MatrixD(truth.dbeta), u.dbeta);
  if (m.gated) add_output_rounding(bd.dg, MatrixD(truth.dg), u.dg);
  return bd;
}

}  // namespace deltaproof::verify::judging
