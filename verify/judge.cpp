// verify::judge: the oracle on the exact inputs of a kernel run, and each produced tensor compared
// within the bounds of kernel_model.hpp. Work is split into (sequence, head) units, run on every
// core; each unit yields one Comparison per tensor, merged into the tensor's worst.
#include "verify/judge.hpp"

#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/linear_attention.hpp"
#include "verify/kernel_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace deltaproof::verify {
namespace {

using ref::High;
using MatrixD = ref::Matrix<double>;
using VectorD = ref::Vector<double>;

// fla's l2norm: x / sqrt(‖x‖² + 1e-6), the normalisation its kernels apply when asked to.
constexpr double l2norm_eps = 1e-6;

// Where entry (batch b, token t, head h, column d) of each kind of tensor lives, in the case's layout.
struct Addressing {
  Layout layout;
  Index H, L, DK, DV;

  size_t token(Index b, Index t, Index h, Index d, Index dim) const {
    return layout == Layout::bhld ? size_t(((b * H + h) * L + t) * dim + d) : size_t(((b * L + t) * H + h) * dim + d);
  }
  size_t gate(Index b, Index t, Index h) const {
    return layout == Layout::bhld ? size_t((b * H + h) * L + t) : size_t((b * L + t) * H + h);
  }
  // State entry S[i][j] (value row i, key column j) of sequence n, head h.
  size_t state(Index n, Index h, Index i, Index j) const {
    return layout == Layout::bhld ? size_t(((n * H + h) * DV + i) * DK + j) : size_t(((n * H + h) * DK + j) * DV + i);
  }
  std::vector<Index> token_index(Index b, Index t, Index h, Index d) const {
    return layout == Layout::bhld ? std::vector<Index>{b, h, t, d} : std::vector<Index>{b, t, h, d};
  }
  std::vector<Index> gate_index(Index b, Index t, Index h) const {
    return layout == Layout::bhld ? std::vector<Index>{b, h, t} : std::vector<Index>{b, t, h};
  }
  std::vector<Index> state_index(Index n, Index h, Index i, Index j) const {
    return layout == Layout::bhld ? std::vector<Index>{n, h, i, j} : std::vector<Index>{n, h, j, i};
  }
};

// One independent sequence of one head: tokens begin .. begin+length−1 of batch row `batch`.
struct Unit {
  Index sequence, head, batch, begin, length;
};

// The inputs of one unit as the oracle sees them, and what the kernel applied to q and k.
struct UnitInputs {
  MatrixD q_raw, k_raw;  // as given (L, DK)
  MatrixD q, k, v;       // used: scale·n(q), n(k), v
  VectorD beta, alpha, log_gate;
  std::optional<MatrixD> s0;  // (DV, DK)
  std::optional<MatrixD> d_o, d_st;
};

// What a unit's oracle yields; dq, dk with respect to the raw q, k.
struct Truth {
  MatrixD o, ht, dq, dk, dv, dh0;
  VectorD dbeta, dg;
};

// Bounds: same shape as the truth (elementwise) or one entry per row (rowwise: rows × 1), or 1 × 1
// for a whole state matrix in Frobenius norm.
struct Bounds {
  MatrixD o, ht, dq, dk, dv, dh0, dbeta, dg;
};

MatrixD token_block(const HostTensor& t, const Addressing& a, const Unit& u, Index dim) {
  MatrixD m(u.length, dim);
  for (Index r = 0; r < u.length; ++r)
    for (Index d = 0; d < dim; ++d) m(r, d) = t.values[a.token(u.batch, u.begin + r, u.head, d, dim)];
  return m;
}

VectorD gate_block(const HostTensor& t, const Addressing& a, const Unit& u) {
  VectorD x(u.length);
  for (Index r = 0; r < u.length; ++r) x(r) = t.values[a.gate(u.batch, u.begin + r, u.head)];
  return x;
}

MatrixD state_block(const HostTensor& t, const Addressing& a, const Unit& u) {
  MatrixD m(a.DV, a.DK);
  for (Index i = 0; i < a.DV; ++i)
    for (Index j = 0; j < a.DK; ++j) m(i, j) = t.values[a.state(u.sequence, u.head, i, j)];
  return m;
}

// Row-wise n(x) = x / sqrt(‖x‖² + eps).
MatrixD normalise_rows(const MatrixD& x) {
  MatrixD out = x;
  for (Index r = 0; r < x.rows(); ++r) out.row(r) /= std::sqrt(x.row(r).squaredNorm() + l2norm_eps);
  return out;
}

// dx from dy through y = s·n(x) (or y = s·x): J_nᵀ dy = r dy − r³ x (x·dy), r = (‖x‖² + eps)^(−1/2).
MatrixD pull_back(const MatrixD& x, const MatrixD& dy, double scale, bool normalised) {
  if (!normalised) return scale * dy;
  MatrixD dx(x.rows(), x.cols());
  for (Index r = 0; r < x.rows(); ++r) {
    const double inv = 1 / std::sqrt(x.row(r).squaredNorm() + l2norm_eps);
    dx.row(r) = scale * (inv * dy.row(r) - inv * inv * inv * x.row(r).dot(dy.row(r)) * x.row(r));
  }
  return dx;
}

// The same through |J| on magnitudes (elementwise bounds): |s|(r M + r³ |x| (|x|·M)).
MatrixD pull_back_magnitude(const MatrixD& x, const MatrixD& m, double scale, bool normalised) {
  if (!normalised) return std::abs(scale) * m;
  MatrixD out(x.rows(), x.cols());
  for (Index r = 0; r < x.rows(); ++r) {
    const double inv = 1 / std::sqrt(x.row(r).squaredNorm() + l2norm_eps);
    const auto ax = x.row(r).cwiseAbs();
    out.row(r) = std::abs(scale) * (inv * m.row(r) + inv * inv * inv * ax.dot(m.row(r)) * ax);
  }
  return out;
}

// ----------------------------------------------------------------------------------------------
// The oracle, in double or High, through reference/.

template <class S>
ref::Matrix<S> to(const MatrixD& m) {
  return ref::matrix_cast<S>(m);
}
template <class S>
ref::Vector<S> to(const VectorD& v) {
  return ref::matrix_cast<S>(ref::Matrix<double>(v)).col(0);
}
template <class S>
MatrixD back(const ref::Matrix<S>& m) {
  return ref::matrix_cast<double>(m);
}

// The token recurrence and its backward over segments of 256 tokens, so that the backward's stored
// states stay small (L = 4096 at D = 128 would hold half a gigabyte per head): forward segment by
// segment, each from the last one's final state, then backward from the last segment, each taking
// the next one's dS_0 as its dS_L. The arithmetic is the whole-sequence recurrence's, in order.
constexpr Index segment_tokens = 256;

template <class S, class In, class Slice, class Forward, class Backward, class Store>
void run_segmented(const In& x, const std::optional<ref::linear_attention::Cotangents<S>>& cot, Slice slice,
                   Forward forward, Backward backward, Store store, Truth& t) {
  const Index L = x.q.rows();
  const Index segments = std::max<Index>(1, (L + segment_tokens - 1) / segment_tokens);
  std::vector<std::optional<ref::Matrix<S>>> entering;  // the state entering each segment
  std::optional<ref::Matrix<S>> state = x.initial_state;
  t.o.resize(L, x.v.cols());
  for (Index i = 0; i < segments; ++i) {
    const Index begin = i * segment_tokens, n = std::min(segment_tokens, L - begin);
    entering.push_back(state);
    const auto f = forward(slice(x, begin, n, state));
    t.o.middleRows(begin, n) = back(f.output);
    state = f.final_state;
  }
  t.ht = back(*state);
  if (!cot) return;
  std::optional<ref::Matrix<S>> grad = cot->d_final_state;
  for (Index i = segments - 1; i >= 0; --i) {
    const Index begin = i * segment_tokens, n = std::min(segment_tokens, L - begin);
    const ref::linear_attention::Cotangents<S> c{cot->d_output.middleRows(begin, n), grad};
    const auto g = backward(slice(x, begin, n, entering[size_t(i)]), c);
    store(g, begin, n);
    grad = g.d_initial_state;
  }
  t.dh0 = back(*grad);
}

template <class S>
Truth oracle_unit(Op op, const UnitInputs& in, bool gradients, double scale, bool normalised) {
  Truth t;
  const auto s0 = in.s0 ? std::optional<ref::Matrix<S>>(to<S>(*in.s0)) : std::nullopt;
  std::optional<ref::linear_attention::Cotangents<S>> cot;
  if (gradients) {
    cot.emplace();
    cot->d_output = to<S>(*in.d_o);
    if (in.d_st) cot->d_final_state = to<S>(*in.d_st);
  }
  const Index L = in.q.rows();
  MatrixD dq_used(L, in.q.cols()), dk_used(L, in.q.cols());
  t.dv.resize(L, in.v.cols()), t.dbeta.resize(L), t.dg.resize(L);
  auto store_common = [&](const auto& g, Index begin, Index n) {
    dq_used.middleRows(begin, n) = back(g.dq), dk_used.middleRows(begin, n) = back(g.dk);
    t.dv.middleRows(begin, n) = back(g.dv);
  };
  if (op == Op::linear) {
    namespace la = ref::linear_attention;
    const la::Inputs<S> x{to<S>(in.q), to<S>(in.k), to<S>(in.v), s0};
    run_segmented<S>(
        x, cot,
        [](const la::Inputs<S>& a, Index b, Index n, const std::optional<ref::Matrix<S>>& s) {
          return la::Inputs<S>{a.q.middleRows(b, n), a.k.middleRows(b, n), a.v.middleRows(b, n), s};
        },
        [](const la::Inputs<S>& a) { return la::token_recurrence(a); },
        [](const la::Inputs<S>& a, const la::Cotangents<S>& c) { return la::token_recurrence_backward(a, c); },
        store_common, t);
  } else if (op == Op::delta) {
    namespace dr = ref::delta_rule;
    const dr::Inputs<S> x{to<S>(in.q), to<S>(in.k), to<S>(in.v), to<S>(in.beta), s0};
    run_segmented<S>(
        x, cot,
        [](const dr::Inputs<S>& a, Index b, Index n, const std::optional<ref::Matrix<S>>& s) {
          return dr::Inputs<S>{a.q.middleRows(b, n), a.k.middleRows(b, n), a.v.middleRows(b, n), a.beta.segment(b, n), s};
        },
        [](const dr::Inputs<S>& a) { return dr::token_recurrence_read_correct_write(a); },
        [](const dr::Inputs<S>& a, const dr::Cotangents<S>& c) { return dr::token_recurrence_backward(a, c); },
        [&](const auto& g, Index begin, Index n) {
          store_common(g, begin, n);
          t.dbeta.segment(begin, n) = back(ref::Matrix<S>(g.d_beta)).col(0);
        },
        t);
  } else {
    namespace gd = ref::gated_delta_rule;
    ref::Vector<S> alpha(in.log_gate.size());
    for (Index r = 0; r < alpha.size(); ++r) {
      using std::exp;
      alpha(r) = S(exp(S(in.log_gate(r))));
    }
    const gd::Inputs<S> x{to<S>(in.q), to<S>(in.k), to<S>(in.v), to<S>(in.beta), alpha, s0};
    run_segmented<S>(
        x, cot,
        [](const gd::Inputs<S>& a, Index b, Index n, const std::optional<ref::Matrix<S>>& s) {
          return gd::Inputs<S>{a.q.middleRows(b, n), a.k.middleRows(b, n), a.v.middleRows(b, n),
                               a.beta.segment(b, n), a.alpha.segment(b, n), s};
        },
        [](const gd::Inputs<S>& a) { return gd::token_recurrence_read_correct_write(a); },
        [](const gd::Inputs<S>& a, const gd::Cotangents<S>& c) { return gd::token_recurrence_backward(a, c); },
        [&](const auto& g, Index begin, Index n) {
          store_common(g, begin, n);
          t.dbeta.segment(begin, n) = back(ref::Matrix<S>(g.d_beta)).col(0);
          const ref::Vector<S> dg = g.d_alpha.cwiseProduct(alpha.segment(begin, n));  // dL/dg = α dL/dα
          t.dg.segment(begin, n) = back(ref::Matrix<S>(dg)).col(0);
        },
        t);
  }
  if (gradients) {
    t.dq = pull_back(in.q_raw, dq_used, scale, normalised);
    t.dk = pull_back(in.k_raw, dk_used, 1.0, normalised);
  }
  return t;
}

// ----------------------------------------------------------------------------------------------
// Linear attention: elementwise bounds ε·M + u_out(|y| + ε·M), M the forms on |inputs|.

struct OutputRoundoffs {
  double o = 0, ht = 0, dq = 0, dk = 0, dv = 0, dh0 = 0, dbeta = 0, dg = 0;
};

MatrixD elementwise_bound(const MatrixD& magnitude, const MatrixD& truth, double eps, double u_out) {
  const MatrixD accumulated = eps * magnitude;
  return accumulated + u_out * (truth.cwiseAbs() + accumulated);
}

Bounds linear_bounds(const UnitInputs& in, const Truth& t, bool gradients, double eps, const OutputRoundoffs& u,
                     double scale, bool normalised) {
  // Every term is a product of inputs, so the forms on |inputs| give Σ|terms| (no subtraction).
  UnitInputs magnitudes = in;
  magnitudes.q = in.q.cwiseAbs(), magnitudes.k = in.k.cwiseAbs(), magnitudes.v = in.v.cwiseAbs();
  if (in.s0) magnitudes.s0 = in.s0->cwiseAbs();
  if (in.d_o) magnitudes.d_o = in.d_o->cwiseAbs();
  if (in.d_st) magnitudes.d_st = in.d_st->cwiseAbs();
  const Truth m = oracle_unit<double>(Op::linear, magnitudes, gradients, 1.0, false);
  Bounds b;
  b.o = elementwise_bound(m.o, t.o, eps, u.o);
  b.ht = elementwise_bound(m.ht, t.ht, eps, u.ht);
  if (gradients) {
    b.dq = elementwise_bound(pull_back_magnitude(in.q_raw, m.dq, scale, normalised), t.dq, eps, u.dq);
    b.dk = elementwise_bound(pull_back_magnitude(in.k_raw, m.dk, 1.0, normalised), t.dk, eps, u.dk);
    b.dv = elementwise_bound(m.dv, t.dv, eps, u.dv);
    b.dh0 = elementwise_bound(m.dh0, t.dh0, eps, u.dh0);
  }
  return b;
}

// ----------------------------------------------------------------------------------------------
// DeltaNet / Gated DeltaNet: row-wise bounds from the propagated error covariance (kernel_model.hpp).
//
// The state error E_t (DV × DK) is a sum of independent entrywise roundings; its key-side
// second-moment proxy C_t = Σ (coefficients²) (DK × DK) follows the transitions exactly:
//   C_t = α_t² A_t C_{t−1} A_t + diag(Σ_i Δ_ij²),   A_t = I − β_t k_t k_tᵀ,
// where Δ bounds the roundings of step t entrywise. Then, except with probability 2e^{−λ²/2},
// ‖E_t q‖ ≤ λ sqrt(qᵀ C_t q) and ‖E_t‖_F ≤ λ sqrt(tr C_t). The cotangent G_t of S_t and its
// error covariance D_t run the mirror image backwards.

// C ← α² A C A with A = I − β k kᵀ, in O(DK²), given ck = C k: with y = β ck − (β² kᵀck / 2) k,
// A C A = C − y kᵀ − k yᵀ (C symmetric).
void transition(MatrixD& c, const VectorD& k, const VectorD& ck, double alpha, double beta) {
  const VectorD y = beta * ck - (0.5 * beta * beta * k.dot(ck)) * k;
  c.noalias() -= y * k.transpose();
  c.noalias() -= k * y.transpose();
  if (alpha != 1) c *= alpha * alpha;
}

// Σ_i Δ_ij² for Δ = a·|X| + (rows ⊗ |k|): per column j.
VectorD column_squares(const MatrixD& x, double a, const VectorD& rows, const VectorD& abs_k) {
  VectorD out(x.cols());
  for (Index j = 0; j < x.cols(); ++j) out(j) = (a * x.col(j).cwiseAbs() + rows * abs_k(j)).squaredNorm();
  return out;
}

struct DeltaModel {
  double eps_acc, eps_op, u_op, lambda;
  bool gated;
};

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

VectorD window_max(const VectorD& x, long w, bool forward) {
  const Index n = x.size();
  VectorD out(n);
  for (Index t = 0; t < n; ++t) {
    const Index lo = forward ? t : std::max<Index>(0, t - w + 1), hi = forward ? std::min<Index>(n, t + w) : t + 1;
    out(t) = x.segment(lo, hi - lo).maxCoeff();
  }
  return out;
}

Bounds delta_bounds(const UnitInputs& in, const Truth& truth, bool gradients, const DeltaModel& m,
                    const OutputRoundoffs& u, double scale, bool normalised) {
  const Index L = in.q.rows(), DK = in.q.cols(), DV = in.v.cols();
  const long w = KernelModel::window;
  const VectorD alpha = in.alpha;
  // Forward sweep: states, norms, covariance.
  MatrixD s = in.s0 ? *in.s0 : MatrixD::Zero(DV, DK);
  MatrixD c = MatrixD::Zero(DK, DK);
  VectorD n_state(L + 1), n_u(L), n_write(L), tr_c(L + 1), kck_before(L), qcq(L), n_sq(L);
  n_state(0) = s.norm();
  tr_c(0) = 0;
  // Gated: the kernel forms decays from fp32 cumulative sums over a chunk: relative error of α_t
  // at most u32·(2 + 64·Σ_{window}|g|).
  const VectorD gate_error =
      m.gated ? VectorD((0x1p-24 * (2.0 + double(w) * window_sums(in.log_gate.cwiseAbs(), w, false).array())).matrix())
              : VectorD::Zero(L);
  for (Index t = 0; t < L; ++t) {
    const VectorD k = in.k.row(t).transpose(), v = in.v.row(t).transpose(), q = in.q.row(t).transpose();
    const VectorD abs_k = k.cwiseAbs();
    const double a = alpha(t), b = in.beta(t);
    const VectorD ck = c * k;
    kck_before(t) = k.dot(ck);
    // Roundings of this step: accumulation over the whole update, operands of the write, the decay.
    const VectorD write_rows = b * (a * (s.cwiseAbs() * abs_k) + v.cwiseAbs());  // β(α|S_{t−1}||k| + |v|)
    VectorD local = column_squares(s, m.eps_acc * a + gate_error(t) * a, (m.eps_acc + m.eps_op) * write_rows, abs_k);
    if (a != 1) s *= a;
    const VectorD correction = v - s * k;
    s.noalias() += (b * correction) * k.transpose();
    transition(c, k, ck, a, b);
    // The state stored in operand precision once per (smallest) chunk of 16 tokens.
    if (t % 16 == 15) local += 2 * std::pow(m.u_op, 2) * s.cwiseAbs2().colwise().sum().transpose();
    c.diagonal() += local;
    n_state(t + 1) = s.norm();
    n_u(t) = correction.norm();
    n_write(t) = b * n_u(t) * k.norm();
    tr_c(t + 1) = c.trace();
    qcq(t) = q.dot(c * q);
    n_sq(t) = n_state(t + 1) * q.norm();  // ≥ ‖|S_t||q_t|‖
  }
  const double lam = m.lambda, eps = m.eps_op + m.eps_acc;
  Bounds bd;
  bd.o.resize(L, 1);
  // The in-chunk part of S_t q_t, Σ_{s ≤ t, within a window} β_s ‖u_s‖ |q_t·k_s|: its magnitude.
  VectorD recent_writes(L);
  for (Index t = 0; t < L; ++t) {
    recent_writes(t) = 0;
    for (Index s = std::max<Index>(0, t - w + 1); s <= t; ++s)
      recent_writes(t) += n_write(s) / std::max(1e-300, in.k.row(s).norm()) * std::abs(in.q.row(t).dot(in.k.row(s)));
  }
  for (Index t = 0; t < L; ++t) {
    const double local = eps * (n_sq(t) + recent_writes(t));
    const double stat = lam * std::sqrt(std::max(0.0, qcq(t))) + local;
    bd.o(t, 0) = stat + u.o * (truth.o.row(t).norm() + stat);
  }
  const double ht_stat = lam * std::sqrt(std::max(0.0, tr_c(L)));
  bd.ht = MatrixD::Constant(1, 1, ht_stat + u.ht * (truth.ht.norm() + ht_stat));
  if (!gradients) return bd;

  // Backward sweep: the cotangent G_t of S_t (after do_t q_tᵀ) and its covariance D_t.
  MatrixD g = in.d_st ? *in.d_st : MatrixD::Zero(DV, DK);
  MatrixD d = MatrixD::Zero(DK, DK);
  VectorD n_g(L), tr_d(L), kdk(L), n_gk(L), n_abs_gk(L);
  VectorD do_q(L);
  for (Index t = 0; t < L; ++t) do_q(t) = in.d_o->row(t).norm() * in.q.row(t).norm();
  for (Index t = L - 1; t >= 0; --t) {
    const VectorD q = in.q.row(t).transpose(), dout = in.d_o->row(t).transpose();
    // Roundings of forming G_t: the outer product and the sum.
    d.diagonal() += column_squares(g, m.eps_acc, eps * dout.cwiseAbs(), q.cwiseAbs());
    g.noalias() += dout * q.transpose();
    if (t % 16 == 0) d.diagonal() += 2 * std::pow(m.u_op, 2) * g.cwiseAbs2().colwise().sum().transpose();
    const VectorD k = in.k.row(t).transpose(), abs_k = k.cwiseAbs();
    const VectorD gk = g * k, dk_vec = d * k, abs_gk = g.cwiseAbs() * abs_k;
    n_g(t) = g.norm();
    tr_d(t) = d.trace();
    kdk(t) = k.dot(dk_vec);
    n_gk(t) = gk.norm();
    n_abs_gk(t) = abs_gk.norm();
    // G_{t−1} before do_{t−1}: α_t G_t A_t, and the roundings of that step.
    const double a = alpha(t), b = in.beta(t);
    const VectorD local = column_squares(g, m.eps_acc * a + gate_error(t) * a, eps * a * b * abs_gk, abs_k);
    g.noalias() -= (b * gk) * k.transpose();
    if (a != 1) g *= a;
    transition(d, k, dk_vec, a, b);
    d.diagonal() += local;
  }
  const double dh0_stat = lam * std::sqrt(std::max(0.0, d.trace()));
  bd.dh0 = MatrixD::Constant(1, 1, dh0_stat + u.dh0 * (truth.dh0.norm() + dh0_stat));
  // Row bounds of the gradients at token t (kernel_model.hpp; σ are λ·sqrt of the covariances).
  // The in-chunk part of G_t k_t, Σ_{s ≥ t, within a window} ‖do_s‖ |q_s·k_t|: its magnitude.
  VectorD later_reads(L);
  for (Index t = 0; t < L; ++t) {
    later_reads(t) = 0;
    for (Index s = t; s < std::min<Index>(L, t + w); ++s)
      later_reads(t) += in.d_o->row(s).norm() * std::abs(in.q.row(s).dot(in.k.row(t)));
  }
  const VectorD window_do_q = window_sums(do_q, w, true);
  const VectorD near_state = window_max(n_state.tail(L), w, false);
  const VectorD recent = window_sums(n_write, w, false);
  bd.dq.resize(L, 1), bd.dk.resize(L, 1), bd.dv.resize(L, 1), bd.dbeta.resize(L, 1), bd.dg.resize(L, 1);
  VectorD dg_terms(L);
  for (Index t = 0; t < L; ++t) {
    const double nk = in.k.row(t).norm(), ndo = in.d_o->row(t).norm(), a = alpha(t), b = in.beta(t);
    const double s_prev = n_state(t), sig_state = lam * std::sqrt(std::max(0.0, tr_c(t + 1)));
    const double sig_prev = lam * std::sqrt(std::max(0.0, tr_c(t)));
    const double sig_u = lam * a * std::sqrt(std::max(0.0, kck_before(t)));
    const double sig_g = lam * std::sqrt(std::max(0.0, tr_d(t))), sig_gk = lam * std::sqrt(std::max(0.0, kdk(t)));
    // Local magnitudes: |G_t| k_t with its in-chunk reads, and the state with its in-chunk writes.
    const double gk_mag = n_abs_gk(t) + later_reads(t), g_mag = n_g(t) + window_do_q(t);
    const double s_mag = near_state(t) + recent(t);
    const double dq = sig_state * ndo + eps * s_mag * ndo;
    const double dv = b * sig_gk + eps * b * gk_mag;
    const double dbeta = n_u(t) * sig_gk + sig_u * n_gk(t) + eps * (n_u(t) + a * s_prev * nk) * gk_mag;
    const double dk = b * (sig_g * n_u(t) + n_g(t) * sig_u + a * (sig_prev * n_gk(t) + s_prev * sig_gk)) +
                      eps * b * (g_mag * n_u(t) + a * (s_prev * gk_mag + s_mag * n_abs_gk(t)));
    dg_terms(t) = a * (1 + b * nk * nk) * (sig_g * s_prev + n_g(t) * sig_prev);
    const double dg_local = eps * a * s_prev * n_g(t) * (1 + b * nk * nk);  // one token's term of the chunk sum
    bd.dq(t, 0) = dq;
    bd.dk(t, 0) = dk;
    bd.dv(t, 0) = dv;
    bd.dbeta(t, 0) = dbeta;
    // A chunk kernel forms dg_t as a sum over the following tokens of its chunk: window of locals.
    bd.dg(t, 0) = dg_terms(t) + dg_local;
  }
  if (m.gated) bd.dg.col(0) = dg_terms + window_sums(bd.dg.col(0) - dg_terms, w, true);
  // Through scale and the in-kernel normalisation (rows of q, k): ‖J‖₂ ≤ |s|·r.
  for (Index t = 0; t < L; ++t) {
    const double rq = normalised ? 1 / std::sqrt(in.q_raw.row(t).squaredNorm() + l2norm_eps) : 1.0;
    const double rk = normalised ? 1 / std::sqrt(in.k_raw.row(t).squaredNorm() + l2norm_eps) : 1.0;
    bd.dq(t, 0) *= std::abs(scale) * rq;
    bd.dk(t, 0) *= rk;
  }
  auto add_output_rounding = [](MatrixD& bound, const MatrixD& truth, double u_out) {
    for (Index t = 0; t < bound.rows(); ++t) bound(t, 0) += u_out * (truth.row(t).norm() + bound(t, 0));
  };
  add_output_rounding(bd.dq, truth.dq, u.dq);
  add_output_rounding(bd.dk, truth.dk, u.dk);
  add_output_rounding(bd.dv, truth.dv, u.dv);
  add_output_rounding(bd.dbeta, MatrixD(truth.dbeta), u.dbeta);
  if (m.gated) add_output_rounding(bd.dg, MatrixD(truth.dg), u.dg);
  return bd;
}

// ----------------------------------------------------------------------------------------------
// Comparisons of one unit.

Comparison compare_unit(const std::string& name, const MatrixD& candidate, const MatrixD& truth, const MatrixD& bound,
                        const std::function<std::vector<Index>(Index, Index)>& where, const Unit& unit) {
  Comparison c;
  c.tensor = name;
  c.batch = unit.sequence;
  c.head = unit.head;
  c.count = truth.size();
  const bool elementwise = bound.rows() == truth.rows() && bound.cols() == truth.cols();
  const bool whole = !elementwise && bound.size() == 1;
  c.norm = elementwise ? Norm::elementwise : Norm::rowwise;
  double sum_sq = 0;
  for (Index i = 0; i < truth.rows(); ++i)
    for (Index j = 0; j < truth.cols(); ++j) {
      const double x = candidate(i, j);
      if (!std::isfinite(x)) {
        if (c.finite) c.index = where(i, j), c.reference = truth(i, j), c.error = c.ratio = INFINITY;
        c.finite = false;
        continue;
      }
      const double e = std::abs(x - truth(i, j));
      sum_sq += e * e;
      c.max_abs = std::max(c.max_abs, e);
    }
  c.rms = c.count ? std::sqrt(sum_sq / double(c.count)) : 0.0;
  if (!c.finite || truth.size() == 0) return c;
  auto consider = [&](double err, double bnd, double ref, Index i, Index j) {
    const double ratio = bnd > 0 ? err / bnd : (err > 0 ? INFINITY : 0.0);
    if (ratio > c.ratio || c.index.empty()) c.ratio = ratio, c.error = err, c.bound = bnd, c.reference = ref, c.index = where(i, j);
  };
  auto worst_in = [&](Index r0, Index rows) {  // the largest entry error of these rows, for the index
    Index bi = r0, bj = 0;
    double best = -1;
    for (Index i = r0; i < r0 + rows; ++i)
      for (Index j = 0; j < truth.cols(); ++j)
        if (std::abs(candidate(i, j) - truth(i, j)) > best) best = std::abs(candidate(i, j) - truth(i, j)), bi = i, bj = j;
    return std::pair<Index, Index>{bi, bj};
  };
  if (elementwise) {
    for (Index i = 0; i < truth.rows(); ++i)
      for (Index j = 0; j < truth.cols(); ++j) consider(std::abs(candidate(i, j) - truth(i, j)), bound(i, j), truth(i, j), i, j);
  } else if (whole) {
    const auto [i, j] = worst_in(0, truth.rows());
    consider((candidate - truth).norm(), bound(0, 0), truth.norm(), i, j);
  } else {
    for (Index i = 0; i < truth.rows(); ++i) {
      const auto [wi, wj] = worst_in(i, 1);
      consider((candidate.row(i) - truth.row(i)).norm(), bound(i, 0), truth.row(i).norm(), wi, wj);
    }
  }
  return c;
}

struct Judged {
  std::map<std::string, Comparison> worst;
  double oracle_share = 0;
  bool in_high = false;
};

}  // namespace

// ----------------------------------------------------------------------------------------------

namespace {

struct Plan {
  const KernelCase& c;
  Addressing a;
  std::vector<Unit> units;
  bool gradients;
};

Plan plan_of(const KernelCase& c) {
  c.validate();
  Plan p{c, {c.layout, c.heads(), c.total_length(), c.key_dim(), c.value_dim()}, {}, c.d_o.has_value()};
  for (Index n = 0; n < c.sequences(); ++n)
    for (Index h = 0; h < c.heads(); ++h) {
      if (c.cu_seqlens.empty()) p.units.push_back({n, h, n, 0, c.total_length()});
      else p.units.push_back({n, h, 0, c.cu_seqlens[n], c.cu_seqlens[n + 1] - c.cu_seqlens[n]});
    }
  return p;
}

UnitInputs inputs_of(const Plan& p, const Unit& u) {
  const KernelCase& c = p.c;
  UnitInputs in;
  in.q_raw = token_block(c.q, p.a, u, p.a.DK);
  in.k_raw = token_block(c.k, p.a, u, p.a.DK);
  in.v = token_block(c.v, p.a, u, p.a.DV);
  in.q = c.scale * (c.l2_normalize_qk ? normalise_rows(in.q_raw) : in.q_raw);
  in.k = c.l2_normalize_qk ? normalise_rows(in.k_raw) : in.k_raw;
  in.beta = c.beta ? gate_block(*c.beta, p.a, u) : VectorD::Ones(u.length);
  in.log_gate = c.g ? gate_block(*c.g, p.a, u) : VectorD::Zero(u.length);
  in.alpha = in.log_gate.array().exp().matrix();
  if (c.h0) in.s0 = state_block(*c.h0, p.a, u);
  if (c.d_o) in.d_o = token_block(*c.d_o, p.a, u, p.a.DV);
  if (c.d_ht) in.d_st = state_block(*c.d_ht, p.a, u);
  return in;
}

// The oracle's per-token temporaries are state-sized (128 KB at D = 128), right at glibc's mmap
// threshold: without this every one is a fresh mapping and page faults dominate the run.
void keep_freed_memory() {
#ifdef __GLIBC__
  static const bool once = [] {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    return true;
  }();
  (void)once;
#endif
}

template <class F>
void parallel_for(size_t n, unsigned threads, F&& f) {
  keep_freed_memory();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = unsigned(std::min<size_t>(threads, std::max<size_t>(1, n)));
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        f(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

OutputRoundoffs roundoffs_of(const KernelResult& r) {
  auto u = [](const std::optional<HostTensor>& t) { return t ? unit_roundoff(t->dtype) : 0.0; };
  return {u(r.o), u(r.ht), u(r.dq), u(r.dk), u(r.dv), u(r.dh0), u(r.dbeta), u(r.dg)};
}

Truth truth_of(const KernelCase& c, const UnitInputs& in, bool gradients, bool high) {
  return high ? oracle_unit<High>(c.op, in, gradients, c.scale, c.l2_normalize_qk)
              : oracle_unit<double>(c.op, in, gradients, c.scale, c.l2_normalize_qk);
}

// Oracle chains: the token recurrence's dot products plus the normalisation and the scale.
long oracle_depth(const KernelCase& c) { return long(c.key_dim() + c.value_dim() + 16); }
long kernel_depth(const KernelCase& c, Index length) {
  return long(length + (length + 15) / 16 + c.key_dim() + c.value_dim() + KernelModel::window + 8);
}

}  // namespace

KernelResult oracle(const KernelCase& c, unsigned threads) {
  const Plan p = plan_of(c);
  KernelResult r;
  auto make = [&](std::vector<Index> shape) {
    HostTensor t;
    t.shape = std::move(shape);
    t.values.assign(size_t(t.size()), 0.0);
    t.dtype = DType::f64;
    return t;
  };
  r.o = make(c.token_shape(c.value_dim()));
  r.ht = make(c.state_shape());
  if (p.gradients) {
    r.dq = make(c.token_shape(c.key_dim())), r.dk = make(c.token_shape(c.key_dim()));
    r.dv = make(c.token_shape(c.value_dim())), r.dh0 = make(c.state_shape());
    if (c.op != Op::linear) r.dbeta = make(c.gate_shape());
    if (c.op == Op::gated_delta) r.dg = make(c.gate_shape());
  }
  parallel_for(p.units.size(), threads, [&](size_t i) {
    const Unit& u = p.units[i];
    const Truth t = truth_of(c, inputs_of(p, u), p.gradients, false);
    auto put_tokens = [&](HostTensor& out, const MatrixD& m) {
      for (Index row = 0; row < m.rows(); ++row)
        for (Index d = 0; d < m.cols(); ++d) out.values[p.a.token(u.batch, u.begin + row, u.head, d, m.cols())] = m(row, d);
    };
    auto put_state = [&](HostTensor& out, const MatrixD& m) {
      for (Index a = 0; a < m.rows(); ++a)
        for (Index b = 0; b < m.cols(); ++b) out.values[p.a.state(u.sequence, u.head, a, b)] = m(a, b);
    };
    auto put_gate = [&](HostTensor& out, const VectorD& x) {
      for (Index row = 0; row < x.size(); ++row) out.values[p.a.gate(u.batch, u.begin + row, u.head)] = x(row);
    };
    put_tokens(*r.o, t.o);
    put_state(*r.ht, t.ht);
    if (p.gradients) {
      put_tokens(*r.dq, t.dq), put_tokens(*r.dk, t.dk), put_tokens(*r.dv, t.dv), put_state(*r.dh0, t.dh0);
      if (r.dbeta) put_gate(*r.dbeta, t.dbeta);
      if (r.dg) put_gate(*r.dg, t.dg);
    }
  });
  return r;
}

Verdict judge(const KernelCase& c, const KernelResult& candidate, const JudgeOptions& options) {
  const Plan p = plan_of(c);
  validate_result(c, candidate);
  const KernelModel model = kernel_model(c.q.dtype, options.tf32_operands, c.l2_normalize_qk);
  const KernelModel exact_enough = double_oracle_model();
  const OutputRoundoffs u = roundoffs_of(candidate);
  const bool gradients = p.gradients && (candidate.dq || candidate.dk || candidate.dv || candidate.dbeta ||
                                         candidate.dg || candidate.dh0);
  std::vector<Judged> judged(p.units.size());
  parallel_for(p.units.size(), options.threads, [&](size_t i) {
    const Unit& unit = p.units[i];
    const UnitInputs in = inputs_of(p, unit);
    const long depth = kernel_depth(c, unit.length);
    const double eps = model.step(depth);
    // The double oracle's bound in the same model, as a share of the kernel's; High when > 1 %.
    const double share = exact_enough.step(oracle_depth(c) + (c.op == Op::linear ? long(unit.length) : 0)) / eps;
    Judged& j = judged[i];
    j.in_high = share > 0.01;
    j.oracle_share = j.in_high ? 0.0 : share;
    const Truth t = truth_of(c, in, gradients, j.in_high);
    Bounds b;
    if (c.op == Op::linear) {
      b = linear_bounds(in, t, gradients, eps * (1 + share), u, c.scale, c.l2_normalize_qk);
    } else {
      const DeltaModel dm{model.step(depth - long(unit.length)) - (std::pow(1 + model.u_op, model.roundings) - 1),
                          std::pow(1 + model.u_op, model.roundings) - 1, model.u_op, model.lambda,
                          c.op == Op::gated_delta};
      DeltaModel widened = dm;  // the double oracle's own error, in the same propagation
      widened.eps_acc += exact_enough.step(oracle_depth(c));
      b = delta_bounds(in, t, gradients, widened, u, c.scale, c.l2_normalize_qk);
    }
    if (j.in_high) {  // the High truth was rounded to double for the comparison: half an ulp more
      auto widen = [](MatrixD& bound, const MatrixD& truth) {
        if (bound.rows() == truth.rows() && bound.cols() == truth.cols()) bound += 0x1p-53 * truth.cwiseAbs();
        else bound.array() += 0x1p-53 * truth.norm();
      };
      widen(b.o, t.o), widen(b.ht, t.ht);
      if (gradients) {
        widen(b.dq, t.dq), widen(b.dk, t.dk), widen(b.dv, t.dv), widen(b.dh0, t.dh0);
        if (c.op != Op::linear) widen(b.dbeta, MatrixD(t.dbeta));
        if (c.op == Op::gated_delta) widen(b.dg, MatrixD(t.dg));
      }
    }
    const Addressing& a = p.a;
    auto tokens = [&](Index dim) {
      return [&, dim](Index r, Index d) { return a.token_index(unit.batch, unit.begin + r, unit.head, d); };
    };
    auto states = [&](Index r, Index d) { return a.state_index(unit.sequence, unit.head, r, d); };
    auto gates = [&](Index r, Index) { return a.gate_index(unit.batch, unit.begin + r, unit.head); };
    auto add = [&](const std::string& name, const std::optional<HostTensor>& cand, const MatrixD& truth,
                   const MatrixD& bound, int kind) {
      if (!cand) return;
      MatrixD m;
      if (kind == 0) m = token_block(*cand, a, unit, truth.cols());
      else if (kind == 1) m = state_block(*cand, a, unit);
      else m = MatrixD(gate_block(*cand, a, unit));
      const std::function<std::vector<Index>(Index, Index)> where =
          kind == 0 ? std::function<std::vector<Index>(Index, Index)>(tokens(truth.cols()))
                    : kind == 1 ? std::function<std::vector<Index>(Index, Index)>(states)
                                : std::function<std::vector<Index>(Index, Index)>(gates);
      j.worst[name] = compare_unit(name, m, truth, bound, where, unit);
    };
    add("o", candidate.o, t.o, b.o, 0);
    add("ht", candidate.ht, t.ht, b.ht, 1);
    if (gradients) {
      add("dq", candidate.dq, t.dq, b.dq, 0);
      add("dk", candidate.dk, t.dk, b.dk, 0);
      add("dv", candidate.dv, t.dv, b.dv, 0);
      if (c.op != Op::linear) add("dbeta", candidate.dbeta, MatrixD(t.dbeta), b.dbeta, 2);
      if (c.op == Op::gated_delta) add("dg", candidate.dg, MatrixD(t.dg), b.dg, 2);
      add("dh0", candidate.dh0, t.dh0, b.dh0, 1);
    }
  });
  Verdict v;
  v.units = Index(p.units.size());
  for (const char* name : {"o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0"}) {
    Comparison merged;
    for (const Judged& j : judged) {
      const auto it = j.worst.find(name);
      if (it != j.worst.end()) merge_worst(merged, it->second);
    }
    if (!merged.tensor.empty()) v.comparisons.push_back(merged);
  }
  for (const Judged& j : judged) {
    v.oracle_share = std::max(v.oracle_share, j.oracle_share);
    v.units_in_high += j.in_high ? 1 : 0;
  }
  return v;
}

}  // namespace deltaproof::verify
