// verify::judge for linear attention: the double oracle (the chunkwise form in 64-token matrix
// products, its |inputs| magnitudes in the same loop) and the elementwise bounds of kernel_model.hpp.
#include "verify/judge_internal.hpp"

#include <algorithm>
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
// Linear attention: elementwise bounds ε·M + u_out(|y| + ε·M), M the forms on |inputs|.

namespace {

MatrixD elementwise_bound(const MatrixD& magnitude, const MatrixD& truth, double eps, double u_out, double eta) {
  const MatrixD accumulated = eps * magnitude;
  return (accumulated + u_out * (truth.cwiseAbs() + accumulated)).array() + eta;
}

}  // namespace

// Every term is a product of inputs, so the forms on |inputs| give Σ|terms| (no subtraction); `m`
// holds them as computed in double, at most a factor 1 − γ below the exact ones, which eps carries.
Bounds linear_bounds(const UnitInputs& in, const Truth& t, const Truth& m, bool gradients, double eps,
                     const OutputRoundoffs& u, double scale, bool normalised) {
  Bounds b;
  b.o = elementwise_bound(m.o, t.o, eps, u.o, u.eta);
  b.ht = elementwise_bound(m.ht, t.ht, eps, u.ht, u.eta);
  if (gradients) {
    b.dq = elementwise_bound(pull_back_magnitude(in.q_raw, m.dq, scale, normalised), t.dq, eps, u.dq, u.eta);
    b.dk = elementwise_bound(pull_back_magnitude(in.k_raw, m.dk, 1.0, normalised), t.dk, eps, u.dk, u.eta);
    b.dv = elementwise_bound(m.dv, t.dv, eps, u.dv, u.eta);
    b.dh0 = elementwise_bound(m.dh0, t.dh0, eps, u.dh0, u.eta);
  }
  return b;
}

}  // namespace deltaproof::verify::judging
