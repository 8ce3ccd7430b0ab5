// The emulated machine (support/cuda_emulation.hpp) and the tensor-core primitives of
// cuda/tensor_core.cuh as it runs them: small GEMMs written the way the project's kernels write
// them (the prepare's W = T·K, the register scan's P = Q·Kᵀ and S += V̄ᵀ·K, block_gemm's WMMA)
// against plain CPU products, bit for bit; the shuffles and the built-ins against their
// definitions; and planted mistakes (a transposed fragment, a wrong lane mapping, a missing or late
// cp.async wait, a race, a divergent collective) each caught.
//
// The reference products are independent of the emulation's arithmetic: exact sums in ℚ (GMP),
// truncated to fp32 by stepping through neighbouring floats.
#include "property_tests/support/cuda_emulation.hpp"

#include "cuda/tensor_core.cuh"
#include "reference/scalar.hpp"

#include <Eigen/Core>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace deltaproof;
using namespace deltaproof::cuda::tensor_core;
using emulation::Launch;
using emulation::ThreadOrder;
using ref::Exact;

DELTAPROOF_EMULATION_SHARED_MEMORY(smem);  // the test kernels' extern __shared__

// ---------------------------------------------------------------------------------------
// The reference arithmetic: x rounded toward zero to fp32 (±inf from 2^128 up), independently of
// the emulation's TwoSum and fixed-point sums.

float truncated_to_float(const Exact& x) {
  if (abs(x) >= Exact(0x1p128)) return x > 0 ? INFINITY : -INFINITY;
  float f = static_cast<float>(ref::to_double(x));
  while (abs(Exact(f)) > abs(x)) f = std::nextafter(f, 0.0f);
  for (float away = std::nextafter(f, x > 0 ? INFINITY : -INFINITY); abs(Exact(away)) <= abs(x);
       away = std::nextafter(f, x > 0 ? INFINITY : -INFINITY))
    f = away;
  return f;
}

template <class T>
double value_of(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return double(__bfloat162float(x));
  else return double(__half2float(x));
}

template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(float(x));
  else return __float2half_rn(float(x));
}

// C = A·B as the tensor cores chain it: per 16-wide k block, the fp32 accumulator plus the block's
// exact products, truncated once. A is M×K, B is K×N, both row-major.
template <class T>
std::vector<float> chained_product(const std::vector<T>& a, const std::vector<T>& b, int M, int N, int K) {
  std::vector<float> c(std::size_t(M) * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int k0 = 0; k0 < K; k0 += 16) {
        Exact sum(acc);
        for (int k = k0; k < k0 + 16; ++k) sum += Exact(value_of(a[i * K + k])) * Exact(value_of(b[k * N + j]));
        acc = truncated_to_float(sum);
      }
      c[i * N + j] = acc;
    }
  return c;
}

// The plain product in double (exact when the entries are small integers).
template <class T>
std::vector<float> plain_product(const std::vector<T>& a, const std::vector<T>& b, int M, int N, int K) {
  std::vector<float> c(std::size_t(M) * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double sum = 0;
      for (int k = 0; k < K; ++k) sum += value_of(a[i * K + k]) * value_of(b[k * N + j]);
      c[i * N + j] = float(sum);
    }
  return c;
}

// Small integers: every product and sum exact, so the tensor cores' rounding never acts.
template <class T>
std::vector<T> small_integers(std::size_t n, std::mt19937_64& engine) {
  std::uniform_int_distribution<int> draw(-8, 8);
  std::vector<T> v(n);
  for (T& x : v) x = from_double<T>(draw(engine));
  return v;
}

// Full mantissas over a wide exponent range (bf16 2^±40, fp16 2^±7): sums that need truncating,
// and (bf16) terms too far apart for a double.
template <class T>
std::vector<T> wide_values(std::size_t n, std::mt19937_64& engine) {
  constexpr int range = std::is_same_v<T, __nv_bfloat16> ? 40 : 7;
  std::uniform_real_distribution<double> mantissa(1, 2);
  std::uniform_int_distribution<int> exponent(-range, range), sign(0, 1);
  std::vector<T> v(n);
  for (T& x : v) x = from_double<T>((sign(engine) ? -1 : 1) * std::ldexp(mantissa(engine), exponent(engine)));
  return v;
}

// ---------------------------------------------------------------------------------------
// GEMM kernels in the project's three mma.sync forms, and the mistakes planted in them.

enum class Form {
  w_equals_t_k,   // A [m][k] rows (ldmatrix), B [k][n] (ldmatrix.trans): the prepare's W = T·K
  p_equals_q_kt,  // A [m][k] rows, B stored [n][k] (ldmatrix): the register scan's P = Q·Kᵀ
  s_plus_vt_k,    // A stored [k][m] (ldmatrix.trans), B [k][n] (ldmatrix.trans): the scan's S += V̄ᵀ·K
};
enum class Plant { none, b_untransposed, b_lane_mapping, a_lane_mapping, wait_missing, wait_late, destination_race };

struct Gemm {
  const void* a;  // as the form stores it
  const void* b;
  float* c;  // M×N row-major
  int M, N, K;
};

constexpr int kPad = 8;  // operand rows padded by 16 bytes, as the kernels pad them

// rows × cols of T from global to shared (pitch cols + kPad), 16 bytes per cp.async.
template <class T>
void copy_in(T* dst, const T* src, int rows, int cols) {
  for (int e = threadIdx.x; e < rows * cols / 8; e += blockDim.x) {
    const int r = e / (cols / 8), c = e % (cols / 8) * 8;
    copy_async_16(dst + r * (cols + kPad) + c, src + r * cols + c, true);
  }
}

template <class T, Form F, Plant P>
__global__ void gemm_kernel(Gemm g) {
  extern __shared__ __align__(128) unsigned char smem[];
  const bool a_transposed = F == Form::s_plus_vt_k, b_by_column = F == Form::p_equals_q_kt;
  const int a_rows = a_transposed ? g.K : g.M, a_cols = a_transposed ? g.M : g.K;
  const int b_rows = b_by_column ? g.N : g.K, b_cols = b_by_column ? g.K : g.N;
  const int pa = a_cols + kPad, pb = b_cols + kPad;
  T* a = reinterpret_cast<T*>(smem);
  T* b = a + a_rows * pa;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g_row = lane / 4, t = lane % 4;

  copy_in(a, static_cast<const T*>(g.a), a_rows, a_cols);
  copy_in(b, static_cast<const T*>(g.b), b_rows, b_cols);
  copy_async_commit();
  if constexpr (P == Plant::destination_race) {
    __syncthreads();
    if (threadIdx.x == 1) a[0] = T(1.0f);  // thread 0's copy of row 0 is still in flight
  }
  if constexpr (P != Plant::wait_missing && P != Plant::wait_late) copy_async_wait<0>();
  __syncthreads();

  const int tiles_n = g.N / 16;
  for (int tile = warp; tile < g.M / 16 * tiles_n; tile += blockDim.x / 32) {
    const int i0 = tile / tiles_n * 16, j0 = tile % tiles_n * 16;
    float acc[2][4] = {};
    for (int kk = 0; kk < g.K / 16; ++kk) {
      unsigned fa[4], fb[4];
      if constexpr (a_transposed) {
        ldmatrix_x4_trans(fa, a + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * pa + i0 + ((lane >> 3) & 1) * 8);
      } else {
        const int row = P == Plant::a_lane_mapping ? (lane / 16) * 8 + lane % 8 : lane % 16;  // lanes 8–15 and 16–23 swapped
        ldmatrix_x4(fa, a + (i0 + row) * pa + kk * 16 + (P == Plant::a_lane_mapping ? (lane / 8) % 2 : lane / 16) * 8);
      }
      if constexpr (b_by_column) {
        ldmatrix_x4(fb, b + (j0 + (lane & 7) + ((lane >> 4) << 3)) * pb + kk * 16 + ((lane >> 3) & 1) * 8);
      } else {
        const int k_half = P == Plant::b_lane_mapping ? lane >> 4 : (lane >> 3) & 1;  // the two lane bits swapped
        const int n_half = P == Plant::b_lane_mapping ? (lane >> 3) & 1 : lane >> 4;
        const T* row = b + (kk * 16 + (lane & 7) + k_half * 8) * pb + j0 + n_half * 8;
        if constexpr (P == Plant::b_untransposed) ldmatrix_x4(fb, row);
        else ldmatrix_x4_trans(fb, row);
      }
      mma_16816<T>(acc[0], fa, fb[0], fb[1]);
      mma_16816<T>(acc[1], fa, fb[2], fb[3]);
    }
    for (int n = 0; n < 2; ++n)
      for (int x = 0; x < 4; ++x) g.c[(i0 + g_row + 8 * (x / 2)) * g.N + j0 + 8 * n + 2 * t + x % 2] = acc[n][x];
  }
  if constexpr (P == Plant::wait_late) copy_async_wait_all();
}

// A·B (A M×K, B K×N, row-major) through gemm_kernel<T, F, P>, the operands stored as F stores them.
template <class T, Form F, Plant P = Plant::none>
std::vector<float> emulated_product(const std::vector<T>& a, const std::vector<T>& b, int M, int N, int K, int threads = 128,
                                    ThreadOrder order = ThreadOrder::shuffled) {
  const bool a_transposed = F == Form::s_plus_vt_k, b_by_column = F == Form::p_equals_q_kt;
  emulation::DeviceBuffer da("a", a.size() * sizeof(T)), db("b", b.size() * sizeof(T)), dc("c", std::size_t(M) * N * 4);
  T* pa = static_cast<T*>(da.data());
  T* pb = static_cast<T*>(db.data());
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k) (a_transposed ? pa[k * M + i] : pa[i * K + k]) = a[i * K + k];
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < N; ++j) (b_by_column ? pb[j * K + k] : pb[k * N + j]) = b[k * N + j];
  const std::size_t shared = ((a_transposed ? K * (M + kPad) : M * (K + kPad)) + (b_by_column ? N * (K + kPad) : K * (N + kPad))) * sizeof(T);
  emulation::launch(Launch{dim3(1), dim3(threads), shared, order, 7}, gemm_kernel<T, F, P>,
                    Gemm{da.data(), db.data(), static_cast<float*>(dc.data()), M, N, K});
  for (const auto* buffer : {&da, &db, &dc}) buffer->check_guards();
  std::vector<float> c(std::size_t(M) * N);
  std::memcpy(c.data(), dc.data(), c.size() * 4);
  return c;
}

// Bitwise equality (NaN never equals), the first difference named.
testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) || std::isnan(got[i]))
      return testing::AssertionFailure() << "entry " << i << ": " << got[i] << " (0x" << std::hex << std::bit_cast<std::uint32_t>(got[i])
                                         << "), expected " << want[i] << " (0x" << std::bit_cast<std::uint32_t>(want[i]) << ")";
  return testing::AssertionSuccess();
}

template <class T, Form F>
void check_form(int M, int N, int K, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  const std::vector<T> a = small_integers<T>(std::size_t(M) * K, engine), b = small_integers<T>(std::size_t(K) * N, engine);
  EXPECT_TRUE(same_bits(emulated_product<T, F>(a, b, M, N, K), plain_product(a, b, M, N, K)))
      << "small integers, form " << int(F) << ", M=" << M << " N=" << N << " K=" << K;
  const std::vector<T> wa = wide_values<T>(std::size_t(M) * K, engine), wb = wide_values<T>(std::size_t(K) * N, engine);
  EXPECT_TRUE(same_bits(emulated_product<T, F>(wa, wb, M, N, K), chained_product(wa, wb, M, N, K)))
      << "wide values, form " << int(F) << ", M=" << M << " N=" << N << " K=" << K;
}

// ---------------------------------------------------------------------------------------

// One m16n8k16 sum: exact, then truncated once, on the paths the emulation takes (double sums
// that are exact; terms 2^±200 apart; cancellation to zero; fp32 subnormals; overflow; NaN).
TEST(TensorCoreEmulation, Dot16IsTheExactSumTruncated) {
  auto check = [](const double (&a)[16], const double (&b)[16], float c) {
    Exact sum(c);
    for (int k = 0; k < 16; ++k) sum += Exact(a[k]) * Exact(b[k]);
    const float got = emulation::dot16_round_toward_zero(a, b, c), want = truncated_to_float(sum);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << got << " vs " << want;
  };
  std::mt19937_64 engine(11);
  for (int trial = 0; trial < 400; ++trial) {
    const auto wa = wide_values<__nv_bfloat16>(16, engine), wb = wide_values<__nv_bfloat16>(16, engine);
    double a[16], b[16];
    for (int k = 0; k < 16; ++k) a[k] = value_of(wa[k]), b[k] = value_of(wb[k]) * (trial % 2 ? 0x1p-100 : 1);
    check(a, b, trial % 3 ? 1.0f + 0x1p-23f : -0x1p-30f);
  }
  double a[16] = {0x1p100, 0x1p-100, -0x1p100}, b[16] = {1, -1, 1};
  check(a, b, 0);                                                  // 2^-100 below 0: -2^-100 exactly
  double tiny[16] = {0x1p-70, -0x1p-70}, small[16] = {0x1p-70, 0x1p-100};
  check(tiny, small, 0x1p-140f);                                   // 2^-139 − 2^-170: a truncated fp32 subnormal
  double big[16] = {0x1p127, 0x1p127}, two[16] = {1, 1};
  EXPECT_EQ(emulation::dot16_round_toward_zero(big, two, 0), INFINITY);
  check(a, b, 0x1p100f);                                           // cancellation: 2^100 − 2^-100, truncated
  double nan[16] = {NAN};
  EXPECT_TRUE(std::isnan(emulation::dot16_round_toward_zero(nan, two, 0)));
}

// The three mma.sync forms of the kernels, bf16 and fp16, one k block and several, 128 and 256
// threads: bit for bit the plain product (small integers) and the chained exact-then-truncated one.
TEST(TensorCoreEmulation, GemmsInTheKernelsFormsAreExact) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  check_form<__nv_bfloat16, Form::w_equals_t_k>(32, 32, 48, 1);
  check_form<__half, Form::w_equals_t_k>(64, 16, 16, 2);
  check_form<__nv_bfloat16, Form::p_equals_q_kt>(32, 48, 32, 3);
  check_form<__half, Form::p_equals_q_kt>(16, 16, 64, 4);
  check_form<__nv_bfloat16, Form::s_plus_vt_k>(48, 32, 32, 5);
  check_form<__half, Form::s_plus_vt_k>(32, 64, 16, 6);
}

// Each planted mistake changes the product or stops the launch.
TEST(TensorCoreEmulation, PlantedMistakesAreCaught) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  using T = __nv_bfloat16;
  constexpr int M = 32, N = 32, K = 32;
  std::mt19937_64 engine(21);
  const std::vector<T> a = small_integers<T>(M * K, engine), b = small_integers<T>(K * N, engine);
  const std::vector<float> want = plain_product(a, b, M, N, K);
  ASSERT_TRUE(same_bits(emulated_product<T, Form::w_equals_t_k>(a, b, M, N, K), want));
  EXPECT_FALSE(same_bits(emulated_product<T, Form::w_equals_t_k, Plant::b_untransposed>(a, b, M, N, K), want)) << "transposed fragment";
  EXPECT_FALSE(same_bits(emulated_product<T, Form::w_equals_t_k, Plant::b_lane_mapping>(a, b, M, N, K), want)) << "B lane mapping";
  EXPECT_FALSE(same_bits(emulated_product<T, Form::w_equals_t_k, Plant::a_lane_mapping>(a, b, M, N, K), want)) << "A lane mapping";
  // The wait after the reads: the copies land too late, the product reads NaN poison.
  const std::vector<float> late = emulated_product<T, Form::w_equals_t_k, Plant::wait_late>(a, b, M, N, K);
  EXPECT_TRUE(std::all_of(late.begin(), late.end(), [](float x) { return std::isnan(x); }));
  // No wait at all: the launch refuses copies never waited for.
  EXPECT_THROW((emulated_product<T, Form::w_equals_t_k, Plant::wait_missing>(a, b, M, N, K)), std::runtime_error);
  // Thread 1 writes where thread 0's copy is in flight: reported when the write comes before the wait.
  EXPECT_THROW((emulated_product<T, Form::w_equals_t_k, Plant::destination_race>(a, b, M, N, K, 128, ThreadOrder::descending)),
               std::runtime_error);
}

// ---------------------------------------------------------------------------------------
// WMMA as block_gemm uses it (row- and col-major operands, fp32 accumulator loaded and stored).

template <class T, class LayoutA, class LayoutB>
__global__ void wmma_kernel(const T* a, const T* b, float* c, int lda, int ldb) {
  using namespace nvcuda;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  for (int k0 = 0; k0 < 32; k0 += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
    wmma::load_matrix_sync(fa, std::is_same_v<LayoutA, wmma::row_major> ? a + k0 : a + k0 * lda, lda);
    wmma::load_matrix_sync(fb, std::is_same_v<LayoutB, wmma::row_major> ? b + k0 * ldb : b + k0, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

TEST(TensorCoreEmulation, WmmaIsExact) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  using T = __nv_bfloat16;
  namespace wmma = nvcuda::wmma;
  std::mt19937_64 engine(31);
  const std::vector<T> a = wide_values<T>(16 * 32, engine), b = wide_values<T>(32 * 16, engine);  // A 16×32, B 32×16
  const std::vector<float> want = chained_product(a, b, 16, 16, 32);
  auto run = [&](auto layout_a, auto layout_b) {
    using LA = decltype(layout_a);
    using LB = decltype(layout_b);
    constexpr bool a_rows = std::is_same_v<LA, wmma::row_major>, b_rows = std::is_same_v<LB, wmma::row_major>;
    emulation::DeviceBuffer da("a", 16 * 32 * 2 + 64), db("b", 32 * 16 * 2 + 64), dc("c", 16 * 16 * 4);
    T* pa = static_cast<T*>(da.data());
    T* pb = static_cast<T*>(db.data());
    const int lda = a_rows ? 40 : 24, ldb = b_rows ? 24 : 40;  // padded, multiples of 8
    for (int i = 0; i < 16; ++i)
      for (int k = 0; k < 32; ++k) (a_rows ? pa[i * lda + k] : pa[k * lda + i]) = a[i * 32 + k];
    for (int k = 0; k < 32; ++k)
      for (int j = 0; j < 16; ++j) (b_rows ? pb[k * ldb + j] : pb[j * ldb + k]) = b[k * 16 + j];
    std::memset(dc.data(), 0, 16 * 16 * 4);
    emulation::launch(Launch{dim3(1), dim3(32)}, wmma_kernel<T, LA, LB>, static_cast<const T*>(pa), static_cast<const T*>(pb),
                      static_cast<float*>(dc.data()), lda, ldb);
    std::vector<float> c(256);
    std::memcpy(c.data(), dc.data(), 1024);
    return c;
  };
  EXPECT_TRUE(same_bits(run(wmma::row_major{}, wmma::row_major{}), want));
  EXPECT_TRUE(same_bits(run(wmma::row_major{}, wmma::col_major{}), want));
  EXPECT_TRUE(same_bits(run(wmma::col_major{}, wmma::row_major{}), want));
  EXPECT_TRUE(same_bits(run(wmma::col_major{}, wmma::col_major{}), want));
}

// ---------------------------------------------------------------------------------------
// The 16-bit pair helpers under g++: CUDA's host conversions, round to nearest even (against
// Eigen's), and x = hi + lo exactly when the residual is representable.

TEST(TensorCoreEmulation, PairHelpersRoundToNearestEven) {
  std::mt19937_64 engine(41);
  std::uniform_real_distribution<float> draw(-3, 3);
  for (int trial = 0; trial < 2000; ++trial) {
    const float x0 = draw(engine), x1 = std::ldexp(draw(engine), -20);
    const unsigned b = pack_pair<__nv_bfloat16>(x0, x1), h = pack_pair<__half>(x0, x1);
    EXPECT_EQ(b & 0xffff, std::bit_cast<std::uint16_t>(Eigen::bfloat16(x0)));
    EXPECT_EQ(b >> 16, std::bit_cast<std::uint16_t>(Eigen::bfloat16(x1)));
    EXPECT_EQ(h & 0xffff, std::bit_cast<std::uint16_t>(Eigen::half(x0)));
    EXPECT_EQ(h >> 16, std::bit_cast<std::uint16_t>(Eigen::half(x1)));
    const float2 back = unpack_pair<__nv_bfloat16>(b);
    EXPECT_EQ(back.x, float(Eigen::bfloat16(x0)));
    EXPECT_EQ(back.y, float(Eigen::bfloat16(x1)));
    unsigned hi, lo;
    split_pair<__nv_bfloat16>(x0, x1, hi, lo);
    const float2 h2 = unpack_pair<__nv_bfloat16>(hi), l2 = unpack_pair<__nv_bfloat16>(lo);
    EXPECT_EQ(h2.x, float(Eigen::bfloat16(x0)));
    EXPECT_EQ(l2.x, float(Eigen::bfloat16(x0 - h2.x)));
    EXPECT_LE(std::fabs(x0 - h2.x - l2.x), std::ldexp(std::fabs(x0), -16));  // ≈ 16 bits
  }
}

// ---------------------------------------------------------------------------------------
// Shuffles against their definitions (CUDA programming guide, PTX shfl.sync), every width.

__global__ void shuffle_kernel(int* out, int width) {
  const int lane = threadIdx.x % 32, value = 1000 + int(threadIdx.x);
  int* row = out + threadIdx.x * 4;
  row[0] = __shfl_sync(0xffffffffu, value, (lane * 7 + 3) % 64, width);
  row[1] = __shfl_up_sync(0xffffffffu, value, 3, width);
  row[2] = __shfl_down_sync(0xffffffffu, value, 5, width);
  row[3] = __shfl_xor_sync(0xffffffffu, value, 6, width);
  __syncwarp();
}

TEST(TensorCoreEmulation, ShufflesFollowTheirDefinitions) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (int width : {32, 16, 8, 4}) {
    std::vector<int> out(64 * 4);
    emulation::launch(Launch{dim3(1), dim3(64)}, shuffle_kernel, out.data(), width);
    for (int t = 0; t < 64; ++t) {
      const int lane = t % 32, base = t - lane, first = lane / width * width;  // the lane's segment
      const int src_idx = first + (lane * 7 + 3) % 64 % width;
      const int src_up = lane - 3 >= first ? lane - 3 : lane;
      const int src_down = lane + 5 < first + width ? lane + 5 : lane;
      const int src_xor = (lane ^ 6) < first + width ? lane ^ 6 : lane;  // earlier segments allowed, later not
      EXPECT_EQ(out[t * 4 + 0], 1000 + base + src_idx) << "width " << width << " thread " << t;
      EXPECT_EQ(out[t * 4 + 1], 1000 + base + src_up) << "width " << width << " thread " << t;
      EXPECT_EQ(out[t * 4 + 2], 1000 + base + src_down) << "width " << width << " thread " << t;
      EXPECT_EQ(out[t * 4 + 3], 1000 + base + src_xor) << "width " << width << " thread " << t;
    }
  }
}

// ---------------------------------------------------------------------------------------
// The machine's own checks.

__global__ void builtins_kernel(unsigned* out) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned block = blockIdx.x + gridDim.x * blockIdx.y;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned* counts = reinterpret_cast<unsigned*>(smem);
  counts[t] = t;
  __syncthreads();
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  out[block * threads + t] = counts[threads - 1 - t] + 10000 * block;  // another thread's write, after the barrier
}

// 1024 threads in a 3-D block, a 2-D grid, dynamic shared memory: every index seen once.
TEST(TensorCoreEmulation, BuiltinsAndBlockBarrierAtTheLargestBlock) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  std::vector<unsigned> out(6 * 1024);
  emulation::launch(Launch{dim3(3, 2), dim3(16, 16, 4), 1024 * 4, ThreadOrder::shuffled, 3}, builtins_kernel, out.data());
  for (unsigned block = 0; block < 6; ++block)
    for (unsigned t = 0; t < 1024; ++t) EXPECT_EQ(out[block * 1024 + t], 1023 - t + 10000 * block);
}

__global__ void misuse_kernel(int what) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x % 32;
  unsigned r[4];
  float d[4] = {};
  switch (what) {
    case 0: (void)__shfl_xor_sync(0x0000ffffu, lane, 1); break;                         // partial mask
    case 1: if (lane % 2 == 0) (void)__shfl_xor_sync(0xffffffffu, lane, 2); break;       // divergent shuffle
    case 2: if (lane < 16) __syncwarp(); else (void)__shfl_sync(0xffffffffu, lane, 0); break;  // two collectives
    case 3: ldmatrix_x4(r, smem + 16 * lane + 8); break;                                 // misaligned row
    case 4: ldmatrix_x4(r, smem + 16 * lane + 1024); break;                              // past the shared bytes
    case 5: smem[1024 + lane] = 1; break;                                                // write past them
    case 6: if (lane < 31) mma_16816<__half>(d, r, 0u, 0u); break;                       // a lane missing
    case 7: copy_async_16(smem + 16 * lane, smem, true); copy_async_wait_all(); break;   // source not a device buffer
    case 8: (void)__shfl_xor_sync(0xffffffffu, lane, 1); break;                          // correct use
  }
}

TEST(TensorCoreEmulation, MisusedPrimitivesStopTheLaunch) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  for (int what = 0; what < 8; ++what) {
    try {
      emulation::launch(Launch{dim3(1), dim3(64), 1024}, misuse_kernel, what);
      ADD_FAILURE() << "misuse " << what << " went unnoticed";
    } catch (const std::runtime_error& e) {
      std::cout << "misuse " << what << ": " << e.what() << "\n";
    }
  }
  // The same full-warp shuffle passes with 64 threads and stops a block of 48 (a warp of 16).
  EXPECT_NO_THROW(emulation::launch(Launch{dim3(1), dim3(64), 1024}, misuse_kernel, 8));
  EXPECT_THROW(emulation::launch(Launch{dim3(1), dim3(48), 1024}, misuse_kernel, 8), std::runtime_error);
}

// A kernel that reads another thread's shared write without a barrier: its result depends on the
// order in which the threads run, which is how the emulation shows a race.
__global__ void racy_kernel(int* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  int* cell = reinterpret_cast<int*>(smem);
  if (threadIdx.x == 0) cell[0] = 0;
  __syncthreads();
  if (threadIdx.x == 5) cell[0] = 5;
  if (threadIdx.x == 9) out[0] = cell[0];  // no barrier between the write and this read
}

TEST(TensorCoreEmulation, ThreadOrdersExposeARace) {
  DELTAPROOF_EMULATION_REQUIRE_X86_64();
  int ascending = -1, descending = -1;
  emulation::launch(Launch{dim3(1), dim3(32), 64, ThreadOrder::ascending}, racy_kernel, &ascending);
  emulation::launch(Launch{dim3(1), dim3(32), 64, ThreadOrder::descending}, racy_kernel, &descending);
  EXPECT_NE(ascending, descending);
}

}  // namespace
