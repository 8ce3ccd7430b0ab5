#include "kernel_checks/delta_rule_backward_stages.hpp"

#include "cuda/delta_rule_backward_tensor_core.h"
#include "kernel_checks/delta_rule_backward_tensor_core_stages.hpp"
#include "kernel_checks/delta_rule_backward_programs.hpp"

#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/random_inputs.hpp"
#include "verify/matrix_comparison.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <tuple>

namespace deltaproof::verify::delta_rule {

namespace dt = deltaproof::verify;
namespace dr = ref::delta_rule;
namespace gdr = ref::gated_delta_rule;

Cotangents make_cotangents(const DeltaCase& c, bool with_final_state_gradient) {
  std::mt19937_64 engine(c.seed + 1);
  std::uniform_int_distribution<int> entry(-8, 8);
  Cotangents cot;
  cot.d_output = Tensor4<Exact>(c.batch, c.heads, c.length, c.value_dim);
  for (Exact& x : cot.d_output.data) x = Exact(entry(engine)) / 4;
  if (with_final_state_gradient) {
    cot.d_final_state = Tensor4<Exact>(c.batch, c.heads, c.value_dim, c.key_dim);
    for (Exact& x : cot.d_final_state->data) x = Exact(entry(engine)) / 4;
  }
  return cot;
}

void make_state_inner_product_dominant(HostInputs& in, Cotangents& cot) {
  for (Exact& x : in.initial_state.data) x = abs(x);
  if (cot.d_final_state)
    for (Exact& x : cot.d_final_state->data) x = abs(x);
  for (Exact& x : cot.d_output.data) x = 0;
}

namespace {

using namespace backward_programs;

// ---------------------------------------------------------------------------------------
// The checks of one head.

template <class S>
void check_head(const DeltaCase& c, const HostInputs& in, const Cotangents& cot, const BackwardResult& r, Index b, Index h,
                std::vector<Comparison>& rep) {
  if (!has(r.boundary) || !has(r.state_gradients) || !has(r.t))
    throw std::invalid_argument("check_backward_stages: the result holds no intermediates (run_backward with intermediates)");
  const BackwardUnits un = backward_units(c.dtype);
  const Index C = c.chunk, DK = c.key_dim, DV = c.value_dim, N = cuda::chunk_count(int(c.length), int(C));
  const Matrix<S> q = to<S>(in.q.head(b, h)), k = to<S>(in.k.head(b, h)), v = to<S>(in.v.head(b, h));
  const Vector<S> beta = to<S>(in.beta.head(b, h)).col(0), g = to<S>(in.log_gate.head(b, h)).col(0);
  const Matrix<S> d_out = to<S>(cot.d_output.head(b, h));
  const Matrix<S> s0 = c.with_initial_state ? to<S>(in.initial_state.head(b, h)) : Matrix<S>::Zero(DV, DK);
  const Matrix<S> dsl = cot.d_final_state ? to<S>(cot.d_final_state->head(b, h)) : Matrix<S>::Zero(DV, DK);
  const auto kernel = [&](const Tensor4<Exact>& t) { return to<S>(t.head(b, h)); };
  const Matrix<S> gate_all = kernel(r.gate_sums), a_all = kernel(r.a), t_all = kernel(r.t), p_all = kernel(r.scores);
  const Matrix<S> w_all = kernel(r.w), u_all = kernel(r.u), bnd = kernel(r.boundary), vbar_all = kernel(r.v_new);
  const Matrix<S> dvbar_all = kernel(r.d_v_new), grads = kernel(r.state_gradients), dw_all = kernel(r.d_w);
  const Matrix<S> e_all = has(r.e) ? kernel(r.e) : Matrix<S>(), dg_sum_all = has(r.d_gate_sums) ? kernel(r.d_gate_sums) : Matrix<S>();
  const Matrix<S> dq_all = kernel(r.dq), dk_all = kernel(r.dk), dv_all = kernel(r.dv), db_all = kernel(r.d_beta);

  auto add = [&](const std::string& stage, Index chunk, const Matrix<S>& candidate, const Matrix<S>& oracle, const Matrix<S>& bound) {
    rep.push_back(compare_within<S>(stage, candidate, oracle, bound, {b, h, chunk}));
  };
  auto exact = [](Index rows, Index cols) { return Matrix<S>(Matrix<S>::Zero(rows, cols)); };

  // S_[0] is S_0 and G_[N] is dS_L, exactly (a lost S_0 or a dropped dS_L shows here first).
  add("S_0", 0, Matrix<S>(bnd.topRows(DV)), s0, exact(DV, DK));
  add("dS_L", N - 1, Matrix<S>(grads.middleRows((N - 1) * DV, DV)), dsl, exact(DV, DK));

  for (const ref::Chunk& ch : ref::chunks_of(c.length, C)) {
    const Index n = ch.size, cc = ch.index, t0 = ch.begin;
    const Matrix<S> qc = q.middleRows(t0, n), kc = k.middleRows(t0, n), vc = v.middleRows(t0, n), doc = d_out.middleRows(t0, n);
    const Vector<S> bc = beta.segment(t0, n), bca = absolute(bc);
    const Matrix<S> qa = absolute(qc), ka = absolute(kc), va = absolute(vc), doa = absolute(doc);

    // G: one thread's sequential sum, i roundings for G_i; DeltaNet's must be exactly 0.
    const Vector<S> gk = gate_all.col(0).segment(t0, n);
    const auto add_in_chunk = [&](const std::string& stage, const auto&... m) { add(stage, cc, m...); };
    check_gate_sums<S>(add_in_chunk, gk, g, t0, c.gated, rho(n, 0, un.acc, 0), un);
    const Decays<S> x = decays_of<S>(gk, c.gated);
    double spread = 0;  // max |Ĝ_e − Ĝ_s|, e ≥ s
    for (Index i = 0; i < n; ++i)
      for (Index j = 0; j <= i; ++j) spread = std::max(spread, std::abs(ref::to_double(S(gk(i) - gk(j)))));
    const double eps = c.gated ? (std::expm1(un.acc * spread) * (1 + un.exp) + un.exp) * (1 + 1e-12) : 0.0;
    const auto rh = [&](long m, int decays) { return rho(m, decays, un.acc, eps); };

    // A (C×C, identity past a partial chunk): (β_i · k_i·k_j) · D_ij, dot product then two products.
    const Matrix<S> a_hat = a_all.middleRows(cc * C, C);
    Matrix<S> a_ref = Matrix<S>::Identity(C, C), a_mag = Matrix<S>::Zero(C, C);
    a_ref.topLeftCorner(n, n) += Value<S>::a_lower(kc, bc, x);
    a_mag.topLeftCorner(n, n) = Magnitude<S>::a_lower(ka, bca, x);
    if (has(r.a)) add("A", cc, a_hat, a_ref, bound_of<S>(a_mag, a_ref, rh(dot_depth(DK) + 2, 1), false, un));

    // T = Â⁻¹ by column forward substitution: along a path j < m_1 < … < i the sums contribute
    // (m_{l+1} − m_l) roundings each, at most n in all; magnitude (I − |strictly_lower(Â)|)⁻¹.
    const Matrix<S> t_hat = t_all.middleRows(cc * C, C), t_top = t_hat.topLeftCorner(n, n), ta = absolute(t_top);
    if (has(r.a)) {
      const Matrix<S> a_top = a_hat.topLeftCorner(n, n);
      Matrix<S> t_ref = Matrix<S>::Identity(C, C), t_mag = Matrix<S>::Identity(C, C);
      t_ref.topLeftCorner(n, n) = dr::invert_unit_lower_forward_substitution<S>(a_top);
      t_mag.topLeftCorner(n, n) = dr::invert_unit_lower_forward_substitution<S>(
          Matrix<S>(Matrix<S>::Identity(n, n) - dr::strictly_lower<S>(absolute(a_top))));
      add("T", cc, t_hat, t_ref, bound_of<S>(t_mag, t_ref, rh(n, 0), false, un));
    }

    // P (C×C, zero above the diagonal and past n): dot product, then × D.
    const Matrix<S> p_hat = p_all.middleRows(cc * C, C), p_top = p_hat.topLeftCorner(n, n);
    {
      Matrix<S> p_ref = Matrix<S>::Zero(C, C), p_mag = Matrix<S>::Zero(C, C);
      p_ref.topLeftCorner(n, n) = Value<S>::scores(qc, kc, x);
      p_mag.topLeftCorner(n, n) = Magnitude<S>::scores(qa, ka, x);
      add("P", cc, p_hat, p_ref, bound_of<S>(p_mag, p_ref, rh(dot_depth(DK) + 1, 1), false, un));
    }

    // W, U from T̂: β_j γ_j (1 rounding), × t_ij (1), an (i+1)-term FMA sum.
    const Matrix<S> w_hat = w_all.middleRows(t0, n), u_hat = u_all.middleRows(t0, n);
    {
      const Matrix<S> w_ref = Value<S>::w(t_top, kc, bc, x), u_ref = Value<S>::u(t_top, vc, bc);
      add("W", cc, w_hat, w_ref, bound_of<S>(Magnitude<S>::w(ta, ka, bca, x), w_ref, rh(n + 2, 1), false, un));
      add("U", cc, u_hat, u_ref, bound_of<S>(Magnitude<S>::u(ta, va, bca), u_ref, rh(n + 1, 0), false, un));
    }

    // V̄ = Û − Ŵ Ŝᵀ: a dot product of length DK, one subtraction.
    const Matrix<S> s_hat = bnd.middleRows(cc * DV, DV), sa = absolute(s_hat);
    const Matrix<S> vbar_hat = vbar_all.middleRows(t0, n), vbara = absolute(vbar_hat);
    {
      const Matrix<S> ref_value = Value<S>::v_new(u_hat, w_hat, s_hat);
      add("Vbar", cc, vbar_hat, ref_value,
          bound_of<S>(Magnitude<S>::v_new(absolute(u_hat), absolute(w_hat), sa), ref_value, rh(dot_depth(DK) + 1, 0), false, un));
    }

    // S_[c+1] = γ_{n−1} Ŝ + V̄̂ᵀ diag(λ) K: V̄ λ (1), an n-term sum, one FMA with γ_{n−1}.
    if (cc + 1 < N || has(r.final_state)) {
      const Matrix<S> s_next_hat = cc + 1 < N ? Matrix<S>(bnd.middleRows((cc + 1) * DV, DV)) : kernel(r.final_state);
      const Matrix<S> ref_value = Value<S>::s_next(s_hat, vbar_hat, kc, x);
      add(cc + 1 < N ? "S_next" : "final_state", cc, s_next_hat, ref_value,
          bound_of<S>(Magnitude<S>::s_next(sa, vbara, ka, x), ref_value, rh(n + 2, 1), false, un));
    }

    // O (forward recompute, stored in the dtype): two warp dot products, one FMA with γ_i.
    if (has(r.output)) {
      const Matrix<S> ref_value = Value<S>::output(qc, s_hat, p_top, vbar_hat, x);
      add("O", cc, Matrix<S>(kernel(r.output).middleRows(t0, n)), ref_value,
          bound_of<S>(Magnitude<S>::output(qa, sa, absolute(p_top), vbara, x), ref_value,
                      rh(std::max(dot_depth(DK), dot_depth(n)) + 1, 1), true, un));
    }

    // dV̄ from P̂, dO, K and Ĝ_[c+1]: two warp dot products, one FMA with λ_j.
    const Matrix<S> g_next = grads.middleRows(cc * DV, DV), ga = absolute(g_next);
    const Matrix<S> dvbar_hat = dvbar_all.middleRows(t0, n), dvbara = absolute(dvbar_hat);
    {
      const Matrix<S> ref_value = Value<S>::d_v_new(p_top, doc, kc, g_next, x);
      add("dVbar", cc, dvbar_hat, ref_value,
          bound_of<S>(Magnitude<S>::d_v_new(absolute(p_top), doa, ka, ga, x), ref_value,
                      rh(std::max(dot_depth(DK), dot_depth(n)) + 1, 1), false, un));
    }

    // G_[c] = γ_{n−1} Ĝ' + dOᵀ diag(γ) Q − dV̄̂ᵀ Ŵ: dO γ (1), a 2n-term sum, one FMA with γ_{n−1}.
    if (cc > 0 || has(r.d_initial_state)) {
      const Matrix<S> prev_hat = cc > 0 ? Matrix<S>(grads.middleRows((cc - 1) * DV, DV)) : kernel(r.d_initial_state);
      const Matrix<S> ref_value = Value<S>::s_grad(g_next, doc, qc, dvbar_hat, w_hat, x);
      add(cc > 0 ? "dS_prev" : "dS_0", cc, prev_hat, ref_value,
          bound_of<S>(Magnitude<S>::s_grad(ga, doa, qa, dvbara, absolute(w_hat), x), ref_value, rh(2 * n + 2, 1), false, un));
    }

    // dW = −dV̄̂ Ŝ: a DV-term sum.
    const Matrix<S> dw_hat = dw_all.middleRows(t0, n), dwa = absolute(dw_hat);
    {
      const Matrix<S> ref_value = Value<S>::d_w(dvbar_hat, s_hat);
      add("dW", cc, dw_hat, ref_value, bound_of<S>(Magnitude<S>::d_w(dvbara, sa), ref_value, rh(DV, 0), false, un));
    }

    // E = dA from T̂, dŴ, dV̄̂: dT (two warp dot products, β_j γ_j, a product, one FMA), then two
    // sums of at most n terms (X = Tᵀ dT, E = −X Tᵀ).
    Matrix<S> e_top = Matrix<S>::Zero(n, n);
    if (has(r.e)) {
      const Matrix<S> e_hat = e_all.middleRows(cc * C, C);
      e_top = e_hat.topLeftCorner(n, n);
      Matrix<S> e_ref = Matrix<S>::Zero(C, C), e_mag = Matrix<S>::Zero(C, C);
      e_ref.topLeftCorner(n, n) = Value<S>::adjoint(t_top, dvbar_hat, dw_hat, vc, kc, bc, x);
      e_mag.topLeftCorner(n, n) = Magnitude<S>::adjoint(ta, dvbara, dwa, va, ka, bca, x);
      add("dA", cc, e_hat, e_ref,
          bound_of<S>(e_mag, e_ref, rh(std::max(dot_depth(DV) + 1, dot_depth(DK) + 3) + 2 * n, 1), false, un));
    }
    const Matrix<S> ea = absolute(e_top);

    // dq: dO Ŝ (DV terms) and E_o K (E_o: a dot product × D, then an (i+1)-term sum), one FMA.
    {
      const Matrix<S> ref_value = Value<S>::dq(doc, s_hat, vbar_hat, kc, x);
      add("dq", cc, Matrix<S>(dq_all.middleRows(t0, n)), ref_value,
          bound_of<S>(Magnitude<S>::dq(doa, sa, vbara, ka, x), ref_value, rh(std::max<long>(DV + 1, dot_depth(DV) + n + 2), 1),
                      true, un));
    }
    // dk: E_oᵀ Q and (F + Fᵀ) K in one sum of at most 2n terms (E_o: dot product × D; F: Ê × D × β),
    // V̄̂ Ĝ' (DV terms) × λ and Tᵀ dŴ (n terms) × βγ, joined by two FMAs.
    {
      const Matrix<S> ref_value = Value<S>::dk(doc, vbar_hat, qc, g_next, t_top, dw_hat, e_top, kc, bc, x);
      const long m = std::max<long>({dot_depth(DV) + 2 * n + 3, 2 * n + 4, DV + 2, n + 3});
      add("dk", cc, Matrix<S>(dk_all.middleRows(t0, n)), ref_value,
          bound_of<S>(Magnitude<S>::dk(doa, vbara, qa, ga, ta, dwa, ea, ka, bca, x), ref_value, rh(m, 1), true, un));
    }
    // dv = β_i (T̂ᵀ dV̄̂)_i: an n-term sum, one product.
    {
      const Matrix<S> ref_value = Value<S>::dv(t_top, dvbar_hat, bc);
      add("dv", cc, Matrix<S>(dv_all.middleRows(t0, n)), ref_value,
          bound_of<S>(Magnitude<S>::dv(ta, dvbara, bca), ref_value, rh(n + 1, 0), true, un));
    }
    // dβ: Σ_j (Ê ⊙ D)_ij (k_i·k_j) (n terms after a dot product and a product), FMA with γ_i and the
    // lane-reduced <(Tᵀ dW)_i, k_i>, plus the lane-reduced <(Tᵀ dU)_i, v_i>.
    if (has(r.e)) {
      const Matrix<S> ref_value = column(Value<S>::d_beta(t_top, dvbar_hat, vc, dw_hat, kc, e_top, x));
      const long m = n + std::max(dot_depth(DK) + 3, dot_depth(DV) + 1);
      add("dbeta", cc, Matrix<S>(db_all.middleRows(t0, n)), ref_value,
          bound_of<S>(column(Magnitude<S>::d_beta(ta, dvbara, va, dwa, ka, ea, x)), ref_value, rh(m, 1), true, un));
    }
    // dG (gated): the longest chains are dγ (DV or n terms, a lane reduction, FMAs with β and γ), the
    // Z sums (a dot product, ×P̂ or ×D×β then FMA with kk, then 2n − 2 additions), dλ λ (DV terms,
    // a lane reduction, the n-term sum of the last token) and <G', S> (⌈DV·DK/256⌉ + 8 over the block).
    if (c.gated && has(r.e) && has(r.d_gate_sums)) {
      const Matrix<S> dg_hat = dg_sum_all.middleRows(t0, n);
      const Matrix<S> ref_value =
          column(Value<S>::d_gate_sums(doc, s_hat, qc, t_top, dw_hat, kc, vbar_hat, g_next, p_top, e_top, bc, x));
      const long m = std::max<long>({std::max<long>(DV, n) + dot_depth(DK) + 4,
                                     std::max<long>({dot_depth(DV) + 1, dot_depth(DK), 2}) + 2 * n + 2,
                                     DV + dot_depth(DK) + n + 3, (DV * DK + 255) / 256 + 10});
      add("dG", cc, dg_hat, ref_value,
          bound_of<S>(column(Magnitude<S>::d_gate_sums(doa, sa, qa, ta, dwa, ka, vbara, ga, absolute(p_top), ea, bca, x)),
                      ref_value, rh(m, 1), false, un));
      // dg from the kernel's own dĜ: the reverse sum, at most n roundings.
      const Vector<S> dgk = dg_hat.col(0);
      const Matrix<S> dg_ref = column(Value<S>::dg(dgk));
      add("dg", cc, Matrix<S>(kernel(r.d_log_gate).middleRows(t0, n)), dg_ref,
          bound_of<S>(column(Magnitude<S>::dg(absolute(dgk))), dg_ref, rh(n, 0), false, un));
    }
  }
}

// ---------------------------------------------------------------------------------------
// The oracle's chain, one head: the kernel's algorithm in exact (or 100-digit) arithmetic.

template <class S>
void oracle_head(const DeltaCase& c, const HostInputs& in, const Cotangents& cot, Index b, Index h, BackwardResult& r) {
  const Index C = c.chunk, DK = c.key_dim, DV = c.value_dim, L = c.length, N = cuda::chunk_count(int(L), int(C));
  const Matrix<S> q = to<S>(in.q.head(b, h)), k = to<S>(in.k.head(b, h)), v = to<S>(in.v.head(b, h));
  const Vector<S> beta = to<S>(in.beta.head(b, h)).col(0), g = to<S>(in.log_gate.head(b, h)).col(0);
  const Matrix<S> d_out = to<S>(cot.d_output.head(b, h));
  Matrix<S> state = c.with_initial_state ? to<S>(in.initial_state.head(b, h)) : Matrix<S>::Zero(DV, DK);
  Matrix<S> grad = cot.d_final_state ? to<S>(cot.d_final_state->head(b, h)) : Matrix<S>::Zero(DV, DK);

  const std::vector<ref::Chunk> chunks = ref::chunks_of(L, C);
  std::vector<Decays<S>> decay;
  std::vector<Matrix<S>> t(chunks.size()), p(chunks.size()), w(chunks.size()), vbar(chunks.size()), s(chunks.size());
  std::vector<Matrix<S>> g_next(chunks.size()), dvbar(chunks.size());
  Matrix<S> gate_sums(L, 1), a_out = Matrix<S>::Zero(N * C, C), t_out = Matrix<S>::Zero(N * C, C), p_out = Matrix<S>::Zero(N * C, C);
  Matrix<S> w_out(L, DK), u_out(L, DV), vbar_out(L, DV), o_out(L, DV), bnd(N * DV, DK), dvbar_out(L, DV), grads(N * DV, DK);
  for (const ref::Chunk& ch : chunks) {
    const Index n = ch.size, cc = ch.index, t0 = ch.begin;
    const Matrix<S> qc = q.middleRows(t0, n), kc = k.middleRows(t0, n), vc = v.middleRows(t0, n);
    const Vector<S> bc = beta.segment(t0, n);
    Vector<S> gsum(n);
    S running(0);
    for (Index i = 0; i < n; ++i) gsum(i) = running += c.gated ? g(t0 + i) : S(0);
    gate_sums.middleRows(t0, n) = gsum;
    decay.push_back(decays_of<S>(gsum, c.gated));
    const Decays<S>& x = decay.back();
    const Matrix<S> a = Matrix<S>::Identity(n, n) + Value<S>::a_lower(kc, bc, x);
    t[cc] = dr::invert_unit_lower_forward_substitution<S>(a);
    p[cc] = Value<S>::scores(qc, kc, x);
    w[cc] = Value<S>::w(t[cc], kc, bc, x);
    const Matrix<S> u = Value<S>::u(t[cc], vc, bc);
    s[cc] = state;
    vbar[cc] = Value<S>::v_new(u, w[cc], state);
    a_out.block(cc * C, 0, C, C).setIdentity(), t_out.block(cc * C, 0, C, C).setIdentity();
    a_out.block(cc * C, 0, n, n) = a, t_out.block(cc * C, 0, n, n) = t[cc], p_out.block(cc * C, 0, n, n) = p[cc];
    w_out.middleRows(t0, n) = w[cc], u_out.middleRows(t0, n) = u, vbar_out.middleRows(t0, n) = vbar[cc];
    o_out.middleRows(t0, n) = Value<S>::output(qc, state, p[cc], vbar[cc], x);
    bnd.middleRows(cc * DV, DV) = state;
    state = Value<S>::s_next(state, vbar[cc], kc, x);
  }
  for (Index cc = N - 1; cc >= 0; --cc) {
    const ref::Chunk& ch = chunks[size_t(cc)];
    const Index n = ch.size, t0 = ch.begin;
    g_next[cc] = grad;
    grads.middleRows(cc * DV, DV) = grad;
    dvbar[cc] = Value<S>::d_v_new(p[cc], Matrix<S>(d_out.middleRows(t0, n)), Matrix<S>(k.middleRows(t0, n)), grad, decay[cc]);
    dvbar_out.middleRows(t0, n) = dvbar[cc];
    grad = Value<S>::s_grad(grad, Matrix<S>(d_out.middleRows(t0, n)), Matrix<S>(q.middleRows(t0, n)), dvbar[cc], w[cc], decay[cc]);
  }
  Matrix<S> dq(L, DK), dk(L, DK), dv(L, DV), db(L, 1), dgs(L, 1), dg(L, 1), dw_out(L, DK), e_out = Matrix<S>::Zero(N * C, C);
  for (const ref::Chunk& ch : chunks) {
    const Index n = ch.size, cc = ch.index, t0 = ch.begin;
    const Matrix<S> qc = q.middleRows(t0, n), kc = k.middleRows(t0, n), vc = v.middleRows(t0, n), doc = d_out.middleRows(t0, n);
    const Vector<S> bc = beta.segment(t0, n);
    const Decays<S>& x = decay[size_t(cc)];
    const Matrix<S> dw = Value<S>::d_w(dvbar[cc], s[cc]);
    const Matrix<S> e = Value<S>::adjoint(t[cc], dvbar[cc], dw, vc, kc, bc, x);
    dw_out.middleRows(t0, n) = dw;
    e_out.block(cc * C, 0, n, n) = e;
    dq.middleRows(t0, n) = Value<S>::dq(doc, s[cc], vbar[cc], kc, x);
    dk.middleRows(t0, n) = Value<S>::dk(doc, vbar[cc], qc, g_next[cc], t[cc], dw, e, kc, bc, x);
    dv.middleRows(t0, n) = Value<S>::dv(t[cc], dvbar[cc], bc);
    db.middleRows(t0, n) = column(Value<S>::d_beta(t[cc], dvbar[cc], vc, dw, kc, e, x));
    const Vector<S> d_gsum = Value<S>::d_gate_sums(doc, s[cc], qc, t[cc], dw, kc, vbar[cc], g_next[cc], p[cc], e, bc, x);
    dgs.middleRows(t0, n) = column(d_gsum);
    dg.middleRows(t0, n) = column(Value<S>::dg(d_gsum));
  }
  const auto put = [&](Tensor4<Exact>& into, const Matrix<S>& m) { into.set_head(b, h, ref::matrix_cast<Exact>(m)); };
  put(r.dq, dq), put(r.dk, dk), put(r.dv, dv), put(r.d_beta, db), put(r.d_initial_state, grad);
  if (c.gated) put(r.d_log_gate, dg);
  put(r.gate_sums, gate_sums), put(r.a, a_out), put(r.t, t_out), put(r.scores, p_out), put(r.w, w_out), put(r.u, u_out);
  put(r.boundary, bnd), put(r.v_new, vbar_out), put(r.d_v_new, dvbar_out), put(r.state_gradients, grads), put(r.d_w, dw_out);
  put(r.e, e_out), put(r.d_gate_sums, dgs), put(r.output, o_out), put(r.final_state, state);
}

// Tensors of every field of a result, shaped for the case (d_log_gate only when gated).
BackwardResult shaped(const DeltaCase& c) {
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim, C = c.chunk;
  const Index N = cuda::chunk_count(int(L), int(C));
  BackwardResult r;
  r.dq = r.dk = Tensor4<Exact>(B, H, L, DK);
  r.dv = Tensor4<Exact>(B, H, L, DV);
  r.d_beta = Tensor4<Exact>(B, H, L, 1);
  if (c.gated) r.d_log_gate = Tensor4<Exact>(B, H, L, 1);
  r.d_initial_state = Tensor4<Exact>(B, H, DV, DK);
  r.gate_sums = r.d_gate_sums = Tensor4<Exact>(B, H, L, 1);
  r.a = r.t = r.scores = r.e = Tensor4<Exact>(B, H, N * C, C);
  r.w = r.d_w = Tensor4<Exact>(B, H, L, DK);
  r.u = r.v_new = r.d_v_new = r.output = Tensor4<Exact>(B, H, L, DV);
  r.boundary = r.state_gradients = Tensor4<Exact>(B, H, N * DV, DK);
  r.final_state = Tensor4<Exact>(B, H, DV, DK);
  return r;
}

}  // namespace

std::vector<Comparison> check_backward_stages(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                              const BackwardResult& r) {
  if (r.tensor_cores) return check_backward_stages_tensor_core(c, in, cot, r);
  std::vector<Comparison> rep;
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    if (c.gated) check_head<High>(c, in, cot, r, b, h, rep);
    else check_head<Exact>(c, in, cot, r, b, h, rep);
  });
  return rep;
}

BackwardResult oracle_backward_as_kernel(const DeltaCase& c, const HostInputs& in, const Cotangents& cot) {
  BackwardResult r = shaped(c);
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    if (c.gated) oracle_head<High>(c, in, cot, b, h, r);
    else oracle_head<Exact>(c, in, cot, b, h, r);
  });
  return r;
}

BackwardResult reference_gradients(const DeltaCase& c, const HostInputs& in, const Cotangents& cot) {
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim;
  BackwardResult r;
  r.dq = r.dk = Tensor4<Exact>(B, H, L, DK);
  r.dv = Tensor4<Exact>(B, H, L, DV);
  r.d_beta = Tensor4<Exact>(B, H, L, 1);
  if (c.gated) r.d_log_gate = Tensor4<Exact>(B, H, L, 1);
  r.d_initial_state = Tensor4<Exact>(B, H, DV, DK);
  ref::for_each_head(B, H, [&](Index b, Index h) {
    std::optional<Matrix<Exact>> s0, dsl;
    if (c.with_initial_state) s0 = in.initial_state.head(b, h);
    if (cot.d_final_state) dsl = cot.d_final_state->head(b, h);
    if (c.gated) {
      const auto high = [](const Matrix<Exact>& m) { return ref::matrix_cast<High>(m); };
      std::optional<Matrix<High>> s0h, dslh;
      if (s0) s0h = high(*s0);
      if (dsl) dslh = high(*dsl);
      const auto g = gdr::chunkwise_log_gate_backward<High>(
          {high(in.q.head(b, h)), high(in.k.head(b, h)), high(in.v.head(b, h)), high(in.beta.head(b, h)).col(0),
           high(in.log_gate.head(b, h)).col(0), s0h},
          {high(cot.d_output.head(b, h)), dslh}, c.chunk);
      r.dq.set_head(b, h, ref::matrix_cast<Exact>(g.dq)), r.dk.set_head(b, h, ref::matrix_cast<Exact>(g.dk));
      r.dv.set_head(b, h, ref::matrix_cast<Exact>(g.dv));
      r.d_beta.set_head(b, h, ref::matrix_cast<Exact>(Matrix<High>(g.d_beta)));
      r.d_log_gate.set_head(b, h, ref::matrix_cast<Exact>(Matrix<High>(g.d_alpha)));
      r.d_initial_state.set_head(b, h, ref::matrix_cast<Exact>(g.d_initial_state));
    } else {
      const auto g = dr::chunkwise_backward<Exact>(
          {in.q.head(b, h), in.k.head(b, h), in.v.head(b, h), in.beta.head(b, h).col(0), s0}, {cot.d_output.head(b, h), dsl},
          c.chunk);
      r.dq.set_head(b, h, g.dq), r.dk.set_head(b, h, g.dk), r.dv.set_head(b, h, g.dv);
      r.d_beta.set_head(b, h, Matrix<Exact>(g.d_beta)), r.d_initial_state.set_head(b, h, g.d_initial_state);
    }
  });
  return r;
}

namespace {
// The gated token recurrence's backward (reference/gated_delta_rule.hpp, token_recurrence_backward) on |q|,
// |k|, |v|, |β|, |dO|, |S_0|, |dS_L| (α > 0 already) with every − turned into +: each gradient's terms summed
// in absolute value. DeltaNet is α ≡ 1.
void append_magnitudes(const Matrix<double>& q, const Matrix<double>& k, const Matrix<double>& v, const Vector<double>& beta,
                       const Vector<double>& alpha, const Matrix<double>& s0, const Matrix<double>& d_out,
                       const Matrix<double>& d_final, bool gated, GradientTensors& out) {
  const Index L = q.rows();
  std::vector<Matrix<double>> states{s0};
  for (Index t = 0; t < L; ++t) {
    const Vector<double> kt = k.row(t).transpose();
    const Matrix<double> decayed = alpha(t) * states.back();
    const Vector<double> error = v.row(t).transpose() + decayed * kt;
    states.push_back(decayed + beta(t) * (error * kt.transpose()));
  }
  Matrix<double> grad = d_final;
  Matrix<double> dq(L, q.cols()), dk(L, k.cols()), dv(L, v.cols());
  Vector<double> d_beta(L), d_log_gate(L);
  for (Index t = L - 1; t >= 0; --t) {
    const Vector<double> kt = k.row(t).transpose(), d_out_t = d_out.row(t).transpose();
    const Matrix<double> decayed = alpha(t) * states[t];
    grad += d_out_t * q.row(t);
    const Vector<double> error = v.row(t).transpose() + decayed * kt, gk = grad * kt;
    dq.row(t) = (states[t + 1].transpose() * d_out_t).transpose();
    dv.row(t) = beta(t) * gk.transpose();
    d_beta(t) = error.dot(gk);
    dk.row(t) = beta(t) * (grad.transpose() * error + decayed.transpose() * gk).transpose();
    const Matrix<double> d_decayed = grad + beta(t) * (gk * kt.transpose());
    d_log_gate(t) = alpha(t) * d_decayed.cwiseProduct(states[t]).sum();  // dL/dg = α dL/dα
    grad = alpha(t) * d_decayed;
  }
  out.dq.push_back(dq), out.dk.push_back(dk), out.dv.push_back(dv), out.d_beta.push_back(d_beta);
  if (gated) out.d_log_gate.push_back(d_log_gate);
  out.d_initial_state.push_back(grad);
}
}  // namespace

DoubleGradients double_gradients(const DeltaCase& c, const HostInputs& in, const Cotangents& cot) {
  DoubleGradients out;
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    const auto d = [](const Matrix<Exact>& m) { return ref::matrix_cast<double>(m); };
    std::optional<Matrix<double>> s0, dsl;
    if (c.with_initial_state) s0 = d(in.initial_state.head(b, h));
    if (cot.d_final_state) dsl = d(cot.d_final_state->head(b, h));
    const Matrix<double> q = d(in.q.head(b, h)), k = d(in.k.head(b, h)), v = d(in.v.head(b, h));
    const Vector<double> beta = d(in.beta.head(b, h)).col(0);
    const dr::Cotangents<double> cd{d(cot.d_output.head(b, h)), dsl};
    const Vector<double> alpha =
        c.gated ? Vector<double>(d(in.log_gate.head(b, h)).col(0).array().exp()) : Vector<double>(Vector<double>::Ones(c.length));
    append_magnitudes(q.cwiseAbs(), k.cwiseAbs(), v.cwiseAbs(), beta.cwiseAbs(), alpha,
                      s0 ? Matrix<double>(s0->cwiseAbs()) : Matrix<double>(Matrix<double>::Zero(c.value_dim, c.key_dim)),
                      cd.d_output.cwiseAbs(),
                      dsl ? Matrix<double>(dsl->cwiseAbs()) : Matrix<double>(Matrix<double>::Zero(c.value_dim, c.key_dim)), c.gated,
                      out.magnitude);
    if (c.gated) {
      const auto g = gdr::token_recurrence_backward<double>({q, k, v, beta, alpha, s0}, cd);
      out.dq.push_back(g.dq), out.dk.push_back(g.dk), out.dv.push_back(g.dv), out.d_beta.push_back(g.d_beta);
      out.d_log_gate.push_back(Matrix<double>(g.d_alpha.cwiseProduct(alpha)));  // dL/dg = α dL/dα
      out.d_initial_state.push_back(g.d_initial_state);
    } else {
      const auto g = dr::token_recurrence_backward<double>({q, k, v, beta, s0}, cd);
      out.dq.push_back(g.dq), out.dk.push_back(g.dk), out.dv.push_back(g.dv), out.d_beta.push_back(g.d_beta);
      out.d_initial_state.push_back(g.d_initial_state);
    }
  });
  return out;
}

namespace {
// The kernel's gradients per head, in the order of gradient_names(c).
std::vector<std::pair<std::string, std::pair<std::vector<Matrix<double>>, const std::vector<Matrix<double>>*>>> gradient_pairs(
    const DeltaCase& c, const BackwardResult& r, const GradientTensors& reference) {
  std::vector<std::pair<std::string, std::pair<std::vector<Matrix<double>>, const std::vector<Matrix<double>>*>>> pairs = {
      {"dq", {heads_of(r.dq), &reference.dq}},       {"dk", {heads_of(r.dk), &reference.dk}},
      {"dv", {heads_of(r.dv), &reference.dv}},       {"dbeta", {heads_of(r.d_beta), &reference.d_beta}},
      {"dS_0", {heads_of(r.d_initial_state), &reference.d_initial_state}}};
  if (c.gated) pairs.push_back({"dg", {heads_of(r.d_log_gate), &reference.d_log_gate}});
  return pairs;
}
// The same gradients of one set (magnitudes), in the same order.
std::vector<const std::vector<Matrix<double>>*> gradients_in_order(const DeltaCase& c, const GradientTensors& g) {
  std::vector<const std::vector<Matrix<double>>*> out = {&g.dq, &g.dk, &g.dv, &g.d_beta, &g.d_initial_state};
  if (c.gated) out.push_back(&g.d_log_gate);
  return out;
}
}  // namespace

std::vector<Comparison> compare_gradients_end_to_end(const DeltaCase& c, const BackwardResult& r,
                                                     const GradientTensors& reference, double tau,
                                                     const GradientTensors* magnitudes) {
  // A gradient can cancel to (near) zero over ℝ while its terms do not: with DK = 1, β k² = 1 makes I − β k kᵀ
  // zero and dS_0 exactly 0, where the kernel's fp32 terms of size |dO||q| leave a residue. Accumulation leaves
  // at most γ_m u_acc of the terms' magnitude, m the longest chain (the state recurrence, a chunk, the two head
  // dimensions), so that is allowed on top of the normwise agreement.
  const double floor_unit = double(c.length + c.chunk + c.key_dim + c.value_dim + 16) * backward_units(c.dtype).acc;
  const auto scales = magnitudes != nullptr ? gradients_in_order(c, *magnitudes) : std::vector<const std::vector<Matrix<double>>*>{};
  std::vector<Comparison> rows;
  for (const auto& [name, pair] : gradient_pairs(c, r, reference)) {
    const std::vector<Matrix<double>>* scale = scales.empty() ? nullptr : scales[rows.size()];
    rows.push_back(compare_rows_normwise(name, pair.first, *pair.second, tau, c.heads, scale, floor_unit));
  }
  return rows;
}

// In units of the dtype's precision, as end_to_end_tau (the backward rounds nothing but its outputs).
double gradient_tau(DType d) {
  switch (d) {
    case DType::f64: return 0x1p-40;
    case DType::f32: return 0x1p-16;
    default: return 16 * backward_units(d).out;
  }
}

std::vector<std::pair<std::string, double>> gradient_relative_l2(const DeltaCase& c, const BackwardResult& r,
                                                                 const GradientTensors& reference) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, pair] : gradient_pairs(c, r, reference)) out.push_back({name, relative_l2_all(pair.first, *pair.second)});
  return out;
}

// ---------------------------------------------------------------------------------------
// Device runs.

BackwardDeviceInputs upload_backward_inputs(const DeltaCase& c, const HostInputs& in, const Cotangents& cot) {
  const DType acc = accumulator_dtype(c.dtype);
  BackwardDeviceInputs d{dt::upload(in.q, c.dtype), dt::upload(in.k, c.dtype), dt::upload(in.v, c.dtype),
                         dt::upload(in.beta, c.dtype), dt::upload(in.log_gate, acc), {}, dt::upload(cot.d_output, c.dtype), {}};
  if (c.with_initial_state) d.initial_state = dt::upload(in.initial_state, acc);
  if (cot.d_final_state) d.d_final_state = dt::upload(*cot.d_final_state, acc);
  return d;
}

BackwardBuffers allocate_backward(const DeltaCase& c, bool intermediates, bool forward) {
  const DType acc = accumulator_dtype(c.dtype);
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim, C = c.chunk;
  const Index N = cuda::chunk_count(int(L), int(C));
  BackwardBuffers f;
  f.dq = dt::allocate(c.dtype, B, H, L, DK);
  f.dk = dt::allocate(c.dtype, B, H, L, DK);
  f.dv = dt::allocate(c.dtype, B, H, L, DV);
  f.d_beta = dt::allocate(c.dtype, B, H, L, 1);
  if (c.gated) f.d_log_gate = dt::allocate(acc, B, H, L, 1);
  f.d_initial_state = dt::allocate(acc, B, H, DV, DK);
  if (intermediates) {
    f.gate_sums = dt::allocate(acc, B, H, L, 1);
    if (c.gated) f.d_gate_sums = dt::allocate(acc, B, H, L, 1);
    f.a = dt::allocate(acc, B, H, N * C, C);
    f.t = dt::allocate(acc, B, H, N * C, C);
    f.scores = dt::allocate(acc, B, H, N * C, C);
    f.e = dt::allocate(acc, B, H, N * C, C);
    f.w = dt::allocate(acc, B, H, L, DK);
    f.d_w = dt::allocate(acc, B, H, L, DK);
    f.u = dt::allocate(acc, B, H, L, DV);
    f.v_new = dt::allocate(acc, B, H, L, DV);
    f.d_v_new = dt::allocate(acc, B, H, L, DV);
    f.boundary = dt::allocate(acc, B, H, N * DV, DK);
    f.state_gradients = dt::allocate(acc, B, H, N * DV, DK);
  }
  if (forward) {
    f.output = dt::allocate(c.dtype, B, H, L, DV);
    f.final_state = dt::allocate(acc, B, H, DV, DK);
  }
  return f;
}

cuda::delta_rule::BackwardStageParams backward_params(const DeltaCase& c, const BackwardDeviceInputs& d, BackwardBuffers& f) {
  cuda::delta_rule::BackwardStageParams p;
  p.dtype = c.dtype;
  p.batch = int(c.batch), p.heads = int(c.heads), p.length = int(c.length);
  p.key_dim = int(c.key_dim), p.value_dim = int(c.value_dim), p.chunk_size = int(c.chunk);
  p.q = d.q.device.data(), p.k = d.k.device.data(), p.v = d.v.device.data(), p.beta = d.beta.device.data();
  p.log_gate = c.gated ? d.log_gate.device.data() : nullptr;
  p.initial_state = c.with_initial_state ? d.initial_state.device.data() : nullptr;
  p.d_output = d.d_output.device.data();
  p.d_final_state = d.d_final_state.device.count() ? d.d_final_state.device.data() : nullptr;
  p.dq = f.dq.data(), p.dk = f.dk.data(), p.dv = f.dv.data(), p.d_beta = f.d_beta.data();
  p.d_log_gate = c.gated ? f.d_log_gate.data() : nullptr;
  p.d_initial_state = f.d_initial_state.data();
  p.gate_sums = f.gate_sums.data(), p.wy_inverse = f.t.data(), p.w = f.w.data(), p.u = f.u.data();
  p.scores = f.scores.data(), p.boundary_states = f.boundary.data(), p.v_new = f.v_new.data(), p.d_v_new = f.d_v_new.data();
  p.state_gradients = f.state_gradients.data(), p.d_w = f.d_w.data(), p.wy_system = f.a.data();
  p.wy_system_adjoint = f.e.data(), p.gate_sum_gradients = f.d_gate_sums.data();
  p.output = f.output.data(), p.final_state = f.final_state.data();
  cuda::delta_rule::set_contiguous_strides(p);
  if (cuda::delta_rule::tensor_core_backward_applies(p)) p.scores = nullptr;  // P stays in registers there
  const std::size_t bytes = cuda::delta_rule::testing::workspace_bytes(p);
  if (bytes > f.workspace.bytes()) f.workspace = DeviceBuffer(bytes);
  p.workspace = bytes ? f.workspace.get() : nullptr;
  return p;
}

BackwardResult read_back(const DeltaCase& c, const BackwardBuffers& f) {
  const auto get = [](const DeviceTensor& t) { return t.data() ? dt::download(t) : Tensor4<Exact>(); };
  BackwardResult r;
  r.dq = get(f.dq), r.dk = get(f.dk), r.dv = get(f.dv), r.d_beta = get(f.d_beta);
  if (c.gated) r.d_log_gate = get(f.d_log_gate);
  r.d_initial_state = get(f.d_initial_state);
  r.gate_sums = get(f.gate_sums), r.a = get(f.a), r.t = get(f.t), r.scores = get(f.scores), r.w = get(f.w), r.u = get(f.u);
  r.boundary = get(f.boundary), r.v_new = get(f.v_new), r.d_v_new = get(f.d_v_new), r.state_gradients = get(f.state_gradients);
  r.d_w = get(f.d_w), r.e = get(f.e), r.d_gate_sums = get(f.d_gate_sums);
  r.output = get(f.output), r.final_state = get(f.final_state);
  return r;
}

BackwardResult run_backward(const DeltaCase& c, const HostInputs& in, const Cotangents& cot, bool intermediates) {
  const BackwardDeviceInputs d = upload_backward_inputs(c, in, cot);
  BackwardBuffers f = allocate_backward(c, intermediates);
  const cuda::delta_rule::BackwardStageParams p = backward_params(c, d, f);
  cuda::delta_rule::testing::backward(p);
  const bool tensor_cores = cuda::delta_rule::tensor_core_backward_applies(p);
  if (tensor_cores) f.scores = DeviceTensor();  // P stays in registers there: nothing to read back
  BackwardResult r = read_back(c, f);
  r.tensor_cores = tensor_cores;
  return r;
}

BackwardResult run_backward_forward(const DeltaCase& c, const HostInputs& in) {
  const Cotangents none = make_cotangents(c, false);
  const BackwardDeviceInputs d = upload_backward_inputs(c, in, none);
  BackwardBuffers f = allocate_backward(c, false, true);
  cuda::delta_rule::testing::backward_forward(backward_params(c, d, f));
  BackwardResult r;
  r.output = dt::download(f.output);
  r.final_state = dt::download(f.final_state);
  return r;
}

// ---------------------------------------------------------------------------------------
// The fp64 directional check.

namespace {
// <dO, O> + <dS_L, S_L> over every head, and the same with absolute values (its scale).
std::pair<High, High> pairing_of(const Cotangents& cot, const Tensor4<Exact>& output, const Tensor4<Exact>& final_state) {
  High value(0), scale(0);
  for (size_t i = 0; i < output.data.size(); ++i) {
    const High o = High(output.data[i]), w = High(cot.d_output.data[i]);
    value += w * o, scale += abs(w) * abs(o);
  }
  if (cot.d_final_state)
    for (size_t i = 0; i < final_state.data.size(); ++i) {
      const High s = High(final_state.data[i]), w = High(cot.d_final_state->data[i]);
      value += w * s, scale += abs(w) * abs(s);
    }
  return {value, scale};
}

Tensor4<Exact>& input_named(HostInputs& in, const std::string& tensor) {
  if (tensor == "q") return in.q;
  if (tensor == "k") return in.k;
  if (tensor == "v") return in.v;
  if (tensor == "beta") return in.beta;
  if (tensor == "g") return in.log_gate;
  if (tensor == "S_0") return in.initial_state;
  throw std::invalid_argument("check_directional_derivative: tensor must be q, k, v, beta, g or S_0, got " + tensor);
}
const Tensor4<Exact>& gradient_named(const BackwardResult& r, const std::string& tensor) {
  if (tensor == "q") return r.dq;
  if (tensor == "k") return r.dk;
  if (tensor == "v") return r.dv;
  if (tensor == "beta") return r.d_beta;
  if (tensor == "g") return r.d_log_gate;
  return r.d_initial_state;
}

// The oracle's forward at these inputs: output and final state (ℚ, or the 100-digit log-gate path).
std::pair<Tensor4<Exact>, Tensor4<Exact>> oracle_forward(const DeltaCase& c, const HostInputs& in) {
  Tensor4<Exact> o(c.batch, c.heads, c.length, c.value_dim), s(c.batch, c.heads, c.value_dim, c.key_dim);
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    std::optional<Matrix<Exact>> s0;
    if (c.with_initial_state) s0 = in.initial_state.head(b, h);
    if (c.gated) {
      const auto high = [](const Matrix<Exact>& m) { return ref::matrix_cast<High>(m); };
      std::optional<Matrix<High>> s0h;
      if (s0) s0h = high(*s0);
      const auto f = gdr::chunkwise_log_gate<High>({high(in.q.head(b, h)), high(in.k.head(b, h)), high(in.v.head(b, h)),
                                                    high(in.beta.head(b, h)).col(0), high(in.log_gate.head(b, h)).col(0), s0h},
                                                   c.chunk);
      o.set_head(b, h, ref::matrix_cast<Exact>(f.output)), s.set_head(b, h, ref::matrix_cast<Exact>(f.final_state));
    } else {
      const auto f = dr::chunkwise<Exact>({in.q.head(b, h), in.k.head(b, h), in.v.head(b, h), in.beta.head(b, h).col(0), s0}, c.chunk);
      o.set_head(b, h, f.output), s.set_head(b, h, f.final_state);
    }
  });
  return {o, s};
}
}  // namespace

DirectionalCheck check_directional_derivative(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                              const std::string& tensor, std::uint64_t direction_seed) {
  return check_directional_derivative(
      c, in, cot, tensor, direction_seed, [](const DeltaCase& x, const HostInputs& i) { return run_backward_forward(x, i); },
      [](const DeltaCase& x, const HostInputs& i, const Cotangents& t) { return run_backward(x, i, t, false); });
}

DirectionalCheck check_directional_derivative(const DeltaCase& c0, const HostInputs& in, const Cotangents& cot,
                                              const std::string& tensor, std::uint64_t direction_seed,
                                              const ForwardRunner& forward, const BackwardRunner& backward) {
  DeltaCase c = c0;
  c.dtype = DType::f64;
  HostInputs probe = in;
  const Tensor4<Exact>& base = input_named(probe, tensor);
  if (!has(base)) throw std::invalid_argument("check_directional_derivative: the case has no " + tensor);
  if (tensor == "g" && !c.gated) throw std::invalid_argument("check_directional_derivative: g needs a gated case");
  Tensor4<Exact> direction(base.batch, base.heads, base.rows, base.cols);
  ref::RandomDyadic random(direction_seed);
  for (Exact& x : direction.data) x = random.matrix<Exact>(1, 1)(0, 0);
  const Exact step = Exact(1) / 64;

  // P at x ± h u: the fp64 kernel forward and the oracle's, with the scale of P.
  const auto at = [&](const Exact& t) {
    HostInputs moved = in;
    Tensor4<Exact>& target = input_named(moved, tensor);
    for (size_t i = 0; i < target.data.size(); ++i) target.data[i] += t * direction.data[i];  // dyadic: exact in fp64
    const BackwardResult kernel = forward(c, moved);
    const auto [o, s] = oracle_forward(c, moved);
    return std::tuple{pairing_of(cot, kernel.output, kernel.final_state).first, pairing_of(cot, o, s).first,
                      pairing_of(cot, o, s).second};
  };
  const auto [kernel_plus, exact_plus, scale_plus] = at(step);
  const auto [kernel_minus, exact_minus, scale_minus] = at(-step);
  const High two_h = High(2 * step);
  const High kernel_difference = (kernel_plus - kernel_minus) / two_h, exact_difference = (exact_plus - exact_minus) / two_h;

  const BackwardResult kernel_grad = backward(c, in, cot);
  const BackwardResult exact_grad = reference_gradients(c, in, cot);
  const Tensor4<Exact>& kg = gradient_named(kernel_grad, tensor);
  const Tensor4<Exact>& eg = gradient_named(exact_grad, tensor);
  High kernel_derivative(0), exact_derivative(0), derivative_scale(0);
  for (size_t i = 0; i < direction.data.size(); ++i) {
    const High u = High(direction.data[i]);
    kernel_derivative += u * High(kg.data[i]);
    exact_derivative += u * High(eg.data[i]);
    derivative_scale += abs(u) * abs(High(eg.data[i]));
  }
  const High gap = exact_difference - exact_derivative;
  const double allowed_relative = 0x1p-36;
  const High allowed = High(allowed_relative) * ((scale_plus + scale_minus) / two_h + derivative_scale);
  const High error = abs((kernel_difference - kernel_derivative) - gap);

  DirectionalCheck out;
  out.central_difference = ref::to_double(kernel_difference);
  out.backward = ref::to_double(kernel_derivative);
  out.exact_gap = ref::to_double(gap);
  out.row.tensor = tensor;
  out.row.error = ref::to_double(error);
  out.row.bound = ref::to_double(allowed);
  out.row.max_abs = out.row.error;
  out.row.reference = ref::to_double(exact_derivative);
  out.row.count = 1;
  out.row.finite = std::isfinite(out.central_difference) && std::isfinite(out.backward);
  out.row.ratio = ratio_with_verdict(out.row.bound > 0 ? out.row.error / out.row.bound : INFINITY, error <= allowed);
  return out;
}

}  // namespace deltaproof::verify::delta_rule
