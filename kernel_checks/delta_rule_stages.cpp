#include "kernel_checks/delta_rule_stages.hpp"

#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "verify/judge.hpp"
#include "verify/matrix_comparison.hpp"

#include <cmath>
#include <random>
#include <sstream>
#include <tuple>

namespace deltaproof::verify::delta_rule {

using ref::Exact;
using ref::High;
using ref::Index;
using ref::Tensor4;
namespace dt = deltaproof::verify;
namespace dr = ref::delta_rule;
namespace gdr = ref::gated_delta_rule;

std::ostream& operator<<(std::ostream& os, const DeltaCase& c) {
  return os << (c.gated ? "gated" : "delta") << " B=" << c.batch << " H=" << c.heads << " L=" << c.length
            << " DK=" << c.key_dim << " DV=" << c.value_dim << " C=" << c.chunk << " dtype=" << cuda::name_of(c.dtype)
            << " S0=" << (c.with_initial_state ? "yes" : "no") << " seed=" << c.seed << " key_shift=" << c.key_shift
            << " gate_step=" << c.gate_step << (c.zero_gates ? " g=0" : "");
}

std::string describe(const DeltaCase& c) {
  std::ostringstream s;
  s << c;
  return s.str();
}

static int default_key_shift(Index key_dim) {
  int e = 0;
  while ((Index{1} << (2 * e)) < key_dim) ++e;  // 4^e >= DK, so ‖k‖² <= DK · (8/2^(3+e))² <= 1
  return e;
}

HostInputs make_inputs(const DeltaCase& c) {
  std::mt19937_64 engine(c.seed);
  std::uniform_int_distribution<int> entry(-8, 8), unit(1, 8), gate(0, 16);
  auto fill = [&](Index rows, Index cols, double scale) {
    Tensor4<Exact> t(c.batch, c.heads, rows, cols);
    for (Exact& x : t.data) x = Exact(entry(engine)) * Exact(scale);
    return t;
  };
  const int shift = c.key_shift >= 0 ? c.key_shift : default_key_shift(c.key_dim);
  HostInputs in;
  in.q = fill(c.length, c.key_dim, 0.25);
  in.k = fill(c.length, c.key_dim, std::ldexp(1.0, -(3 + shift)));
  in.v = fill(c.length, c.value_dim, 0.25);
  in.beta = Tensor4<Exact>(c.batch, c.heads, c.length, 1);
  for (Exact& x : in.beta.data) x = Exact(unit(engine)) / 8;
  in.log_gate = Tensor4<Exact>(c.batch, c.heads, c.length, 1);
  for (Exact& x : in.log_gate.data) x = c.zero_gates ? Exact(0) : -Exact(gate(engine)) * Exact(c.gate_step);
  if (c.with_initial_state) in.initial_state = fill(c.value_dim, c.key_dim, 0.25);
  return in;
}

DeviceInputs upload_inputs(const DeltaCase& c, const HostInputs& in) {
  DeviceInputs d{dt::upload(in.q, c.dtype), dt::upload(in.k, c.dtype), dt::upload(in.v, c.dtype),
                 dt::upload(in.beta, c.dtype), dt::upload(in.log_gate, DType::f32), {}};
  if (c.with_initial_state) d.initial_state = dt::upload(in.initial_state, DType::f32);
  return d;
}

ForwardBuffers allocate_forward(const DeltaCase& c, bool intermediates) {
  const Index B = c.batch, H = c.heads, L = c.length, N = cuda::chunk_count(int(L), int(c.chunk));
  ForwardBuffers f;
  f.output = dt::allocate(c.dtype, B, H, L, c.value_dim);
  f.final_state = dt::allocate(DType::f32, B, H, c.value_dim, c.key_dim);
  f.w = dt::allocate(c.dtype, B, H, L, c.key_dim);
  f.u = dt::allocate(c.dtype, B, H, L, c.value_dim);
  if (c.dtype != DType::f32) f.scores = dt::allocate(c.dtype, B, H, N * c.chunk, c.chunk);  // the register scan's P
  if (intermediates) {
    f.v_new = dt::allocate(DType::f32, B, H, L, c.value_dim);
    f.a = dt::allocate(DType::f32, B, H, N * c.chunk, c.chunk);
    f.t = dt::allocate(DType::f32, B, H, N * c.chunk, c.chunk);
    f.boundary = dt::allocate(DType::f32, B, H, N * c.value_dim, c.key_dim);
  }
  return f;
}

cuda::delta_rule::ForwardStageParams forward_params(const DeltaCase& c, const DeviceInputs& d, ForwardBuffers& f) {
  cuda::delta_rule::ForwardStageParams p;
  p.dtype = c.dtype;
  p.batch = int(c.batch), p.heads = int(c.heads), p.length = int(c.length);
  p.key_dim = int(c.key_dim), p.value_dim = int(c.value_dim), p.chunk_size = int(c.chunk);
  p.q = d.q.device.data(), p.k = d.k.device.data(), p.v = d.v.device.data(), p.beta = d.beta.device.data();
  p.log_gate = c.gated ? static_cast<const float*>(d.log_gate.device.data()) : nullptr;
  p.initial_state = c.with_initial_state ? static_cast<const float*>(d.initial_state.device.data()) : nullptr;
  p.output = f.output.data(), p.final_state = static_cast<float*>(f.final_state.data());
  p.w = f.w.data(), p.u = f.u.data(), p.scores = f.scores.data();
  p.wy_system = static_cast<float*>(f.a.data());
  p.wy_inverse = static_cast<float*>(f.t.data());
  p.v_new = static_cast<float*>(f.v_new.data());
  p.boundary_states = static_cast<float*>(f.boundary.data());
  cuda::delta_rule::set_contiguous_strides(p);
  return p;
}

ForwardResult read_back(const ForwardBuffers& f, bool intermediates) {
  ForwardResult r;
  r.output = dt::download(f.output);
  r.final_state = dt::download(f.final_state);
  r.w = dt::download(f.w);
  r.u = dt::download(f.u);
  if (intermediates) {
    r.v_new = dt::download(f.v_new);
    r.a = dt::download(f.a);
    r.t = dt::download(f.t);
    r.boundary = dt::download(f.boundary);
  }
  return r;
}

ForwardResult run_forward(const DeltaCase& c, const HostInputs& in, bool intermediates) {
  const DeviceInputs d = upload_inputs(c, in);
  ForwardBuffers f = allocate_forward(c, intermediates);
  const cuda::delta_rule::ForwardStageParams p = forward_params(c, d, f);
  cuda::delta_rule::testing::forward(p);
  ForwardResult r = read_back(f, intermediates);
  r.arithmetic = cuda::delta_rule::testing::uses_register_scan(p) ? ScanArithmetic::register_scan : ScanArithmetic::fallback_scan;
  return r;
}

Units units_of(DType d) {
  switch (d) {
    case DType::bf16: return {0x1p-8, 0x1p-8, 0x1p-134};
    case DType::f16: return {0x1p-11, 0x1p-11, 0x1p-25};
    default: return {0.0, u32, 0.0};
  }
}

// Π(1 + γ_{m_acc}(u_acc)) (1 + u_op)^op_roundings (1 + extra) − 1, rounded up.
static double rho(long acc_roundings, int op_roundings, double u_op, double extra = 0) {
  const double r = (1 + ref::gamma(acc_roundings, u_acc)) * std::pow(1 + u_op, op_roundings) * (1 + extra) - 1;
  return r * (1 + 1e-12);
}

// Relative error of the kernel's decays over one chunk (0 without gates). A decay is 2^y (exp2_ftz,
// cuda/delta_rule_forward_kernels.cuh) of y = (Ĝ_i − Ĝ_j) · log2 e, or of Ĝ_i · log2 e − Ĝ_j · log2 e (the
// register scan keeps its sums in that unit), with |Ĝ_i|, |Ĝ_j|, |G_i − G_j| ≤ Σ|g| over the chunk: the
// in-chunk sums are off by γ_C Σ|g| each; log2 e rounded to fp32, each product's rounding and the subtraction's
// add a relative u of what they round — at most 4u Σ|g| in e-units, 5u with room for second-order terms;
// exp2f's 2 ulp on top (a result flushed below 2⁻¹²⁶ is the floor's, below).
static double decay_error(bool gated, const Vector<High>& log_gate, Index chunk) {
  if (!gated) return 0;
  double sum = 0;
  for (Index i = 0; i < log_gate.size(); ++i) sum += std::abs(ref::to_double(log_gate(i)));
  const double shift = (2 * ref::gamma(chunk, u32) + 5 * u32) * sum;  // the exponent's error, in e-units
  return std::expm1(shift) * (1 + 0x1p-22) + 0x1p-22;
}

template <class S>
static Matrix<S> scalar_times(double x, const Matrix<S>& m) {
  return m * S(x);
}

template <class S>
static Matrix<S> to(const Matrix<Exact>& m) {
  return ref::matrix_cast<S>(m);
}

template <class S>
static Matrix<S> decay_matrix(bool gated, const Vector<High>& g) {
  if constexpr (std::is_same_v<S, High>) {
    if (gated) return gdr::decay_from_log_gates<High>(g);
  }
  return gdr::decay_from_gates<S>(Vector<S>::Ones(g.size()));
}

// Roundings a term of T's blocks of size `size` passes through, as the prepare kernel computes them (fp32
// fmaf, each one rounding): the 16×16 forward substitution x_ij = −Σ_{j≤m<i} a_im x_mj (sum in m order, a_im
// exact) puts i − j ≤ 15 on a term; a merge T21 = −T22 (A21 T11) multiplies computed factors, whose counts
// add (Higham, Lemma 3.3), and sums twice over ≤ s terms: D(2s) = 2 D(s) + 2s, so 15, 62, 188 at 16, 32, 64.
static long inverse_roundings(Index size) { return size <= 16 ? 15 : 2 * inverse_roundings(size / 2) + size; }

// One head, every chunk: A, T (whole, each 16×16 diagonal block, each merged block), W, U, V̄,
// S_[c+1] (boundary, or final when the result has it), O (when it has it). S is Exact for DeltaNet and
// High for Gated DeltaNet.
template <class S>
static void check_head_stages(const DeltaCase& c, const HostInputs& in, const ForwardResult& r, Index b, Index h,
                              std::vector<Comparison>& rep) {
  const Units un = units_of(c.dtype);
  // The register scan feeds S to W Sᵀ and Q Sᵀ as a hi + lo pair (x = hi + lo to u² |x|, η below the normal
  // range); the state pass also stores W and U as pairs and feeds W, U and the update's V̄ as pairs: every u_op
  // of those steps becomes u_op².
  const bool pairs = r.arithmetic == ScanArithmetic::state_pass;
  const bool s_pair = r.arithmetic != ScanArithmetic::fallback_scan;
  const double u_pair = un.op * un.op;
  const Index C = c.chunk, DK = c.key_dim, DV = c.value_dim, N = cuda::chunk_count(int(c.length), int(C));
  const Matrix<S> q = to<S>(in.q.head(b, h)), k = to<S>(in.k.head(b, h)), v = to<S>(in.v.head(b, h));
  const Vector<S> beta = to<S>(in.beta.head(b, h)).col(0);
  const Vector<High> g = ref::matrix_cast<High>(in.log_gate.head(b, h)).col(0);
  const Matrix<S> a_all = to<S>(r.a.head(b, h)), t_all = to<S>(r.t.head(b, h)), w_all = to<S>(r.w.head(b, h));
  const Matrix<S> u_all = to<S>(r.u.head(b, h)), vnew_all = to<S>(r.v_new.head(b, h));
  const bool has_output = !r.output.data.empty(), has_final = !r.final_state.data.empty();
  const Matrix<S> o_all = has_output ? to<S>(r.output.head(b, h)) : Matrix<S>();
  const Matrix<S> boundary = to<S>(r.boundary.head(b, h)), final_state = has_final ? to<S>(r.final_state.head(b, h)) : Matrix<S>();
  const Matrix<S> s0 = c.with_initial_state ? to<S>(in.initial_state.head(b, h)) : Matrix<S>::Zero(DV, DK);

  // One row per stage of this (batch, head, chunk), decided in S.
  auto add = [&](const std::string& stage, Index chunk, const Matrix<S>& kernel, const Matrix<S>& oracle, const Matrix<S>& bound) {
    rep.push_back(compare_within<S>(stage, kernel, oracle, bound, {b, h, chunk}));
  };
  auto exact_bound = [](Index rows, Index cols) { return Matrix<S>(Matrix<S>::Zero(rows, cols)); };
  // fp32 underflow: a result below 2⁻¹²⁶ may be flushed (the exp of a very negative exponent, the
  // products of tiny decayed entries), an absolute loss of at most 2⁻¹²⁶ per operation; over the
  // at most 2C + DK operations of one entry, scaled by at most the largest magnitude of that stage,
  // it stays below 2⁻¹¹⁰ · max(magnitude). Added to every stage bound as a constant floor.
  auto floor_of = [](const Matrix<S>& magnitude) {
    return Matrix<S>(Matrix<S>::Constant(magnitude.rows(), magnitude.cols(),
                                         S(0x1p-110) * (magnitude.size() ? S(magnitude.cwiseAbs().maxCoeff()) : S(0))));
  };

  // S_[0] is S_0 exactly (a lost S_0 shows here first).
  add("S_0", 0, boundary.topRows(DV), s0, exact_bound(DV, DK));

  for (const ref::Chunk& ch : ref::chunks_of(c.length, C)) {
    const Index n = ch.size, cc = ch.index;
    const Matrix<S> qc = q.middleRows(ch.begin, n), kc = k.middleRows(ch.begin, n), vc = v.middleRows(ch.begin, n);
    const Vector<S> bc = beta.segment(ch.begin, n), bca = bc.cwiseAbs();  // β < 0 is legal: magnitudes take |β|
    const Vector<High> gc = g.segment(ch.begin, n);
    const Matrix<S> decay = decay_matrix<S>(c.gated, gc);
    const Vector<S> gamma = gdr::chunk_gamma(decay), lambda = gdr::decay_to_end(decay);
    const Matrix<S> d = gdr::token_decay(decay);
    const S gamma_end = decay(n, 0);
    const double eps_d = decay_error(c.gated, gc, C);
    const Matrix<S> k_abs = kc.cwiseAbs(), q_abs = qc.cwiseAbs();

    // A (C×C with the identity past a partial chunk): fp32 Gram (DK products) × β × decay.
    const Matrix<S> a_hat = a_all.middleRows(cc * C, C);
    Matrix<S> a_ref = Matrix<S>::Identity(C, C), a_bound = exact_bound(C, C);
    a_ref.topLeftCorner(n, n) = c.gated ? gdr::wy_system<S>(kc, bc, decay) : dr::wy_system<S>(kc, bc);
    const Matrix<S> a_mag = dr::scale_rows<S>(bca, (k_abs * k_abs.transpose()).cwiseProduct(d));
    a_bound.topLeftCorner(n, n) = dr::strictly_lower<S>(Matrix<S>(scalar_times(rho(DK + 2, 0, 0, eps_d), a_mag) + floor_of(a_mag)));
    add("A", cc, a_hat, a_ref, a_bound);

    // T = Â⁻¹ (of the kernel's own A): forward substitution on 16×16 blocks and merge levels in fp32,
    // γ_D(u32) with D = inverse_roundings(C) (15, 62, 188; "2C roundings deep" would under-count
    // the merges' products at C = 64); magnitude (I − |strictly_lower(Â)|)⁻¹, the same program on |Â|.
    const Matrix<S> a_top = a_hat.topLeftCorner(n, n);
    const dr::BlockInverse<S> inv = dr::invert_unit_lower_blocked<S>(a_top, 16);
    const Matrix<S> t_mag_top = dr::invert_unit_lower_forward_substitution<S>(
        Matrix<S>(Matrix<S>::Identity(n, n) - dr::strictly_lower<S>(Matrix<S>(a_top.cwiseAbs()))));
    const Matrix<S> t_hat = t_all.middleRows(cc * C, C);
    Matrix<S> t_ref = Matrix<S>::Identity(C, C), t_mag = Matrix<S>::Identity(C, C);
    t_ref.topLeftCorner(n, n) = inv.t;
    t_mag.topLeftCorner(n, n) = t_mag_top;
    Matrix<S> t_bound = exact_bound(C, C);
    t_bound.topLeftCorner(n, n) = scalar_times(ref::gamma(inverse_roundings(C), u32), t_mag_top) + floor_of(t_mag_top);
    add("T", cc, t_hat, t_ref, t_bound);
    for (size_t blk = 0; blk < inv.diagonal_block_inverses.size(); ++blk) {
      const Index at = Index(blk) * 16;
      add("T16." + std::to_string(blk), cc, Matrix<S>(t_hat.block(at, at, 16, 16)), inv.diagonal_block_inverses[blk],
          Matrix<S>(scalar_times(ref::gamma(inverse_roundings(16), u32), Matrix<S>(t_mag.block(at, at, 16, 16))) +
                    Matrix<S>::Constant(16, 16, floor_of(t_mag_top)(0, 0))));
    }
    for (size_t level = 0; level < inv.merged_levels.size(); ++level)
      for (size_t blk = 0; blk < inv.merged_levels[level].size(); ++blk) {
        const Index size = Index(16) << (level + 1), at = Index(blk) * size;
        add("T" + std::to_string(size) + "." + std::to_string(blk), cc, Matrix<S>(t_hat.block(at, at, size, size)),
            inv.merged_levels[level][blk],
            Matrix<S>(scalar_times(ref::gamma(inverse_roundings(size), u32), Matrix<S>(t_mag.block(at, at, size, size))) +
                      Matrix<S>::Constant(size, size, floor_of(t_mag_top)(0, 0))));
      }

    // W = T̂ diag(βγ) K, U = T̂ diag(β) V: fp32 factor split hi + lo (residual u_op²), 2C
    // accumulations, stored in the dtype: |fl(x) − x| ≤ u_out|x| + η, the η for results in the
    // dtype's subnormal range (fp16 below 2⁻¹⁴: gated W entries reach 5e-7 there).
    const Matrix<S> t_top = t_hat.topLeftCorner(n, n), t_abs = t_top.cwiseAbs();
    const dr::WY<S> wy = c.gated ? gdr::wy_factors<S>(t_top, kc, vc, bc, gamma) : dr::wy_factors<S>(t_top, kc, vc, bc);
    const double r_w = rho(2 * C + 2, 0, 0, un.op * un.op + eps_d), r_u = rho(2 * C + 1, 0, 0, un.op * un.op);
    const Matrix<S> w_mag = t_abs * dr::scale_rows<S>(Vector<S>(bca.cwiseProduct(gamma)), k_abs);
    const Matrix<S> u_mag = t_abs * dr::scale_rows<S>(bca, Matrix<S>(vc.cwiseAbs()));
    const Matrix<S> ones_c = Matrix<S>::Ones(n, n);
    const double u_store = pairs ? u_pair : un.out;
    auto stored = [&](const Matrix<S>& ref_value, const Matrix<S>& mag, double r, const Matrix<S>& operand_abs) {
      return Matrix<S>(scalar_times(u_store, Matrix<S>(ref_value.cwiseAbs())) + scalar_times((1 + u_store) * r, mag) +
                       scalar_times(2 * un.eta, Matrix<S>(ones_c * operand_abs)) +
                       Matrix<S>::Constant(mag.rows(), mag.cols(), S(un.eta)) + floor_of(mag));
    };
    add("W", cc, Matrix<S>(w_all.middleRows(ch.begin, n)), wy.w, stored(wy.w, w_mag, r_w, k_abs));
    add("U", cc, Matrix<S>(u_all.middleRows(ch.begin, n)), wy.u, stored(wy.u, u_mag, r_u, Matrix<S>(vc.cwiseAbs())));

    // V̄ = Û − Ŵ Ŝᵀ with Ŝ = the kernel's S_[c]; S rounded to an operand, DK + 1 accumulations. State
    // pass: S as hi + lo (u²) and the dropped W_lo S_lo term (≤ u² |W||S|), both subnormal parts η.
    const Matrix<S> w_hat = w_all.middleRows(ch.begin, n), u_hat = u_all.middleRows(ch.begin, n);
    const Matrix<S> s_hat = boundary.middleRows(cc * DV, DV);
    const Matrix<S> vnew_hat = vnew_all.middleRows(ch.begin, n);
    const Matrix<S> vnew_ref = u_hat - w_hat * s_hat.transpose();
    const Matrix<S> vnew_mag = u_hat.cwiseAbs() + w_hat.cwiseAbs() * s_hat.cwiseAbs().transpose();
    const Matrix<S> vnew_eta = w_hat.cwiseAbs() * Matrix<S>::Ones(DK, DV);
    // State pass: V̄ is exposed as the pair it is written as (u² |V̄| more, and η).
    const double r_vnew = pairs ? rho(DK + 2, 0, 0, 2 * u_pair) : s_pair ? rho(DK + 1, 0, 0, u_pair) : rho(DK + 1, 1, un.op);
    const Matrix<S> vnew_stored = pairs ? Matrix<S>(scalar_times(u_pair, Matrix<S>(vnew_hat.cwiseAbs())).array() + S(un.eta))
                                        : Matrix<S>(Matrix<S>::Zero(n, DV));
    add("Vbar", cc, vnew_hat, vnew_ref,
        Matrix<S>(scalar_times(r_vnew, vnew_mag) + scalar_times((pairs ? 2 : 1) * un.eta, vnew_eta) + vnew_stored + floor_of(vnew_mag)));

    // S_[c+1] = γ_C Ŝ + V̄̂ᵀ diag(λ) K: decay in fp32, V̄ rounded to an operand (state pass: hi + lo), C + 1
    // accumulations.
    if (cc + 1 < N || has_final) {  // the last chunk's update only where the result has the final state
      const Matrix<S> s_next_hat = cc + 1 < N ? Matrix<S>(boundary.middleRows((cc + 1) * DV, DV)) : final_state;
      const Matrix<S> s_next_ref = s_hat * gamma_end + vnew_hat.transpose() * dr::scale_rows<S>(lambda, kc);
      // State pass: S_[c] is exposed in fp32 from the registers it is carried in; the update operand pair(λ V̄)
      // differs from λ V̄̂ = λ pair(V̄) by 2u² λ|V̄| (in the 3u² below).
      const Matrix<S> s_next_bound =
          scalar_times(rho(C + 2, 0, 0, eps_d), Matrix<S>(s_hat.cwiseAbs() * gamma_end)) +
          scalar_times(pairs ? rho(C + 3, 0, 0, 3 * u_pair + eps_d) : rho(C + 3, 1, un.op, eps_d),
                       Matrix<S>(vnew_hat.cwiseAbs().transpose() * dr::scale_rows<S>(lambda, k_abs))) +
          scalar_times((pairs ? 3 : 1) * un.eta, Matrix<S>(Matrix<S>::Ones(DV, n) * k_abs)) +
          floor_of(Matrix<S>(s_hat.cwiseAbs() + vnew_hat.cwiseAbs().transpose() * k_abs));
      add(cc + 1 < N ? "S_next" : "final_state", cc, s_next_hat, s_next_ref, s_next_bound);
    }

    // O = diag(γ) Q Ŝᵀ + (Q Kᵀ ⊙ D) V̄̂: S, P and V̄ rounded to operands, DK + C + 2 accumulations,
    // stored in the dtype (relative u_out, and η below its normal range, as W and U). The state pass's output
    // (the training forward's chunk_output_kernel) takes S rounded once and V̄ as its pair: P V̄_hi and P V̄_lo
    // both accumulate, DK + 2C + 2.
    if (!has_output) continue;
    const Matrix<S> scores = (qc * kc.transpose()).cwiseProduct(d);
    const Matrix<S> o_ref = dr::scale_rows<S>(gamma, Matrix<S>(qc * s_hat.transpose())) + scores * vnew_hat;
    const Matrix<S> o_mag1 = dr::scale_rows<S>(gamma, Matrix<S>(q_abs * s_hat.cwiseAbs().transpose()));
    const Matrix<S> o_mag2 = (q_abs * k_abs.transpose()).cwiseProduct(d) * vnew_hat.cwiseAbs();
    const Matrix<S> o_eta = q_abs * Matrix<S>::Ones(DK, DV) + (q_abs * k_abs.transpose()).cwiseProduct(d) * Matrix<S>::Ones(n, DV) +
                            Matrix<S>::Ones(n, n) * vnew_hat.cwiseAbs();
    const Matrix<S> o_bound = scalar_times(un.out, Matrix<S>(o_ref.cwiseAbs())) +
                              scalar_times((1 + un.out) * (pairs    ? rho(DK + 2 * C + 2, 1, un.op, eps_d + u32)
                                                           : s_pair ? rho(DK + C + 2, 0, 0, u_pair + eps_d + u32)
                                                                    : rho(DK + C + 2, 1, un.op, eps_d + u32)),
                                           o_mag1) +
                              scalar_times((1 + un.out) * (pairs ? rho(DK + 2 * C + 2, 1, un.op, u_pair + eps_d + u32)
                                                                 : rho(DK + C + 2, 2, un.op, eps_d + u32)),
                                           o_mag2) +
                              scalar_times(2 * un.eta, o_eta) + Matrix<S>::Constant(n, DV, S(un.eta)) +
                              floor_of(Matrix<S>(o_mag1 + o_mag2 + o_eta));
    add("O", cc, Matrix<S>(o_all.middleRows(ch.begin, n)), o_ref, o_bound);
  }
}

std::vector<Comparison> check_stages(const DeltaCase& c, const HostInputs& in, const ForwardResult& r) {
  std::vector<Comparison> rep;
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.heads; ++h) {
      check_head_stages<High>(c, in, r, b, h, rep);
    }
  return rep;
}

DoubleForward double_oracle(const DeltaCase& c, const HostInputs& in) {
  DoubleForward f;
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.heads; ++h) {
      std::optional<Matrix<double>> s0;
      if (c.with_initial_state) s0 = ref::matrix_cast<double>(in.initial_state.head(b, h));
      const Matrix<double> q = ref::matrix_cast<double>(in.q.head(b, h)), k = ref::matrix_cast<double>(in.k.head(b, h)),
                           v = ref::matrix_cast<double>(in.v.head(b, h));
      const Vector<double> beta = ref::matrix_cast<double>(in.beta.head(b, h)).col(0);
      dr::Forward<double> out;
      if (c.gated) {
        const Vector<double> g = ref::matrix_cast<double>(in.log_gate.head(b, h)).col(0);
        out = gdr::token_recurrence<double>({q, k, v, beta, Vector<double>(g.array().exp()), s0});
      } else {
        out = dr::token_recurrence<double>({q, k, v, beta, s0});
      }
      f.output.push_back(out.output);
      f.final_state.push_back(out.final_state);
    }
  return f;
}

double relative_l2_all(const std::vector<Matrix<double>>& candidate, const std::vector<Matrix<double>>& reference) {
  double num = 0, den = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    num += (candidate[i] - reference[i]).squaredNorm();
    den += reference[i].squaredNorm();
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

std::vector<Matrix<double>> heads_of(const Tensor4<Exact>& t) {
  std::vector<Matrix<double>> out;
  ref::for_each_head(t.batch, t.heads, [&](Index b, Index h) { out.push_back(ref::matrix_cast<double>(t.head(b, h))); });
  return out;
}

Comparison compare_end_to_end(const std::string& tensor, const DeltaCase& c, const std::vector<Matrix<double>>& candidate,
                              const std::vector<Matrix<double>>& reference, double tau) {
  return compare_rows_normwise(tensor, candidate, reference, tau, c.heads);
}

Verdict judge_forward(const DeltaCase& c, const HostInputs& in, const Tensor4<Exact>& output, const Tensor4<Exact>& final_state) {
  auto host = [](const Tensor4<Exact>& t, std::vector<Index> shape, dt::DType dtype) {
    HostTensor h;
    h.shape = std::move(shape), h.dtype = dtype;
    h.values.reserve(t.data.size());
    for (const Exact& x : t.data) h.values.push_back(ref::to_double(x));  // every entry is a dtype number: exact
    return h;
  };
  const dt::DType dtype = dt::verify_dtype(c.dtype);
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim;
  KernelCase k;
  k.op = c.gated ? Op::gated_delta : Op::delta;
  k.layout = Layout::bhld;
  k.q = host(in.q, {B, H, L, DK}, dtype), k.k = host(in.k, {B, H, L, DK}, dtype), k.v = host(in.v, {B, H, L, DV}, dtype);
  k.beta = host(in.beta, {B, H, L}, dtype);
  if (c.gated) k.g = host(in.log_gate, {B, H, L}, dt::DType::f32);
  if (c.with_initial_state) k.h0 = host(in.initial_state, {B, H, DV, DK}, dt::DType::f32);
  KernelResult r;
  r.o = host(output, {B, H, L, DV}, dtype);
  r.ht = host(final_state, {B, H, DV, DK}, dt::DType::f32);
  JudgeOptions options;
  options.chunk_size = long(c.chunk);
  return judge(k, r, options);
}

// End-to-end threshold in units of the operand rounding (fp32 inputs: fp32 accumulation over the
// chain, 2⁻¹⁶ covers L <= 512 with well-conditioned keys).
double end_to_end_tau(DType d) { return d == DType::f32 ? 0x1p-16 : 16 * units_of(d).op; }

// Decodes all tokens of `in` from the given fp32 state (exact values) or zero.
DecodeResult run_decode(const DeltaCase& c, const HostInputs& in, const std::optional<Tensor4<Exact>>& state) {
  DeltaCase d = c;
  d.with_initial_state = false;
  const DeviceInputs dev = upload_inputs(d, in);
  Uploaded s0;
  if (state) s0 = dt::upload(*state, DType::f32);
  DeviceTensor out = dt::allocate(c.dtype, c.batch, c.heads, c.length, c.value_dim);
  DeviceTensor fin = dt::allocate(DType::f32, c.batch, c.heads, c.value_dim, c.key_dim);
  cuda::delta_rule::DecodeParams p;
  p.dtype = c.dtype, p.batch = int(c.batch), p.heads = int(c.heads), p.tokens = int(c.length);
  p.key_dim = int(c.key_dim), p.value_dim = int(c.value_dim);
  p.q = dev.q.device.data(), p.k = dev.k.device.data(), p.v = dev.v.device.data(), p.beta = dev.beta.device.data();
  p.log_gate = c.gated ? static_cast<const float*>(dev.log_gate.device.data()) : nullptr;
  p.initial_state = state ? static_cast<const float*>(s0.device.data()) : nullptr;
  p.output = out.data(), p.final_state = static_cast<float*>(fin.data());
  cuda::delta_rule::set_contiguous_strides(p);
  cuda::delta_rule::decode(p);
  return {dt::download(out), dt::download(fin)};
}

// The recurrence in fp32, bounded by γ_m(u32) times the same recurrence on |inputs|
// (M_t = α M + β(|v| + α M|k|)|k|ᵀ), m = DK + 12 roundings per token (+4 for expf), DK + 6 for o_t.
template <class S>
static void check_decode_head(const DeltaCase& c, const HostInputs& in, const DecodeResult& r, const Matrix<S>& s_start, Index b,
                              Index h, std::vector<Comparison>& rep) {
  const Units un = units_of(c.dtype);
  const Matrix<S> q = to<S>(in.q.head(b, h)), k = to<S>(in.k.head(b, h)), v = to<S>(in.v.head(b, h));
  const Vector<S> beta = to<S>(in.beta.head(b, h)).col(0), beta_abs = beta.cwiseAbs();
  const Vector<High> g = ref::matrix_cast<High>(in.log_gate.head(b, h)).col(0);
  Matrix<S> state = s_start, mag = s_start.cwiseAbs();
  Matrix<S> o_ref(c.length, c.value_dim), o_bound(c.length, c.value_dim);
  long depth = 0;
  for (Index t = 0; t < c.length; ++t) {
    S alpha(1);
    if constexpr (std::is_same_v<S, High>)
      if (c.gated) alpha = exp(g(t));
    const Matrix<S> kt = k.row(t), qt = q.row(t), kt_abs = kt.cwiseAbs();
    const Matrix<S> decayed = state * alpha;
    const Matrix<S> error = v.row(t).transpose() - decayed * kt.transpose();  // (DV, 1)
    state = decayed + error * kt * beta(t);
    mag = mag * alpha + (v.row(t).transpose().cwiseAbs() + mag * alpha * kt_abs.transpose()) * kt_abs * beta_abs(t);
    depth += c.key_dim + 12 + (c.gated ? 4 : 0);
    o_ref.row(t) = (state * qt.transpose()).transpose();
    o_bound.row(t) = (scalar_times(un.out, Matrix<S>(o_ref.row(t).cwiseAbs())) +
                      scalar_times((1 + un.out) * ref::gamma(depth + c.key_dim + 6, u32), Matrix<S>((mag * qt.cwiseAbs().transpose()).transpose())))
                         .eval();
  }
  rep.push_back(compare_within<S>("decode O", to<S>(r.output.head(b, h)), o_ref, o_bound, {b, h, -1}));
  rep.push_back(compare_within<S>("decode S", to<S>(r.final_state.head(b, h)), state, scalar_times(ref::gamma(depth, u32), mag),
                                  {b, h, -1}));
}

std::vector<Comparison> check_decode(const DeltaCase& c, const HostInputs& in, const DecodeResult& r,
                                     const std::optional<Tensor4<Exact>>& state) {
  std::vector<Comparison> rep;
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.heads; ++h) {
      const Matrix<Exact> s = state ? state->head(b, h) : Matrix<Exact>::Zero(c.value_dim, c.key_dim);
      if (c.gated) check_decode_head<High>(c, in, r, ref::matrix_cast<High>(s), b, h, rep);
      else check_decode_head<Exact>(c, in, r, s, b, h, rep);
    }
  return rep;
}

// The exact oracle's chunkwise intermediates laid out as the kernel writes them (no device
// needed): the stage checks must accept them, and reject them once a bug is planted.
ForwardResult oracle_as_kernel(const DeltaCase& c, const HostInputs& in) {
  const Index C = c.chunk, N = cuda::chunk_count(int(c.length), int(C)), DK = c.key_dim, DV = c.value_dim;
  ForwardResult r{Tensor4<Exact>(c.batch, c.heads, c.length, DV), Tensor4<Exact>(c.batch, c.heads, DV, DK),
                  Tensor4<Exact>(c.batch, c.heads, c.length, DK),  Tensor4<Exact>(c.batch, c.heads, c.length, DV),
                  Tensor4<Exact>(c.batch, c.heads, c.length, DV),  Tensor4<Exact>(c.batch, c.heads, N * C, C),
                  Tensor4<Exact>(c.batch, c.heads, N * C, C),      Tensor4<Exact>(c.batch, c.heads, N * DV, DK)};
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    std::optional<Matrix<Exact>> s0;
    if (c.with_initial_state) s0 = in.initial_state.head(b, h);
    dr::ChunkwiseForward<Exact> f;
    if (c.gated) {  // 100-digit log-gate path, carried over to ℚ (its error, ~1e-100, is far inside every bound)
      std::optional<Matrix<High>> s0h;
      if (s0) s0h = ref::matrix_cast<High>(*s0);
      const auto g = gdr::chunkwise_log_gate<High>(
          {ref::matrix_cast<High>(in.q.head(b, h)), ref::matrix_cast<High>(in.k.head(b, h)),
           ref::matrix_cast<High>(in.v.head(b, h)), ref::matrix_cast<High>(in.beta.head(b, h)).col(0),
           ref::matrix_cast<High>(in.log_gate.head(b, h)).col(0), s0h},
          C);
      f.output = ref::matrix_cast<Exact>(g.output), f.final_state = ref::matrix_cast<Exact>(g.final_state);
      for (const auto& s : g.boundary_states) f.boundary_states.push_back(ref::matrix_cast<Exact>(s));
      for (const auto& x : g.chunks)
        f.chunks.push_back({ref::matrix_cast<Exact>(x.a), ref::matrix_cast<Exact>(x.t), ref::matrix_cast<Exact>(x.w),
                            ref::matrix_cast<Exact>(x.u), ref::matrix_cast<Exact>(x.v_new)});
    } else {
      f = dr::chunkwise<Exact>({in.q.head(b, h), in.k.head(b, h), in.v.head(b, h), in.beta.head(b, h).col(0), s0}, C);
    }
    Matrix<Exact> w(c.length, DK), u(c.length, DV), v_new(c.length, DV), a = Matrix<Exact>::Zero(N * C, C),
        t = Matrix<Exact>::Zero(N * C, C), boundary(N * DV, DK);
    for (const ref::Chunk& ch : ref::chunks_of(c.length, C)) {
      const auto& x = f.chunks[size_t(ch.index)];
      w.middleRows(ch.begin, ch.size) = x.w, u.middleRows(ch.begin, ch.size) = x.u;
      v_new.middleRows(ch.begin, ch.size) = x.v_new;
      a.block(ch.index * C, 0, C, C).setIdentity(), t.block(ch.index * C, 0, C, C).setIdentity();
      a.block(ch.index * C, 0, ch.size, ch.size) = x.a, t.block(ch.index * C, 0, ch.size, ch.size) = x.t;
      boundary.middleRows(ch.index * DV, DV) = f.boundary_states[size_t(ch.index)];
    }
    r.output.set_head(b, h, f.output), r.final_state.set_head(b, h, f.final_state);
    r.w.set_head(b, h, w), r.u.set_head(b, h, u), r.v_new.set_head(b, h, v_new);
    r.a.set_head(b, h, a), r.t.set_head(b, h, t), r.boundary.set_head(b, h, boundary);
  });
  return r;
}

HostInputs design_inputs(const DeltaCase& c) {
  std::mt19937_64 engine(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const Index D = c.key_dim;
  HostInputs in;
  in.q = Tensor4<Exact>(c.batch, c.heads, c.length, D);
  in.k = Tensor4<Exact>(c.batch, c.heads, c.length, D);
  in.v = Tensor4<Exact>(c.batch, c.heads, c.length, c.value_dim);
  in.beta = Tensor4<Exact>(c.batch, c.heads, c.length, 1);
  in.log_gate = Tensor4<Exact>(c.batch, c.heads, c.length, 1);
  for (Exact& x : in.q.data) x = dt::round_to(Exact(normal(engine) / std::sqrt(double(D))), c.dtype);
  for (size_t row = 0; row < in.k.data.size() / size_t(D); ++row) {
    std::vector<double> x(D);
    double norm = 0;
    for (double& e : x) e = normal(engine), norm += e * e;
    for (Index j = 0; j < D; ++j) in.k.data[row * D + j] = dt::round_to(Exact(x[j] / std::sqrt(norm)), c.dtype);
  }
  for (Exact& x : in.v.data) x = dt::round_to(Exact(normal(engine)), c.dtype);
  for (Exact& x : in.beta.data) x = dt::round_to(Exact(1 / (1 + std::exp(-normal(engine)))), c.dtype);
  for (Exact& x : in.log_gate.data) {
    const double z = normal(engine) + 3;
    x = Exact(double(float(-std::log1p(std::exp(-z)))));  // logsigmoid, as fp32
  }
  return in;
}

}  // namespace deltaproof::verify::delta_rule
