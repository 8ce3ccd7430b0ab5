// Stage checks of the tensor-core backward (cuda/delta_rule_backward_tensor_core.cu; bf16 inputs), in the pattern of
// the fp32 FMA backward's (delta_rule_backward_stages.cpp): every stage of every (batch, head, chunk) is
// recomputed by the oracle from the exact values the kernel read — its own Ĝ, T̂, Ŵ, Ŝ_[c], V̄̂, Ĝ_[c+1], dV̄̂,
// dŴ, Ê — and compared within a bound derived from the kernel's arithmetic:
//   |computed − exact| ≤ ρ · M + (stored gradients: u_out|x| + η) + floor,
//   ρ = (1 + γ_m(u_acc)) (1 + u)^r (1 + e) (1 + ε_D)^k − 1,
// where u_acc = 2⁻²³ (tensor-core sums may truncate), m counts the accumulations along the longest chain,
// u = 2⁻⁸ is one rounding of an operand to bf16 and r the most such roundings in one monomial, e sums the
// u² of the operands fed as hi + lo pairs (x = hi + lo to u² |x|) and of the dropped lo·lo products, and
// ε_D is a kernel decay's error (k of them). M is the stage's program on |inputs| (every − turned into +)
// with every rounded operand's magnitude raised by 2⁻¹¹⁸ ≥ η/u², so that ρ·M also covers the absolute error
// η of an operand that lands below bf16's normal range (the very-negative-gate regime).
// The forward stages (A, T, W, U, V̄, S_[c+1]) are the forward kernels' own, checked by check_stages as
// ScanArithmetic::state_pass (kernel_checks/delta_rule_stages.cpp).
#include "kernel_checks/delta_rule_backward_tensor_core_stages.hpp"

#include "kernel_checks/delta_rule_backward_programs.hpp"
#include "verify/matrix_comparison.hpp"

#include <algorithm>
#include <cmath>

namespace deltaproof::verify::delta_rule {

namespace {

using namespace backward_programs;

constexpr double kU = 0x1p-8;           // bf16 operand rounding
constexpr double kU2 = kU * kU;         // residual of a hi + lo pair
constexpr double kUAcc = 0x1p-23;       // tensor-core accumulation
constexpr double kU32 = 0x1p-24;        // fp32 SIMT rounding
constexpr double kInflation = 0x1p-118;  // η_bf16 / u² (η_bf16 = 2⁻¹³⁴)

double rho_tensor_core(long m, int roundings, double extra, int decays, double eps) {
  const double r = (1 + ref::gamma(m, kUAcc)) * std::pow(1 + kU, roundings) * (1 + extra) * std::pow(1 + eps, decays) - 1;
  return r * (1 + 1e-12);
}

// |x| raised by the inflation: the magnitude of an operand the kernel rounds to bf16.
template <class S>
Matrix<S> rounded(const Matrix<S>& x) {
  return Matrix<S>(x.cwiseAbs().array() + S(kInflation));
}

template <class S>
Matrix<S> strictly_lower(const Matrix<S>& m) {
  return dr::strictly_lower<S>(m);
}

template <class S>
void check_head_tensor_core(const DeltaCase& c, const HostInputs& in, const Cotangents& cot, const BackwardResult& r, Index b, Index h,
                     std::vector<Comparison>& rep) {
  const BackwardUnits un = backward_units(c.dtype);
  const Index C = c.chunk, DK = c.key_dim, DV = c.value_dim, N = cuda::chunk_count(int(c.length), int(C));
  const Matrix<S> q = to<S>(in.q.head(b, h)), k = to<S>(in.k.head(b, h)), v = to<S>(in.v.head(b, h));
  const Vector<S> beta = to<S>(in.beta.head(b, h)).col(0), g = to<S>(in.log_gate.head(b, h)).col(0);
  const Matrix<S> d_out = to<S>(cot.d_output.head(b, h));
  const Matrix<S> dsl = cot.d_final_state ? to<S>(cot.d_final_state->head(b, h)) : Matrix<S>::Zero(DV, DK);
  const auto kernel = [&](const Tensor4<Exact>& t) { return to<S>(t.head(b, h)); };
  const Matrix<S> gate_all = kernel(r.gate_sums), t_all = kernel(r.t), w_all = kernel(r.w), bnd = kernel(r.boundary);
  const Matrix<S> vbar_all = kernel(r.v_new), dvbar_all = kernel(r.d_v_new), grads = kernel(r.state_gradients);
  const Matrix<S> dw_all = kernel(r.d_w), e_all = kernel(r.e);
  const Matrix<S> dg_sum_all = has(r.d_gate_sums) ? kernel(r.d_gate_sums) : Matrix<S>();
  const Matrix<S> dq_all = kernel(r.dq), dk_all = kernel(r.dk), dv_all = kernel(r.dv), db_all = kernel(r.d_beta);

  auto add = [&](const std::string& stage, Index chunk, const Matrix<S>& candidate, const Matrix<S>& oracle, const Matrix<S>& bound) {
    rep.push_back(compare_within<S>(stage, candidate, oracle, bound, {b, h, chunk}));
  };
  add("dS_L", N - 1, Matrix<S>(grads.middleRows((N - 1) * DV, DV)), dsl, Matrix<S>::Zero(DV, DK));

  for (const ref::Chunk& ch : ref::chunks_of(c.length, C)) {
    const Index n = ch.size, cc = ch.index, t0 = ch.begin;
    const Matrix<S> qc = q.middleRows(t0, n), kc = k.middleRows(t0, n), vc = v.middleRows(t0, n), doc = d_out.middleRows(t0, n);
    const Vector<S> bc = beta.segment(t0, n), bca = absolute(bc);
    const Matrix<S> qa = absolute(qc), ka = absolute(kc), va = absolute(vc), doa = absolute(doc);

    // G: a warp's shuffle prefix sum, at most 7 additions deep; DeltaNet's must be exactly 0.
    const Vector<S> gk = gate_all.col(0).segment(t0, n);
    const auto add_in_chunk = [&](const std::string& stage, const auto&... m) { add(stage, cc, m...); };
    check_gate_sums<S>(add_in_chunk, gk, g, t0, c.gated, rho(7, 0, kU32, 0), un);
    const Decays<S> x = decays_of<S>(gk, c.gated);
    // A decay is 2^y (exp2_ftz, cuda/delta_rule_forward_kernels.cuh) of y = x · log2 e, x = Ĝ_e − Ĝ_s (e ≥ s) or
    // Ĝ_e, or of Ĝ_e · log2 e − Ĝ_s · log2 e (the gradient scan keeps its sums in that unit). log2 e rounded to
    // fp32, the products' and the subtraction's roundings each add a relative u of what they round, each at most
    // `reach` = max(|Ĝ_e − Ĝ_s|, |Ĝ_e|): ≤ 4u·reach on the exponent, 5u with room for second-order terms; then
    // exp2f's 2 ulp (results flushed below 2⁻¹²⁶ are the floor's).
    double reach = 0;
    for (Index i = 0; i < n; ++i)
      for (Index j = 0; j <= i; ++j)
        reach = std::max({reach, std::abs(ref::to_double(S(gk(i) - gk(j)))), std::abs(ref::to_double(gk(i)))});
    const double eps = c.gated ? (std::expm1(5 * kU32 * reach) * (1 + un.exp) + un.exp) * (1 + 1e-12) : 0.0;
    const int kd = c.gated ? 1 : 0;
    const Matrix<S> d_lower = x.d;  // D on and below the diagonal, 0 above

    const Matrix<S> t_top = t_all.middleRows(cc * C, C).topLeftCorner(n, n), tr = rounded(t_top);
    const Matrix<S> w_hat = w_all.middleRows(t0, n), s_hat = bnd.middleRows(cc * DV, DV);
    const Matrix<S> vbar_hat = vbar_all.middleRows(t0, n), dvbar_hat = dvbar_all.middleRows(t0, n);
    const Matrix<S> g_next = grads.middleRows(cc * DV, DV), dw_hat = dw_all.middleRows(t0, n);
    const Matrix<S> e_top = e_all.middleRows(cc * C, C).topLeftCorner(n, n), ea = absolute(e_top);
    const Matrix<S> scores = Value<S>::scores(qc, kc, x), scores_mag = Magnitude<S>::scores(qa, ka, x);

    // The reverse scan keeps G in fp32 registers and writes dV̄ as a pair (what stage 4 reads): the exposed pair
    // differs from the value it was formed from by u² of it (and η). G_[c+1] is exposed in fp32 from the registers.
    const auto pair_residual = [](const Matrix<S>& exposed) {
      return Matrix<S>((exposed.cwiseAbs() * S(kU2 * (1 + 1e-12))).array() + S(0x1p-134));  // u²|x| + η_bf16
    };
    // dV̄ = diag(λ) K Ĝ'ᵀ + Pᵀ dO: Ĝ' and P (formed in fp32 from the exact inputs, × decay) as hi + lo.
    {
      const Matrix<S> ref_value = Value<S>::d_v_new(scores, doc, kc, g_next, x);
      const Matrix<S> mag = Magnitude<S>::d_v_new(rounded(scores_mag), doa, ka, rounded(g_next), x);
      add("dVbar", cc, dvbar_hat, ref_value,
          Matrix<S>(bound_of<S>(mag, ref_value, rho_tensor_core(DK + n + 3, 0, kU2, kd, eps), false, un) + pair_residual(dvbar_hat)));
    }
    // G_[c] = γ_{n−1} G' + (diag(γ) dO)ᵀ Q − dV̄ᵀ W_hi from the registers' G' (Ĝ' exactly) and dV̄ rounded once
    // (within u(1 + u) of the pair dV̄̂), diag(γ) dO rounded once, W_hi = Ŵ − W_lo (|W_lo| ≤ u/(1 − u) |Ŵ|: one
    // rounding and 2u²); exposed in fp32 (dS_prev, dS_0).
    if (cc > 0 || has(r.d_initial_state)) {
      const Matrix<S> prev_hat = cc > 0 ? Matrix<S>(grads.middleRows((cc - 1) * DV, DV)) : kernel(r.d_initial_state);
      const Matrix<S> ref_value = Value<S>::s_grad(g_next, doc, qc, dvbar_hat, w_hat, x);
      const Matrix<S> mag = Magnitude<S>::s_grad(absolute(g_next), c.gated ? rounded(doc) : doa, qa, rounded(dvbar_hat),
                                                 rounded(w_hat), x);
      add(cc > 0 ? "dS_prev" : "dS_0", cc, prev_hat, ref_value,
          bound_of<S>(mag, ref_value, rho_tensor_core(2 * n + 2, 2, 3 * kU2, kd, eps), false, un));
    }

    // dW = −dV̄̂ Ŝ: dV̄ as hi + lo, Ŝ rounded once.
    {
      const Matrix<S> ref_value = Value<S>::d_w(dvbar_hat, s_hat);
      add("dW", cc, dw_hat, ref_value,
          bound_of<S>(Magnitude<S>::d_w(rounded(dvbar_hat), rounded(s_hat)), ref_value, rho_tensor_core(DV + 1, 1, kU2, 0, 0), false, un));
    }
    // E = strictly_lower(−X T̃ᵀ), X = fl(T̃ᵀ dT̃), dT = dV̄ (βV)ᵀ + dŴ (βγK)ᵀ: T, dT, X, dW, βV and βγK
    // rounded once (at most six in a monomial), dV̄ as hi + lo.
    const Matrix<S> bv_mag = rounded(Matrix<S>(dr::scale_rows<S>(bca, va)));
    const Matrix<S> bgk_mag = rounded(Matrix<S>(dr::scale_rows<S>(Vector<S>(bca.cwiseProduct(x.gamma)), ka)));
    {
      const Matrix<S> ref_value = [&] {
        Matrix<S> e = Matrix<S>::Zero(C, C);
        e.topLeftCorner(n, n) = Value<S>::adjoint(t_top, dvbar_hat, dw_hat, vc, kc, bc, x);
        return e;
      }();
      const Matrix<S> dt_mag = rounded(Matrix<S>(rounded(dvbar_hat) * bv_mag.transpose() + rounded(dw_hat) * bgk_mag.transpose()));
      const Matrix<S> x_mag = rounded(Matrix<S>(tr.transpose() * dt_mag));
      Matrix<S> mag = Matrix<S>::Zero(C, C);
      mag.topLeftCorner(n, n) = strictly_lower<S>(Matrix<S>(x_mag * tr.transpose()));
      add("dA", cc, Matrix<S>(e_all.middleRows(cc * C, C)), ref_value,
          bound_of<S>(mag, ref_value, rho_tensor_core(DV + DK + 2 * n + 4, 6, 2 * kU2, kd, eps), false, un));
    }
    const Matrix<S> eo_mag = rounded(Matrix<S>((doa * rounded(vbar_hat).transpose()).cwiseProduct(d_lower)));

    // dq = diag(γ) dO Ŝ + E_o K: Ŝ rounded once, V̄ as hi + lo, E_o rounded once (one rounding a monomial);
    // stored in bf16.
    {
      const Matrix<S> ref_value = Value<S>::dq(doc, s_hat, vbar_hat, kc, x);
      const Matrix<S> mag = dr::scale_rows<S>(x.gamma, Matrix<S>(doa * rounded(s_hat))) + eo_mag * ka;
      add("dq", cc, Matrix<S>(dq_all.middleRows(t0, n)), ref_value,
          bound_of<S>(mag, ref_value, rho_tensor_core(DV + n + 3, 1, kU2, kd, eps), true, un));
    }
    // dk = E_oᵀ Q + diag(λ) V̄̂ Ĝ' + diag(βγ) T̃ᵀ dW̃ + (F + Fᵀ) K, F = diag(β)(Ê ⊙ D) rounded once, Ĝ' rounded
    // once, V̄ as hi + lo.
    const Matrix<S> f_mag = rounded(Matrix<S>(dr::scale_rows<S>(bca, Matrix<S>(ea.cwiseProduct(d_lower)))));
    const Matrix<S> z1_mag = tr.transpose() * rounded(dw_hat);
    {
      const Matrix<S> ref_value = Value<S>::dk(doc, vbar_hat, qc, g_next, t_top, dw_hat, e_top, kc, bc, x);
      const Matrix<S> mag = eo_mag.transpose() * qa + dr::scale_rows<S>(x.lambda, Matrix<S>(rounded(vbar_hat) * rounded(g_next))) +
                            dr::scale_rows<S>(Vector<S>(bca.cwiseProduct(x.gamma)), z1_mag) + (f_mag + f_mag.transpose()) * ka;
      add("dk", cc, Matrix<S>(dk_all.middleRows(t0, n)), ref_value,
          bound_of<S>(mag, ref_value, rho_tensor_core(DV + DK + 3 * n + 6, 2, kU2, kd, eps), true, un));
    }
    // dv = diag(β) T̃ᵀ dV̄̂ (dV̄ as hi + lo).
    const Matrix<S> tu_mag = tr.transpose() * rounded(dvbar_hat);
    {
      const Matrix<S> ref_value = Value<S>::dv(t_top, dvbar_hat, bc);
      add("dv", cc, Matrix<S>(dv_all.middleRows(t0, n)), ref_value,
          bound_of<S>(Matrix<S>(dr::scale_rows<S>(bca, tu_mag)), ref_value, rho_tensor_core(n + 2, 1, kU2, 0, 0), true, un));
    }
    // dβ = rowsum(T̃ᵀ dV̄ ⊙ V) + γ ⊙ rowsum(T̃ᵀ dW̃ ⊙ K) + rowsum(Ê ⊙ D ⊙ K Kᵀ): row sums over warps' parts.
    {
      const Matrix<S> ref_value = column(Value<S>::d_beta(t_top, dvbar_hat, vc, dw_hat, kc, e_top, x));
      const Vector<S> mag = Vector<S>(tu_mag.cwiseProduct(va).rowwise().sum()) +
                            x.gamma.cwiseProduct(Vector<S>(z1_mag.cwiseProduct(ka).rowwise().sum())) +
                            Vector<S>(ea.cwiseProduct(d_lower).cwiseProduct(ka * ka.transpose()).rowwise().sum());
      add("dbeta", cc, Matrix<S>(db_all.middleRows(t0, n)), ref_value,
          bound_of<S>(column(mag), ref_value, rho_tensor_core(DV + DK + 2 * n + 40, 2, kU2, kd, eps), true, un));
    }
    // dG (gated): the longest chain is <G', S>: per-thread sums over the streamed tiles (at most DV·DK/256
    // terms), a 32-lane butterfly (5), then the warps' partials in order (at most 16). Ŝ and Ĝ' rounded once
    // (two roundings in <G', S>), V̄ as hi + lo.
    if (c.gated && has(r.d_gate_sums)) {
      const Matrix<S> dg_hat = dg_sum_all.middleRows(t0, n);
      const Matrix<S> ref_value =
          column(Value<S>::d_gate_sums(doc, s_hat, qc, t_top, dw_hat, kc, vbar_hat, g_next, scores, e_top, bc, x));
      const Matrix<S> mag = column(Magnitude<S>::d_gate_sums(doa, rounded(s_hat), qa, tr, rounded(dw_hat), ka, rounded(vbar_hat),
                                                             rounded(g_next), scores_mag, ea, bca, x));
      const long m = (DV * DK + 255) / 256 + 5 + 16 + DV + DK + 2 * C + 64;
      add("dG", cc, dg_hat, ref_value, bound_of<S>(mag, ref_value, rho_tensor_core(m, 2, kU2, kd, eps), false, un));
      // dg from the kernel's own dĜ: the reverse sum, at most n roundings (fp32).
      const Vector<S> dgk = dg_hat.col(0);
      const Matrix<S> dg_ref = column(Value<S>::dg(dgk));
      add("dg", cc, Matrix<S>(kernel(r.d_log_gate).middleRows(t0, n)), dg_ref,
          bound_of<S>(column(Magnitude<S>::dg(absolute(dgk))), dg_ref, rho(n, 0, kU32, 0), false, un));
    }
  }
}

}  // namespace

std::vector<Comparison> check_backward_stages_tensor_core(const DeltaCase& c, const HostInputs& in, const Cotangents& cot,
                                                   const BackwardResult& r) {
  if (!has(r.boundary) || !has(r.state_gradients) || !has(r.t) || !has(r.e) || !has(r.d_w))
    throw std::invalid_argument("check_backward_stages: the result holds no intermediates (run_backward with intermediates)");
  ForwardResult f;  // stages 1–2 are the forward's kernels in their backward modes (and r.output, when given, the
                    // training forward's, formed from them)
  f.final_state = r.final_state, f.w = r.w, f.u = r.u, f.v_new = r.v_new, f.a = r.a, f.t = r.t, f.boundary = r.boundary;
  f.output = r.output;
  f.arithmetic = ScanArithmetic::state_pass;
  std::vector<Comparison> rep = check_stages(c, in, f);
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    if (c.gated) check_head_tensor_core<High>(c, in, cot, r, b, h, rep);
    else check_head_tensor_core<Exact>(c, in, cot, r, b, h, rep);
  });
  return rep;
}

}  // namespace deltaproof::verify::delta_rule
