// verify::judge: the oracle on the exact inputs of a kernel run, and each produced tensor compared
// within the bounds of kernel_model.hpp. Work is split into (sequence, head) units, run on every
// core; each unit yields one Comparison per tensor, merged into the tensor's worst.
#include "verify/judge.hpp"

#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/linear_attention.hpp"
#include "verify/host_memory.hpp"
#include "verify/kernel_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include <mpfr.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
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
  // Eight tokens at a time: each token's entries are contiguous in the tensor, each column's in m.
  for (Index r0 = 0; r0 < u.length; r0 += 8)
    for (Index d = 0; d < dim; ++d)
      for (Index r = r0; r < std::min(u.length, r0 + 8); ++r) m(r, d) = t.values[a.token(u.batch, u.begin + r, u.head, d, dim)];
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
// The oracle in High, through reference/ (where the double oracle's own bound is not ≤ 1 % of the
// kernel's); the double oracle is further down, with the bounds it feeds.

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
// The double oracle of linear attention: the chunkwise form (the article's Equation 4, as
// reference/linear_attention.hpp's chunkwise and chunkwise_backward) in matrix products of 64-token
// chunks, on the inputs and, in the same chunk loop, on |inputs| for the magnitudes of the bounds.

constexpr Index linear_chunk = 64;

struct LinearOracle {
  Truth value, magnitude;  // dq, dk with respect to the q, k used (before scale and normalisation)
};

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

struct OutputRoundoffs {
  double o = 0, ht = 0, dq = 0, dk = 0, dv = 0, dh0 = 0, dbeta = 0, dg = 0;
};

MatrixD elementwise_bound(const MatrixD& magnitude, const MatrixD& truth, double eps, double u_out) {
  const MatrixD accumulated = eps * magnitude;
  return accumulated + u_out * (truth.cwiseAbs() + accumulated);
}

// Every term is a product of inputs, so the forms on |inputs| give Σ|terms| (no subtraction); `m`
// holds them as computed in double, at most a factor 1 − γ below the exact ones, which eps carries.
Bounds linear_bounds(const UnitInputs& in, const Truth& t, const Truth& m, bool gradients, double eps,
                     const OutputRoundoffs& u, double scale, bool normalised) {
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
// Column kernels of the delta sweeps (judge_kernels.inc), compiled twice from the same source: for
// x86-64's baseline (SSE2) and for AVX2 with FMA, picked once at run time. A run uses one of them
// throughout, and the state update spells out its rounding (updated() in the file), so the
// backward's recomputed states are the forward's bit for bit. The helpers pass 32-byte vectors by
// value; they are internal and inlined, so GCC's note that such calls change ABI with AVX does not
// apply.
// The kernels' arguments (see judge_kernels.inc).
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
#include "verify/judge_kernels.inc"
}  // namespace baseline
// DELTAPROOF_JUDGE_BASELINE_ONLY: the baseline kernels alone (a test build; what a CPU without AVX2 runs).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(DELTAPROOF_JUDGE_BASELINE_ONLY)
#define DELTAPROOF_AVX2_KERNELS 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define DELTAPROOF_KERNELS_FMA 1
namespace avx2 {
#include "verify/judge_kernels.inc"
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

// Every per-token quantity of the bounds, from the sweeps of delta_oracle.
struct DeltaSweep {
  // Forward: n_state(i), tr_c(i) after i tokens (0: S_0); per token t: ‖u_t‖, |β_t|‖u_t‖‖k_t‖,
  // k_tᵀ C_{t−1} k_t, q_tᵀ C_t q_t, ‖S_t‖‖q_t‖, Σ_i do_ti² v_ti.
  VectorD n_state, tr_c, n_u, n_write, kck_before, qcq, n_sq, do_w;
  MatrixD value_before;  // (DV, L): v_{t−1}, the value side of E_{t−1}
  // Backward, per token t: ‖G_t‖, tr D_t, k_tᵀ D_t k_t, ‖G_t k_t‖, ‖|G_t||k_t|‖, Σ_i u_ti² w_ti,
  // Σ_i (G_t k_t)_i² v_{t−1,i}; and the trace of the covariance of dS_0.
  VectorD n_g, tr_d, kdk, n_gk, n_abs_gk, u_v, gk_v;
  double tr_d_initial = 0;
};

using ConstColumn = Eigen::Map<const VectorD>;

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
  const double storage = bounds ? 2 * model->u_op * model->u_op : 0;
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

Bounds delta_bounds(const UnitInputs& in, const Truth& truth, const DeltaSweep& sw, bool gradients, const DeltaModel& m,
                    const OutputRoundoffs& u, double scale, bool normalised) {
  const Index L = in.q.rows();
  const long w = KernelModel::window;
  const VectorD& alpha = in.alpha;
  const double lam = m.lambda, eps = m.eps_op + m.eps_acc;
  const VectorD q_norms = in.q.rowwise().norm(), k_norms = in.k.rowwise().norm();
  Bounds bd;
  bd.o.resize(L, 1);
  // The in-chunk part of S_t q_t, Σ_{s ≤ t, within a window} |β_s| ‖u_s‖ |q_t·k_s|: its magnitude.
  const VectorD recent_writes = banded_score_sums(in.q, in.k, in.beta.cwiseAbs().cwiseProduct(sw.n_u), w, false);
  const VectorD o_norms = truth.o.rowwise().norm();
  for (Index t = 0; t < L; ++t) {
    const double local = eps * (sw.n_sq(t) + recent_writes(t));
    const double stat = lam * std::sqrt(std::max(0.0, sw.qcq(t))) + local;
    bd.o(t, 0) = stat + u.o * (o_norms(t) + stat);
  }
  const double ht_stat = lam * std::sqrt(std::max(0.0, sw.tr_c(L)));
  bd.ht = MatrixD::Constant(1, 1, ht_stat + u.ht * (truth.ht.norm() + ht_stat));
  if (!gradients) return bd;

  const double dh0_stat = lam * std::sqrt(std::max(0.0, sw.tr_d_initial));
  bd.dh0 = MatrixD::Constant(1, 1, dh0_stat + u.dh0 * (truth.dh0.norm() + dh0_stat));
  // Row bounds of the gradients at token t (kernel_model.hpp; σ are λ·sqrt of the covariances).
  // The in-chunk part of G_t k_t, Σ_{s ≥ t, within a window} ‖do_s‖ |q_s·k_t|: its magnitude.
  const VectorD do_norms = in.d_o->rowwise().norm();
  const VectorD later_reads = banded_score_sums(in.q, in.k, do_norms, w, true);
  // Window magnitudes (kernel_model.hpp): a chunk containing t starts at most w − 1 tokens before
  // it, so the state it starts from is one of S_{t−w} .. S_{t−1}; the chunk's writes before t and
  // reads after t are at most w tokens each, added by the triangle inequality.
  VectorD near_state(L), do_q(L);
  for (Index t = 0; t < L; ++t) {
    near_state(t) = sw.n_state.segment(std::max<Index>(0, t + 1 - w), std::min<Index>(w, t + 1)).maxCoeff();
    do_q(t) = do_norms(t) * q_norms(t);
  }
  const VectorD g_mag = sw.n_g + window_sums(do_q, w, true);           // ≥ ‖G‖ at the chunk's end, plus its reads
  const VectorD s_mag = near_state + window_sums(sw.n_write, w, false);  // ≥ ‖S‖ at the chunk's start, plus its writes
  bd.dq.resize(L, 1), bd.dk.resize(L, 1), bd.dv.resize(L, 1), bd.dbeta.resize(L, 1), bd.dg.resize(L, 1);
  VectorD dg_terms(L);
  for (Index t = 0; t < L; ++t) {
    const double nk = k_norms(t), ndo = do_norms(t), a = alpha(t), b = std::abs(in.beta(t));
    const double s_prev = sw.n_state(t);
    const double sig_prev = lam * std::sqrt(std::max(0.0, sw.tr_c(t)));
    const double sig_u = lam * a * std::sqrt(std::max(0.0, sw.kck_before(t)));
    const double sig_g = lam * std::sqrt(std::max(0.0, sw.tr_d(t))), sig_gk = lam * std::sqrt(std::max(0.0, sw.kdk(t)));
    // Local magnitudes: |G_t| k_t with its in-chunk reads; G and S with the chunk's reads and writes.
    const double gk_mag = sw.n_abs_gk(t) + later_reads(t);
    const double sig_state_do =
        std::min(lam * std::sqrt(std::max(0.0, sw.tr_c(t + 1))) * ndo, lam * std::sqrt(std::max(0.0, sw.do_w(t))));
    const double dq = sig_state_do + eps * s_mag(t) * ndo;
    const double dv = b * sig_gk + eps * b * gk_mag;
    const double dbeta = sw.n_u(t) * sig_gk + sig_u * sw.n_gk(t) + eps * (sw.n_u(t) + a * s_prev * nk) * gk_mag;
    // Value-side forms where they are smaller: F_tᵀ u_t, and E_{t−1}ᵀ (G_t k_t) (each ≤ its Frobenius form).
    const double sig_gu = std::min(sig_g * sw.n_u(t), lam * std::sqrt(std::max(0.0, sw.u_v(t))));
    const double sig_prev_gk = std::min(sig_prev * sw.n_gk(t), lam * std::sqrt(std::max(0.0, sw.gk_v(t))));
    const double dk = b * (sig_gu + sw.n_g(t) * sig_u + a * (sig_prev_gk + s_prev * sig_gk)) +
                      eps * b * (g_mag(t) * sw.n_u(t) + a * (s_prev * gk_mag + s_mag(t) * sw.n_abs_gk(t)));
    dg_terms(t) = a * (1 + b * nk * nk) * (sig_g * s_prev + sw.n_g(t) * sig_prev);
    const double dg_local = eps * a * s_prev * sw.n_g(t) * (1 + b * nk * nk);  // one token's term of the chunk sum
    bd.dq(t, 0) = dq;
    bd.dk(t, 0) = dk;
    bd.dv(t, 0) = dv;
    bd.dbeta(t, 0) = dbeta;
    // A chunk kernel forms dg_t as a sum over the following tokens of its chunk: window of locals.
    bd.dg(t, 0) = dg_terms(t) + dg_local;
  }
  if (m.gated) bd.dg.col(0) = dg_terms + window_sums(bd.dg.col(0) - dg_terms, w, true);
  // Through scale and the in-kernel normalisation (rows of q, k): ‖J‖₂ ≤ |s|·r.
  bd.dq *= std::abs(scale);
  if (normalised) {
    bd.dq.array() /= (in.q_raw.rowwise().squaredNorm().array() + l2norm_eps).sqrt();
    bd.dk.array() /= (in.k_raw.rowwise().squaredNorm().array() + l2norm_eps).sqrt();
  }
  auto add_output_rounding = [](MatrixD& bound, const MatrixD& truth, double u_out) {
    bound.col(0).array() += u_out * (truth.rowwise().norm().array() + bound.col(0).array());
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
  // Column by column (the matrices are column-major); the first non-finite entry is named.
  for (Index j = 0; j < truth.cols() && c.finite; ++j)
    for (Index i = 0; i < truth.rows(); ++i)
      if (!std::isfinite(candidate(i, j))) {
        c.index = where(i, j), c.reference = truth(i, j), c.error = c.ratio = INFINITY, c.finite = false;
        break;
      }
  if (!c.finite) return c;
  const MatrixD error = (candidate - truth).cwiseAbs();
  c.max_abs = truth.size() ? error.maxCoeff() : 0.0;
  c.rms = c.count ? std::sqrt(error.squaredNorm() / double(c.count)) : 0.0;
  if (truth.size() == 0) return c;
  auto ratio_of = [](double err, double bnd) { return bnd > 0 ? err / bnd : (err > 0 ? INFINITY : 0.0); };
  auto worst_entry_of_row = [&](Index i) {
    Index j;
    error.row(i).maxCoeff(&j);
    return j;
  };
  if (elementwise) {
    Index wi = 0, wj = 0;
    double worst = -1;
    for (Index j = 0; j < truth.cols(); ++j)
      for (Index i = 0; i < truth.rows(); ++i)
        if (const double r = ratio_of(error(i, j), bound(i, j)); r > worst) worst = r, wi = i, wj = j;
    c.ratio = worst, c.error = error(wi, wj), c.bound = bound(wi, wj), c.reference = truth(wi, wj), c.index = where(wi, wj);
  } else if (whole) {
    Index wi, wj;
    error.maxCoeff(&wi, &wj);
    c.error = (candidate - truth).norm(), c.bound = bound(0, 0), c.reference = truth.norm();
    c.ratio = ratio_of(c.error, c.bound), c.index = where(wi, wj);
  } else {  // one norm per row; the worst row's largest entry names it
    const VectorD row_errors = (candidate - truth).rowwise().norm();
    Index wi = 0;
    double worst = -1;
    for (Index i = 0; i < truth.rows(); ++i)
      if (const double r = ratio_of(row_errors(i), bound(i, 0)); r > worst) worst = r, wi = i;
    c.ratio = worst, c.error = row_errors(wi), c.bound = bound(wi, 0), c.reference = truth.row(wi).norm();
    c.index = where(wi, worst_entry_of_row(wi));
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

// A unit allocates matrices of a few megabytes (about 100 MB at L = 4096, D = 128) and frees them
// at its end. By default glibc hands that memory back each time (a worker thread's arena unmaps its
// emptied heaps) and the next unit page-faults it in again. So: one arena for every thread (the
// allocations are few and large, so they do not contend), freed memory kept up to 512 MB, and the
// largest mmap threshold glibc accepts (32 MB; 256 MB, asked for before, is refused).
void keep_freed_memory() {
#ifdef __GLIBC__
  static const bool once = [] {
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
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
    // MPFR caches its constants (π, log 2, exp) per thread and a thread that ends keeps them
    // allocated for good: LeakSanitizer found them after every judgement that used High.
    mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);
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

// dq, dk through scale and the in-kernel normalisation, from the gradients on the q, k used.
Truth& pulled_back(Truth& t, const UnitInputs& in, const KernelCase& c, bool gradients) {
  if (gradients) {
    t.dq = pull_back(in.q_raw, t.dq, c.scale, c.l2_normalize_qk);
    t.dk = pull_back(in.k_raw, t.dk, 1.0, c.l2_normalize_qk);
  }
  return t;
}

// The double oracle alone (no bounds).
Truth double_truth(const KernelCase& c, const UnitInputs& in, bool gradients) {
  if (c.op == Op::linear) {
    LinearOracle lo = linear_chunkwise(in, gradients, false);
    return pulled_back(lo.value, in, c, gradients);
  }
  DeltaSweep unused;
  Truth t = delta_oracle(in, gradients, c.op == Op::gated_delta, nullptr, unused);
  return pulled_back(t, in, c, gradients);
}

// The double oracle's chains. Delta family: one step of the token recurrence (DK- and DV-long dot
// products plus a few operations, the normalisation and the scale), propagated like the kernel's
// own step errors. Linear attention: the chunkwise form, each entry a sum whose terms meet at most
// L + DK + DV + 4 roundings (reference/linear_attention.hpp, rounding_depth): the caller adds L.
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
    reserve_in_huge_pages(t.values, size_t(t.size()));
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
    const Truth t = double_truth(c, inputs_of(p, u), p.gradients);
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
    auto high_truth = [&] { return oracle_unit<High>(c.op, in, gradients, c.scale, c.l2_normalize_qk); };
    Truth t;
    Bounds b;
    if (c.op == Op::linear) {
      LinearOracle lo = linear_chunkwise(in, gradients, true);
      t = j.in_high ? high_truth() : std::move(pulled_back(lo.value, in, c, gradients));
      // The magnitudes, computed in double, are at most a factor 1 − γ below the exact ones.
      const double gamma = share * eps;
      b = linear_bounds(in, t, lo.magnitude, gradients, eps * (1 + share) / (1 - gamma), u, c.scale, c.l2_normalize_qk);
    } else {
      const DeltaModel dm{model.step(depth - long(unit.length)) - (std::pow(1 + model.u_op, model.roundings) - 1),
                          std::pow(1 + model.u_op, model.roundings) - 1, model.u_op, model.lambda,
                          c.op == Op::gated_delta};
      DeltaModel widened = dm;  // the double oracle's own error, in the same propagation
      widened.eps_acc += exact_enough.step(oracle_depth(c));
      DeltaSweep sweep;
      Truth d = delta_oracle(in, gradients, c.op == Op::gated_delta, &widened, sweep);
      t = j.in_high ? high_truth() : std::move(pulled_back(d, in, c, gradients));
      b = delta_bounds(in, t, sweep, gradients, widened, u, c.scale, c.l2_normalize_qk);
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
