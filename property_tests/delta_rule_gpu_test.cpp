// DeltaNet and Gated DeltaNet kernels (cuda/delta_rule.h) against the oracle, stage by stage.
//
// Every stage is compared with the oracle's formula for that stage evaluated in 100-digit MPFR
// (High: exact ℚ would be as good but slower; the decays exp(G_i − G_j) of Gated DeltaNet are
// irrational anyway, and 1e-100 is far inside every bound below) on the
// exact values of that stage's inputs as the kernel saw them: the rounded inputs for A, the
// kernel's own A for T, its own T for W and U, its own W, U and S_[c] for V̄, and so on. Each
// stage then carries only its own rounding error, and its bound is derived from the operations
// the kernel performs (DESIGN.md, numerical policy 2):
//
//   Every stage is a straight-line program of +, −, × (the unit-diagonal inverse needs no
//   division), so |computed − exact| <= γ_m(u) · (the same program run on |inputs| with every
//   − turned into +), where m is the longest chain of roundings from an input to the result
//   (Higham, §3.1). Roundings of different sizes compose as Π(1 + γ_{m_i}(u_i)) − 1:
//     u_acc = 2⁻²³  fp32 accumulation (tensor cores may truncate instead of round: 2u),
//     u_op          rounding of an MMA operand to the input dtype (0 for fp32 inputs: plain FMA),
//     u_out         rounding of a stored result to the input dtype,
//     η             absolute error of an operand that lands among fp16 subnormals (2⁻²⁵),
//     ε_D           relative error of a kernel decay exp(Ĝ_i − Ĝ_j) (fp32 cumulative sums, expf
//                   within 2 ulp), zero for DeltaNet where every exponent is exactly 0.
//
// End to end (cross-C, decode after prefill, accuracy) the kernel is compared with a float64
// token recurrence normwise: bounds on the whole chain would multiply the stage bounds by the
// recurrence's growth, so these tests state their thresholds in units of u_op instead.
#include "cuda/delta_rule.h"
#include "property_tests/support/device_tensors.hpp"
#include "property_tests/support/gpu.hpp"
#include "reference/delta_rule.hpp"
#include "reference/error_report.hpp"
#include "reference/gated_delta_rule.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace deltaproof;
using cuda::DType;
using ref::Exact;
using ref::High;
using ref::Index;
using ref::Matrix;
using ref::Tensor4;
using ref::Vector;
namespace dt = deltaproof::testing;
using dt::DeviceTensor;
using dt::Uploaded;
namespace dr = ref::delta_rule;
namespace gdr = ref::gated_delta_rule;

// ---------------------------------------------------------------------------------------
// Cases: a shape, then entries drawn from a seed (printed with every failure).

struct DeltaCase {
  Index batch = 1, heads = 1, length = 1, key_dim = 1, value_dim = 1, chunk = 64;
  DType dtype = DType::bf16;
  bool with_initial_state = false, gated = false;
  std::uint64_t seed = 0;
  int key_shift = -1;       // keys n / 2^(3 + key_shift), |n| <= 8; −1: chosen so that ‖k‖² <= 1
  double gate_step = 1.0 / 16;  // log-gates g = −m · gate_step, m in 0..16 (a power of two: exact in fp32)
  bool zero_gates = false;      // g = 0 exactly (Gated DeltaNet must then equal DeltaNet bit for bit)
};

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

// Exact values of every input (already representable in the dtype, so rounding leaves them).
struct HostInputs {
  Tensor4<Exact> q, k, v, beta, log_gate, initial_state;  // log_gate [B, H, L, 1] in fp32 values
};

int default_key_shift(Index key_dim) {
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

rc::Gen<DeltaCase> gen_case(bool gated, Index max_length, Index max_dim) {
  return rc::gen::exec([=] {
    DeltaCase c;
    c.gated = gated;
    c.chunk = *rc::gen::element<Index>(16, 32, 64);
    c.length = *rc::gen::oneOf(rc::gen::element<Index>(1, 2, c.chunk - 1, c.chunk, c.chunk + 1),
                               rc::gen::inRange<Index>(1, max_length + 1));
    c.key_dim = *rc::gen::oneOf(rc::gen::element<Index>(1, 15, 16, 60), rc::gen::inRange<Index>(1, max_dim + 1));
    c.value_dim = *rc::gen::oneOf(rc::gen::element<Index>(1, 15, 16, 60), rc::gen::inRange<Index>(1, max_dim + 1));
    c.batch = *rc::gen::inRange<Index>(1, 3);
    c.heads = *rc::gen::inRange<Index>(1, 3);
    c.dtype = *rc::gen::element(DType::bf16, DType::f16, DType::f32);
    c.with_initial_state = *rc::gen::arbitrary<bool>();
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

// Runs a property over a bounded number of generated cases (GPU tests share a 90 s budget);
// the seed still comes from RC_PARAMS.
template <class Testable>
bool check_cases(const std::string& name, int cases, Testable&& testable) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = cases;
  rc::detail::TestMetadata metadata;
  metadata.id = metadata.description = name;
  const auto result = rc::detail::checkTestable(std::forward<Testable>(testable), metadata, params);
  rc::detail::printResultMessage(result, std::cerr);
  std::cerr << std::endl;
  return result.template is<rc::detail::SuccessResult>();
}

// ---------------------------------------------------------------------------------------
// Running the kernels.

struct DeviceInputs {
  Uploaded q, k, v, beta, log_gate, initial_state;
};

DeviceInputs upload_inputs(const DeltaCase& c, const HostInputs& in) {
  DeviceInputs d{dt::upload(in.q, c.dtype), dt::upload(in.k, c.dtype), dt::upload(in.v, c.dtype),
                 dt::upload(in.beta, c.dtype), dt::upload(in.log_gate, DType::f32), {}};
  if (c.with_initial_state) d.initial_state = dt::upload(in.initial_state, DType::f32);
  return d;
}

// What the forward writes, read back exactly.
struct ForwardResult {
  Tensor4<Exact> output, final_state, w, u, v_new, a, t, boundary;  // a, t [B, H, N·C, C]; boundary [B, H, N·DV, DK]
};

struct ForwardBuffers {
  DeviceTensor output, final_state, w, u, v_new, a, t, boundary;
  DeviceTensor state_operands, v_new_operands;  // workspace of scan version 3
};

ForwardBuffers allocate_forward(const DeltaCase& c, bool intermediates) {
  const Index B = c.batch, H = c.heads, L = c.length, N = cuda::chunk_count(int(L), int(c.chunk));
  ForwardBuffers f;
  f.output = dt::allocate(c.dtype, B, H, L, c.value_dim);
  f.final_state = dt::allocate(DType::f32, B, H, c.value_dim, c.key_dim);
  f.w = dt::allocate(c.dtype, B, H, L, c.key_dim);
  f.u = dt::allocate(c.dtype, B, H, L, c.value_dim);
  f.state_operands = dt::allocate(c.dtype, B, H, N * c.value_dim, c.key_dim);
  f.v_new_operands = dt::allocate(c.dtype, B, H, L, c.value_dim);
  if (intermediates) {
    f.v_new = dt::allocate(DType::f32, B, H, L, c.value_dim);
    f.a = dt::allocate(DType::f32, B, H, N * c.chunk, c.chunk);
    f.t = dt::allocate(DType::f32, B, H, N * c.chunk, c.chunk);
    f.boundary = dt::allocate(DType::f32, B, H, N * c.value_dim, c.key_dim);
  }
  return f;
}

cuda::DeltaRuleForwardParams forward_params(const DeltaCase& c, const DeviceInputs& d, ForwardBuffers& f) {
  cuda::DeltaRuleForwardParams p;
  p.dtype = c.dtype;
  p.batch = int(c.batch), p.heads = int(c.heads), p.length = int(c.length);
  p.key_dim = int(c.key_dim), p.value_dim = int(c.value_dim), p.chunk_size = int(c.chunk);
  p.q = d.q.device.data(), p.k = d.k.device.data(), p.v = d.v.device.data(), p.beta = d.beta.device.data();
  p.log_gate = c.gated ? static_cast<const float*>(d.log_gate.device.data()) : nullptr;
  p.initial_state = c.with_initial_state ? static_cast<const float*>(d.initial_state.device.data()) : nullptr;
  p.output = f.output.data(), p.final_state = static_cast<float*>(f.final_state.data());
  p.w = f.w.data(), p.u = f.u.data();
  p.state_operands = f.state_operands.data(), p.v_new_operands = f.v_new_operands.data();
  p.wy_system = static_cast<float*>(f.a.data());
  p.wy_inverse = static_cast<float*>(f.t.data());
  p.v_new = static_cast<float*>(f.v_new.data());
  p.boundary_states = static_cast<float*>(f.boundary.data());
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

ForwardResult run_forward(const DeltaCase& c, const HostInputs& in, bool intermediates = true) {
  const DeviceInputs d = upload_inputs(c, in);
  ForwardBuffers f = allocate_forward(c, intermediates);
  cuda::delta_rule_forward(forward_params(c, d, f));
  return read_back(f, intermediates);
}

// ---------------------------------------------------------------------------------------
// Bounds.

constexpr double u_acc = 0x1p-23;
constexpr double u32 = 0x1p-24;

struct Units {
  double op, out, eta;
};
Units units_of(DType d) {
  switch (d) {
    case DType::bf16: return {0x1p-8, 0x1p-8, 0x1p-134};
    case DType::f16: return {0x1p-11, 0x1p-11, 0x1p-25};
    default: return {0.0, u32, 0.0};
  }
}

// Π(1 + γ_{m_acc}(u_acc)) (1 + u_op)^op_roundings (1 + extra) − 1, rounded up.
double rho(long acc_roundings, int op_roundings, double u_op, double extra = 0) {
  const double r = (1 + ref::gamma(acc_roundings, u_acc)) * std::pow(1 + u_op, op_roundings) * (1 + extra) - 1;
  return r * (1 + 1e-12);
}

// Relative error of the kernel's decays over one chunk (0 without gates).
double decay_error(bool gated, const Vector<High>& log_gate, Index chunk) {
  if (!gated) return 0;
  double sum = 0;
  for (Index i = 0; i < log_gate.size(); ++i) sum += std::abs(ref::to_double(log_gate(i)));
  const double shift = (2 * ref::gamma(chunk, u32) + u32) * sum;  // |Ĝ_i − Ĝ_j − (G_i − G_j)|
  return std::expm1(shift) * (1 + 0x1p-22) + 0x1p-22;           // expf: within 2 ulp
}

template <class S>
Matrix<S> scalar_times(double x, const Matrix<S>& m) {
  return m * S(x);
}

// Collects stage comparisons; the test fails on the first summary outside its bound.
struct Report {
  std::string context;
  std::vector<ref::ErrorSummary> summaries;
  std::vector<std::string> failures;

  void add(ref::ErrorSummary s) {
    if (!s.within_bound) failures.push_back(context + " | " + s.describe());
    summaries.push_back(std::move(s));
  }
  bool ok() const { return failures.empty(); }
  std::string message() const {
    std::string m;
    for (const auto& f : failures) m += f + "\n";
    return m;
  }
  // Largest err/bound per stage name prefix (before '['), for the printed calibration.
  std::string calibration() const {
    std::vector<std::pair<std::string, double>> worst;
    for (const auto& s : summaries) {
      const std::string stage = s.name.substr(0, s.name.find('['));
      auto it = std::find_if(worst.begin(), worst.end(), [&](const auto& p) { return p.first == stage; });
      if (it == worst.end()) worst.push_back({stage, s.max_bound_ratio});
      else it->second = std::max(it->second, s.max_bound_ratio);
    }
    std::ostringstream os;
    os.precision(2);
    for (const auto& [stage, r] : worst) os << stage << " " << std::scientific << r << "  ";
    return os.str();
  }
};

template <class S>
Matrix<S> to(const Matrix<Exact>& m) {
  return ref::matrix_cast<S>(m);
}

template <class S>
Matrix<S> decay_matrix(bool gated, const Vector<High>& g) {
  if constexpr (std::is_same_v<S, High>) {
    if (gated) return gdr::decay_from_log_gates<High>(g);
  }
  return gdr::decay_from_gates<S>(Vector<S>::Ones(g.size()));
}

// One head, every chunk: A, T (whole, each 16×16 diagonal block, each merged block), W, U, V̄,
// S_[c+1] (boundary or final), O. S is Exact for DeltaNet and High for Gated DeltaNet.
template <class S>
void check_head_stages(const DeltaCase& c, const HostInputs& in, const ForwardResult& r, Index b, Index h, Report& rep) {
  const Units un = units_of(c.dtype);
  const Index C = c.chunk, DK = c.key_dim, DV = c.value_dim, N = cuda::chunk_count(int(c.length), int(C));
  const Matrix<S> q = to<S>(in.q.head(b, h)), k = to<S>(in.k.head(b, h)), v = to<S>(in.v.head(b, h));
  const Vector<S> beta = to<S>(in.beta.head(b, h)).col(0);
  const Vector<High> g = ref::matrix_cast<High>(in.log_gate.head(b, h)).col(0);
  const Matrix<S> a_all = to<S>(r.a.head(b, h)), t_all = to<S>(r.t.head(b, h)), w_all = to<S>(r.w.head(b, h));
  const Matrix<S> u_all = to<S>(r.u.head(b, h)), vnew_all = to<S>(r.v_new.head(b, h)), o_all = to<S>(r.output.head(b, h));
  const Matrix<S> boundary = to<S>(r.boundary.head(b, h)), final_state = to<S>(r.final_state.head(b, h));
  const Matrix<S> s0 = c.with_initial_state ? to<S>(in.initial_state.head(b, h)) : Matrix<S>::Zero(DV, DK);

  auto tag = [&](const char* stage, Index chunk) {
    return std::string(stage) + "[b=" + std::to_string(b) + ",h=" + std::to_string(h) + ",chunk=" + std::to_string(chunk) + "]";
  };
  auto exact_bound = [](Index rows, Index cols) { return Matrix<S>(Matrix<S>::Zero(rows, cols)); };

  // S_[0] is S_0 exactly (a lost S_0 shows here first).
  rep.add(ref::compare<S>(tag("S_[0]", 0), boundary.topRows(DV), s0, exact_bound(DV, DK)));

  for (const ref::Chunk& ch : ref::chunks_of(c.length, C)) {
    const Index n = ch.size, cc = ch.index;
    const Matrix<S> qc = q.middleRows(ch.begin, n), kc = k.middleRows(ch.begin, n), vc = v.middleRows(ch.begin, n);
    const Vector<S> bc = beta.segment(ch.begin, n);
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
    const Matrix<S> a_mag = dr::scale_rows<S>(bc, (k_abs * k_abs.transpose()).cwiseProduct(d));
    a_bound.topLeftCorner(n, n) = dr::strictly_lower<S>(scalar_times(rho(DK + 2, 0, 0, eps_d), a_mag));
    rep.add(ref::compare<S>(tag("A", cc), a_hat, a_ref, a_bound));

    // T = Â⁻¹ (of the kernel's own A): forward substitution on 16×16 blocks and two merge levels
    // in fp32, at most 2C roundings deep; magnitude (I − |strictly_lower(Â)|)⁻¹.
    const Matrix<S> a_top = a_hat.topLeftCorner(n, n);
    const dr::BlockInverse<S> inv = dr::invert_unit_lower_blocked<S>(a_top, 16);
    const Matrix<S> t_mag_top = dr::invert_unit_lower_forward_substitution<S>(
        Matrix<S>(Matrix<S>::Identity(n, n) - dr::strictly_lower<S>(Matrix<S>(a_top.cwiseAbs()))));
    const Matrix<S> t_hat = t_all.middleRows(cc * C, C);
    Matrix<S> t_ref = Matrix<S>::Identity(C, C), t_mag = Matrix<S>::Identity(C, C);
    t_ref.topLeftCorner(n, n) = inv.t;
    t_mag.topLeftCorner(n, n) = t_mag_top;
    Matrix<S> t_bound = exact_bound(C, C);
    t_bound.topLeftCorner(n, n) = scalar_times(ref::gamma(2 * C, u32), t_mag_top);
    rep.add(ref::compare<S>(tag("T", cc), t_hat, t_ref, t_bound));
    for (size_t blk = 0; blk < inv.diagonal_block_inverses.size(); ++blk) {
      const Index at = Index(blk) * 16;
      rep.add(ref::compare<S>(tag(("T16." + std::to_string(blk)).c_str(), cc), Matrix<S>(t_hat.block(at, at, 16, 16)),
                              inv.diagonal_block_inverses[blk],
                              scalar_times(ref::gamma(32, u32), Matrix<S>(t_mag.block(at, at, 16, 16)))));
    }
    for (size_t level = 0; level < inv.merged_levels.size(); ++level)
      for (size_t blk = 0; blk < inv.merged_levels[level].size(); ++blk) {
        const Index size = Index(16) << (level + 1), at = Index(blk) * size;
        rep.add(ref::compare<S>(tag(("T" + std::to_string(size) + "." + std::to_string(blk)).c_str(), cc),
                                Matrix<S>(t_hat.block(at, at, size, size)), inv.merged_levels[level][blk],
                                scalar_times(ref::gamma(2 * size, u32), Matrix<S>(t_mag.block(at, at, size, size)))));
      }

    // W = T̂ diag(βγ) K, U = T̂ diag(β) V: fp32 factor split hi + lo (residual u_op²), 2C
    // accumulations, stored in the dtype.
    const Matrix<S> t_top = t_hat.topLeftCorner(n, n), t_abs = t_top.cwiseAbs();
    const dr::WY<S> wy = c.gated ? gdr::wy_factors<S>(t_top, kc, vc, bc, gamma) : dr::wy_factors<S>(t_top, kc, vc, bc);
    const double r_w = rho(2 * C + 2, 0, 0, un.op * un.op + eps_d), r_u = rho(2 * C + 1, 0, 0, un.op * un.op);
    const Matrix<S> w_mag = t_abs * dr::scale_rows<S>(Vector<S>(bc.cwiseProduct(gamma)), k_abs);
    const Matrix<S> u_mag = t_abs * dr::scale_rows<S>(bc, Matrix<S>(vc.cwiseAbs()));
    const Matrix<S> ones_c = Matrix<S>::Ones(n, n);
    auto stored = [&](const Matrix<S>& ref_value, const Matrix<S>& mag, double r, const Matrix<S>& operand_abs) {
      return Matrix<S>(scalar_times(un.out, Matrix<S>(ref_value.cwiseAbs())) + scalar_times((1 + un.out) * r, mag) +
                       scalar_times(2 * un.eta, Matrix<S>(ones_c * operand_abs)));
    };
    rep.add(ref::compare<S>(tag("W", cc), Matrix<S>(w_all.middleRows(ch.begin, n)), wy.w,
                            stored(wy.w, w_mag, r_w, k_abs)));
    rep.add(ref::compare<S>(tag("U", cc), Matrix<S>(u_all.middleRows(ch.begin, n)), wy.u,
                            stored(wy.u, u_mag, r_u, Matrix<S>(vc.cwiseAbs()))));

    // V̄ = Û − Ŵ Ŝᵀ with Ŝ = the kernel's S_[c]; S rounded to an operand, DK + 1 accumulations.
    const Matrix<S> w_hat = w_all.middleRows(ch.begin, n), u_hat = u_all.middleRows(ch.begin, n);
    const Matrix<S> s_hat = boundary.middleRows(cc * DV, DV);
    const Matrix<S> vnew_hat = vnew_all.middleRows(ch.begin, n);
    const Matrix<S> vnew_ref = u_hat - w_hat * s_hat.transpose();
    const Matrix<S> vnew_mag = u_hat.cwiseAbs() + w_hat.cwiseAbs() * s_hat.cwiseAbs().transpose();
    const Matrix<S> vnew_eta = w_hat.cwiseAbs() * Matrix<S>::Ones(DK, DV);
    rep.add(ref::compare<S>(tag("Vbar", cc), vnew_hat, vnew_ref,
                            Matrix<S>(scalar_times(rho(DK + 1, 1, un.op), vnew_mag) + scalar_times(un.eta, vnew_eta))));

    // S_[c+1] = γ_C Ŝ + V̄̂ᵀ diag(λ) K: decay in fp32, V̄ rounded to an operand, C + 1 accumulations.
    const Matrix<S> s_next_hat = cc + 1 < N ? Matrix<S>(boundary.middleRows((cc + 1) * DV, DV)) : final_state;
    const Matrix<S> s_next_ref = s_hat * gamma_end + vnew_hat.transpose() * dr::scale_rows<S>(lambda, kc);
    const Matrix<S> s_next_bound =
        scalar_times(rho(C + 2, 0, 0, eps_d), Matrix<S>(s_hat.cwiseAbs() * gamma_end)) +
        scalar_times(rho(C + 3, 1, un.op, eps_d), Matrix<S>(vnew_hat.cwiseAbs().transpose() * dr::scale_rows<S>(lambda, k_abs))) +
        scalar_times(un.eta, Matrix<S>(Matrix<S>::Ones(DV, n) * k_abs));
    rep.add(ref::compare<S>(tag(cc + 1 < N ? "S_[c+1]" : "final_state", cc), s_next_hat, s_next_ref, s_next_bound));

    // O = diag(γ) Q Ŝᵀ + (Q Kᵀ ⊙ D) V̄̂: S, P and V̄ rounded to operands, DK + C + 2 accumulations,
    // stored in the dtype.
    const Matrix<S> scores = (qc * kc.transpose()).cwiseProduct(d);
    const Matrix<S> o_ref = dr::scale_rows<S>(gamma, Matrix<S>(qc * s_hat.transpose())) + scores * vnew_hat;
    const Matrix<S> o_mag1 = dr::scale_rows<S>(gamma, Matrix<S>(q_abs * s_hat.cwiseAbs().transpose()));
    const Matrix<S> o_mag2 = (q_abs * k_abs.transpose()).cwiseProduct(d) * vnew_hat.cwiseAbs();
    const Matrix<S> o_eta = q_abs * Matrix<S>::Ones(DK, DV) + (q_abs * k_abs.transpose()).cwiseProduct(d) * Matrix<S>::Ones(n, DV) +
                            Matrix<S>::Ones(n, n) * vnew_hat.cwiseAbs();
    const Matrix<S> o_bound = scalar_times(un.out, Matrix<S>(o_ref.cwiseAbs())) +
                              scalar_times((1 + un.out) * rho(DK + C + 2, 1, un.op, eps_d + u32), o_mag1) +
                              scalar_times((1 + un.out) * rho(DK + C + 2, 2, un.op, eps_d + u32), o_mag2) +
                              scalar_times(2 * un.eta, o_eta);
    rep.add(ref::compare<S>(tag("O", cc), Matrix<S>(o_all.middleRows(ch.begin, n)), o_ref, o_bound));
  }
}

Report check_stages(const DeltaCase& c, const HostInputs& in, const ForwardResult& r) {
  Report rep;
  rep.context = describe(c);
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.heads; ++h) {
      check_head_stages<High>(c, in, r, b, h, rep);
    }
  return rep;
}

// ---------------------------------------------------------------------------------------
// float64 oracle for end-to-end comparisons.

struct DoubleForward {
  std::vector<Matrix<double>> output, final_state;  // per head
};

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

// Token-wise normwise agreement: ‖ô_t − o_t‖ <= τ (‖o_t‖ + RMS_t ‖o_t‖) for every token t.
// Returns an empty string on success, else the worst token.
std::string rowwise_disagreement(const std::vector<Matrix<double>>& candidate, const std::vector<Matrix<double>>& reference,
                                 double tau) {
  for (size_t hd = 0; hd < reference.size(); ++hd) {
    const Matrix<double>& ref_m = reference[hd];
    const double rms = std::sqrt(ref_m.squaredNorm() / std::max<Index>(1, ref_m.rows()));
    for (Index t = 0; t < ref_m.rows(); ++t) {
      const double err = (candidate[hd].row(t) - ref_m.row(t)).norm(), allowed = tau * (ref_m.row(t).norm() + rms);
      if (!(err <= allowed)) {
        std::ostringstream s;
        s << "head " << hd << " token " << t << ": error " << err << " > " << allowed << " (tau " << tau << ")";
        return s.str();
      }
    }
  }
  return {};
}

// End-to-end threshold in units of the operand rounding (fp32 inputs: fp32 accumulation over the
// chain, 2⁻¹⁶ covers L <= 512 with well-conditioned keys).
double end_to_end_tau(DType d) { return d == DType::f32 ? 0x1p-16 : 16 * units_of(d).op; }

// ---------------------------------------------------------------------------------------
// Stage properties.

TEST(DeltaRuleGpu, StagesMatchOracleDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("DeltaNet stages vs the oracle", 12, [](void) {
    const DeltaCase c = *gen_case(false, 100, 32);
    const HostInputs in = make_inputs(c);
    const Report rep = check_stages(c, in, run_forward(c, in));
    RC_TAG(cuda::name_of(c.dtype));
    if (!rep.ok()) RC_FAIL(rep.message());
  }));
}

TEST(DeltaRuleGpu, StagesMatchOracleGatedDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("Gated DeltaNet stages vs the oracle with alpha = exp(g)", 10, [](void) {
    const DeltaCase c = *gen_case(true, 80, 32);
    const HostInputs in = make_inputs(c);
    const Report rep = check_stages(c, in, run_forward(c, in));
    if (!rep.ok()) RC_FAIL(rep.message());
  }));
}

// Prints the worst err/bound per stage for one mid-sized case of each dtype (calibration).
TEST(DeltaRuleGpu, StageBoundCalibration) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType d : {DType::bf16, DType::f16, DType::f32})
    for (bool gated : {false, true}) {
      DeltaCase c;
      c.gated = gated, c.dtype = d, c.length = 100, c.key_dim = 48, c.value_dim = 32, c.chunk = 64;
      c.with_initial_state = true, c.seed = 7;
      const HostInputs in = make_inputs(c);
      const Report rep = check_stages(c, in, run_forward(c, in));
      std::cout << describe(c) << "\n  max err/bound: " << rep.calibration() << "\n";
      EXPECT_TRUE(rep.ok()) << rep.message();
    }
}

// ---------------------------------------------------------------------------------------
// Named regimes.

Report stages_for(DeltaCase c) {
  const HostInputs in = make_inputs(c);
  return check_stages(c, in, run_forward(c, in));
}

TEST(DeltaRuleGpu, RegimeChunk64ShortSequences) {  // C = 64 on Hopper with L <= 8 and L < C
  DELTAPROOF_REQUIRE_GPU();
  for (Index L : {1, 2, 3, 5, 8, 33, 63})
    for (bool gated : {false, true}) {
      DeltaCase c;
      c.gated = gated, c.length = L, c.chunk = 64, c.key_dim = 32, c.value_dim = 24, c.with_initial_state = true;
      c.seed = 100 + L;
      const Report rep = stages_for(c);
      EXPECT_TRUE(rep.ok()) << rep.message();
    }
}

TEST(DeltaRuleGpu, RegimePartialLastChunk) {  // L % C != 0 for every C
  DELTAPROOF_REQUIRE_GPU();
  for (Index C : {16, 32, 64})
    for (Index L : {C + 1, 2 * C - 1, 3 * C + 7}) {
      DeltaCase c;
      c.length = L, c.chunk = C, c.key_dim = 20, c.value_dim = 36, c.with_initial_state = L % 2 == 1;
      c.seed = 200 + L;
      const Report rep = stages_for(c);
      EXPECT_TRUE(rep.ok()) << rep.message();
    }
}

TEST(DeltaRuleGpu, RegimeHeadDims256AndOdd) {  // shared-memory limits at DK = DV = 256; odd dims
  DELTAPROOF_REQUIRE_GPU();
  for (DType d : {DType::bf16, DType::f32})
    for (auto [dk, dv] : {std::pair<Index, Index>{256, 256}, {100, 1}, {1, 100}}) {
      DeltaCase c;
      c.dtype = d, c.length = 70, c.chunk = 64, c.key_dim = dk, c.value_dim = dv, c.seed = 300 + dk;
      const Report rep = stages_for(c);
      EXPECT_TRUE(rep.ok()) << rep.message();
    }
}

// g = 0: the gated kernels compute with exp(0) = 1 everywhere, so every written byte equals DeltaNet's.
TEST(DeltaRuleGpu, RegimeZeroGatesEqualDeltaNetBitwise) {
  DELTAPROOF_REQUIRE_GPU();
  for (DType d : {DType::bf16, DType::f16, DType::f32}) {
    DeltaCase c;
    c.dtype = d, c.length = 77, c.chunk = 32, c.key_dim = 40, c.value_dim = 24, c.with_initial_state = true;
    c.zero_gates = true, c.seed = 400;
    const HostInputs in = make_inputs(c);
    const DeviceInputs dev = upload_inputs(c, in);
    ForwardBuffers plain = allocate_forward(c, true), gated = allocate_forward(c, true);
    cuda::delta_rule_forward(forward_params(c, dev, plain));
    c.gated = true;
    cuda::delta_rule_forward(forward_params(c, dev, gated));
    auto same = [](const DeviceTensor& x, const DeviceTensor& y) { return dt::download_bytes(x) == dt::download_bytes(y); };
    EXPECT_TRUE(same(plain.output, gated.output)) << describe(c);
    EXPECT_TRUE(same(plain.final_state, gated.final_state)) << describe(c);
    EXPECT_TRUE(same(plain.w, gated.w) && same(plain.u, gated.u)) << describe(c);
    EXPECT_TRUE(same(plain.a, gated.a) && same(plain.t, gated.t) && same(plain.v_new, gated.v_new)) << describe(c);
  }
}

// Decays underflow to 0 (g down to −128 per token): no 0·∞, nothing non-finite, stages in bound.
TEST(DeltaRuleGpu, RegimeVeryNegativeGates) {
  DELTAPROOF_REQUIRE_GPU();
  for (double step : {1.0, 8.0}) {
    DeltaCase c;
    c.gated = true, c.gate_step = step, c.length = 90, c.chunk = 64, c.key_dim = 16, c.value_dim = 16;
    c.with_initial_state = true, c.seed = 500;
    const Report rep = stages_for(c);  // download() rejects any non-finite entry
    EXPECT_TRUE(rep.ok()) << rep.message();
  }
}

// Unnormalized keys make I + A ill-conditioned: the stage bounds (which scale with
// (I − |N̂|)⁻¹) must still hold; the end-to-end error against float64 grows and is reported.
TEST(DeltaRuleGpu, RegimeUnnormalizedKeysErrorGrowth) {
  DELTAPROOF_REQUIRE_GPU();
  std::cout << "unnormalized keys (bf16, L=64, DK=DV=16, C=16): key entries n/2^(3+shift), |n|<=8\n";
  for (int shift : {2, 1, 0}) {
    DeltaCase c;
    c.length = 64, c.chunk = 16, c.key_dim = 16, c.value_dim = 16, c.key_shift = shift, c.seed = 600;
    const HostInputs in = make_inputs(c);
    const ForwardResult r = run_forward(c, in);
    const Report rep = check_stages(c, in, r);
    EXPECT_TRUE(rep.ok()) << rep.message();
    const DoubleForward oracle = double_oracle(c, in);
    double t_max = 0;
    for (const Exact& x : r.t.data) t_max = std::max(t_max, std::abs(ref::to_double(x)));
    std::cout << "  key_shift " << shift << " (max ||k||^2 = " << 16.0 * 64 / std::ldexp(1.0, 2 * (3 + shift))
              << "): max |T| " << t_max << ", output rel L2 vs float64 " << relative_l2_all(heads_of(r.output), oracle.output)
              << ", max err/bound per stage: " << rep.calibration() << "\n";
  }
}

// fp16 inputs over a long sequence: state growth and error vs float64 reported and bounded.
TEST(DeltaRuleGpu, RegimeFp16LongSequence) {
  DELTAPROOF_REQUIRE_GPU();
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.dtype = DType::f16, c.length = 4096, c.chunk = 64, c.key_dim = 64, c.value_dim = 64;
    c.heads = 2, c.with_initial_state = true, c.seed = 700;
    const HostInputs in = make_inputs(c);
    const ForwardResult r = run_forward(c, in, false);
    const DoubleForward oracle = double_oracle(c, in);
    const double err = relative_l2_all(heads_of(r.output), oracle.output);
    double state_max = 0;
    for (const auto& s : oracle.final_state) state_max = std::max(state_max, s.cwiseAbs().maxCoeff());
    std::cout << describe(c) << ": output rel L2 vs float64 " << err << ", final state rel L2 "
              << relative_l2_all(heads_of(r.final_state), oracle.final_state) << ", max |S_L| " << state_max << "\n";
    EXPECT_LE(err, 8 * units_of(c.dtype).op) << describe(c);
    const std::string bad = rowwise_disagreement(heads_of(r.output), oracle.output, end_to_end_tau(c.dtype));
    EXPECT_TRUE(bad.empty()) << describe(c) << ": " << bad;
  }
}

// ---------------------------------------------------------------------------------------
// Cross-C, decode, determinism.

TEST(DeltaRuleGpu, ChunkSizesAgree) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("C = 16, 32, 64 agree with float64 and with each other", 6, [](void) {
    DeltaCase c = *gen_case(*rc::gen::arbitrary<bool>(), 300, 64);
    const HostInputs in = make_inputs(c);
    const DoubleForward oracle = double_oracle(c, in);
    std::vector<std::vector<Matrix<double>>> outputs;
    for (Index C : {16, 32, 64}) {
      c.chunk = C;
      const ForwardResult r = run_forward(c, in, false);
      outputs.push_back(heads_of(r.output));
      const std::string bad = rowwise_disagreement(outputs.back(), oracle.output, end_to_end_tau(c.dtype));
      if (!bad.empty()) RC_FAIL(describe(c) + ": output vs float64: " + bad);
      const std::string bad_state = rowwise_disagreement(heads_of(r.final_state), oracle.final_state, end_to_end_tau(c.dtype));
      if (!bad_state.empty()) RC_FAIL(describe(c) + ": final state vs float64: " + bad_state);
    }
    for (size_t i = 1; i < outputs.size(); ++i) {
      const std::string bad = rowwise_disagreement(outputs[i], outputs[0], 2 * end_to_end_tau(c.dtype));
      if (!bad.empty()) RC_FAIL(describe(c) + ": C=" + std::to_string(16 << i) + " vs C=16: " + bad);
    }
  }));
}

struct DecodeResult {
  Tensor4<Exact> output, final_state;
};

// Decodes all tokens of `in` from the given fp32 state (exact values) or zero.
DecodeResult run_decode(const DeltaCase& c, const HostInputs& in, const std::optional<Tensor4<Exact>>& state) {
  DeltaCase d = c;
  d.with_initial_state = false;
  const DeviceInputs dev = upload_inputs(d, in);
  Uploaded s0;
  if (state) s0 = dt::upload(*state, DType::f32);
  DeviceTensor out = dt::allocate(c.dtype, c.batch, c.heads, c.length, c.value_dim);
  DeviceTensor fin = dt::allocate(DType::f32, c.batch, c.heads, c.value_dim, c.key_dim);
  cuda::DeltaRuleDecodeParams p;
  p.dtype = c.dtype, p.batch = int(c.batch), p.heads = int(c.heads), p.tokens = int(c.length);
  p.key_dim = int(c.key_dim), p.value_dim = int(c.value_dim);
  p.q = dev.q.device.data(), p.k = dev.k.device.data(), p.v = dev.v.device.data(), p.beta = dev.beta.device.data();
  p.log_gate = c.gated ? static_cast<const float*>(dev.log_gate.device.data()) : nullptr;
  p.initial_state = state ? static_cast<const float*>(s0.device.data()) : nullptr;
  p.output = out.data(), p.final_state = static_cast<float*>(fin.data());
  cuda::delta_rule_decode(p);
  return {dt::download(out), dt::download(fin)};
}

// The recurrence in fp32, bounded by γ_m(u32) times the same recurrence on |inputs|
// (M_t = α M + β(|v| + α M|k|)|k|ᵀ), m = DK + 12 roundings per token (+4 for expf), DK + 6 for o_t.
template <class S>
void check_decode_head(const DeltaCase& c, const HostInputs& in, const DecodeResult& r, const Matrix<S>& s_start, Index b,
                       Index h, Report& rep) {
  const Units un = units_of(c.dtype);
  const Matrix<S> q = to<S>(in.q.head(b, h)), k = to<S>(in.k.head(b, h)), v = to<S>(in.v.head(b, h));
  const Vector<S> beta = to<S>(in.beta.head(b, h)).col(0);
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
    mag = mag * alpha + (v.row(t).transpose().cwiseAbs() + mag * alpha * kt_abs.transpose()) * kt_abs * beta(t);
    depth += c.key_dim + 12 + (c.gated ? 4 : 0);
    o_ref.row(t) = (state * qt.transpose()).transpose();
    o_bound.row(t) = (scalar_times(un.out, Matrix<S>(o_ref.row(t).cwiseAbs())) +
                      scalar_times((1 + un.out) * ref::gamma(depth + c.key_dim + 6, u32), Matrix<S>((mag * qt.cwiseAbs().transpose()).transpose())))
                         .eval();
  }
  const std::string where = "[b=" + std::to_string(b) + ",h=" + std::to_string(h) + "]";
  rep.add(ref::compare<S>("decode O" + where, to<S>(r.output.head(b, h)), o_ref, o_bound));
  rep.add(ref::compare<S>("decode S" + where, to<S>(r.final_state.head(b, h)), state,
                          scalar_times(ref::gamma(depth, u32), mag)));
}

Report check_decode(const DeltaCase& c, const HostInputs& in, const DecodeResult& r, const std::optional<Tensor4<Exact>>& state) {
  Report rep;
  rep.context = describe(c);
  for (Index b = 0; b < c.batch; ++b)
    for (Index h = 0; h < c.heads; ++h) {
      const Matrix<Exact> s = state ? state->head(b, h) : Matrix<Exact>::Zero(c.value_dim, c.key_dim);
      if (c.gated) check_decode_head<High>(c, in, r, ref::matrix_cast<High>(s), b, h, rep);
      else check_decode_head<Exact>(c, in, r, s, b, h, rep);
    }
  return rep;
}

TEST(DeltaRuleStageChecks, DecodeCheckAcceptsTheOracleAndCatchesALostState) {  // runs without a device
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.length = 6, c.key_dim = 20, c.value_dim = 7, c.with_initial_state = true, c.seed = 12;
    const HostInputs in = make_inputs(c);
    const std::optional<Tensor4<Exact>> s0 = in.initial_state;
    DecodeResult exact{Tensor4<Exact>(1, 1, c.length, c.value_dim), Tensor4<Exact>(1, 1, c.value_dim, c.key_dim)};
    dr::Forward<Exact> f;
    if (gated) {
      const auto g = gdr::token_recurrence<High>(gdr::with_gates<High>(
          {ref::matrix_cast<High>(in.q.head(0, 0)), ref::matrix_cast<High>(in.k.head(0, 0)),
           ref::matrix_cast<High>(in.v.head(0, 0)), ref::matrix_cast<High>(in.beta.head(0, 0)).col(0),
           ref::matrix_cast<High>(in.log_gate.head(0, 0)).col(0), ref::matrix_cast<High>(s0->head(0, 0))}));
      f = {ref::matrix_cast<Exact>(g.output), ref::matrix_cast<Exact>(g.final_state)};
    } else {
      f = dr::token_recurrence<Exact>({in.q.head(0, 0), in.k.head(0, 0), in.v.head(0, 0), in.beta.head(0, 0).col(0), s0->head(0, 0)});
    }
    exact.output.set_head(0, 0, f.output), exact.final_state.set_head(0, 0, f.final_state);
    const Report rep = check_decode(c, in, exact, s0);
    EXPECT_TRUE(rep.ok()) << rep.message();
    const Report lost = check_decode(c, in, exact, std::nullopt);  // the same results claimed from S_0 = 0
    EXPECT_FALSE(lost.ok()) << describe(c);
  }
}

TEST(DeltaRuleGpu, DecodeMatchesOracle) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("decode (1..8 tokens, optional S_0) vs exact recurrence", 15, [](void) {
    DeltaCase c = *gen_case(*rc::gen::arbitrary<bool>(), 8, 64);
    c.length = *rc::gen::inRange<Index>(1, 9);
    const HostInputs in = make_inputs(c);
    std::optional<Tensor4<Exact>> s0;
    if (c.with_initial_state) s0 = in.initial_state;
    const Report rep = check_decode(c, in, run_decode(c, in, s0), s0);
    if (!rep.ok()) RC_FAIL(rep.message());
  }));
}

// Prefill L0 tokens with the chunkwise kernel, decode the rest from its fp32 final state: the
// decode is within its bound of the exact recurrence from that state, and agrees with one
// chunkwise pass over the whole sequence.
TEST(DeltaRuleGpu, DecodeAfterChunkPrefillEqualsOnePass) {
  DELTAPROOF_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("decode after chunkwise prefill", 6, [](void) {
    DeltaCase whole = *gen_case(*rc::gen::arbitrary<bool>(), 200, 64);
    whole.length = std::max<Index>(whole.length, 2);
    const Index prefill = *rc::gen::inRange<Index>(1, whole.length);
    const HostInputs in = make_inputs(whole);
    auto slice = [&](const Tensor4<Exact>& t, Index begin, Index count) {
      Tensor4<Exact> out(t.batch, t.heads, count, t.cols);
      ref::for_each_head(t.batch, t.heads, [&](Index b, Index h) { out.set_head(b, h, t.head(b, h).middleRows(begin, count)); });
      return out;
    };
    DeltaCase first = whole, rest = whole;
    first.length = prefill, rest.length = whole.length - prefill;
    HostInputs in_first = in, in_rest = in;
    for (auto [dst_first, dst_rest, src] : {std::tuple{&in_first.q, &in_rest.q, &in.q}, {&in_first.k, &in_rest.k, &in.k},
                                            {&in_first.v, &in_rest.v, &in.v}, {&in_first.beta, &in_rest.beta, &in.beta},
                                            {&in_first.log_gate, &in_rest.log_gate, &in.log_gate}}) {
      *dst_first = slice(*src, 0, prefill);
      *dst_rest = slice(*src, prefill, whole.length - prefill);
    }
    const ForwardResult pre = run_forward(first, in_first, false);
    const std::optional<Tensor4<Exact>> state = pre.final_state;
    const DecodeResult dec = run_decode(rest, in_rest, state);
    const Report rep = check_decode(rest, in_rest, dec, state);
    if (!rep.ok()) RC_FAIL(rep.message());

    const ForwardResult one_pass = run_forward(whole, in, false);
    std::vector<Matrix<double>> tail;
    for (const auto& m : heads_of(one_pass.output)) tail.push_back(m.bottomRows(rest.length));
    const double tau = 2 * end_to_end_tau(whole.dtype);
    const std::string bad = rowwise_disagreement(heads_of(dec.output), tail, tau);
    if (!bad.empty()) RC_FAIL(describe(whole) + " prefill=" + std::to_string(prefill) + ": decode vs one pass: " + bad);
    const std::string bad_state = rowwise_disagreement(heads_of(dec.final_state), heads_of(one_pass.final_state), tau);
    if (!bad_state.empty()) RC_FAIL(describe(whole) + ": final states: " + bad_state);
  }));
}

TEST(DeltaRuleGpu, Deterministic) {
  DELTAPROOF_REQUIRE_GPU();
  for (bool gated : {false, true}) {
    DeltaCase c;
    c.gated = gated, c.batch = 2, c.heads = 3, c.length = 333, c.chunk = 64, c.key_dim = 64, c.value_dim = 64, c.seed = 800;
    c.with_initial_state = true;
    const HostInputs in = make_inputs(c);
    const DeviceInputs dev = upload_inputs(c, in);
    ForwardBuffers first = allocate_forward(c, false), second = allocate_forward(c, false);
    cuda::delta_rule_forward(forward_params(c, dev, first));
    cuda::delta_rule_forward(forward_params(c, dev, second));
    EXPECT_EQ(dt::download_bytes(first.output), dt::download_bytes(second.output)) << describe(c);
    EXPECT_EQ(dt::download_bytes(first.final_state), dt::download_bytes(second.final_state)) << describe(c);
    for (auto [slice, pipeline] : {std::pair{16, 0}, {32, 0}, {64, 1}, {64, 2}, {32, 2}, {64, 3}, {16, 3}}) {  // tuning knobs: same bits
      ForwardBuffers other = allocate_forward(c, false);
      cuda::DeltaRuleForwardParams p = forward_params(c, dev, other);
      p.value_slice = slice, p.pipeline = pipeline;
      cuda::delta_rule_forward(p);
      EXPECT_EQ(dt::download_bytes(first.output), dt::download_bytes(other.output)) << describe(c) << " slice " << slice << " pipeline " << pipeline;
      EXPECT_EQ(dt::download_bytes(first.final_state), dt::download_bytes(other.final_state))
          << describe(c) << " slice " << slice << " pipeline " << pipeline;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Argument validation: std::invalid_argument naming the argument, nothing launched.

TEST(DeltaRuleGpu, InvalidArgumentsThrowBeforeAnyLaunch) {
  DELTAPROOF_REQUIRE_GPU();
  DeltaCase c;
  c.length = 40, c.chunk = 16, c.key_dim = 8, c.value_dim = 8, c.seed = 900;
  const HostInputs in = make_inputs(c);
  const DeviceInputs dev = upload_inputs(c, in);
  ForwardBuffers f = allocate_forward(c, false);
  const auto poisoned = dt::download_bytes(f.output);
  std::vector<float> host_buffer(1024);
  auto expect_rejected = [&](const std::string& argument, auto mutate) {
    cuda::DeltaRuleForwardParams p = forward_params(c, dev, f);
    p.wy_system = p.wy_inverse = p.v_new = p.boundary_states = nullptr;
    mutate(p);
    try {
      cuda::delta_rule_forward(p);
      ADD_FAILURE() << "no exception for a bad " << argument;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(argument), std::string::npos) << e.what();
    }
    EXPECT_EQ(dt::download_bytes(f.output), poisoned) << "output touched after a bad " << argument;
  };
  expect_rejected("chunk_size", [](auto& p) { p.chunk_size = 48; });
  expect_rejected("key_dim", [](auto& p) { p.key_dim = 257; });
  expect_rejected("value_dim", [](auto& p) { p.value_dim = 0; });
  expect_rejected("length", [](auto& p) { p.length = 0; });
  expect_rejected("dtype", [](auto& p) { p.dtype = DType::f64; });
  expect_rejected("q", [](auto& p) { p.q = nullptr; });
  expect_rejected("k", [&](auto& p) { p.k = host_buffer.data(); });
  expect_rejected("beta", [](auto& p) { p.beta = static_cast<const char*>(p.beta) + 1; });
  expect_rejected("final_state", [](auto& p) { p.final_state = nullptr; });
  expect_rejected("log_gate", [&](auto& p) { p.log_gate = host_buffer.data(); });

  cuda::DeltaRuleDecodeParams d;
  d.dtype = c.dtype, d.batch = 1, d.heads = 1, d.tokens = 1, d.key_dim = 300, d.value_dim = 8;
  EXPECT_THROW(cuda::delta_rule_decode(d), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// The checks catch planted bugs: each mutant is what the kernel would have written with the
// named bug, and the same stage check must reject it.

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

void expect_planted_bugs_caught(const DeltaCase& c, const HostInputs& in, const ForwardResult& good) {
  auto expect_caught = [&](const std::string& bug, auto mutate) {
    ForwardResult bad = good;
    mutate(bad);
    const Report rep = check_stages(c, in, bad);
    EXPECT_FALSE(rep.ok()) << "planted bug not caught: " << bug;
    if (!rep.ok()) std::cout << "caught " << bug << ": " << rep.failures.front().substr(0, 200) << "...\n";
  };
  expect_caught("wrong sign in the merge T21 = +T22 A21 T11", [](ForwardResult& r) {
    for (Index i = 16; i < 32; ++i)
      for (Index j = 0; j < 16; ++j) r.t.data[size_t(i * 32 + j)] = -r.t.data[size_t(i * 32 + j)];
  });
  expect_caught("swapped W and U", [](ForwardResult& r) { std::swap(r.w, r.u); });
  expect_caught("lost S_0", [&](ForwardResult& r) {
    for (Index i = 0; i < c.value_dim * c.key_dim; ++i) r.boundary.data[size_t(i)] = 0;
  });
  expect_caught("dropped partial last chunk", [&](ForwardResult& r) {
    for (Index t = c.length - 4; t < c.length; ++t)
      for (Index j = 0; j < c.value_dim; ++j) r.output.data[size_t(t * c.value_dim + j)] = 0;
  });
  expect_caught("strict causal mask (diagonal dropped)", [&](ForwardResult& r) {
    // o_t loses (q_t·k_t) v̄_t, rounded to the dtype as the kernel would store it.
    for (Index t = 0; t < c.length; ++t) {
      Exact qk(0);
      for (Index j = 0; j < c.key_dim; ++j) qk += in.q.data[size_t(t * c.key_dim + j)] * in.k.data[size_t(t * c.key_dim + j)];
      for (Index j = 0; j < c.value_dim; ++j) {
        Exact& o = r.output.data[size_t(t * c.value_dim + j)];
        o = dt::round_to(o - qk * r.v_new.data[size_t(t * c.value_dim + j)], c.dtype);
      }
    }
  });
  expect_caught("state update without the V̄ term of the last token", [&](ForwardResult& r) {
    for (Index i = 0; i < c.value_dim; ++i)
      for (Index j = 0; j < c.key_dim; ++j)
        r.final_state.data[size_t(i * c.key_dim + j)] -=
            r.v_new.data[size_t((c.length - 1) * c.value_dim + i)] * in.k.data[size_t((c.length - 1) * c.key_dim + j)];
  });
}

DeltaCase planted_bug_case() {
  DeltaCase c;
  c.length = 40, c.chunk = 32, c.key_dim = 16, c.value_dim = 16, c.with_initial_state = true, c.seed = 1000;
  return c;
}

TEST(DeltaRuleStageChecks, AcceptTheExactOracleAndCatchPlantedBugs) {  // runs without a device
  const DeltaCase c = planted_bug_case();
  const HostInputs in = make_inputs(c);
  const ForwardResult exact = oracle_as_kernel(c, in);
  const Report rep = check_stages(c, in, exact);
  ASSERT_TRUE(rep.ok()) << rep.message();
  for (const auto& s : rep.summaries) EXPECT_LT(s.max_bound_ratio, 1e-50) << s.describe();  // exact data
  expect_planted_bugs_caught(c, in, exact);
}

TEST(DeltaRuleStageChecks, AcceptTheOracleOnRegimes) {  // runs without a device: the checker's own code paths
  for (bool gated : {false, true})
    for (auto [L, C, s0] : {std::tuple<Index, Index, bool>{1, 64, true}, {70, 64, false}, {33, 16, true}}) {
      DeltaCase c;
      c.gated = gated, c.length = L, c.chunk = C, c.key_dim = 15, c.value_dim = 9, c.with_initial_state = s0;
      c.batch = 2, c.seed = 11;
      const HostInputs in = make_inputs(c);
      const Report rep = check_stages(c, in, oracle_as_kernel(c, in));
      EXPECT_TRUE(rep.ok()) << rep.message();
    }
}

TEST(DeltaRuleGpu, StageChecksCatchPlantedBugs) {
  DELTAPROOF_REQUIRE_GPU();
  const DeltaCase c = planted_bug_case();
  const HostInputs in = make_inputs(c);
  const ForwardResult good = run_forward(c, in);
  ASSERT_TRUE(check_stages(c, in, good).ok()) << check_stages(c, in, good).message();

  expect_planted_bugs_caught(c, in, good);
}

// ---------------------------------------------------------------------------------------
// Accuracy at DESIGN.md's shape: bf16, B=2, H=4, L=512, D=128; q ~ N(0,1)/√D, k = normalize(N(0,1)),
// v ~ N(0,1), β = sigmoid(N(0,1)), g = logsigmoid(N(0,1) + 3); relative L2 of the output against
// a float64 recurrence on the same rounded inputs.

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

void accuracy_at_design_shape(bool gated, double target) {
  DeltaCase c;
  c.gated = gated, c.batch = 2, c.heads = 4, c.length = 512, c.key_dim = 128, c.value_dim = 128, c.chunk = 64;
  c.seed = 42;
  const HostInputs in = design_inputs(c);
  const ForwardResult r = run_forward(c, in, false);
  const DoubleForward oracle = double_oracle(c, in);
  const double err = relative_l2_all(heads_of(r.output), oracle.output);
  std::vector<Matrix<double>> rounded;  // the oracle's output merely rounded to bf16: the floor
  for (const auto& m : oracle.output)
    rounded.push_back(m.unaryExpr([](double x) { return double(static_cast<float>(Eigen::bfloat16(static_cast<float>(x)))); }));
  std::cout << (gated ? "Gated DeltaNet" : "DeltaNet") << " accuracy (bf16, B=2, H=4, L=512, D=128, C=64): output rel L2 vs float64 = "
            << err << " (target <= " << target << "; rounding the exact output to bf16 alone: "
            << relative_l2_all(rounded, oracle.output) << "), final state rel L2 = "
            << relative_l2_all(heads_of(r.final_state), oracle.final_state) << "\n";
  EXPECT_LE(err, target);
}

TEST(DeltaRuleGpu, AccuracyAtDesignShapeDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  accuracy_at_design_shape(false, 4.1e-3);
}

TEST(DeltaRuleGpu, AccuracyAtDesignShapeGatedDeltaNet) {
  DELTAPROOF_REQUIRE_GPU();
  accuracy_at_design_shape(true, 3.7e-3);
}

}  // namespace
