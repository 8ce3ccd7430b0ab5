// verify::judge for linear attention: the double oracle (the chunkwise form in 64-token matrix
// products, its |inputs| magnitudes in the same loop) and the elementwise bounds of kernel_model.hpp.
#include "verify/judge_internal.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace deltaproof::verify::judging {

// The double oracle of linear attention: the chunkwise form (the derivation's Equation 4, as
// reference/linear_attention.hpp's chunkwise and chunkwise_backward) in matrix products of 64-token
// chunks, on the inputs and, in the same chunk loop, on |inputs| for the magnitudes of the bounds.

constexpr Index linear_chunk = 64;

LinearOracle linear_chunkwise(const UnitInputs& in, bool gradients, bool magnitudes) {
  const Index L = in.q.rows(), DK = in.q.cols(), DV = in.v.cols();
  const Index chunks = (L + linear_chunk - 1) / linear_chunk;
  const int runs = magnitudes ? 2 : 1;
  const MatrixD abs_q = magnitudes ? MatrixD(in.q.cwiseAbs()) : MatrixD(), abs_k = magnitudes ? MatrixD(in.k.cwiseAbs()) : MatrixD();
  const MatrixD abs_v = magnitudes ? MatrixD(in.v.cwiseAbs()) : MatrixD();
  const MatrixD abs_do = magnitudes && gradients ? MatrixD(in.d_o->cwiseAbs()) : MatrixD();
  auto q_of = [&](int r) -> const MatrixD& { return r ? abs_q : in.q; };
  auto k_of = [&](int r) -> const MatrixD& { return r ? abs_k : in.k; };
  auto v_of = [&](int r) -> const MatrixD& { return r ? abs_v : in.v; };
  auto do_of = [&](int r) -> const MatrixD& { return r ? abs_do : *in.d_o; };
  LinearOracle out;
  for (int r = 0; r < runs; ++r) {
    Truth& t = r ? out.magnitude : out.value;
    const MatrixD &q = q_of(r), &k = k_of(r), &v = v_of(r);
    // S_[c+1] = S_[c] + V_[c]ᵀ K_[c],   O_[c] = Q_[c] S_[c]ᵀ + (Q_[c] K_[c]ᵀ ⊙ M) V_[c]
    MatrixD state = in.s0 ? (r ? MatrixD(in.s0->cwiseAbs()) : *in.s0) : MatrixD::Zero(DV, DK);  // (DV, DK)
    std::vector<MatrixD> boundary, scores;  // S_[c] and Q Kᵀ ⊙ M per chunk, for the backward
    t.o.resize(L, DV);
    MatrixD p;
    for (Index c = 0; c < chunks; ++c) {
      const Index b = c * linear_chunk, n = std::min(linear_chunk, L - b);
      p.noalias() = q.middleRows(b, n) * k.middleRows(b, n).transpose();  // (C, C)
      p.triangularView<Eigen::StrictlyUpper>().setZero();
      t.o.middleRows(b, n).noalias() = q.middleRows(b, n) * state.transpose();
      t.o.middleRows(b, n).noalias() += p * v.middleRows(b, n);
      if (gradients) boundary.push_back(state), scores.push_back(p);
      state.noalias() += v.middleRows(b, n).transpose() * k.middleRows(b, n);
    }
    t.ht = state;
    if (!gradients) continue;
    // G_[c] = G_[c+1] + dO_[c]ᵀ Q_[c] (G_[N] = dS_L); with E = dO Vᵀ ⊙ M per chunk:
    //   dQ = dO S_[c] + E K,  dK = Eᵀ Q + V G_[c+1],  dV = (Q Kᵀ ⊙ M)ᵀ dO + K G_[c+1]ᵀ
    const MatrixD& d_o = do_of(r);
    MatrixD grad = in.d_st ? (r ? MatrixD(in.d_st->cwiseAbs()) : *in.d_st) : MatrixD::Zero(DV, DK);  // (DV, DK)
    t.dq.resize(L, DK), t.dk.resize(L, DK), t.dv.resize(L, DV);
    MatrixD e;
    for (Index c = chunks - 1; c >= 0; --c) {
      const Index b = c * linear_chunk, n = std::min(linear_chunk, L - b);
      const auto qc = q.middleRows(b, n), kc = k.middleRows(b, n), vc = v.middleRows(b, n), dc = d_o.middleRows(b, n);
      e.noalias() = dc * vc.transpose();  // (C, C)
      e.triangularView<Eigen::StrictlyUpper>().setZero();
      t.dq.middleRows(b, n).noalias() = dc * boundary[size_t(c)];
      t.dq.middleRows(b, n).noalias() += e * kc;
      t.dk.middleRows(b, n).noalias() = e.transpose() * qc;
      t.dk.middleRows(b, n).noalias() += vc * grad;
      t.dv.middleRows(b, n).noalias() = scores[size_t(c)].transpose() * dc;
      t.dv.middleRows(b, n).noalias() += kc * grad.transpose();
      grad.noalias() += dc.transpose() * qc;
    }
    t.dh0 = grad;
  }
  return out;
}

// ----------------------------------------------------------------------------------------------
// The forward's state-side terms (proofs/kernel_error_bounds.md §6).
//
// A chunk kernel computes o_t = fl(q̂_t·Ŝ_b + Σ_{s=b..t} P̂_ts v_s) for the start b of t's chunk, with
// q̂ = scale·q rounded, Ŝ_b the state it read rounded as an operand and P̂ the scores rounded. Those
// roundings are relative to the values rounded, |S_b| and |q_t|·|k_s|, so they act on
//   A_t = |q_t| (|S_w| + Σ_{s=w..t} |v_s||k_s|ᵀ)ᵀ  ≥  |q_t| (|S_b| + Σ_{s=b..t} |v_s||k_s|ᵀ)ᵀ  for every b ≥ w,
// with w = b for a known chunk size and, for an unknown one, w the start of the 64-token block before
// t's (every chunk of ≤ 64 tokens holding t starts at or after it). Their absolute parts below the
// normal range (η_op each) weigh ‖q_t‖₁ (Ŝ_b), Σ_{s=w..t} |v_s| (P̂), |S_w|𝟙 + Σ_{s=w..t} ‖k_s‖₁|v_s| (q̂),
// and with keys normalised in the kernel ‖q_t‖₁ Σ_{s≤t} |v_s| (k̂, on every later token).
// A declared 16-bit state Ŝ is rounded at every chunk boundary b' (multiples of the chunk size, or of
// 16 when it is unknown: a superset of the boundaries of 16, 32 and 64, where a phantom boundary only
// adds to the bound) and once more at the sequence's end:
//   E_{b'} = (1 + u_s)((1 + ε_c) E_b + ε_c (|S_b| + Σ_{s=b..b'−1} |v_s||k_s|ᵀ)) + u_s |S_{b'}| + η_s,
// E_0 = u_s|S_0| + η_s where h0 is given (a kernel may hold h0 in its 16-bit state too); o_t reads a
// state with error ≤ E at the last boundary ≤ t (E only grows).

LinearStateTerms linear_state_terms(const UnitInputs& in, const LinearForwardModel& model) {
  const Index L = in.q.rows(), DK = in.q.cols(), DV = in.v.cols();
  const bool known = model.chunk_size > 0;
  const Index block = known ? Index(model.chunk_size) : KernelModel::window;
  const MatrixD aq = in.q.cwiseAbs(), ak = in.k.cwiseAbs(), av = in.v.cwiseAbs();
  const VectorD q_l1 = aq.rowwise().sum(), k_l1 = ak.rowwise().sum();
  LinearStateTerms out;
  out.local.resize(L, DV), out.eta_weight.resize(L, DV);
  MatrixD state = in.s0 ? *in.s0 : MatrixD::Zero(DV, DK);  // S at the block's start (DV, DK)
  MatrixD before = state.cwiseAbs();                       // |S_w| + Σ_{w ≤ s < b} |v_s||k_s|ᵀ (DV, DK)
  VectorD before_eta = before.rowwise().sum();             // |S_w|𝟙 + Σ_{w ≤ s < b} (1 + ‖k_s‖₁)|v_s| (DV)
  VectorD v_prefix = VectorD::Zero(DV);                    // Σ_{s < b} |v_s|
  MatrixD p;
  for (Index b = 0; b < L; b += block) {
    const Index n = std::min(block, L - b);
    const auto qa = aq.middleRows(b, n), ka = ak.middleRows(b, n), va = av.middleRows(b, n);
    p.noalias() = qa * ka.transpose();  // (n, n)
    p.triangularView<Eigen::StrictlyUpper>().setZero();
    out.local.middleRows(b, n).noalias() = qa * before.transpose();
    out.local.middleRows(b, n).noalias() += p * va;
    VectorD running = before_eta;
    for (Index r = 0; r < n; ++r) {
      running += (1 + k_l1(b + r)) * va.row(r).transpose();
      v_prefix += va.row(r).transpose();
      out.eta_weight.row(b + r) = (running.array() + q_l1(b + r)).matrix().transpose();
      if (model.normalised) out.eta_weight.row(b + r) += q_l1(b + r) * v_prefix.transpose();
    }
    const MatrixD at_start = state.cwiseAbs();
    state.noalias() += in.v.middleRows(b, n).transpose() * in.k.middleRows(b, n);
    if (known) {
      before = state.cwiseAbs();
      before_eta = before.rowwise().sum();
    } else {  // the next block's window starts here
      before = at_start;
      before.noalias() += va.transpose() * ka;
      before_eta = at_start.rowwise().sum();
      before_eta.noalias() += va.transpose() * (1 + k_l1.segment(b, n).array()).matrix();
    }
  }
  out.final_eta_weight = model.normalised ? MatrixD(v_prefix * VectorD::Ones(DK).transpose()) : MatrixD::Zero(DV, DK);
  if (model.u_state > 0) {
    const Index stride = known ? Index(model.chunk_size) : 16;
    const double us = model.u_state, ec = model.eps_chunk;
    MatrixD s = in.s0 ? *in.s0 : MatrixD::Zero(DV, DK);
    MatrixD e = in.s0 ? MatrixD((us * s.cwiseAbs()).array() + model.eta_state) : MatrixD::Zero(DV, DK);
    long roundings = in.s0 ? 1 : 0;
    out.state_error.resize(L, DV);
    for (Index b = 0; b < L; b += stride, ++roundings) {
      const Index n = std::min(stride, L - b);
      out.state_error.middleRows(b, n).noalias() = aq.middleRows(b, n) * e.transpose();
      MatrixD written = av.middleRows(b, n).transpose() * ak.middleRows(b, n);
      written += s.cwiseAbs();
      s.noalias() += in.v.middleRows(b, n).transpose() * in.k.middleRows(b, n);
      e = ((1 + us) * ((1 + ec) * e + ec * written) + us * s.cwiseAbs()).array() + model.eta_state;
    }
    out.final_state_error = e;
    // E is computed from the double oracle's |S_b|, each off by at most its γ times M.
    out.sensitivity = double(roundings) * (us + ec) * (1 + us) * std::pow((1 + us) * (1 + ec), double(roundings));
  }
  return out;
}

// ----------------------------------------------------------------------------------------------
// Linear attention's bounds. Gradients: elementwise ε·M + u_out(|y| + ε·M), M the forms on |inputs|.
// Forward: ε_o·A + (1 + ε_o)(ε_S·M + η_op·weights + |q|Eᵀ) for o, ε_S·M + E_L for ht, each stored once.

namespace {

MatrixD stored(const MatrixD& accumulated, const MatrixD& truth, double u_out, double eta) {
  return (accumulated + u_out * (truth.cwiseAbs() + accumulated)).array() + eta;
}

MatrixD elementwise_bound(const MatrixD& magnitude, const MatrixD& truth, double eps, double u_out, double eta) {
  return stored(eps * magnitude, truth, u_out, eta);
}

}  // namespace

// Every term is a product of inputs, so the forms on |inputs| give Σ|terms| (no subtraction); `m`
// holds them as computed in double, at most a factor 1 − γ below the exact ones (γ = eps.oracle, the
// double oracle's own), and the truth is off by at most γ·M.
Bounds linear_bounds(const UnitInputs& in, const Truth& t, const Truth& m, const LinearStateTerms& s, bool gradients,
                     const LinearEps& e, const OutputRoundoffs& u, double scale, bool normalised) {
  Bounds b;
  const double widen = 1 / (1 - e.oracle), absolute = e.eta_acc * double(e.depth);
  // M's coefficient: the state's chain, the oracle's own error, and that error in the |S| A and E are computed from.
  const double state = e.state + e.oracle * (1 + s.sensitivity);
  MatrixD o = e.local * s.local;
  o += (1 + e.local) * (state * m.o + e.eta_op * s.eta_weight) + e.local * e.oracle * m.o;
  if (s.state_error.size()) o += (1 + e.local) * s.state_error;
  b.o = stored((widen * o).array() + absolute, t.o, u.o, u.eta);
  MatrixD ht = state * m.ht + e.eta_op * s.final_eta_weight;
  if (s.final_state_error.size()) ht += s.final_state_error;
  b.ht = stored((widen * ht).array() + absolute, t.ht, u.ht, u.eta);
  if (gradients) {
    const double eps = e.gradients;
    b.dq = elementwise_bound(pull_back_magnitude(in.q_raw, m.dq, scale, normalised), t.dq, eps, u.dq, u.eta);
    b.dk = elementwise_bound(pull_back_magnitude(in.k_raw, m.dk, 1.0, normalised), t.dk, eps, u.dk, u.eta);
    b.dv = elementwise_bound(m.dv, t.dv, eps, u.dv, u.eta);
    b.dh0 = elementwise_bound(m.dh0, t.dh0, eps, u.dh0, u.eta);
  }
  return b;
}

}  // namespace deltaproof::verify::judging
