// verify::judge's bounds held from both sides: every output the judge compares catches an error
// planted in it alone, at the planted index; each term of the kernel error model lets the honest
// computation through and catches an error of about twice what the term allows; the WY chunkwise
// algorithm as production kernels run it (16-bit operands, fp32 sums, fp32 or 16-bit running state)
// agrees where its premises hold and is inconclusive, never rejected, where they do not.
#include "verify/judge.hpp"
#include "verify/judge_internal.hpp"
#include "verify/tests/round_bf16.hpp"

#include <nlohmann/json.hpp>

#include "reference/delta_rule.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/parallel.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace deltaproof::verify {
namespace {

using judging::MatrixD;
using judging::VectorD;


HostTensor tensor(std::vector<Index> shape, DType dtype, const std::function<double()>& draw) {
  HostTensor t;
  t.shape = std::move(shape);
  t.dtype = dtype;
  for (Index i = 0; i < t.size(); ++i) t.values.push_back(draw());
  return t;
}

// A case in either layout, fixed or varlen, with every cotangent.
KernelCase make_case(Op op, Layout layout, bool varlen, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  const Index H = 2, DK = 6, DV = 5, B = varlen ? 1 : 2;
  const std::vector<Index> cu = varlen ? std::vector<Index>{0, 7, 7, 30} : std::vector<Index>{};
  const Index T = varlen ? cu.back() : 23, N = varlen ? Index(cu.size()) - 1 : B;
  KernelCase c;
  c.op = op, c.layout = layout, c.cu_seqlens = cu;
  auto tokens = [&](Index d) { return layout == Layout::bhld ? std::vector<Index>{B, H, T, d} : std::vector<Index>{B, T, H, d}; };
  auto gates = [&] { return layout == Layout::bhld ? std::vector<Index>{B, H, T} : std::vector<Index>{B, T, H}; };
  auto states = [&] { return layout == Layout::bhld ? std::vector<Index>{N, H, DV, DK} : std::vector<Index>{N, H, DK, DV}; };
  auto f32 = [&](double sd, double mean = 0) { return [&, sd, mean] { return double(float(mean + sd * normal(rng))); }; };
  c.q = tensor(tokens(DK), DType::f32, f32(0.4));
  c.k = tensor(tokens(DK), DType::f32, f32(0.4));
  c.v = tensor(tokens(DV), DType::f32, f32(1));
  if (op != Op::linear) c.beta = tensor(gates(), DType::f32, f32(0.1, 0.5)), c.l2_normalize_qk = true;
  if (op == Op::gated_delta) c.g = tensor(gates(), DType::f32, f32(0.02, -0.1));
  c.h0 = tensor(states(), DType::f32, f32(1));
  c.d_o = tensor(tokens(DV), DType::f32, f32(1));
  c.d_ht = tensor(states(), DType::f32, f32(1));
  return c;
}

// A one-entry fp32 tensor of this shape.
HostTensor one(std::vector<Index> shape, double x) {
  HostTensor t;
  t.shape = std::move(shape), t.dtype = DType::f32, t.values = {x};
  return t;
}

KernelResult stored_fp32(KernelResult r) {
  for (auto* t : {&r.o, &r.ht, &r.dq, &r.dk, &r.dv, &r.dbeta, &r.dg, &r.dh0})
    if (*t) {
      for (double& x : (*t)->values) x = float(x);
      (*t)->dtype = DType::f32;
    }
  return r;
}

std::optional<HostTensor>* output(KernelResult& r, const std::string& name) {
  if (name == "o") return &r.o;
  if (name == "ht") return &r.ht;
  if (name == "dq") return &r.dq;
  if (name == "dk") return &r.dk;
  if (name == "dv") return &r.dv;
  if (name == "dbeta") return &r.dbeta;
  if (name == "dg") return &r.dg;
  return &r.dh0;
}

Index flat_index(const HostTensor& t, const std::vector<Index>& index) {
  Index flat = 0;
  for (size_t d = 0; d < index.size(); ++d) flat = flat * t.shape[d] + index[d];
  return flat;
}

// ---------------------------------------------------------------------------------------------
// Every output alone: an error planted in one entry of one output is caught in that output's row, at
// that entry, and no other row moves. Both layouts, fixed length and varlen, all three ops.

class EveryOutput : public ::testing::TestWithParam<std::tuple<Op, Layout, bool>> {};

TEST_P(EveryOutput, PlantedErrorCaughtAtItsIndexAlone) {
  const auto [op, layout, varlen] = GetParam();
  const KernelCase c = make_case(op, layout, varlen, 3);
  const KernelResult clean = stored_fp32(oracle(c));
  const Verdict honest = judge(c, clean);
  ASSERT_TRUE(honest.agrees()) << format_table(honest);
  std::vector<std::string> names = {"o", "ht", "dq", "dk", "dv", "dh0"};
  if (op != Op::linear) names.push_back("dbeta");
  if (op == Op::gated_delta) names.push_back("dg");
  for (const std::string& name : names) {
    KernelResult r = clean;
    HostTensor& t = **output(r, name);
    double largest = 0;
    for (double x : t.values) largest = std::max(largest, std::abs(x));
    // An entry of the last sequence (varlen: the third, after an empty one), away from the ends.
    const size_t at = t.values.size() - t.values.size() / 5 - 1;
    t.values[at] += 4 * largest + 1;
    const Verdict v = judge(c, r);
    const Comparison* row = v.find(name);
    ASSERT_NE(row, nullptr) << name;
    EXPECT_EQ(row->status(), Status::disagree) << name << "\n" << format_table(v);
    EXPECT_EQ(flat_index(t, row->index), Index(at)) << name << "\n" << format_table(v);
    for (const Comparison& other : v.comparisons) {
      if (other.tensor != name) {
        EXPECT_TRUE(other.agrees()) << name << " moved " << other.tensor;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpsLayoutsVarlen, EveryOutput,
                         ::testing::Combine(::testing::Values(Op::linear, Op::delta, Op::gated_delta),
                                            ::testing::Values(Layout::bhld, Layout::blhd), ::testing::Bool()));

// ---------------------------------------------------------------------------------------------
// The worst index is the entry with the LARGEST err/bound, not the largest error: fp32 in and out, so an
// entry's bound is about ε·M (M = the form on |inputs|). Entry A, the largest M, moved by 3 ε M_A; entry
// B, the smallest M, by 10 ε M_B: the larger error sits at A, the larger err/bound at B, which is named.
TEST(JudgeRows, WorstIndexIsTheLargestRatio) {
  KernelCase c = make_case(Op::linear, Layout::bhld, false, 5);
  c.d_o.reset(), c.d_ht.reset();
  KernelCase a = c;
  for (HostTensor* t : {&a.q, &a.k, &a.v, &*a.h0})
    for (double& x : t->values) x = std::abs(x);
  const KernelResult truth = oracle(c), magnitude = oracle(a);
  const double L = 23, m = L + std::ceil(L / 16) + 6 + 5 + 64 + 8;
  const double eps = std::pow(1 + 0x1p-24, 3) * (1 + m * 0x1p-23 / (1 - m * 0x1p-23)) - 1;
  KernelResult r = truth;
  r.o->dtype = DType::f64, r.ht.reset();
  size_t big = 0, small = 0;
  const std::vector<double>& mag = magnitude.o->values;
  for (size_t i = 0; i < mag.size(); ++i) {
    if (mag[i] > mag[big]) big = i;
    if (mag[i] < mag[small]) small = i;
  }
  ASSERT_GT(3 * mag[big], 10 * mag[small]);
  r.o->values[big] += 3 * eps * mag[big];
  r.o->values[small] += 10 * eps * mag[small];
  const Verdict v = judge(c, r);
  const Comparison* row = v.find("o");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(flat_index(*r.o, row->index), Index(small)) << format_table(v);
  EXPECT_NEAR(row->ratio, 10, 0.5);
  EXPECT_EQ(row->norm, Norm::elementwise);
  EXPECT_DOUBLE_EQ(row->max_abs, std::abs(r.o->values[big] - truth.o->values[big]));
}

// Rows are measured the way their bounds are stated: linear attention entry by entry, the delta
// family's tokens as row norms and states as whole matrices (Frobenius), error and bound alike.
TEST(JudgeRows, MeasuredTheWayTheBoundIsStated) {
  const KernelCase c = make_case(Op::delta, Layout::bhld, false, 6);
  KernelResult r = stored_fp32(oracle(c));
  const KernelResult truth = oracle(c);
  for (double& x : r.ht->values) x += 1e-3;
  const Verdict v = judge(c, r);
  const Comparison* ht = v.find("ht");
  ASSERT_NE(ht, nullptr);
  EXPECT_EQ(ht->norm, Norm::frobenius);
  // The worst (sequence, head)'s whole-state error: sqrt(DV·DK)·1e-3 up to the fp32 storage.
  EXPECT_NEAR(ht->error, std::sqrt(30.0) * 1e-3, 1e-6);
  EXPECT_EQ(v.find("o")->norm, Norm::rowwise);
  EXPECT_FALSE(ht->formula.empty());
  EXPECT_NE(format_table(v).find("Frobenius"), std::string::npos);
  (void)truth;
}

// ---------------------------------------------------------------------------------------------
// Terms of the model, each alone.

// Storage of the output (u_out): fp32 inputs, o stored in bf16, so u_out |o| is the bound's bulk.
// The honest rounding passes; an entry moved by twice u_out |o| (more than rounding can) is caught.
TEST(JudgeTerms, OutputStorageRounding) {
  KernelCase c = make_case(Op::linear, Layout::blhd, false, 8);
  c.d_o.reset(), c.d_ht.reset();
  KernelResult r = oracle(c);
  for (double& x : r.o->values) x = round_bf16(x);
  r.o->dtype = DType::bf16;
  r.ht.reset();
  EXPECT_TRUE(judge(c, r).agrees());
  size_t at = 0;
  for (size_t i = 0; i < r.o->values.size(); ++i)
    if (std::abs(r.o->values[i]) > std::abs(r.o->values[at])) at = i;
  const KernelResult truth = oracle(c);
  r.o->values[at] = truth.o->values[at] * (1 + 2 * 0x1p-8);
  const Verdict v = judge(c, r);
  EXPECT_FALSE(v.agrees()) << format_table(v);
  EXPECT_EQ(flat_index(*r.o, v.find("o")->index), Index(at));
}

// Accumulation (γ_m(u_acc)·M): fp32 in, fp32 out, M = the form on |inputs| (oracle on |q|, |k|, |v|,
// |h0|), ε = (1 + u_op)³ (1 + γ_m(2⁻²³)) − 1 with m = L + ⌈L/16⌉ + DK + DV + 64 + 8 (kernel_model.hpp),
// u_op = 2⁻²⁴. Half of ε·M at every entry agrees; twice it at one entry is caught there.
TEST(JudgeTerms, AccumulationTimesMagnitudes) {
  KernelCase c = make_case(Op::linear, Layout::bhld, false, 9);
  c.d_o.reset(), c.d_ht.reset();
  KernelCase a = c;
  for (HostTensor* t : {&a.q, &a.k, &a.v, &*a.h0})
    for (double& x : t->values) x = std::abs(x);
  const KernelResult truth = oracle(c), magnitude = oracle(a);
  const double L = 23, m = L + std::ceil(L / 16) + 6 + 5 + 64 + 8, g = m * 0x1p-23 / (1 - m * 0x1p-23);
  const double eps = std::pow(1 + 0x1p-24, 3) * (1 + g) - 1;
  KernelResult r = truth;
  r.o->dtype = DType::f64, r.ht.reset();  // stored exactly: only ε·M remains (u_out = 2⁻⁵³)
  for (size_t i = 0; i < r.o->values.size(); ++i) r.o->values[i] += 0.5 * eps * magnitude.o->values[i];
  EXPECT_TRUE(judge(c, r).agrees()) << format_table(judge(c, r));
  const size_t at = 17;
  r.o->values[at] = truth.o->values[at] + 2 * eps * magnitude.o->values[at];
  const Verdict v = judge(c, r);
  EXPECT_FALSE(v.agrees()) << format_table(v);
  EXPECT_EQ(flat_index(*r.o, v.find("o")->index), Index(at));
}

// The probabilistic multiplier λ = 8 on the propagated covariance, with the WY form's terms: one token,
// DK = DV = 1, no h0, fp32 inputs, ht stored exactly. The state's error is V̄'s through k: V̄ = β v
// passes five operand roundings (ε_wy = (1 + ε)(1 + u)² − 1, ε the token step's) and the fp32 solve's
// γ_D(u32) (D = 188 for the 64-token chunk), then the update's (1 + u)(1 + γ_3(u32)) − 1, so
//   bound(ht) = λ |β v k| sqrt((ε_wy + γ_188(u32))² + ε_upd²) + u_out·(|S| + ·),
// with ε = (1 + u)³ (1 + γ_75(2⁻²³)) − 1 + γ_18(2⁻⁵³) (kernel_model.hpp: m = L + ⌈L/16⌉ + DK + DV + 72,
// the double oracle's own share added). Computed here from those formulas; then an error of twice the
// λ term is caught and half of it is not.
TEST(JudgeTerms, ProbabilisticMultiplierAndWyTerms) {
  KernelCase c;
  c.op = Op::delta, c.layout = Layout::bhld;
  const double k = 0.75, v = 1.25, beta = 0.5;
  c.q = one({1, 1, 1, 1}, 0.5), c.k = one({1, 1, 1, 1}, k), c.v = one({1, 1, 1, 1}, v), c.beta = one({1, 1, 1}, beta);
  KernelResult r = oracle(c);
  r.o.reset();
  r.ht->dtype = DType::f64;
  const double state = beta * v * k;
  ASSERT_DOUBLE_EQ(r.ht->values[0], state);
  auto gamma = [](double m, double unit) { return m * unit / (1 - m * unit); };
  const double u = 0x1p-24, u32 = 0x1p-23;
  const double eps = std::pow(1 + u, 3) * (1 + gamma(75, u32)) - 1 + gamma(18, 0x1p-53);
  const double eps_wy = (1 + eps) * (1 + u) * (1 + u) - 1, eps_upd = (1 + u) * (1 + gamma(3, u32)) - 1;
  const double stat = 8 * state * std::hypot(eps_wy + gamma(188, u32), eps_upd);
  const double expected = stat + 0x1p-53 * (state + stat);
  const Verdict clean = judge(c, r);
  ASSERT_TRUE(clean.agrees());
  EXPECT_NEAR(clean.find("ht")->bound, expected, 1e-9 * expected);
  r.ht->values[0] = state + 2 * stat;
  EXPECT_FALSE(judge(c, r).agrees());
  r.ht->values[0] = state + 0.5 * stat;
  EXPECT_TRUE(judge(c, r).agrees());
}

// The gate's gradient as a chunk kernel forms it (proofs/kernel_error_bounds.md §7): one token of Gated
// DeltaNet, no h0, DK = DV = 1, fp32 inputs. The exact dg is 0 (the gate scales S_0 = 0), but a chunk
// kernel forms it as ⟨q, dq⟩ − ⟨k, dk⟩ with dq = ds·k, dk = ds·q, ds = do·βv (fla's chunk_bwd_dqkwg),
// each rounded in fp32: their difference is a rounding, not 0. The bound carries ε times the terms'
// magnitudes, ε(|q| M_dq + 2|k| M_dk) here (the key term once in dG and once in the chunk's end):
//   M_dq = |βvk|·|do|,  M_dk = |β|(2|do q||v| + α|βvk|·|do q k|)  (g_mag = 2|do q|, gk_mag = 2|do q k|).
// The honest value agrees; twice the term is caught, half of it is not.
TEST(JudgeTerms, GateGradientFromCancellingTerms) {
  KernelCase c;
  c.op = Op::gated_delta, c.layout = Layout::bhld;
  const float q = 0.3f, k = 0.7f, v = 0.3f, d_o = 0.7f, beta = 0.5f, g = -0.25f;
  c.q = one({1, 1, 1, 1}, q), c.k = one({1, 1, 1, 1}, k), c.v = one({1, 1, 1, 1}, v);
  c.beta = one({1, 1, 1}, beta), c.g = one({1, 1, 1}, g), c.d_o = one({1, 1, 1, 1}, d_o);
  KernelResult r = oracle(c);
  ASSERT_EQ(r.dg->values[0], 0.0);
  r.o.reset(), r.ht.reset(), r.dq.reset(), r.dk.reset(), r.dv.reset(), r.dbeta.reset(), r.dh0.reset();
  r.dg->dtype = DType::f64;
  const float ds = d_o * (beta * v), dq = ds * k, dk = ds * q;
  const float honest = q * dq - k * dk;
  ASSERT_NE(honest, 0.0f);
  auto gamma = [](double m, double unit) { return m * unit / (1 - m * unit); };
  const double eps = std::pow(1 + 0x1p-24, 3) * (1 + gamma(75, 0x1p-23)) - 1 + gamma(18, 0x1p-53);
  const double Q = q, K = k, V = v, D = d_o, a = std::exp(double(g)), b = beta, state = b * V * K;
  const double m_dq = std::abs(state * D), m_dk = b * (2 * std::abs(D * Q * V) + a * state * std::abs(D * Q * K));
  const double term = eps * (std::abs(Q) * m_dq + 2 * std::abs(K) * m_dk);
  const Verdict clean = judge(c, r);
  ASSERT_TRUE(clean.agrees()) << format_table(clean);
  EXPECT_NEAR(clean.find("dg")->bound, term, 1e-9 * term);
  r.dg->values[0] = honest;
  EXPECT_TRUE(judge(c, r).agrees()) << format_table(judge(c, r));
  r.dg->values[0] = 2 * term;
  EXPECT_FALSE(judge(c, r).agrees());
  r.dg->values[0] = 0.5 * term;
  EXPECT_TRUE(judge(c, r).agrees());
}

// ---------------------------------------------------------------------------------------------
// The WY chunkwise algorithm as production kernels run it, emulated here: operands rounded to bf16,
// products and sums in fp32, the running state in fp32 (or rounded to bf16 at every chunk's end).

// What an emulated kernel returns: o and ht of one head.
struct KernelRun {
  std::vector<double> o, ht;  // (L, DV), (DV, DK) row-major, one head
};

// Every entry rounded to bf16 (an operand as the tensor cores take it).
Eigen::MatrixXf bf16_operand(const Eigen::MatrixXf& m) { return m.unaryExpr([](float x) { return float(round_bf16(x)); }); }

// One head walked as a chunk kernel walks it: for each chunk of C tokens from a, step(a, Q, K, V, S) (the chunk's
// rows and the state it starts from, in fp32) gives the chunk's outputs O and the values V̄ it writes; then
// S += V̄ᵀ K, in fp32 or rounded to bf16 at every chunk's end. o is stored in bf16, ht is the last state.
struct ChunkStep {
  Eigen::MatrixXf O, written;
};
template <class Step>
KernelRun walk_chunks(const MatrixD& q, const MatrixD& k, const MatrixD& v, Index C, bool bf16_state, const MatrixD& h0, Step step) {
  using MF = Eigen::MatrixXf;
  const Index L = q.rows(), DK = k.cols(), DV = v.cols();
  MF S = h0.size() ? MF(h0.cast<float>()) : MF(MF::Zero(DV, DK));
  KernelRun out;
  out.o.assign(size_t(L * DV), 0.0);
  for (Index a = 0; a < L; a += C) {
    const Index n = std::min(C, L - a);
    const MF K = k.middleRows(a, n).cast<float>(), V = v.middleRows(a, n).cast<float>(), Q = q.middleRows(a, n).cast<float>();
    const ChunkStep c = step(a, Q, K, V, S);
    for (Index i = 0; i < n; ++i)
      for (Index d = 0; d < DV; ++d) out.o[size_t((a + i) * DV + d)] = round_bf16(c.O(i, d));
    S = S + c.written.transpose() * K;
    if (bf16_state) S = bf16_operand(S);
  }
  for (Index i = 0; i < DV; ++i)
    for (Index j = 0; j < DK; ++j) out.ht.push_back(S(i, j));
  return out;
}

KernelRun wy_kernel(const MatrixD& q, const MatrixD& k, const MatrixD& v, const VectorD& beta, Index C, bool bf16_state,
                    const MatrixD& h0) {
  using MF = Eigen::MatrixXf;
  return walk_chunks(q, k, v, C, bf16_state, h0, [&](Index a, const MF& Q, const MF& K, const MF& V, const MF& S) {
    const Index n = K.rows();
    const Eigen::VectorXf b = beta.segment(a, n).cast<float>();
    MF A = (b.asDiagonal() * (K * K.transpose())).eval();
    A.triangularView<Eigen::Upper>().setZero();
    MF T = MF::Identity(n, n);
    for (Index i = 1; i < n; ++i) T.row(i).head(i) = -(A.row(i).head(i) * T.topLeftCorner(i, i));
    T = bf16_operand(T);
    const MF W = bf16_operand(T * bf16_operand(b.asDiagonal() * K)), U = bf16_operand(T * bf16_operand(b.asDiagonal() * V));
    const MF s_op = bf16_operand(S);
    const MF Vbar = bf16_operand(U - W * s_op.transpose());
    MF P = Q * K.transpose();
    P.triangularView<Eigen::StrictlyUpper>().setZero();
    return ChunkStep{Q * s_op.transpose() + bf16_operand(P) * Vbar, Vbar};
  });
}

// One head: inputs rounded to bf16, the WY kernel's outputs as the case's result (bhld).
std::pair<KernelCase, KernelResult> wy_case(const MatrixD& q, const MatrixD& k, const MatrixD& v, const VectorD& beta,
                                            Index C, bool bf16_state, const MatrixD& h0 = MatrixD()) {
  const Index L = q.rows(), DK = k.cols(), DV = v.cols();
  auto pack = [](const MatrixD& m, std::vector<Index> shape) {
    HostTensor t;
    t.shape = std::move(shape), t.dtype = DType::bf16;
    for (Index i = 0; i < m.rows(); ++i)
      for (Index j = 0; j < m.cols(); ++j) t.values.push_back(m(i, j));
    return t;
  };
  KernelCase c;
  c.op = Op::delta, c.layout = Layout::bhld;
  c.q = pack(q, {1, 1, L, DK}), c.k = pack(k, {1, 1, L, DK}), c.v = pack(v, {1, 1, L, DV}), c.beta = pack(beta, {1, 1, L});
  if (h0.size()) {
    c.h0 = pack(h0, {1, 1, DV, DK});
    c.h0->dtype = DType::f32;
  }
  const KernelRun run = wy_kernel(q, k, v, beta, C, bf16_state, h0);
  KernelResult r;
  r.o = HostTensor{{1, 1, L, DV}, run.o, DType::bf16};
  r.ht = HostTensor{{1, 1, DV, DK}, run.ht, DType::f32};
  return {c, r};
}

MatrixD bf16_matrix(Index rows, Index cols, std::mt19937_64& rng, double sd) {
  std::normal_distribution<double> normal(0, sd);
  MatrixD m(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) m(i, j) = round_bf16(normal(rng));
  return m;
}

// DK = 1 with unnormalised keys: β k² up to ~8 (|1 − β k²| ≫ 1) and near 1 (erases). The state's
// intermediates reach ~100× its final size; the WY form's V̄ errors are not erased with it. The bound
// of the token recurrence alone rejected such runs at err/bound 2.5 to 17; the WY bound takes them.
TEST(JudgeWy, HonestWyKernelAgreesWhereTransitionsExpandAndErase) {
  std::mt19937_64 rng(72032);
  std::uniform_real_distribution<double> uniform(0, 1);
  double worst = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Index L = 32 + trial % 7, C = trial % 2 ? 32 : 16;
    const MatrixD q = bf16_matrix(L, 1, rng, 1), k = bf16_matrix(L, 1, rng, 1.5), v = bf16_matrix(L, 2, rng, 1);
    VectorD beta(L);
    for (Index t = 0; t < L; ++t) beta(t) = round_bf16(1 / (1 + std::exp(-2 * (uniform(rng) - 0.5) * 3)));
    const auto [c, r] = wy_case(q, k, v, beta, C, false);
    const Verdict verdict = judge(c, r);
    EXPECT_NE(verdict.status(), Status::disagree) << "trial " << trial << "\n" << format_table(verdict);
    for (const auto& row : verdict.comparisons) worst = std::max(worst, row.ratio);
  }
  std::cout << "  largest err/bound over 40 DK = 1 unnormalised-key runs: " << worst << "\n";
}

// The running state's dtype: a WY kernel that keeps a bf16 state is caught when it does not declare
// it (held to fp32), and agrees when it declares state_dtype = bf16; the fp32-state kernel agrees
// under both. The regime where a state's own rounding shows: a large h0 carried through many chunks
// by small writes (β = 2⁻¹⁰), so that rounding S at every chunk's end outweighs the products' roundings.
TEST(JudgeWy, SixteenBitRunningStateIsJudgedByItsOwnModel) {
  std::mt19937_64 rng(11);
  const Index L = 256, DK = 16, DV = 16, C = 16;
  MatrixD q = bf16_matrix(L, DK, rng, 0.25), k = bf16_matrix(L, DK, rng, 1), v = bf16_matrix(L, DV, rng, 1);
  for (Index t = 0; t < L; ++t) k.row(t) = (k.row(t) / k.row(t).norm()).unaryExpr([](double x) { return round_bf16(x); });
  const MatrixD h0 = bf16_matrix(DV, DK, rng, 4);
  VectorD beta = VectorD::Constant(L, 0x1p-10);
  JudgeOptions bf16_state;
  bf16_state.state_dtype = DType::bf16;
  {
    const auto [c, r] = wy_case(q, k, v, beta, C, false, h0);
    EXPECT_TRUE(judge(c, r).agrees()) << format_table(judge(c, r));
    EXPECT_TRUE(judge(c, r, bf16_state).agrees());
  }
  const auto [c, r] = wy_case(q, k, v, beta, C, true, h0);
  const Verdict held = judge(c, r), declared = judge(c, r, bf16_state);
  EXPECT_EQ(held.find("ht")->status(), Status::disagree) << format_table(held);
  EXPECT_TRUE(declared.agrees()) << format_table(declared);
}

// Outside a premise: DK = 1 keys with β k² ≈ 100 for 20 tokens make |T| ~ 99¹⁹, beyond what a fp32
// solve gets to first order (and beyond fp32); a kernel's output, even a wrong one, is inconclusive
// with that premise and the quantity measured, never a disagreement. Within the premises the same
// wrong output disagrees.
TEST(JudgeWy, OutsideThePremiseIsInconclusiveWithTheMeasuredQuantity) {
  const Index L = 20;
  MatrixD q = MatrixD::Constant(L, 1, 0.5), k = MatrixD::Constant(L, 1, 10), v(L, 1);
  for (Index t = 0; t < L; ++t) v(t, 0) = (t % 3) - 1.0;
  VectorD beta = VectorD::Ones(L);
  auto [c, r] = wy_case(q, k, v, beta, 16, false);
  KernelResult wrong = oracle(c);
  wrong.o->values[3] += 1e3 * (1 + std::abs(wrong.o->values[3]));
  const Verdict v1 = judge(c, wrong);
  EXPECT_EQ(v1.status(), Status::inconclusive) << format_table(v1);
  ASSERT_TRUE(v1.premise().has_value());
  EXPECT_GT(v1.premise()->measured, v1.premise()->limit);
  EXPECT_NE(format_table(v1).find("INCONCLUSIVE"), std::string::npos);
  const nlohmann::json j = to_json(v1);
  EXPECT_EQ(j["status"], "inconclusive");
  EXPECT_FALSE(j["premise"]["reason"].get<std::string>().empty());
  // β = 0.01: transitions 1 − β k² = 0 (an erase) but no growth: within every premise, caught.
  beta = VectorD::Constant(L, 0.01);
  auto [c2, r2] = wy_case(q, k, v, beta, 16, false);
  KernelResult wrong2 = oracle(c2);
  wrong2.o->values[3] += 1e3 * (1 + std::abs(wrong2.o->values[3]));
  EXPECT_EQ(judge(c2, wrong2).status(), Status::disagree);
  (void)r, (void)r2;
}

// A fp16 output whose exact value exceeds fp16's range: the kernel's infinity is inconclusive.
TEST(JudgeWy, ResultBeyondTheDtypesRangeIsInconclusive) {
  KernelCase c = make_case(Op::linear, Layout::bhld, false, 12);
  c.d_o.reset(), c.d_ht.reset();
  for (double& x : c.v.values) x *= 3e4;
  KernelResult r = oracle(c);
  r.ht.reset();
  bool overflowed = false;
  for (double& x : r.o->values)
    if (std::abs(x) > 65504) x = std::copysign(INFINITY, x), overflowed = true;
  r.o->dtype = DType::f16;
  ASSERT_TRUE(overflowed);
  const Verdict v = judge(c, r);
  EXPECT_EQ(v.status(), Status::inconclusive) << format_table(v);
}

// ---------------------------------------------------------------------------------------------
// Linear attention's forward as production kernels run it (fla's chunk_fwd_h and chunk_fwd_o), emulated:
// scale·q, the state read and the scores rounded to bf16 as operands, products and sums in fp32, the
// running state in fp32 (or rounded to bf16 at every chunk's end), o stored in bf16, ht in fp32.

KernelRun linear_kernel(const MatrixD& q, const MatrixD& k, const MatrixD& v, Index C, bool bf16_state, const MatrixD& h0) {
  using MF = Eigen::MatrixXf;
  return walk_chunks(q, k, v, C, bf16_state, h0, [](Index, const MF& Q, const MF& K, const MF& V, const MF& S) {
    MF P = Q * K.transpose();
    P.triangularView<Eigen::StrictlyUpper>().setZero();
    return ChunkStep{Q * bf16_operand(S).transpose() + bf16_operand(P) * V, V};
  });
}

std::pair<KernelCase, KernelResult> linear_case(const MatrixD& q, const MatrixD& k, const MatrixD& v, Index C, bool bf16_state,
                                                const MatrixD& h0) {
  const Index L = q.rows(), DK = k.cols(), DV = v.cols();
  auto pack = [](const MatrixD& m, std::vector<Index> shape, DType dtype) {
    HostTensor t;
    t.shape = std::move(shape), t.dtype = dtype;
    for (Index i = 0; i < m.rows(); ++i)
      for (Index j = 0; j < m.cols(); ++j) t.values.push_back(m(i, j));
    return t;
  };
  KernelCase c;
  c.op = Op::linear, c.layout = Layout::bhld;
  c.q = pack(q, {1, 1, L, DK}, DType::bf16), c.k = pack(k, {1, 1, L, DK}, DType::bf16), c.v = pack(v, {1, 1, L, DV}, DType::bf16);
  c.h0 = pack(h0, {1, 1, DV, DK}, DType::f32);
  const KernelRun run = linear_kernel(q, k, v, C, bf16_state, h0);
  KernelResult r;
  r.o = HostTensor{{1, 1, L, DV}, run.o, DType::bf16};
  r.ht = HostTensor{{1, 1, DV, DK}, run.ht, DType::f32};
  return {c, r};
}

// The fp32-state contract: the honest chunk kernel agrees at every chunk size, told or not; the same kernel
// with a bf16 running state is caught in ht when it does not declare it and agrees when it does.
TEST(JudgeLinear, SixteenBitRunningStateIsCaughtUnlessDeclared) {
  std::mt19937_64 rng(5);
  double worst = 0;
  for (Index C : {16, 32, 64}) {
    const Index L = 5 * C + 3, DK = 8, DV = 6;
    const MatrixD q = bf16_matrix(L, DK, rng, 0.35), k = bf16_matrix(L, DK, rng, 0.35), v = bf16_matrix(L, DV, rng, 1);
    const MatrixD h0 = bf16_matrix(DV, DK, rng, 1);
    JudgeOptions told, declared;
    told.chunk_size = C;
    declared.state_dtype = DType::bf16;
    const auto [c, honest] = linear_case(q, k, v, C, false, h0);
    for (const JudgeOptions& o : {JudgeOptions{}, told, declared}) {
      const Verdict verdict = judge(c, honest, o);
      EXPECT_TRUE(verdict.agrees()) << "C = " << C << "\n" << format_table(verdict);
      for (const auto& row : verdict.comparisons) worst = std::max(worst, row.ratio);
    }
    const auto [c16, sixteen] = linear_case(q, k, v, C, true, h0);
    const Verdict held = judge(c16, sixteen);
    EXPECT_EQ(held.find("ht")->status(), Status::disagree) << "C = " << C << "\n" << format_table(held);
    EXPECT_TRUE(judge(c16, sixteen, declared).agrees()) << "C = " << C << "\n" << format_table(judge(c16, sixteen, declared));
  }
  std::cout << "  largest err/bound of the honest kernel: " << worst << "\n";
}

// The state's chain alone: bf16 inputs, ht stored in fp64, so its bound is ε_S·M (M = |h0| + Σ |v_s||k_s|ᵀ)
// with ε_S = γ_{m_S}(2⁻²³), m_S = L + ⌈L/16⌉ + 8: no operand rounding (bf16 products are exact in fp32).
// Half of it at every entry agrees; twice it at one entry is caught there (the model before, 3·2⁻⁸·M, let
// that through, and with it a bf16 state).
TEST(JudgeLinear, StateChainTerm) {
  std::mt19937_64 rng(6);
  const Index L = 200, DK = 5, DV = 4;
  const MatrixD q = bf16_matrix(L, DK, rng, 0.4), k = bf16_matrix(L, DK, rng, 0.4), v = bf16_matrix(L, DV, rng, 1);
  const MatrixD h0 = bf16_matrix(DV, DK, rng, 1);
  auto [c, r] = linear_case(q, k, v, 64, false, h0);
  const KernelResult truth = oracle(c);
  MatrixD m = h0.cwiseAbs();
  for (Index t = 0; t < L; ++t) m += v.row(t).cwiseAbs().transpose() * k.row(t).cwiseAbs();
  const double ms = L + std::ceil(L / 16.0) + 8, eps = ms * 0x1p-23 / (1 - ms * 0x1p-23);
  r.o.reset();
  r.ht = truth.ht;
  r.ht->dtype = DType::f64;
  for (Index i = 0; i < DV; ++i)
    for (Index j = 0; j < DK; ++j) r.ht->values[size_t(i * DK + j)] += 0.5 * eps * m(i, j);
  EXPECT_TRUE(judge(c, r).agrees()) << format_table(judge(c, r));
  const size_t at = 13;
  r.ht->values[at] = truth.ht->values[at] + 2 * eps * m(Index(at) / DK, Index(at) % DK);
  const Verdict v1 = judge(c, r);
  EXPECT_EQ(v1.status(), Status::disagree) << format_table(v1);
  EXPECT_EQ(flat_index(*r.ht, v1.find("ht")->index), Index(at));
  EXPECT_NEAR(v1.find("ht")->ratio, 2, 0.01);
}

// The window of the operand roundings: for an unknown chunk size, A_t covers every chunk start b in
// [t − 63, t] (|q_t|(|S_b| + Σ_{s=b..t} |v_s||k_s|ᵀ)ᵀ, entry by entry); for a told one it is that sum at
// the chunk's own start.
TEST(JudgeLinear, OperandWindowCoversEveryChunkStart) {
  std::mt19937_64 rng(7);
  const Index L = 150, DK = 3, DV = 2;
  judging::UnitInputs in;
  in.q = bf16_matrix(L, DK, rng, 1), in.k = bf16_matrix(L, DK, rng, 1), in.v = bf16_matrix(L, DV, rng, 1);
  in.s0 = bf16_matrix(DV, DK, rng, 1);
  std::vector<MatrixD> states{*in.s0};  // S_b: the state before token b
  for (Index t = 0; t < L; ++t) states.push_back(states.back() + in.v.row(t).transpose() * in.k.row(t));
  auto sum_from = [&](Index b, Index t) {
    MatrixD x = states[size_t(b)].cwiseAbs();
    for (Index s = b; s <= t; ++s) x += in.v.row(s).cwiseAbs().transpose() * in.k.row(s).cwiseAbs();
    return VectorD(x * in.q.row(t).cwiseAbs().transpose());
  };
  judging::LinearForwardModel unknown, told;
  told.chunk_size = 32;
  const judging::LinearStateTerms any = judging::linear_state_terms(in, unknown), own = judging::linear_state_terms(in, told);
  for (Index t = 0; t < L; ++t) {
    for (Index b = std::max<Index>(0, t - 63); b <= t; ++b)
      for (Index d = 0; d < DV; ++d) EXPECT_LE(sum_from(b, t)(d), any.local(t, d) * (1 + 1e-12)) << "t " << t << ", b " << b;
    const VectorD exact = sum_from(t / 32 * 32, t);
    for (Index d = 0; d < DV; ++d) EXPECT_NEAR(own.local(t, d), exact(d), 1e-12 * exact(d)) << "t " << t;
  }
}

// ---------------------------------------------------------------------------------------------
// Threads: the judge's units run on reference/parallel.hpp's workers, so a parallel_for inside a unit
// (a High product) runs on that unit's thread instead of starting a pool of its own.
TEST(JudgeThreads, NestedParallelWorkStaysOnTheUnitsThread) {
  ref::set_thread_count(4);
  std::mutex m;
  bool nested_elsewhere = false;
  std::set<std::thread::id> unit_threads;
  judging::for_each_unit(8, 4, [&](size_t) {
    const std::thread::id self = std::this_thread::get_id();
    std::set<std::thread::id> seen;
    std::mutex inner;
    ref::parallel_for(16, [&](Eigen::Index) {
      std::lock_guard<std::mutex> lock(inner);
      seen.insert(std::this_thread::get_id());
    });
    std::lock_guard<std::mutex> lock(m);
    unit_threads.insert(self);
    if (seen.size() != 1 || *seen.begin() != self) nested_elsewhere = true;
  });
  ref::set_thread_count(0);
  EXPECT_FALSE(nested_elsewhere);
  EXPECT_GE(unit_threads.size(), 1u);
}

// Where the double oracle's recurrences differ from reference/: the read–correct–write order
// (u = v − S k, S ← S + β u kᵀ, with the update's FMA spelled out) and the reverse sweep that
// recomputes states from checkpoints. In fp64 both are the same recurrence to rounding: agreement
// with reference/'s token_recurrence and token_recurrence_backward in double at 1e-12 of the scale.
TEST(JudgeOracle, DoubleOracleMatchesReferenceInDouble) {
  for (Op op : {Op::delta, Op::gated_delta}) {
    KernelCase c = make_case(op, Layout::bhld, false, 21);
    c.l2_normalize_qk = false;
    const KernelResult fast = oracle(c);
    const Index L = 23, DK = 6, DV = 5;
    auto head = [&](const HostTensor& t, Index b, Index h, Index rows, Index cols) {
      MatrixD m(rows, cols);
      for (Index i = 0; i < rows; ++i)
        for (Index j = 0; j < cols; ++j) m(i, j) = t.values[size_t(((b * 2 + h) * rows + i) * cols + j)];
      return m;
    };
    for (Index b = 0; b < 2; ++b)
      for (Index h = 0; h < 2; ++h) {
        const MatrixD q = head(c.q, b, h, L, DK), k = head(c.k, b, h, L, DK), v = head(c.v, b, h, L, DV);
        const VectorD beta = head(*c.beta, b, h, L, 1).col(0);
        const MatrixD s0 = head(*c.h0, b, h, DV, DK), d_o = head(*c.d_o, b, h, L, DV), d_st = head(*c.d_ht, b, h, DV, DK);
        MatrixD o, ht, dq, dh0;
        if (op == Op::delta) {
          namespace dr = ref::delta_rule;
          const dr::Inputs<double> in{q, k, v, beta, s0};
          const auto f = dr::token_recurrence(in);
          const auto g = dr::token_recurrence_backward(in, {d_o, d_st});
          o = f.output, ht = f.final_state, dq = g.dq, dh0 = g.d_initial_state;
        } else {
          namespace gd = ref::gated_delta_rule;
          const VectorD alpha = head(*c.g, b, h, L, 1).col(0).array().exp().matrix();
          const gd::Inputs<double> in{q, k, v, beta, alpha, s0};
          const auto f = gd::token_recurrence(in);
          const auto g = gd::token_recurrence_backward(in, {d_o, d_st});
          o = f.output, ht = f.final_state, dq = g.dq, dh0 = g.d_initial_state;
        }
        auto close = [&](const MatrixD& want, const HostTensor& got, const char* name) {
          const MatrixD g = head(got, b, h, want.rows(), want.cols());
          EXPECT_LE((g - want).cwiseAbs().maxCoeff(), 1e-12 * (1 + want.cwiseAbs().maxCoeff())) << name_of(op) << " " << name;
        };
        close(o, *fast.o, "o"), close(ht, *fast.ht, "ht"), close(dq, *fast.dq, "dq"), close(dh0, *fast.dh0, "dh0");
      }
  }
}

}  // namespace
}  // namespace deltaproof::verify
