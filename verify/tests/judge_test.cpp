// verify::judge and verify::oracle: the oracle's own outputs, rounded as a kernel would store them,
// agree; planted errors are caught at the entry planted; layouts, varlen and the in-kernel
// transformations of q and k are the oracle's, checked against independent computations.
#include "verify/judge.hpp"
#include "verify/tests/round_bf16.hpp"

#include "reference/linear_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace deltaproof::verify {
namespace {


double round_to(double x, DType d) {
  switch (d) {
    case DType::bf16: return round_bf16(x);
    case DType::f32: return float(x);
    case DType::f16: {
      // fp16 has 11 significant bits: round through scaling (values here stay in the normal range).
      const int e = std::ilogb(x);
      const double unit = std::ldexp(1.0, e - 10);
      return x == 0 ? 0.0 : std::nearbyint(x / unit) * unit;
    }
    default: return x;
  }
}

HostTensor random_tensor(std::vector<Index> shape, std::mt19937_64& rng, double sd, DType dtype, double mean = 0) {
  HostTensor t;
  t.shape = std::move(shape);
  t.dtype = dtype;
  std::normal_distribution<double> normal(mean, sd);
  for (Index i = 0; i < t.size(); ++i) t.values.push_back(round_to(normal(rng), dtype));
  return t;
}

struct Shape {
  Index batch = 2, heads = 3, length = 37, key_dim = 15, value_dim = 9;
};

KernelCase make_case(Op op, Layout layout, DType dtype, const Shape& s, std::uint64_t seed, bool gradients = true,
                     std::vector<Index> cu_seqlens = {}) {
  std::mt19937_64 rng(seed);
  KernelCase c;
  c.op = op, c.layout = layout, c.cu_seqlens = cu_seqlens;
  const Index B = cu_seqlens.empty() ? s.batch : 1, N = cu_seqlens.empty() ? s.batch : Index(cu_seqlens.size()) - 1;
  const Index T = cu_seqlens.empty() ? s.length : cu_seqlens.back();
  auto tokens = [&](Index d) {
    return layout == Layout::bhld ? std::vector<Index>{B, s.heads, T, d} : std::vector<Index>{B, T, s.heads, d};
  };
  auto gates = [&] { return layout == Layout::bhld ? std::vector<Index>{B, s.heads, T} : std::vector<Index>{B, T, s.heads}; };
  auto states = [&] {
    return layout == Layout::bhld ? std::vector<Index>{N, s.heads, s.value_dim, s.key_dim}
                                  : std::vector<Index>{N, s.heads, s.key_dim, s.value_dim};
  };
  c.q = random_tensor(tokens(s.key_dim), rng, 1 / std::sqrt(double(s.key_dim)), dtype);
  c.k = random_tensor(tokens(s.key_dim), rng, 1 / std::sqrt(double(s.key_dim)), dtype);
  c.v = random_tensor(tokens(s.value_dim), rng, 1, dtype);
  if (op != Op::linear) {
    c.beta = random_tensor(gates(), rng, 0.2, dtype, 0.5);
    c.l2_normalize_qk = true;
  }
  if (op == Op::gated_delta) c.g = random_tensor(gates(), rng, 0.05, DType::f32, -0.1);
  c.h0 = random_tensor(states(), rng, 1, DType::f32);
  if (gradients) {
    c.d_o = random_tensor(tokens(s.value_dim), rng, 1, dtype);
    c.d_ht = random_tensor(states(), rng, 1, DType::f32);
  }
  return c;
}

// The oracle's outputs stored as a kernel stores them: token tensors in the input dtype, states fp32.
KernelResult as_kernel_output(KernelResult r, DType dtype) {
  for (auto* t : {&r.o, &r.dq, &r.dk, &r.dv, &r.dbeta, &r.dg})
    if (*t) {
      for (double& x : (*t)->values) x = round_to(x, dtype);
      (*t)->dtype = dtype;
    }
  for (auto* t : {&r.ht, &r.dh0})
    if (*t) {
      for (double& x : (*t)->values) x = float(x);
      (*t)->dtype = DType::f32;
    }
  return r;
}

class JudgeOps : public ::testing::TestWithParam<std::tuple<Op, Layout, DType>> {};

TEST_P(JudgeOps, OracleStoredAsAKernelAgrees) {
  const auto [op, layout, dtype] = GetParam();
  const KernelCase c = make_case(op, layout, dtype, {}, 7);
  const Verdict v = judge(c, as_kernel_output(oracle(c), dtype));
  EXPECT_TRUE(v.agrees()) << format_table(v);
  EXPECT_EQ(v.comparisons.size(), op == Op::linear ? 6u : op == Op::delta ? 7u : 8u);
  EXPECT_LT(v.oracle_share, 0.01);
  EXPECT_EQ(v.units_in_high, 0);
  for (const auto& row : v.comparisons) EXPECT_GT(row.bound, 0) << row.tensor;
}

// A planted error the size of the tensor's largest entry, at one entry: caught there. (The delta
// family's normwise gradient bounds sit at 10-40 % of a row's norm in bf16 and fp16, so a tenth
// would not always be caught; an error as large as the entries is. Except dk: near the start of a
// sequence its bound bounds the chunk's in-token reads by the triangle inequality and reaches
// 1.0-1.6 times the row's norm in 16-bit dtypes, so the error planted there is 4 times as large.)
TEST_P(JudgeOps, PlantedErrorCaughtWhereItIs) {
  const auto [op, layout, dtype] = GetParam();
  const KernelCase c = make_case(op, layout, dtype, {}, 11);
  const KernelResult clean = as_kernel_output(oracle(c), dtype);
  for (const char* name : {"o", "dv", "dk"}) {
    KernelResult r = clean;
    HostTensor& t = std::string(name) == "o" ? *r.o : std::string(name) == "dv" ? *r.dv : *r.dk;
    double largest = 0;
    for (double x : t.values) largest = std::max(largest, std::abs(x));
    const size_t at = t.values.size() / 2 + 3;
    const bool loose_dk = std::string(name) == "dk" && op != Op::linear && dtype != DType::f32;
    t.values[at] += (loose_dk ? 4 : 1) * largest;
    const Verdict v = judge(c, r);
    const Comparison* row = v.find(name);
    ASSERT_NE(row, nullptr);
    EXPECT_FALSE(row->agrees()) << name << "\n" << format_table(v);
    // The worst index is the planted entry (its flat position in the tensor's layout).
    Index flat = 0;
    for (size_t d = 0; d < row->index.size(); ++d) flat = flat * t.shape[d] + row->index[d];
    EXPECT_EQ(flat, Index(at)) << name;
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Op, Layout, DType>>& info) {  // gated_delta_blhd_bf16
  const DType dtype = std::get<2>(info.param);
  std::string name = name_of(std::get<0>(info.param)) + "_" + name_of(std::get<1>(info.param)) + "_" +
                     (dtype == DType::bf16 ? "bf16" : dtype == DType::f16 ? "fp16" : "fp32");
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryOpLayoutDtype, JudgeOps,
                         ::testing::Combine(::testing::Values(Op::linear, Op::delta, Op::gated_delta),
                                            ::testing::Values(Layout::bhld, Layout::blhd),
                                            ::testing::Values(DType::bf16, DType::f16, DType::f32)),
                         case_name);

// The same numbers in deltaproof's layout and fla's give the same oracle, entry for entry.
TEST(Judge, LayoutsAreTheSameOracle) {
  for (Op op : {Op::linear, Op::delta, Op::gated_delta}) {
    const Shape s;
    const KernelCase a = make_case(op, Layout::bhld, DType::f32, s, 5);
    KernelCase b = a;
    b.layout = Layout::blhd;
    auto to_blhd = [&](const HostTensor& t) {  // [B, H, L, D] -> [B, L, H, D]
      HostTensor out = t;
      const Index B = t.shape[0], H = t.shape[1], L = t.shape[2], D = t.shape.size() == 4 ? t.shape[3] : 1;
      out.shape = t.shape.size() == 4 ? std::vector<Index>{B, L, H, D} : std::vector<Index>{B, L, H};
      for (Index i = 0; i < B; ++i)
        for (Index h = 0; h < H; ++h)
          for (Index l = 0; l < L; ++l)
            for (Index d = 0; d < D; ++d) out.values[size_t(((i * L + l) * H + h) * D + d)] = t.values[size_t(((i * H + h) * L + l) * D + d)];
      return out;
    };
    auto transpose_states = [&](const HostTensor& t) {  // [N, H, DV, DK] -> [N, H, DK, DV]
      HostTensor out = t;
      const Index N = t.shape[0], H = t.shape[1], R = t.shape[2], C = t.shape[3];
      out.shape = {N, H, C, R};
      for (Index n = 0; n < N * H; ++n)
        for (Index i = 0; i < R; ++i)
          for (Index j = 0; j < C; ++j) out.values[size_t((n * C + j) * R + i)] = t.values[size_t((n * R + i) * C + j)];
      return out;
    };
    b.q = to_blhd(a.q), b.k = to_blhd(a.k), b.v = to_blhd(a.v), b.d_o = to_blhd(*a.d_o);
    if (a.beta) b.beta = to_blhd(*a.beta);
    if (a.g) b.g = to_blhd(*a.g);
    b.h0 = transpose_states(*a.h0), b.d_ht = transpose_states(*a.d_ht);
    const KernelResult ra = oracle(a), rb = oracle(b);
    EXPECT_EQ(to_blhd(*ra.o).values, rb.o->values) << name_of(op);
    EXPECT_EQ(to_blhd(*ra.dk).values, rb.dk->values) << name_of(op);
    EXPECT_EQ(transpose_states(*ra.ht).values, rb.ht->values) << name_of(op);
    EXPECT_EQ(transpose_states(*ra.dh0).values, rb.dh0->values) << name_of(op);
  }
}

// Varlen: each packed sequence is the fixed-length oracle on that sequence alone, states reset;
// empty and one-token sequences included.
TEST(Judge, VarlenIsEachSequenceAlone) {
  const std::vector<Index> cu{0, 0, 1, 6, 6, 19};
  for (Op op : {Op::linear, Op::delta, Op::gated_delta}) {
    Shape s;
    s.heads = 2;
    const KernelCase packed = make_case(op, Layout::blhd, DType::f32, s, 9, true, cu);
    const KernelResult whole = oracle(packed);
    for (size_t n = 0; n + 1 < cu.size(); ++n) {
      const Index begin = cu[n], length = cu[n + 1] - cu[n];
      KernelCase one = packed;
      one.cu_seqlens.clear();
      auto slice_tokens = [&](const HostTensor& t) {
        HostTensor out = t;
        const Index H = t.shape[2], D = t.shape.size() == 4 ? t.shape[3] : 1;
        out.shape[1] = length;
        out.values.assign(t.values.begin() + begin * H * D, t.values.begin() + (begin + length) * H * D);
        return out;
      };
      auto slice_state = [&](const HostTensor& t) {
        HostTensor out = t;
        const Index per = t.shape[1] * t.shape[2] * t.shape[3];
        out.shape[0] = 1;
        out.values.assign(t.values.begin() + Index(n) * per, t.values.begin() + Index(n + 1) * per);
        return out;
      };
      one.q = slice_tokens(packed.q), one.k = slice_tokens(packed.k), one.v = slice_tokens(packed.v);
      one.d_o = slice_tokens(*packed.d_o);
      if (packed.beta) one.beta = slice_tokens(*packed.beta);
      if (packed.g) one.g = slice_tokens(*packed.g);
      one.h0 = slice_state(*packed.h0), one.d_ht = slice_state(*packed.d_ht);
      const KernelResult alone = oracle(one);
      EXPECT_EQ(slice_tokens(*whole.o).values, alone.o->values) << name_of(op) << " sequence " << n;
      EXPECT_EQ(slice_tokens(*whole.dq).values, alone.dq->values) << name_of(op) << " sequence " << n;
      EXPECT_EQ(slice_state(*whole.ht).values, alone.ht->values) << name_of(op) << " sequence " << n;
      EXPECT_EQ(slice_state(*whole.dh0).values, alone.dh0->values) << name_of(op) << " sequence " << n;
    }
  }
}

// dq and dk through scale and fla's in-kernel normalisation: the directional derivative of
// <do, o> + <dht, ht> by central differences in double matches <dq, δq> + <dk, δk>.
TEST(Judge, GradientsThroughScaleAndNormalisation) {
  for (Op op : {Op::linear, Op::delta, Op::gated_delta}) {
    Shape s;
    s.batch = 1, s.heads = 1, s.length = 6, s.key_dim = 5, s.value_dim = 4;
    KernelCase c = make_case(op, Layout::blhd, DType::f64, s, 3);
    c.scale = 0.37;
    c.l2_normalize_qk = true;
    const KernelResult g = oracle(c);
    std::mt19937_64 rng(4);
    const HostTensor dir_q = random_tensor(c.q.shape, rng, 1, DType::f64), dir_k = random_tensor(c.k.shape, rng, 1, DType::f64);
    auto loss = [&](double step) {
      KernelCase x = c;
      x.d_o.reset(), x.d_ht.reset();
      for (size_t i = 0; i < x.q.values.size(); ++i) x.q.values[i] += step * dir_q.values[i], x.k.values[i] += step * dir_k.values[i];
      const KernelResult r = oracle(x);
      double l = 0;
      for (size_t i = 0; i < r.o->values.size(); ++i) l += c.d_o->values[i] * r.o->values[i];
      for (size_t i = 0; i < r.ht->values.size(); ++i) l += c.d_ht->values[i] * r.ht->values[i];
      return l;
    };
    const double h = 1e-5, numeric = (loss(h) - loss(-h)) / (2 * h);
    double analytic = 0;
    for (size_t i = 0; i < dir_q.values.size(); ++i) analytic += g.dq->values[i] * dir_q.values[i] + g.dk->values[i] * dir_k.values[i];
    EXPECT_NEAR(analytic, numeric, 1e-7 * (1 + std::abs(numeric))) << name_of(op);
  }
}

// fp64 kernels: the double oracle's own bound is no longer ≤ 1 % of theirs, so the truth is the
// reference's token recurrence in High. The fast double oracle (chunks of 64 tokens for linear
// attention; for the delta family a sweep that recomputes states from checkpoints every 16 tokens)
// judged as such a kernel must agree: L = 150 has two whole chunks and a partial one, and nine
// checkpoint blocks, the last one partial.
TEST(Judge, Fp64KernelsAreJudgedInHigh) {
  for (Op op : {Op::linear, Op::delta, Op::gated_delta}) {
    Shape s;
    s.length = 150;
    const KernelCase c = make_case(op, Layout::bhld, DType::f64, s, 2);
    const Verdict v = judge(c, oracle(c));
    EXPECT_EQ(v.units_in_high, v.units) << name_of(op);
    EXPECT_TRUE(v.agrees()) << name_of(op) << "\n" << format_table(v);
  }
}

TEST(Judge, NonFiniteOutputDisagrees) {
  const KernelCase c = make_case(Op::linear, Layout::blhd, DType::bf16, {}, 1, false);
  KernelResult r = as_kernel_output(oracle(c), DType::bf16);
  r.o->values[4] = NAN;
  const Verdict v = judge(c, r);
  ASSERT_NE(v.find("o"), nullptr);
  EXPECT_FALSE(v.find("o")->finite);
  EXPECT_FALSE(v.agrees());
}

TEST(Judge, BadShapesNameTheTensor) {
  KernelCase c = make_case(Op::delta, Layout::blhd, DType::bf16, {}, 1, false);
  c.beta->shape[1] += 1;
  try {
    (void)oracle(c);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("beta"), std::string::npos) << e.what();
  }
  KernelCase d = make_case(Op::linear, Layout::blhd, DType::bf16, {}, 1, false);
  KernelResult r = oracle(d);
  r.o->shape[3] += 1;
  try {
    (void)judge(d, r);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("o:"), std::string::npos) << e.what();
  }
}

// The elementwise magnitudes of linear attention: the token recurrence on |inputs| is the
// parallel form's Σ|terms| (reference backward_magnitude), exactly.
TEST(Judge, LinearMagnitudesAreSumsOfAbsoluteTerms) {
  namespace la = ref::linear_attention;
  using ref::Exact;
  std::mt19937_64 rng(8);
  std::uniform_int_distribution<int> pick(-8, 8);
  auto m = [&](Index r, Index c) {
    ref::Matrix<Exact> x(r, c);
    for (Index i = 0; i < r; ++i)
      for (Index j = 0; j < c; ++j) x(i, j) = Exact(pick(rng)) / 4;
    return x;
  };
  const la::Inputs<Exact> in{m(7, 3), m(7, 3), m(7, 2), m(2, 3)};
  const la::Cotangents<Exact> cot{m(7, 2), m(2, 3)};
  const auto abs_in = la::absolute(in);
  const auto abs_cot = la::absolute(cot);
  EXPECT_EQ(la::token_recurrence(abs_in).output, la::forward_magnitude(in).output);
  const auto g = la::token_recurrence_backward(abs_in, abs_cot), want = la::backward_magnitude(in, cot);
  EXPECT_EQ(g.dq, want.dq);
  EXPECT_EQ(g.dk, want.dk);
  EXPECT_EQ(g.dv, want.dv);
  EXPECT_EQ(g.d_initial_state, want.d_initial_state);
}

}  // namespace
}  // namespace deltaproof::verify
