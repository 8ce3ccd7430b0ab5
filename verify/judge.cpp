// verify::judge: the oracle on the exact inputs of a kernel run, and each produced tensor compared
// within the bounds of kernel_model.hpp. Work is split into (sequence, head) units, run on the threads
// of reference/parallel.hpp; each unit yields one Comparison per tensor, merged into the tensor's worst.
// The families' double oracles and bounds: judge_linear.cpp, judge_delta.cpp, judge_wy.cpp.
#include "verify/judge.hpp"

#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/linear_attention.hpp"
#include "reference/parallel.hpp"
#include "verify/host_memory.hpp"
#include "verify/judge_internal.hpp"
#include "verify/kernel_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <utility>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace deltaproof::verify::judging {
namespace {


using ref::High;


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

}  // namespace

double subnormal_eta(DType d) {
  switch (d) {
    case DType::f16: return 0x1p-25;
    case DType::bf16: return 0x1p-134;
    case DType::f32: return 0x1p-150;
    default: return std::numeric_limits<double>::denorm_min();  // 2⁻¹⁰⁷⁵ is below every double: the next one up
  }
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

namespace {

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
  c.norm = elementwise ? Norm::elementwise : whole ? Norm::frobenius : Norm::rowwise;
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

// The bounds as stated (kernel_model.hpp; proofs/kernel_error_bounds.md), one line per tensor.
std::string linear_formula(const std::string& tensor) {
  const std::string eps = "ε = (1 + u_op)^r (1 + γ_m(u_acc)) − 1";
  if (tensor == "o")
    return "ε_o·A + (1 + ε_o)·(ε_S·M + η_op·W + |q|Eᵀ) + u_out·(|y| + ·) per entry; A = |q_t|(|S_w| + Σ_{s=w..t}|v_s||k_s|ᵀ)ᵀ "
           "over the chunks t can lie in, M = the form on |inputs|, ε_S = the fp32 state's chain, E = a declared 16-bit state's "
           "roundings";
  if (tensor == "ht")
    return "ε_S·M + E_L + u_out·(|y| + ·) per entry; ε_S = (1 + u_op)^{r_S} (1 + γ_{m_S}(u_acc)) − 1, r_S = 0 for 16-bit "
           "products, E_L = a declared 16-bit state's roundings";
  return "ε·M + u_out·(|y| + ε·M) per entry; M = the same form on |inputs|, " + eps;
}
std::string delta_formula(const std::string& tensor) {
  const std::string propagated = "C = the largest of the token recurrence's and the WY chunks' error covariances";
  if (tensor == "o") return "λ·√(q_tᵀ C_t q_t) + ε·(‖S‖‖q_t‖ + Σ_s |β_s|‖u_s‖|q_t·k_s|) + u_out·(‖o_t‖ + ·) per token; " + propagated;
  if (tensor == "ht") return "λ·√(tr C_L) + u_out·(‖S_L‖ + ·), Frobenius; " + propagated;
  if (tensor == "dh0") return "λ·√(tr D_0) + u_out·(‖dS_0‖ + ·), Frobenius; D = the cotangent's error covariance";
  return "λ·(propagated state and cotangent errors) + ε·(window magnitudes) + u_out·(‖row‖ + ·) per token (kernel_model.hpp)";
}

std::string dtype_name(DType d) {
  switch (d) {
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::f32: return "fp32";
    default: return "fp64";
  }
}

// The largest finite number of a storage dtype.
double largest_finite(DType d) {
  switch (d) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 0x1.fep127;
    case DType::f32: return double(std::numeric_limits<float>::max());
    default: return std::numeric_limits<double>::max();
  }
}

struct Judged {
  std::map<std::string, Comparison> worst;
  std::vector<Premise> premises;  // broken by this unit's inputs
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

OutputRoundoffs roundoffs_of(const KernelResult& r) {
  auto u = [](const std::optional<HostTensor>& t) { return t ? unit_roundoff(t->dtype) : 0.0; };
  OutputRoundoffs out{u(r.o), u(r.ht), u(r.dq), u(r.dk), u(r.dv), u(r.dh0), u(r.dbeta), u(r.dg)};
  for (const auto* t : {&r.o, &r.ht, &r.dq, &r.dk, &r.dv, &r.dh0, &r.dbeta, &r.dg})
    if (*t) out.eta = std::max(out.eta, subnormal_eta((*t)->dtype));
  return out;
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

// Units on the threads of reference/parallel.hpp, which mark their workers: a High product inside a
// unit (reference/eigen_products.hpp) then runs on its unit's thread instead of starting a second
// pool. Each worker takes the next unit as it finishes one (units of a varlen batch differ in length).
void for_each_unit(size_t n, unsigned threads, const std::function<void(size_t)>& f) {
  keep_freed_memory();
  const unsigned limit = threads == 0 ? ref::thread_count() : threads;
  const Index workers = Index(std::min<size_t>(limit, std::max<size_t>(1, n)));
  std::atomic<size_t> next{0};
  ref::parallel_for(workers, [&](Index) {
    for (size_t i; (i = next.fetch_add(1)) < n;) f(i);
  });
  // MPFR caches its constants (π, log 2, exp) per thread; the calling thread's go too (parallel.hpp
  // frees its other workers'): LeakSanitizer found them after every judgement that used High.
  mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);
}

}  // namespace deltaproof::verify::judging

namespace deltaproof::verify {

using namespace judging;

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
  for_each_unit(p.units.size(), threads, [&](size_t i) {
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
  // The running state: fp32 for 16-bit and fp32 kernels (fp64 for fp64) unless the kernel declares
  // a 16-bit one, rounded at every chunk boundary.
  const DType state_dtype = options.state_dtype.value_or(c.q.dtype == DType::f64 ? DType::f64 : DType::f32);
  const double state_roundoff = state_dtype == DType::bf16 || state_dtype == DType::f16 ? unit_roundoff(state_dtype) : 0.0;
  // The WY chunk sizes covered: the kernel's, or 16, 32 and 64 (chunks from each sequence's start).
  if (options.chunk_size < 0 || options.chunk_size == 1 || options.chunk_size > KernelModel::window)
    throw std::invalid_argument("chunk_size: expected 0 (unknown) or 2 .. " + std::to_string(KernelModel::window) + ", got " +
                                std::to_string(options.chunk_size));
  const std::vector<long> chunk_sizes = options.chunk_size ? std::vector<long>{options.chunk_size} : std::vector<long>{16, 32, 64};
  const long chunk_stride = options.chunk_size ? options.chunk_size : 16;
  std::vector<Judged> judged(p.units.size());
  for_each_unit(p.units.size(), options.threads, [&](size_t i) {
    const Unit& unit = p.units[i];
    const UnitInputs in = inputs_of(p, unit);
    const long depth = kernel_depth(c, unit.length);
    const double eps = model.step(depth);
    // The double oracle's bound in the same model, as a share of the kernel's; High when > 1 %.
    const double oracle_gamma = exact_enough.step(oracle_depth(c) + (c.op == Op::linear ? long(unit.length) : 0));
    // Linear attention's forward (kernel_model.hpp): the state's chain ε_S (the smallest coefficient on M, so
    // the one the oracle's share is taken of) and the chunk's ε_o on the operands it rounds.
    const long state_depth = long(unit.length + (unit.length + 15) / 16 + 8) + (c.l2_normalize_qk ? long(c.key_dim()) : 0);
    const double eps_state = model.step(state_depth, model.state_roundings);
    const double share = oracle_gamma / (c.op == Op::linear ? std::min(eps, eps_state) : eps);
    Judged& j = judged[i];
    j.in_high = share > 0.01;
    j.oracle_share = j.in_high ? 0.0 : share;
    auto high_truth = [&] { return oracle_unit<High>(c.op, in, gradients, c.scale, c.l2_normalize_qk); };
    Truth t;
    Bounds b;
    if (c.op == Op::linear) {
      LinearOracle lo = linear_chunkwise(in, gradients, true);
      t = j.in_high ? high_truth() : std::move(pulled_back(lo.value, in, c, gradients));
      LinearForwardModel fm;
      fm.chunk_size = options.chunk_size, fm.normalised = c.l2_normalize_qk;
      fm.u_state = state_roundoff, fm.eta_state = state_roundoff > 0 ? subnormal_eta(state_dtype) : 0.0;
      fm.eps_chunk = model.step(KernelModel::window + 8, model.state_roundings);
      LinearEps e;
      e.local = model.step(long(c.key_dim() + c.value_dim()) + KernelModel::window);
      e.state = eps_state;
      e.oracle = oracle_gamma;
      // The gradients: ε on M; the magnitudes, computed in double, at most a factor 1 − γ below the exact ones.
      e.gradients = (eps + oracle_gamma) / (1 - oracle_gamma);
      e.eta_op = subnormal_eta(c.q.dtype);
      e.eta_acc = subnormal_eta(c.q.dtype == DType::f64 ? DType::f64 : DType::f32);
      e.depth = depth;
      b = linear_bounds(in, t, lo.magnitude, linear_state_terms(in, fm), gradients, e, u, c.scale, c.l2_normalize_qk);
    } else {
      DeltaModel dm;
      dm.eps_op = std::pow(1 + model.u_op, model.roundings) - 1;
      dm.eps_acc = model.step(depth - long(unit.length)) - dm.eps_op;
      dm.u_op = model.u_op, dm.lambda = model.lambda, dm.gated = c.op == Op::gated_delta;
      dm.u_state = state_roundoff;
      dm.u_acc32 = c.q.dtype == DType::f64 ? model.u_acc : 0x1p-23;
      dm.operand_max = largest_finite(c.q.dtype);
      dm.eta_op = subnormal_eta(c.q.dtype);
      dm.chunk_sizes = chunk_sizes;
      dm.chunk_stride = chunk_stride;
      DeltaModel widened = dm;  // the double oracle's own error, in the same propagation
      widened.eps_acc += exact_enough.step(oracle_depth(c));
      DeltaSweep sweep;
      Truth d = delta_oracle(in, gradients, c.op == Op::gated_delta, &widened, sweep);
      const WyMoments wy = wy_moments(in, sweep, widened);
      for (const PremiseFailure& f : wy.premises) j.premises.push_back({f.reason, f.measured, f.limit});
      t = j.in_high ? high_truth() : std::move(pulled_back(d, in, c, gradients));
      b = delta_bounds(in, t, sweep, wy, gradients, widened, u, c.scale, c.l2_normalize_qk);
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
      Comparison row = compare_unit(name, m, truth, bound, where, unit);
      row.formula = c.op == Op::linear ? linear_formula(name) : delta_formula(name);
      // Premises: the unit's (the WY products), and the exact result representable in the dtype stored.
      if (!j.premises.empty()) row.premise = j.premises.front();
      const double largest = truth.size() ? truth.cwiseAbs().maxCoeff() : 0.0, limit = largest_finite(cand->dtype);
      if (!row.premise && largest > limit)
        row.premise = Premise{"the exact " + name + " exceeds the range of " + dtype_name(cand->dtype) + ": max |" + name + "|",
                              largest, limit};
      j.worst[name] = std::move(row);
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