// DeltaNet and Gated DeltaNet: chunkwise WY forward (two kernels) and recurrent decode.
//
// Precision plan (where values are rounded to the input dtype, and why):
//   * Every product runs with fp32 accumulation: tensor cores (WMMA or raw mma.sync, bf16/fp16 operands) for
//     bf16/fp16 inputs, plain fp32 FMA for fp32 inputs.
//   * A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ) and its inverse T stay in fp32 (the inverse
//     amplifies errors in A when keys are not normalized, so A is never rounded).
//   * W = T diag(βγ) K and U = T diag(β) V: the fp32 factor T diag(βγ) is split into a hi and a
//     lo part in the input dtype (x = hi + lo + O(u²|x|)), so the tensor-core product sees T to
//     about 16 bits instead of 8, at the cost of a second cheap MMA.
//   * W and U are stored in the input dtype: they are tensor-core operands of the scan anyway.
//   * The state S lives in fp32 for the whole scan. Scan v4 (the default) feeds it to W Sᵀ and
//     Q Sᵀ as a hi + lo pair in the input dtype (≈ 16 bits, two MMAs); v1–v3 round it once to the
//     input dtype (the one rounding that the best public kernels also make).
//   * V̄ = U − W Sᵀ is accumulated in fp32 and rounded to the input dtype only as an operand of
//     P V̄ and of the state update; the gate decay is applied in fp32 before that rounding.
//   * P = Q Kᵀ ⊙ Γ ⊙ M is formed in fp32 and rounded to the input dtype as an MMA operand.
#include "cuda/delta_rule.h"

#include "cuda/check.hpp"
#include "cuda/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace deltaproof::cuda {
namespace {

using namespace nvcuda;

constexpr int kMaxHeadDim = 256;
constexpr int kPrepareThreads = 256;
constexpr int kScanThreads = 256;
constexpr int kDecodeThreads = 256;
constexpr int kDefaultValueSlice = 64;  // value columns per scan block (tuned on the H200: NOTES_delta.md)
constexpr int kDefaultPipeline = 4;     // scan version (NOTES_delta.md)
constexpr int kPanel = 64;  // column panel of the W and U products (bounds the fp32 staging buffer)

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

template <class T>
constexpr bool kTensorCore = !std::is_same_v<T, float>;

template <class T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}

// Round to nearest even in T.
template <class T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return __float2half_rn(x);
}

// Shared-memory pitches: operand rows padded by 8 elements (16 bytes, breaks bank conflicts and
// keeps WMMA's 32-byte tile alignment), fp32 rows by 4.
__host__ __device__ constexpr int operand_pitch(int cols) { return cols + 8; }
__host__ __device__ constexpr int float_pitch(int cols) { return cols + 4; }

// Bump allocator over dynamic shared memory (host and device agree on the layout).
struct Carver {
  std::size_t offset = 0;
  __host__ __device__ std::size_t take(std::size_t bytes) {
    const std::size_t at = offset;
    offset = round_up(static_cast<int>(offset + bytes), 128);
    return at;
  }
};

// Calls f(r, c) for every r < rows, c < cols: warps over rows, lanes over columns. No integer
// division in the index (the v1 loops' runtime div/mod cost more than the MMAs: NOTES_delta.md).
template <class F>
__device__ __forceinline__ void for_each_2d(int rows, int cols, F&& f) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int r = threadIdx.x / 32; r < rows; r += warps)
    for (int c = lane; c < cols; c += 32) f(r, c);
}

// ---------------------------------------------------------------------------------------
// Block-level products in shared memory.

enum class Layout { row, col };

// C (M×N, fp32, row-major, ldc) = [C +] A·B (+ A_lo·B when a_lo is given).
// A is M×K: row-major a[m·lda + k] or col-major a[k·lda + m]; B is K×N: row-major b[k·ldb + n]
// or col-major b[n·ldb + k]. M, N, K are multiples of 16. lower_out: only 16×16 tiles on or
// below the diagonal are computed (the others are left as they are); lower_a: A is lower
// triangular, so the K loop stops after the diagonal tile.
template <class T, Layout LA, Layout LB>
__device__ void block_gemm(const T* a, const T* a_lo, int lda, const T* b, int ldb, float* c, int ldc, int M, int N,
                           int K, bool accumulate, bool lower_out = false, bool lower_a = false) {
  const int tiles_m = M / 16, tiles_n = N / 16;
  if constexpr (kTensorCore<T>) {
    using LayoutA = std::conditional_t<LA == Layout::row, wmma::row_major, wmma::col_major>;
    using LayoutB = std::conditional_t<LB == Layout::row, wmma::row_major, wmma::col_major>;
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int tile = warp; tile < tiles_m * tiles_n; tile += warps) {
      const int mi = tile / tiles_n, ni = tile % tiles_n;
      if (lower_out && ni > mi) continue;
      float* ct = c + mi * 16 * ldc + ni * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      if (accumulate) wmma::load_matrix_sync(acc, ct, ldc, wmma::mem_row_major);
      else wmma::fill_fragment(acc, 0.0f);
      const int k_end = lower_a ? min(K, (mi + 1) * 16) : K;
      for (int k0 = 0; k0 < k_end; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
        const int a_offset = LA == Layout::row ? mi * 16 * lda + k0 : k0 * lda + mi * 16;
        const T* bt = LB == Layout::row ? b + k0 * ldb + ni * 16 : b + ni * 16 * ldb + k0;
        wmma::load_matrix_sync(fb, bt, ldb);
        wmma::load_matrix_sync(fa, a + a_offset, lda);
        wmma::mma_sync(acc, fa, fb, acc);
        if (a_lo != nullptr) {
          wmma::load_matrix_sync(fa, a_lo + a_offset, lda);
          wmma::mma_sync(acc, fa, fb, acc);
        }
      }
      wmma::store_matrix_sync(ct, acc, ldc, wmma::mem_row_major);
    }
  } else {
    // fp32 inputs: plain FMA, one output element per thread (the correctness path; the
    // benchmarks use bf16).
    for (int idx = threadIdx.x; idx < M * N; idx += blockDim.x) {
      const int m = idx / N, n = idx % N;
      if (lower_out && n / 16 > m / 16) continue;
      const int k_end = lower_a ? min(K, (m / 16 + 1) * 16) : K;
      float sum = accumulate ? c[m * ldc + n] : 0.0f;
      for (int k = 0; k < k_end; ++k) {
        const float av = LA == Layout::row ? a[m * lda + k] : a[k * lda + m];
        const float bv = LB == Layout::row ? b[k * ldb + n] : b[n * ldb + k];
        sum = fmaf(av, bv, sum);
      }
      c[m * ldc + n] = sum;
    }
  }
}

// dst (rows_pad × cols_pad, pitch) ← ±src (rows × cols, leading dim ld), zero padded.
// 16-byte loads when the row length and the source allow it.
template <class T>
__device__ void load_operand(T* dst, int pitch, const T* src, int ld, int rows, int cols, int rows_pad, int cols_pad,
                             bool negate) {
  constexpr int V = 16 / sizeof(T);
  const bool vector = cols % V == 0 && ld % V == 0 && (reinterpret_cast<std::uintptr_t>(src) & 15) == 0;
  if (vector) {
    for_each_2d(rows_pad, cols_pad / V, [&](int r, int vec) {
      const int c = vec * V;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (r < rows && c < cols) {
        x = *reinterpret_cast<const uint4*>(src + static_cast<std::size_t>(r) * ld + c);
        if (negate) {  // flip the sign bits: exact
          const unsigned mask = sizeof(T) == 4 ? 0x80000000u : 0x80008000u;
          x.x ^= mask, x.y ^= mask, x.z ^= mask, x.w ^= mask;
        }
      }
      *reinterpret_cast<uint4*>(dst + r * pitch + c) = x;
    });
  } else {
    for_each_2d(rows_pad, cols_pad, [&](int r, int c) {
      float x = 0.0f;
      if (r < rows && c < cols) x = to_float(src[static_cast<std::size_t>(r) * ld + c]);
      dst[r * pitch + c] = from_float<T>(negate ? -x : x);
    });
  }
}

// In-chunk cumulative log-gates G_i = Σ_{t≤i} g_t of up to 64 values held two per lane (lo: i =
// lane, hi: i = lane + 32), by a fixed shuffle tree: deterministic, and the same order in every
// kernel that forms G.
__device__ __forceinline__ void chunk_prefix_sums(float& lo, float& hi, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const float a = __shfl_up_sync(0xffffffffu, lo, d), b = __shfl_up_sync(0xffffffffu, hi, d);
    if (lane >= d) lo += a, hi += b;
  }
  hi += __shfl_sync(0xffffffffu, lo, 31);
}

// Loads the fp32 log-gates of one chunk and forms their in-chunk cumulative sums G_i = Σ_{t≤i} g_t
// (zero for DeltaNet and past the end of a partial chunk, where g is taken as 0). Warp 0 only;
// the caller's barrier publishes the result.
__device__ void load_cumulative_gates(float* cumulative, const float* log_gate, int size, int chunk_size) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  float lo = (log_gate != nullptr && lane < size) ? log_gate[lane] : 0.0f;
  float hi = (log_gate != nullptr && lane + 32 < size) ? log_gate[lane + 32] : 0.0f;
  chunk_prefix_sums(lo, hi, lane);
  if (lane < chunk_size) cumulative[lane] = lo;
  if (lane + 32 < chunk_size) cumulative[lane + 32] = hi;
}

// Raw tensor-core helpers (ldmatrix, mma.sync, 16-bit pairs, cp.async): cuda/tensor_core.cuh.
using namespace tensor_core;

// ---------------------------------------------------------------------------------------
// Stage 1: WY preparation, one block per (chunk, head).

struct PrepareLayout {
  std::size_t keys, system, inverse, w_hi, w_lo, u_hi, u_lo, staging, beta, gates, bytes;
};

__host__ __device__ inline PrepareLayout prepare_layout(int element_size, int chunk, int key_dim, int value_dim) {
  const int dp = round_up(key_dim > value_dim ? key_dim : value_dim, 16);
  const bool split = element_size != 4;  // hi/lo parts only when the operands are 16-bit
  PrepareLayout l{};
  Carver c;
  l.keys = c.take(static_cast<std::size_t>(chunk) * operand_pitch(dp) * element_size);  // K, later V
  // A is dead once T is built, so its space takes what comes after. At C = 64 (16-bit inputs):
  // the factors' hi and lo parts, 53 KB at DK = 128, four blocks per SM (NOTES_delta.md v8). At
  // C ≤ 32, where registers, not shared memory, bound the blocks per SM: V, copied in early
  // (see the kernel), the factors in their own space. fp32 inputs: the fp32 staging of
  // the products. U's factors reuse W's once W is written.
  const bool factors_in_system = split && chunk >= 64;
  const int system_pitch = float_pitch(chunk > kPanel ? chunk : kPanel);
  const std::size_t system = static_cast<std::size_t>(chunk) * system_pitch * 4;
  const std::size_t factor = static_cast<std::size_t>(chunk) * operand_pitch(chunk) * element_size;
  l.system = c.take(factors_in_system && 2 * factor > system ? 2 * factor : system);
  l.inverse = c.take(static_cast<std::size_t>(chunk) * float_pitch(chunk) * 4);
  l.w_hi = factors_in_system ? l.system : c.take(factor);
  l.w_lo = factors_in_system ? l.system + factor : split ? c.take(factor) : l.w_hi;
  l.u_hi = l.w_hi;
  l.u_lo = l.w_lo;
  l.staging = l.system;
  l.beta = c.take(chunk * 4);
  l.gates = c.take(chunk * 4);
  l.bytes = c.offset;
  return l;
}

// out (rows × cols of a [.., L, ld] head) ← factor · operand, in column panels of kPanel.
template <class T, int C>
__device__ void wy_product(const T* hi, const T* lo, const T* operand, int op_pitch, float* staging, T* out, int ld,
                           int size, int cols) {
  const int cols_pad = round_up(cols, 16);
  for (int p0 = 0; p0 < cols_pad; p0 += kPanel) {
    const int width = min(kPanel, cols_pad - p0);
    block_gemm<T, Layout::row, Layout::row>(hi, kTensorCore<T> ? lo : nullptr, operand_pitch(C), operand + p0, op_pitch,
                                            staging, float_pitch(kPanel), C, width, C, false, false, true);
    __syncthreads();
    for_each_2d(size, min(width, cols - p0), [&](int i, int j) {
      out[static_cast<std::size_t>(i) * ld + p0 + j] = from_float<T>(staging[i * float_pitch(kPanel) + j]);
    });
    __syncthreads();
  }
}

// The same product on tensor cores (16-bit inputs): mma.sync with the factor's hi and lo parts as
// A operands (ldmatrix) and the operand rows as B (transposed ldmatrix); each warp owns one 16-row
// block and every (kGroups)th 16-column block, and stores its accumulators rounded to T straight
// from registers (no fp32 staging, no barriers). The factor is lower triangular: the k loop
// stops at the diagonal block.
template <class T, int C>
__device__ void wy_product_tc(const T* hi, const T* lo, const T* operand, int op_pitch, T* out, int ld, int size, int cols) {
  constexpr int kRowBlocks = C / 16, kGroups = kPrepareThreads / 32 / kRowBlocks, pf = operand_pitch(C);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int row_block = warp % kRowBlocks, i0 = 16 * row_block;
  const bool pairs = cols % 2 == 0 && (reinterpret_cast<std::uintptr_t>(out) & 3) == 0;  // 4-byte stores
  for (int cb = warp / kRowBlocks; cb < (cols + 15) / 16; cb += kGroups) {
    float acc[2][4] = {};
    for (int kk = 0; kk <= row_block; ++kk) {
      unsigned ah[4], al[4], b[4];
      ldmatrix_x4(ah, hi + (i0 + lane % 16) * pf + kk * 16 + (lane / 16) * 8);
      ldmatrix_x4(al, lo + (i0 + lane % 16) * pf + kk * 16 + (lane / 16) * 8);
      // operand stored [token][column]: transposed ldmatrix gives the col-major B
      ldmatrix_x4_trans(b, operand + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * op_pitch + cb * 16 + (lane >> 4) * 8);
      mma_16816<T>(acc[0], ah, b[0], b[1]);
      mma_16816<T>(acc[1], ah, b[2], b[3]);
      mma_16816<T>(acc[0], al, b[0], b[1]);
      mma_16816<T>(acc[1], al, b[2], b[3]);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + g + 8 * half, c = cb * 16 + 8 * n + 2 * t;
        if (i >= size || c >= cols) continue;
        T* dst = out + static_cast<std::size_t>(i) * ld + c;  // W and U are stored in T: scan operands
        if (pairs) {
          *reinterpret_cast<unsigned*>(dst) = pack_pair<T>(acc[n][2 * half], acc[n][2 * half + 1]);
        } else {
          dst[0] = from_float<T>(acc[n][2 * half]);
          if (c + 1 < cols) dst[1] = from_float<T>(acc[n][2 * half + 1]);
        }
      }
  }
}

template <class T, int C>
__global__ void __launch_bounds__(kPrepareThreads) wy_prepare_kernel(DeltaRuleForwardParams p) {
  const int chunk = blockIdx.x, head = blockIdx.y;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = gridDim.x;
  const int begin = chunk * C, size = min(C, L - begin);
  const int dkp = round_up(DK, 16), dvp = round_up(DV, 16);
  const std::size_t token0 = static_cast<std::size_t>(head) * L + begin;

  extern __shared__ __align__(128) unsigned char smem[];
  const PrepareLayout lay = prepare_layout(sizeof(T), C, DK, DV);
  T* rows = reinterpret_cast<T*>(smem + lay.keys);  // K (C, DK), later V (C, DV)
  float* a = reinterpret_cast<float*>(smem + lay.system);   // (C, C) strictly lower part of A
  float* t = reinterpret_cast<float*>(smem + lay.inverse);  // (C, C) T = A⁻¹
  T* w_hi = reinterpret_cast<T*>(smem + lay.w_hi);
  T* w_lo = reinterpret_cast<T*>(smem + lay.w_lo);
  T* u_hi = reinterpret_cast<T*>(smem + lay.u_hi);
  T* u_lo = reinterpret_cast<T*>(smem + lay.u_lo);
  float* staging = reinterpret_cast<float*>(smem + lay.staging);
  float* beta = reinterpret_cast<float*>(smem + lay.beta);
  float* gates = reinterpret_cast<float*>(smem + lay.gates);
  const int pa = float_pitch(C), pk = operand_pitch(round_up(DK > DV ? DK : DV, 16)), pf = operand_pitch(C);
  const bool gated = p.log_gate != nullptr;

  load_operand(rows, pk, static_cast<const T*>(p.k) + token0 * DK, DK, size, DK, C, dkp, false);
  for (int i = threadIdx.x; i < C; i += blockDim.x)
    beta[i] = i < size ? to_float(static_cast<const T*>(p.beta)[token0 + i]) : 0.0f;
  load_cumulative_gates(gates, p.log_gate ? p.log_gate + token0 : nullptr, size, C);
  __syncthreads();

  // Gram matrix K Kᵀ (only tiles on or below the diagonal are needed).
  block_gemm<T, Layout::row, Layout::col>(rows, nullptr, pk, rows, pk, a, pa, C, C, dkp, false, true);
  __syncthreads();

  // A_ij = β_i exp(G_i − G_j) k_i·k_j for j < i (fp32); exp of a non-positive number only.
  const std::size_t block_cc = (static_cast<std::size_t>(head) * N + chunk) * C * C;
  for (int idx = threadIdx.x; idx < C * C; idx += blockDim.x) {
    const int i = idx / C, j = idx % C;
    // Without gates the decay is exactly 1 (= expf(0)), so skipping expf changes no bit.
    const float value = j < i ? (gated ? beta[i] * a[i * pa + j] * expf(gates[i] - gates[j]) : beta[i] * a[i * pa + j]) : 0.0f;
    a[i * pa + j] = value;
    t[i * pa + j] = 0.0f;
    if (p.wy_system) p.wy_system[block_cc + idx] = i == j ? 1.0f : value;
  }
  __syncthreads();

  // 16×16 diagonal blocks of T by forward substitution; one half-warp per block, lane j owns
  // column j (X = L⁻¹: x_jj = 1, x_ij = −Σ_{j≤m<i} a_im x_mj).
  {
    const int block = threadIdx.x / 16, j = threadIdx.x % 16;
    if (block < C / 16) {
      const int r0 = block * 16;
      float x[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float sum = 0.0f;
#pragma unroll
        for (int m = 0; m < i; ++m)
          if (m >= j) sum = fmaf(a[(r0 + i) * pa + r0 + m], x[m], sum);
        x[i] = i < j ? 0.0f : (i == j ? 1.0f : -sum);
        t[(r0 + i) * pa + r0 + j] = x[i];
      }
    }
  }
  __syncthreads();

  // Merges 16→32→64: T21 = −T22 A21 T11. X = A21 T11 is parked in the (unused) upper block.
  for (int s = 16, log_s = 4; s < C; s *= 2, ++log_s) {
    const int pairs = C / (2 * s);
    for (int idx = threadIdx.x; idx < pairs * s * s; idx += blockDim.x) {
      const int r0 = (idx >> (2 * log_s)) * 2 * s, i = (idx >> log_s) & (s - 1), j = idx & (s - 1);
      float sum = 0.0f;
      for (int m = j; m < s; ++m) sum = fmaf(a[(r0 + s + i) * pa + r0 + m], t[(r0 + m) * pa + r0 + j], sum);
      t[(r0 + i) * pa + r0 + s + j] = sum;  // X_ij
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < pairs * s * s; idx += blockDim.x) {
      const int r0 = (idx >> (2 * log_s)) * 2 * s, i = (idx >> log_s) & (s - 1), j = idx & (s - 1);
      float sum = 0.0f;
      for (int m = 0; m <= i; ++m) sum = fmaf(t[(r0 + s + i) * pa + r0 + s + m], t[(r0 + m) * pa + r0 + s + j], sum);
      t[(r0 + s + i) * pa + r0 + j] = -sum;
    }
    __syncthreads();
  }

  // T diag(βγ) (for W), then T diag(β) (for U), in fp32, split into operand-precision hi + lo.
  for (int idx = threadIdx.x; idx < C * C; idx += blockDim.x) {
    const int i = idx / C, j = idx % C;
    const float tij = j <= i ? t[i * pa + j] : 0.0f;
    if (p.wy_inverse) p.wy_inverse[block_cc + idx] = tij;
    const float wf = tij * (gated ? beta[j] * expf(gates[j]) : beta[j]);
    const T wh = from_float<T>(wf);
    w_hi[i * pf + j] = wh;
    if constexpr (kTensorCore<T>) w_lo[i * pf + j] = from_float<T>(wf - to_float(wh));
  }
  __syncthreads();

  // U's factor T diag(β) replaces W's once W is written (without gates it is the same numbers: kept).
  auto build_u_factors = [&] {
    for (int idx = threadIdx.x; idx < C * C; idx += blockDim.x) {
      const int i = idx / C, j = idx % C;
      const float uf = (j <= i ? t[i * pa + j] : 0.0f) * beta[j];
      const T uh = from_float<T>(uf);
      u_hi[i * pf + j] = uh;
      if constexpr (kTensorCore<T>) u_lo[i * pf + j] = from_float<T>(uf - to_float(uh));
    }
  };
  if constexpr (kTensorCore<T>) {
    // C ≤ 32: V comes in (cp.async) while W is computed, into A's dead space when it fits (DV ≤ 128,
    // 16-byte rows); otherwise (and at C = 64, whose factors live there) into the key rows once W is done.
    const bool early_v = C < 64 && dvp <= 128 && DV % 8 == 0 && (reinterpret_cast<std::uintptr_t>(p.v) & 15) == 0;
    T* v_rows = early_v ? reinterpret_cast<T*>(a) : rows;
    const int pv = operand_pitch(dvp);
    if (early_v) {
      const T* v = static_cast<const T*>(p.v) + token0 * DV;
      for_each_2d(C, dvp / 8, [&](int r, int vec) {
        const int c = vec * 8;
        const bool valid = r < size && c < DV;
        copy_async_16(v_rows + r * pv + c, valid ? v + static_cast<std::size_t>(r) * DV + c : v, valid);
      });
    }
    wy_product_tc<T, C>(w_hi, w_lo, rows, pk, static_cast<T*>(p.w) + token0 * DK, DK, size, DK);
    __syncthreads();  // W's factors and the key rows are consumed: V and (gated) U's factors take their place
    if (!early_v) load_operand(rows, pv, static_cast<const T*>(p.v) + token0 * DV, DV, size, DV, C, dvp, false);
    if (gated) build_u_factors();
    copy_async_wait_all();
    __syncthreads();
    wy_product_tc<T, C>(u_hi, u_lo, v_rows, pv, static_cast<T*>(p.u) + token0 * DV, DV, size, DV);
  } else {
    wy_product<T, C>(w_hi, w_lo, rows, pk, staging, static_cast<T*>(p.w) + token0 * DK, DK, size, DK);
    load_operand(rows, pk, static_cast<const T*>(p.v) + token0 * DV, DV, size, DV, C, dvp, false);
    build_u_factors();
    __syncthreads();
    wy_product<T, C>(u_hi, u_lo, rows, pk, staging, static_cast<T*>(p.u) + token0 * DV, DV, size, DV);
  }
}

// ---------------------------------------------------------------------------------------
// Stage 2: state scan and chunk output, one block per (value slice, head), chunks in order.

struct ScanLayout {
  std::size_t queries, keys, neg_w, v_new, v_op, v_decayed, state, state_op, scores, scores_op, out, gates, bytes;
};

// fp32 inputs share buffers whose operand copy would be the same numbers (state, V̄, P), and
// keep W and Q in one buffer (loaded one after the other) so that DK = 256 fits.
__host__ __device__ inline ScanLayout scan_layout(int element_size, int chunk, int slice, int key_dim) {
  const int dkp = round_up(key_dim, 16);
  const bool wide = element_size == 4;
  const std::size_t rows_bytes = static_cast<std::size_t>(chunk) * operand_pitch(dkp) * element_size;
  ScanLayout l{};
  Carver c;
  l.queries = c.take(rows_bytes);
  l.keys = c.take(rows_bytes);
  l.neg_w = wide ? l.queries : c.take(rows_bytes);
  l.v_new = c.take(static_cast<std::size_t>(chunk) * float_pitch(slice) * 4);
  l.v_op = wide ? l.v_new : c.take(static_cast<std::size_t>(chunk) * operand_pitch(slice) * element_size);
  l.v_decayed = c.take(static_cast<std::size_t>(chunk) * operand_pitch(slice) * element_size);
  l.state = c.take(static_cast<std::size_t>(slice) * float_pitch(dkp) * 4);
  l.state_op = wide ? l.state : c.take(static_cast<std::size_t>(slice) * operand_pitch(dkp) * element_size);
  l.scores = c.take(static_cast<std::size_t>(chunk) * float_pitch(chunk) * 4);
  l.scores_op = wide ? l.scores : c.take(static_cast<std::size_t>(chunk) * operand_pitch(chunk) * element_size);
  l.out = c.take(static_cast<std::size_t>(chunk) * float_pitch(slice) * 4);
  l.gates = c.take(chunk * 4);
  l.bytes = c.offset;
  return l;
}

// Register prefetch of the next chunk (v2): its Q, K, W, U and g are loaded while the current
// chunk computes, and written to shared memory once the current chunk no longer reads them.
// Only for 16-bit inputs with DK and DV multiples of 8 (16-byte vectors); the contents written
// are exactly what the direct loads write, so results are the same bit for bit.
template <class T, int C, int BV>
struct NextChunk {
  static constexpr int kRowsVec = C * kMaxHeadDim / 8 / kScanThreads;  // vectors per thread per tensor (max)
  static constexpr int kSliceVec = (C * BV / 8 + kScanThreads - 1) / kScanThreads;
  uint4 q[kRowsVec], k[kRowsVec], w[kRowsVec], u[kSliceVec];
  float g;

  __device__ void issue(const DeltaRuleForwardParams& p, std::size_t token0, int size, int dkp, int v0, int bv, bool with_q) {
    const int DK = p.key_dim, DV = p.value_dim, per_row = dkp / 8;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    // (row, vector) of idx = threadIdx.x + e·kScanThreads, stepped without dividing in the loop
    const int step_rows = kScanThreads / per_row, step_vec = kScanThreads % per_row;
    int r = threadIdx.x / per_row, vec = threadIdx.x % per_row;
#pragma unroll
    for (int e = 0; e < kRowsVec; ++e) {
      const int idx = threadIdx.x + e * kScanThreads, c = vec * 8;
      const bool valid = idx < C * per_row && r < size && c < DK;
      const std::size_t at = (token0 + r) * DK + c;
      q[e] = valid && with_q ? *reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + at) : zero;
      k[e] = valid ? *reinterpret_cast<const uint4*>(static_cast<const T*>(p.k) + at) : zero;
      w[e] = valid ? *reinterpret_cast<const uint4*>(static_cast<const T*>(p.w) + at) : zero;
      r += step_rows, vec += step_vec;
      if (vec >= per_row) vec -= per_row, ++r;
    }
#pragma unroll
    for (int e = 0; e < kSliceVec; ++e) {
      const int idx = threadIdx.x + e * kScanThreads, r = idx / (BV / 8), c = (idx % (BV / 8)) * 8;
      const bool valid = idx < C * BV / 8 && r < size && c < bv;
      u[e] = valid ? *reinterpret_cast<const uint4*>(static_cast<const T*>(p.u) + (token0 + r) * DV + v0 + c) : zero;
    }
    g = (p.log_gate != nullptr && static_cast<int>(threadIdx.x) < size) ? p.log_gate[token0 + threadIdx.x] : 0.0f;
  }

  __device__ void commit(T* qs, T* ks, T* neg_w, int pk, float* v_new, int pv, float* gates, int dkp) const {
    const int per_row = dkp / 8;
    const int step_rows = kScanThreads / per_row, step_vec = kScanThreads % per_row;
    int r = threadIdx.x / per_row, vec = threadIdx.x % per_row;
#pragma unroll
    for (int e = 0; e < kRowsVec; ++e, r += step_rows, vec += step_vec) {
      if (vec >= per_row) vec -= per_row, ++r;
      const int idx = threadIdx.x + e * kScanThreads, c = vec * 8;
      if (idx < C * per_row) {
        uint4 nw = w[e];
        nw.x ^= 0x80008000u, nw.y ^= 0x80008000u, nw.z ^= 0x80008000u, nw.w ^= 0x80008000u;
        if (qs != nullptr) *reinterpret_cast<uint4*>(qs + r * pk + c) = q[e];
        *reinterpret_cast<uint4*>(ks + r * pk + c) = k[e];
        *reinterpret_cast<uint4*>(neg_w + r * pk + c) = nw;
      }
    }
#pragma unroll
    for (int e = 0; e < kSliceVec; ++e) {
      const int idx = threadIdx.x + e * kScanThreads, r = idx / (BV / 8), c = (idx % (BV / 8)) * 8;
      if (idx < C * BV / 8) {
        const T* x = reinterpret_cast<const T*>(&u[e]);
#pragma unroll
        for (int j = 0; j < 8; ++j) v_new[r * pv + c + j] = to_float(x[j]);
      }
    }
    if (static_cast<int>(threadIdx.x) < C) gates[threadIdx.x] = g;  // raw g; summed after the next barrier
  }
};

// Fused = true: the output is computed here too (v1, v2). Fused = false (v3): this kernel only
// carries the state and writes the operands the output needs (S_[c] and V̄ in the dtype);
// chunk_output_kernel then computes O for all chunks in parallel, with the same products in the
// same order, so the output is the same bit for bit.
template <class T, int C, int BV, bool Prefetch, bool Fused>
__global__ void __launch_bounds__(kScanThreads) chunk_scan_kernel(DeltaRuleForwardParams p) {
  constexpr bool wide = !kTensorCore<T>;
  const int slice = blockIdx.x, head = blockIdx.y;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim;
  const int N = (L + C - 1) / C;
  const int v0 = slice * BV, bv = min(BV, DV - v0);
  const int dkp = round_up(DK, 16);

  extern __shared__ __align__(128) unsigned char smem[];
  const ScanLayout lay = scan_layout(sizeof(T), C, BV, DK);
  T* qs = reinterpret_cast<T*>(smem + lay.queries);
  T* ks = reinterpret_cast<T*>(smem + lay.keys);
  T* neg_w = reinterpret_cast<T*>(smem + lay.neg_w);
  float* v_new = reinterpret_cast<float*>(smem + lay.v_new);   // (C, BV): U, then V̄ = U − W Sᵀ
  T* v_op = reinterpret_cast<T*>(smem + lay.v_op);             // V̄ as an operand of P V̄
  T* v_decayed = reinterpret_cast<T*>(smem + lay.v_decayed);   // diag(γ_C/γ) V̄, operand of the update
  float* state = reinterpret_cast<float*>(smem + lay.state);   // (BV, DK) rows v0.. of S, fp32
  T* state_op = reinterpret_cast<T*>(smem + lay.state_op);     // S as an operand
  float* scores = reinterpret_cast<float*>(smem + lay.scores);  // (C, C) Q Kᵀ
  T* scores_op = reinterpret_cast<T*>(smem + lay.scores_op);    // P = Q Kᵀ ⊙ Γ ⊙ M
  float* out = reinterpret_cast<float*>(smem + lay.out);       // (C, BV)
  float* gates = reinterpret_cast<float*>(smem + lay.gates);
  const int pk = operand_pitch(dkp), ps = float_pitch(dkp), pso = wide ? ps : pk;
  const int pv = float_pitch(BV), pvo = wide ? pv : operand_pitch(BV), pvd = operand_pitch(BV);
  const int pp = float_pitch(C), ppo = wide ? pp : operand_pitch(C);

  const std::size_t state_base = static_cast<std::size_t>(head) * DV * DK;
  for_each_2d(BV, dkp, [&](int r, int c) {
    const float x = (p.initial_state && r < bv && c < DK) ? p.initial_state[state_base + (v0 + r) * DK + c] : 0.0f;
    state[r * ps + c] = x;
    if constexpr (!wide) state_op[r * pso + c] = from_float<T>(x);
  });
  __syncthreads();  // the first chunk's boundary write reads other threads' entries
  const bool gated = p.log_gate != nullptr;

  for (int chunk = 0; chunk < N; ++chunk) {
    const int begin = chunk * C, size = min(C, L - begin);
    const std::size_t token0 = static_cast<std::size_t>(head) * L + begin;
    if (p.boundary_states) {
      float* dst = p.boundary_states + (static_cast<std::size_t>(head) * N + chunk) * DV * DK;
      for_each_2d(bv, DK, [&](int r, int c) { dst[(v0 + r) * DK + c] = state[r * ps + c]; });
    }
    if constexpr (!Fused) {  // S_[c] as the output's operand: the same rounding as state_op
      T* dst = static_cast<T*>(p.state_operands) + (static_cast<std::size_t>(head) * N + chunk) * DV * DK;
      for_each_2d(bv, DK, [&](int r, int c) { dst[(v0 + r) * DK + c] = from_float<T>(state[r * ps + c]); });
    }
    if (!Prefetch || chunk == 0) {
      load_operand(ks, pk, static_cast<const T*>(p.k) + token0 * DK, DK, size, DK, C, dkp, false);
      load_operand(neg_w, pk, static_cast<const T*>(p.w) + token0 * DK, DK, size, DK, C, dkp, true);
      if constexpr (!wide && Fused) load_operand(qs, pk, static_cast<const T*>(p.q) + token0 * DK, DK, size, DK, C, dkp, false);
      for (int idx = threadIdx.x; idx < C * BV; idx += blockDim.x) {
        const int i = idx / BV, j = idx % BV;
        v_new[i * pv + j] = (i < size && j < bv) ? to_float(static_cast<const T*>(p.u)[(token0 + i) * DV + v0 + j]) : 0.0f;
      }
      load_cumulative_gates(gates, p.log_gate ? p.log_gate + token0 : nullptr, size, C);
    }
    __syncthreads();
    NextChunk<T, C, BV> next;
    if constexpr (Prefetch) {
      if (chunk + 1 < N) next.issue(p, token0 + C, min(C, L - begin - C), dkp, v0, bv, Fused);
      if (chunk > 0 && threadIdx.x < 32) {  // the committed raw gates, summed as load_cumulative_gates does
        const int lane = threadIdx.x;
        float lo = lane < C ? gates[lane] : 0.0f, hi = lane + 32 < C ? gates[lane + 32] : 0.0f;
        chunk_prefix_sums(lo, hi, lane);
        if (lane < C) gates[lane] = lo;
        if (lane + 32 < C) gates[lane + 32] = hi;
      }
    }

    // V̄ = U + (−W) Sᵀ
    block_gemm<T, Layout::row, Layout::col>(neg_w, nullptr, pk, state_op, pso, v_new, pv, C, BV, dkp, true);
    if constexpr (wide) {  // W and Q share a buffer: Q comes in once W Sᵀ is done
      __syncthreads();
      load_operand(qs, pk, static_cast<const T*>(p.q) + token0 * DK, DK, size, DK, C, dkp, false);
      __syncthreads();
    }
    if constexpr (Fused) {
      block_gemm<T, Layout::row, Layout::col>(qs, nullptr, pk, state_op, pso, out, pv, C, BV, dkp, false);  // Q Sᵀ
      block_gemm<T, Layout::row, Layout::col>(qs, nullptr, pk, ks, pk, scores, pp, C, C, dkp, false, true);  // Q Kᵀ
    }
    __syncthreads();

    // Gate decays in fp32, then the roundings to operand precision.
    const float last = gates[size - 1];
    for (int idx = threadIdx.x; idx < C * BV; idx += blockDim.x) {
      const int i = idx / BV, j = idx % BV;
      const float x = v_new[i * pv + j];
      if (p.v_new && i < size && j < bv) p.v_new[(token0 + i) * DV + v0 + j] = x;
      // Without gates every decay is exactly 1 (= expf(0)): skipping expf changes no bit.
      v_decayed[i * pvd + j] = from_float<T>(gated ? x * expf(last - gates[i]) : x);
      if constexpr (Fused) {
        v_op[i * pvo + j] = from_float<T>(x);
        if (gated) out[i * pv + j] *= expf(gates[i]);
      } else if (i < size && j < bv) {
        static_cast<T*>(p.v_new_operands)[(token0 + i) * DV + v0 + j] = from_float<T>(x);
      }
    }
    if constexpr (Fused)
      for (int idx = threadIdx.x; idx < C * C; idx += blockDim.x) {
        const int i = idx / C, j = idx % C;
        scores_op[i * ppo + j] =
            j <= i ? from_float<T>(gated ? scores[i * pp + j] * expf(gates[i] - gates[j]) : scores[i * pp + j]) : from_float<T>(0.0f);
      }
    if (gated) {
      const float decay = expf(last);
      for_each_2d(BV, dkp, [&](int r, int c) { state[r * ps + c] *= decay; });
    }
    __syncthreads();

    // O += P V̄;  S ← γ_C S + (diag(γ_C/γ) V̄)ᵀ K
    if constexpr (Fused)
      block_gemm<T, Layout::row, Layout::row>(scores_op, nullptr, ppo, v_op, pvo, out, pv, C, BV, C, true, false, true);
    block_gemm<T, Layout::col, Layout::row>(v_decayed, nullptr, pvd, ks, pk, state, ps, BV, dkp, C, true);
    __syncthreads();

    if constexpr (Fused) {
      T* o = static_cast<T*>(p.output);
      for_each_2d(size, bv, [&](int i, int j) { o[(token0 + i) * DV + v0 + j] = from_float<T>(out[i * pv + j]); });
    }
    if constexpr (!wide)
      for_each_2d(BV, dkp, [&](int r, int c) { state_op[r * pso + c] = from_float<T>(state[r * ps + c]); });
    if constexpr (Prefetch)
      if (chunk + 1 < N) next.commit(Fused ? qs : nullptr, ks, neg_w, pk, v_new, pv, gates, dkp);
    // The next chunk's loads touch none of out, state or state_op; its first barrier orders them.
  }
  __syncthreads();
  for_each_2d(bv, DK, [&](int r, int c) { p.final_state[state_base + (v0 + r) * DK + c] = state[r * ps + c]; });
}

// Stage 3 of v3: chunk outputs, one block per (chunk, value slice, head), all in parallel:
// O = diag(γ) Q S_[c]ᵀ + (Q Kᵀ ⊙ Γ ⊙ M) V̄ from the operands the scan wrote (16-bit inputs only).
struct OutputLayout {
  std::size_t queries, keys, state_op, v_op, scores, scores_op, out, gates, bytes;
};

__host__ __device__ inline OutputLayout output_layout(int element_size, int chunk, int slice, int key_dim) {
  const int dkp = round_up(key_dim, 16);
  const std::size_t rows_bytes = static_cast<std::size_t>(chunk) * operand_pitch(dkp) * element_size;
  OutputLayout l{};
  Carver c;
  l.queries = c.take(rows_bytes);
  l.keys = c.take(rows_bytes);
  l.state_op = c.take(static_cast<std::size_t>(slice) * operand_pitch(dkp) * element_size);
  l.v_op = c.take(static_cast<std::size_t>(chunk) * operand_pitch(slice) * element_size);
  l.scores = c.take(static_cast<std::size_t>(chunk) * float_pitch(chunk) * 4);
  l.scores_op = c.take(static_cast<std::size_t>(chunk) * operand_pitch(chunk) * element_size);
  l.out = c.take(static_cast<std::size_t>(chunk) * float_pitch(slice) * 4);
  l.gates = c.take(chunk * 4);
  l.bytes = c.offset;
  return l;
}

template <class T, int C, int BV>
__global__ void __launch_bounds__(kScanThreads) chunk_output_kernel(DeltaRuleForwardParams p) {
  const int chunk = blockIdx.x, slice = blockIdx.y, head = blockIdx.z, N = gridDim.x;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim;
  const int begin = chunk * C, size = min(C, L - begin);
  const int v0 = slice * BV, bv = min(BV, DV - v0);
  const int dkp = round_up(DK, 16);
  const std::size_t token0 = static_cast<std::size_t>(head) * L + begin;

  extern __shared__ __align__(128) unsigned char smem[];
  const OutputLayout lay = output_layout(sizeof(T), C, BV, DK);
  T* qs = reinterpret_cast<T*>(smem + lay.queries);
  T* ks = reinterpret_cast<T*>(smem + lay.keys);
  T* state_op = reinterpret_cast<T*>(smem + lay.state_op);
  T* v_op = reinterpret_cast<T*>(smem + lay.v_op);
  float* scores = reinterpret_cast<float*>(smem + lay.scores);
  T* scores_op = reinterpret_cast<T*>(smem + lay.scores_op);
  float* out = reinterpret_cast<float*>(smem + lay.out);
  float* gates = reinterpret_cast<float*>(smem + lay.gates);
  const int pk = operand_pitch(dkp), pv = float_pitch(BV), pvo = operand_pitch(BV);
  const int pp = float_pitch(C), ppo = operand_pitch(C);

  load_operand(qs, pk, static_cast<const T*>(p.q) + token0 * DK, DK, size, DK, C, dkp, false);
  load_operand(ks, pk, static_cast<const T*>(p.k) + token0 * DK, DK, size, DK, C, dkp, false);
  load_operand(state_op, pk,
               static_cast<const T*>(p.state_operands) + (static_cast<std::size_t>(head) * N + chunk) * DV * DK + v0 * DK,
               DK, bv, DK, BV, dkp, false);
  load_operand(v_op, pvo, static_cast<const T*>(p.v_new_operands) + token0 * DV + v0, DV, size, bv, C, BV, false);
  load_cumulative_gates(gates, p.log_gate ? p.log_gate + token0 : nullptr, size, C);
  __syncthreads();

  block_gemm<T, Layout::row, Layout::col>(qs, nullptr, pk, state_op, pk, out, pv, C, BV, dkp, false);  // Q Sᵀ
  block_gemm<T, Layout::row, Layout::col>(qs, nullptr, pk, ks, pk, scores, pp, C, C, dkp, false, true);  // Q Kᵀ
  __syncthreads();
  const bool gated = p.log_gate != nullptr;  // without gates every decay is exactly 1: no expf, same bits
  if (gated)
    for (int idx = threadIdx.x; idx < C * BV; idx += blockDim.x) out[(idx / BV) * pv + idx % BV] *= expf(gates[idx / BV]);
  for (int idx = threadIdx.x; idx < C * C; idx += blockDim.x) {
    const int i = idx / C, j = idx % C;
    scores_op[i * ppo + j] =
        j <= i ? from_float<T>(gated ? scores[i * pp + j] * expf(gates[i] - gates[j]) : scores[i * pp + j]) : from_float<T>(0.0f);
  }
  __syncthreads();
  block_gemm<T, Layout::row, Layout::row>(scores_op, nullptr, ppo, v_op, pvo, out, pv, C, BV, C, true, false, true);
  __syncthreads();
  T* o = static_cast<T*>(p.output);
  for_each_2d(size, bv, [&](int i, int j) { o[(token0 + i) * DV + v0 + j] = from_float<T>(out[i * pv + j]); });
}

// ---------------------------------------------------------------------------------------

// Scan v4: raw tensor cores with the state in registers (16-bit inputs, DK ≤ 128, DK and DV
// multiples of 8). One block of 8 warps per head and 64 value rows of S; two blocks per SM.

constexpr int kTcScanThreads = 256, kTcSlice = 64, kTcKeys = 128;
constexpr int kTcLd = kTcKeys + 8, kTcVLd = kTcSlice + 8;  // padded rows: ldmatrix without bank conflicts

struct TcScanLayout {
  std::size_t s_hi, s_lo, queries, keys, w, v_new, v_decayed, gates, bytes;
};
__host__ __device__ constexpr TcScanLayout tc_scan_layout(int chunk) {
  TcScanLayout l{};
  l.s_hi = 0;
  l.s_lo = l.s_hi + kTcSlice * kTcLd * 2;
  l.queries = l.s_lo + kTcSlice * kTcLd * 2;
  l.keys = l.queries + chunk * kTcLd * 2;
  l.w = l.keys + chunk * kTcLd * 2;
  l.v_new = l.w + chunk * kTcLd * 2;
  l.v_decayed = l.v_new + chunk * kTcVLd * 2;
  l.gates = l.v_decayed + chunk * kTcVLd * 2;
  l.bytes = l.gates + chunk * 4;
  return l;
}


// Per chunk: (1) copy K and U in (cp.async; Q, W and g were prefetched during the previous
// chunk), publish S_[c] from the registers to shared memory as hi + lo; barrier. (2) Each output
// warp (16 rows, 16 or 32 value columns): V̄ = U − W Sᵀ, written back in place of U rounded to T
// (and its decayed copy when gated); then Q Sᵀ and the masked scores P = Q Kᵀ ⊙ Γ ⊙ M, P kept in
// registers as an A operand (FlashAttention-2 style); barrier. (3) Q and W of the next chunk start
// loading; O += P V̄ and the output stored from registers; every warp updates its 16 × 64 part of
// S ← γ_C S + (diag(γ_C/γ) V̄)ᵀ K in its accumulators; barrier.
template <class T, int C>
__global__ void __launch_bounds__(kTcScanThreads, 2) chunk_scan_tc_kernel(DeltaRuleForwardParams p) {
  constexpr int kRowBlocks = C / 16;                                                  // 16-row blocks of a chunk
  constexpr int kColumnGroups = 8 / kRowBlocks < 4 ? 8 / kRowBlocks : 4;             // output warps per row block
  constexpr int kOutTiles = kTcSlice / 8 / kColumnGroups;                            // n8 tiles per output warp
  constexpr int kScoreTiles = C / 8;
  constexpr int kStateTiles = kTcKeys / 2 / 8;  // n8 tiles of the warp's 16 × 64 state part
  constexpr TcScanLayout lay = tc_scan_layout(C);
  extern __shared__ __align__(128) unsigned char smem[];
  T* s_hi = reinterpret_cast<T*>(smem + lay.s_hi);  // [64][kTcLd] S_[c] rows (value) × key, hi part
  T* s_lo = reinterpret_cast<T*>(smem + lay.s_lo);
  T* q_s = reinterpret_cast<T*>(smem + lay.queries);  // [C][kTcLd] chunk rows × key
  T* k_s = reinterpret_cast<T*>(smem + lay.keys);
  T* w_s = reinterpret_cast<T*>(smem + lay.w);
  T* v_new_s = reinterpret_cast<T*>(smem + lay.v_new);       // [C][kTcVLd] U, then V̄ rounded to T
  T* v_decayed_s = reinterpret_cast<T*>(smem + lay.v_decayed);  // diag(γ_C/γ) V̄ rounded to T (gated)
  float* gates = reinterpret_cast<float*>(smem + lay.gates);   // G_i

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int head = blockIdx.y, v0 = blockIdx.x * kTcSlice;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
  const int k_steps = (DK + 15) / 16;
  const int row_block = warp % kRowBlocks, column_group = warp / kRowBlocks;
  const bool computes_output = warp < kRowBlocks * kColumnGroups;  // C = 16 leaves 4 warps to the state alone
  const int i0 = 16 * row_block, out_col0 = column_group * (kTcSlice / kColumnGroups);
  const int state_rows = 16 * (warp % 4), state_key0 = (kTcKeys / 2) * (warp / 4);
  const bool gated = p.log_gate != nullptr;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* w = static_cast<const T*>(p.w);
  const T* u = static_cast<const T*>(p.u);
  T* out = static_cast<T*>(p.output);
  const std::size_t head_token0 = static_cast<std::size_t>(head) * L;

  // Rows of a [.., L, DK] tensor into [C][kTcLd] (zero past the chunk and past DK).
  auto load_rows = [&](T* dst, const T* src, std::size_t token0, int size) {
    for (int e = threadIdx.x; e < C * (kTcKeys / 8); e += kTcScanThreads) {
      const int r = e / (kTcKeys / 8), c = (e % (kTcKeys / 8)) * 8;  // constant divisors: shifts
      const bool valid = r < size && c < DK;
      copy_async_16(dst + r * kTcLd + c, valid ? src + (token0 + r) * DK + c : src, valid);
    }
  };
  // Value columns v0.. of a [.., L, DV] tensor into [C][kTcVLd].
  auto load_slice = [&](T* dst, const T* src, std::size_t token0, int size) {
    for (int e = threadIdx.x; e < C * (kTcSlice / 8); e += kTcScanThreads) {
      const int r = e / (kTcSlice / 8), c = (e % (kTcSlice / 8)) * 8;
      const bool valid = r < size && v0 + c < DV;
      copy_async_16(dst + r * kTcVLd + c, valid ? src + (token0 + r) * DV + v0 + c : src, valid);
    }
  };
  float g_lo = 0.0f, g_hi = 0.0f;  // warp 0: raw log-gates of the chunk being loaded (i = lane, lane + 32)
  auto load_gates = [&](std::size_t token0, int size) {
    if (gated && warp == 0) {
      g_lo = lane < size ? p.log_gate[token0 + lane] : 0.0f;
      g_hi = lane + 32 < size ? p.log_gate[token0 + lane + 32] : 0.0f;
    }
  };

  // State rows state_rows + {g, g+8}, key columns state_key0 + 8n + 2t + {0, 1}: accumulator layout.
  float S[kStateTiles][4];
#pragma unroll
  for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = v0 + state_rows + g + (x / 2) * 8, col = state_key0 + 8 * n + 2 * t + x % 2;
      S[n][x] = (p.initial_state && row < DV && col < DK) ? p.initial_state[(static_cast<std::size_t>(head) * DV + row) * DK + col] : 0.0f;
    }

  load_rows(q_s, q, head_token0, min(C, L));
  load_rows(w_s, w, head_token0, min(C, L));
  load_gates(head_token0, min(C, L));
  for (int chunk = 0; chunk < N; ++chunk) {
    const int t0 = chunk * C, size = min(C, L - t0);
    const std::size_t token0 = head_token0 + t0;

    // (1) K and U in; S_[c] out as hi + lo (and exposed in fp32 when asked); G_i.
    load_rows(k_s, k, token0, size);
    load_slice(v_new_s, u, token0, size);
#pragma unroll
    for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = state_rows + g + 8 * half, c = state_key0 + 8 * n + 2 * t;
        unsigned hi, lo;
        split_pair<T>(S[n][2 * half], S[n][2 * half + 1], hi, lo);
        *reinterpret_cast<unsigned*>(s_hi + r * kTcLd + c) = hi;
        *reinterpret_cast<unsigned*>(s_lo + r * kTcLd + c) = lo;
        if (p.boundary_states && v0 + r < DV && c < DK) {
          float* dst = p.boundary_states + ((static_cast<std::size_t>(head) * N + chunk) * DV + v0 + r) * DK + c;
          dst[0] = S[n][2 * half];
          if (c + 1 < DK) dst[1] = S[n][2 * half + 1];
        }
      }
    if (gated && warp == 0) {
      float lo = g_lo, hi = g_hi;
      chunk_prefix_sums(lo, hi, lane);
      if (lane < C) gates[lane] = lo;
      if (lane + 32 < C) gates[lane + 32] = hi;
    }
    copy_async_wait_all();  // this thread's copies have landed; the barrier publishes everyone's
    __syncthreads();

    // (2) V̄, then Q Sᵀ and P, for this warp's 16 rows.
    float O[kOutTiles][4];
    unsigned P_op[kScoreTiles][2];  // P rounded to T, A-operand layout
    if (computes_output) {
      float V[kOutTiles][4];
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float2 x = unpack_pair<T>(*reinterpret_cast<const unsigned*>(v_new_s + (i0 + g + 8 * half) * kTcVLd + out_col0 + 8 * n + 2 * t));
          V[n][2 * half] = x.x, V[n][2 * half + 1] = x.y;
        }
#pragma unroll
      for (int kk = 0; kk < kTcKeys / 16; ++kk) {
        if (kk >= k_steps) break;
        unsigned a[4];
        ldmatrix_x4(a, w_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int x = 0; x < 4; ++x) a[x] ^= 0x80008000u;  // −W: flipping the sign bits is exact
#pragma unroll
        for (int n = 0; n < kOutTiles; n += 2) {
          const T* row = s_hi + (out_col0 + 8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8;
          unsigned bh[4], bl[4];  // Sᵀ: S stored [value][key], plain ldmatrix gives the col-major B
          ldmatrix_x4(bh, row);
          ldmatrix_x4(bl, row + (s_lo - s_hi));
          mma_16816<T>(V[n], a, bh[0], bh[1]);
          mma_16816<T>(V[n + 1], a, bh[2], bh[3]);
          mma_16816<T>(V[n], a, bl[0], bl[1]);
          mma_16816<T>(V[n + 1], a, bl[2], bl[3]);
        }
      }
      // V̄ in fp32 when asked; rounded to T in place of U (the operand of P V̄ and, ungated, of the
      // update); gated: the decay exp(G_last − G_i) in fp32 before its own rounding.
      const float last = gated ? gates[size - 1] : 0.0f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = i0 + g + 8 * half;
        const float decay = gated ? expf(last - gates[r]) : 1.0f;
#pragma unroll
        for (int n = 0; n < kOutTiles; ++n) {
          const int c = out_col0 + 8 * n + 2 * t;
          const float x0 = V[n][2 * half], x1 = V[n][2 * half + 1];
          if (p.v_new && r < size && v0 + c < DV) {
            float* dst = p.v_new + (token0 + r) * DV + v0 + c;
            dst[0] = x0, dst[1] = x1;
          }
          *reinterpret_cast<unsigned*>(v_new_s + r * kTcVLd + c) = pack_pair<T>(x0, x1);
          if (gated) *reinterpret_cast<unsigned*>(v_decayed_s + r * kTcVLd + c) = pack_pair<T>(x0 * decay, x1 * decay);
        }
      }

      float P[kScoreTiles][4];
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n) P[n][0] = P[n][1] = P[n][2] = P[n][3] = 0.0f;
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kTcKeys / 16; ++kk) {
        if (kk >= k_steps) break;
        unsigned a[4];
        ldmatrix_x4(a, q_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int n = 0; n < kScoreTiles; n += 2) {
          if (n / 2 > row_block) break;  // above the diagonal block: masked anyway
          unsigned bk[4];  // Kᵀ: K stored [token][key], plain ldmatrix gives the col-major B
          ldmatrix_x4(bk, k_s + (8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8);
          mma_16816<T>(P[n], a, bk[0], bk[1]);
          mma_16816<T>(P[n + 1], a, bk[2], bk[3]);
        }
#pragma unroll
        for (int n = 0; n < kOutTiles; n += 2) {
          const T* row = s_hi + (out_col0 + 8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8;
          unsigned bh[4], bl[4];
          ldmatrix_x4(bh, row);
          ldmatrix_x4(bl, row + (s_lo - s_hi));
          mma_16816<T>(O[n], a, bh[0], bh[1]);
          mma_16816<T>(O[n + 1], a, bh[2], bh[3]);
          mma_16816<T>(O[n], a, bl[0], bl[1]);
          mma_16816<T>(O[n + 1], a, bl[2], bl[3]);
        }
      }
      // O = diag(γ) Q Sᵀ; P = Q Kᵀ ⊙ Γ ⊙ M in fp32, rounded to T once as an operand (no expf without
      // gates: every decay is exactly 1, same bits).
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = i0 + g + 8 * half;
        const float gate_r = gated ? gates[r] : 0.0f;
        if (gated) {
          const float decay = expf(gate_r);
#pragma unroll
          for (int n = 0; n < kOutTiles; ++n) O[n][2 * half] *= decay, O[n][2 * half + 1] *= decay;
        }
#pragma unroll
        for (int n = 0; n < kScoreTiles; ++n) {
          const int j = 8 * n + 2 * t;
          float x0 = j <= r ? P[n][2 * half] : 0.0f, x1 = j + 1 <= r ? P[n][2 * half + 1] : 0.0f;
          if (gated) {
            if (j <= r) x0 *= expf(gate_r - gates[j]);
            if (j + 1 <= r) x1 *= expf(gate_r - gates[j + 1]);
          }
          P_op[n][half] = pack_pair<T>(x0, x1);
        }
      }
    }
    __syncthreads();  // V̄ published; Q and W are no longer read

    // (3) The next chunk's Q, W and g start loading; O += P V̄; the state update.
    if (chunk + 1 < N) {
      const int next_size = min(C, L - t0 - C);
      load_rows(q_s, q, token0 + C, next_size);
      load_rows(w_s, w, token0 + C, next_size);
      load_gates(token0 + C, next_size);
    }
    if (computes_output) {
#pragma unroll
      for (int jj = 0; jj < kRowBlocks; ++jj) {
        if (jj > row_block) break;
        const unsigned a[4] = {P_op[2 * jj][0], P_op[2 * jj][1], P_op[2 * jj + 1][0], P_op[2 * jj + 1][1]};
#pragma unroll
        for (int n = 0; n < kOutTiles; n += 2) {
          unsigned bv[4];  // V̄ stored [token][value]: transposed ldmatrix gives the col-major B
          ldmatrix_x4_trans(bv, v_new_s + (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcVLd + out_col0 + 8 * n + (lane >> 4) * 8);
          mma_16816<T>(O[n], a, bv[0], bv[1]);
          mma_16816<T>(O[n + 1], a, bv[2], bv[3]);
        }
      }
      // The output rounded to T, two values per store.
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = i0 + g + 8 * half, c = v0 + out_col0 + 8 * n + 2 * t;
          if (r < size && c < DV) *reinterpret_cast<unsigned*>(out + (token0 + r) * DV + c) = pack_pair<T>(O[n][2 * half], O[n][2 * half + 1]);
        }
    }
    if (gated) {
      const float decay = expf(gates[size - 1]);
#pragma unroll
      for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) S[n][x] *= decay;
    }
    const T* v_update = gated ? v_decayed_s : v_new_s;
#pragma unroll
    for (int jj = 0; jj < kRowBlocks; ++jj) {
      if (jj * 16 >= size) break;  // zero rows add nothing
      unsigned a[4];  // V̄ᵀ rows = value, from V̄ stored [token][value]: transposed ldmatrix
      ldmatrix_x4_trans(a, v_update + (jj * 16 + (lane & 7) + (lane >> 4) * 8) * kTcVLd + state_rows + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int n = 0; n < kStateTiles; n += 2) {
        if (state_key0 + n * 8 >= k_steps * 16) break;
        unsigned bk[4];  // K stored [token][key]: transposed ldmatrix gives the col-major B
        ldmatrix_x4_trans(bk, k_s + (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcLd + state_key0 + 8 * n + (lane >> 4) * 8);
        mma_16816<T>(S[n], a, bk[0], bk[1]);
        mma_16816<T>(S[n + 1], a, bk[2], bk[3]);
      }
    }
    __syncthreads();  // K, V̄ and S_hi/lo are rewritten by the next chunk
  }
#pragma unroll
  for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = v0 + state_rows + g + (x / 2) * 8, col = state_key0 + 8 * n + 2 * t + x % 2;
      if (row < DV && col < DK) p.final_state[(static_cast<std::size_t>(head) * DV + row) * DK + col] = S[n][x];
    }
}

// ---------------------------------------------------------------------------------------
// Decode: one warp per state row v (a row depends only on v_t[v]); the row lives in registers
// across tokens, lane l holding entries l, l + 32, ...

__device__ __forceinline__ float warp_sum(float x) {
  // Butterfly: every lane ends with the same bits (a + b == b + a), independent of scheduling.
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <class T, int PerLane>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(DeltaRuleDecodeParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, head = blockIdx.y;
  const int DK = p.key_dim, DV = p.value_dim, steps = p.tokens;
  if (row >= DV) return;  // no block-level barrier below
  const std::size_t state_row = (static_cast<std::size_t>(head) * DV + row) * DK;
  float s[PerLane];
#pragma unroll
  for (int e = 0; e < PerLane; ++e) {
    const int col = lane + 32 * e;
    s[e] = (p.initial_state && col < DK) ? p.initial_state[state_row + col] : 0.0f;
  }
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* beta = static_cast<const T*>(p.beta);
  for (int t = 0; t < steps; ++t) {
    const std::size_t token = static_cast<std::size_t>(head) * steps + t;
    float kr[PerLane], qr[PerLane];
#pragma unroll
    for (int e = 0; e < PerLane; ++e) {
      const int col = lane + 32 * e;
      kr[e] = col < DK ? to_float(k[token * DK + col]) : 0.0f;
      qr[e] = col < DK ? to_float(q[token * DK + col]) : 0.0f;
    }
    const float alpha = p.log_gate ? expf(p.log_gate[token]) : 1.0f;
    const float b = to_float(beta[token]), value = to_float(v[token * DV + row]);
    float sk = 0.0f;
#pragma unroll
    for (int e = 0; e < PerLane; ++e) sk = fmaf(s[e], kr[e], sk);
    sk = warp_sum(sk);
    // S_t = α S + β (v − α S k) kᵀ  (= α S (I − β k kᵀ) + β v kᵀ)
    const float delta = b * (value - alpha * sk);
    float o = 0.0f;
#pragma unroll
    for (int e = 0; e < PerLane; ++e) {
      s[e] = fmaf(delta, kr[e], alpha * s[e]);
      o = fmaf(s[e], qr[e], o);
    }
    o = warp_sum(o);
    if (lane == 0) static_cast<T*>(p.output)[token * DV + row] = from_float<T>(o);
  }
#pragma unroll
  for (int e = 0; e < PerLane; ++e) {
    const int col = lane + 32 * e;
    if (col < DK) p.final_state[state_row + col] = s[e];
  }
}

// ---------------------------------------------------------------------------------------
// Host side: validation, then launch.

// The scan version that runs: params.pipeline, or when 0 the default (the library reads no
// environment: a version is chosen through the params only).
int effective_pipeline(const DeltaRuleForwardParams& p) { return p.pipeline != 0 ? p.pipeline : kDefaultPipeline; }

// v3 (scan, then a parallel output kernel) for 16-bit inputs when asked for.
bool split_output(const DeltaRuleForwardParams& p) {
  return effective_pipeline(p) == 3 && p.dtype != DType::f32 && p.key_dim % 8 == 0 && p.value_dim % 8 == 0;
}

bool aligned_to(const void* pointer, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0; }

// v4 (tensor cores, state in registers) when asked for (the default) and the inputs allow it:
// 16-bit, DK ≤ 128, DK and DV multiples of 8 and 16-byte aligned rows (cp.async). Otherwise v2
// (or v1) runs.
bool register_scan(const DeltaRuleForwardParams& p) {
  return effective_pipeline(p) == 4 && p.dtype != DType::f32 && p.key_dim <= kTcKeys && p.key_dim % 8 == 0 &&
         p.value_dim % 8 == 0 && aligned_to(p.q, 16) && aligned_to(p.k, 16) && aligned_to(p.w, 16) &&
         aligned_to(p.u, 16) && aligned_to(p.output, 4);
}

void require_data(const void* pointer, DType dtype, const std::string& name) {
  require_device_pointer(pointer, name);
  require_aligned(pointer, size_of(dtype), name);
}
void require_optional(const void* pointer, const std::string& name) {
  if (pointer == nullptr) return;
  require_device_pointer(pointer, name);
  require_aligned(pointer, 4, name);
}

void require_common(DType dtype, int batch, int heads, int length, int key_dim, int value_dim, const char* length_name) {
  require_argument(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, "dtype",
                   "must be fp32, bf16 or fp16, got " + name_of(dtype));
  require_argument(batch >= 1, "batch", "must be >= 1, got " + std::to_string(batch));
  require_argument(heads >= 1, "heads", "must be >= 1, got " + std::to_string(heads));
  require_argument(static_cast<long long>(batch) * heads <= 65535, "batch*heads",
                   "must be <= 65535, got " + std::to_string(static_cast<long long>(batch) * heads));
  require_sequence_length(length, length_name);
  require_argument(key_dim >= 1 && key_dim <= kMaxHeadDim, "key_dim",
                   "must be in 1..256, got " + std::to_string(key_dim));
  require_argument(value_dim >= 1 && value_dim <= kMaxHeadDim, "value_dim",
                   "must be in 1..256, got " + std::to_string(value_dim));
}

void validate(const DeltaRuleForwardParams& p) {
  require_common(p.dtype, p.batch, p.heads, p.length, p.key_dim, p.value_dim, "length");
  require_argument(p.chunk_size == 16 || p.chunk_size == 32 || p.chunk_size == 64, "chunk_size",
                   "must be 16, 32 or 64, got " + std::to_string(p.chunk_size));
  require_argument(p.pipeline >= 0 && p.pipeline <= 4, "pipeline", "must be 0, 1, 2, 3 or 4, got " + std::to_string(p.pipeline));
  if (split_output(p)) {
    require_data(p.state_operands, p.dtype, "state_operands");
    require_data(p.v_new_operands, p.dtype, "v_new_operands");
  }
  require_argument(p.value_slice == 0 || p.value_slice == 16 || p.value_slice == 32 || p.value_slice == 64,
                   "value_slice", "must be 0, 16, 32 or 64, got " + std::to_string(p.value_slice));
  require_data(p.q, p.dtype, "q");
  require_data(p.k, p.dtype, "k");
  require_data(p.v, p.dtype, "v");
  require_data(p.beta, p.dtype, "beta");
  require_data(p.output, p.dtype, "output");
  require_data(p.w, p.dtype, "w");
  require_data(p.u, p.dtype, "u");
  require_device_pointer(p.final_state, "final_state");
  require_aligned(p.final_state, 4, "final_state");
  require_optional(p.log_gate, "log_gate");
  require_optional(p.initial_state, "initial_state");
  require_optional(p.wy_system, "wy_system");
  require_optional(p.wy_inverse, "wy_inverse");
  require_optional(p.v_new, "v_new");
  require_optional(p.boundary_states, "boundary_states");
}

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t stream, const std::string& name,
            const DeltaRuleForwardParams& p) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "shared-memory size of " + name);
  kernel<<<grid, threads, smem, stream>>>(p);
  check_launch(name);
}

template <class T, int C>
void prepare_typed(const DeltaRuleForwardParams& p) {
  const std::size_t smem = prepare_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes;
  const dim3 grid(chunk_count(p.length, C), p.batch * p.heads);
  launch(wy_prepare_kernel<T, C>, grid, kPrepareThreads, smem, p.stream,
         "wy_prepare_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">", p);
}

template <class T, int C, int BV>
void scan_sliced(const DeltaRuleForwardParams& p) {
  const std::size_t smem = scan_layout(sizeof(T), C, BV, p.key_dim).bytes;
  const dim3 grid((p.value_dim + BV - 1) / BV, p.batch * p.heads);
  const std::string name =
      "chunk_scan_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ", BV=" + std::to_string(BV) + ">";
  // v2 (register prefetch of the next chunk) where 16-byte vectors fit and asked for; v1 otherwise.
  const bool vectors = kTensorCore<T> && p.key_dim % 8 == 0 && p.value_dim % 8 == 0;
  if (split_output(p)) launch(chunk_scan_kernel<T, C, BV, kTensorCore<T>, false>, grid, kScanThreads, smem, p.stream, name, p);
  else if (vectors && effective_pipeline(p) == 2) launch(chunk_scan_kernel<T, C, BV, kTensorCore<T>, true>, grid, kScanThreads, smem, p.stream, name, p);
  else launch(chunk_scan_kernel<T, C, BV, false, true>, grid, kScanThreads, smem, p.stream, name, p);
}

template <class T, int C, int BV>
void output_sliced(const DeltaRuleForwardParams& p) {
  if constexpr (kTensorCore<T>) {
    const std::size_t smem = output_layout(sizeof(T), C, BV, p.key_dim).bytes;
    const dim3 grid(chunk_count(p.length, C), (p.value_dim + BV - 1) / BV, p.batch * p.heads);
    launch(chunk_output_kernel<T, C, BV>, grid, kScanThreads, smem, p.stream,
           "chunk_output_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ", BV=" + std::to_string(BV) + ">", p);
  }
}


int max_shared_bytes() {
  static const int bytes = [] {
    int device = 0, value = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    return value;
  }();
  return bytes;
}

// The requested value slice, halved until the scan's shared memory fits (DK = 256 with BV = 64
// does not on the H200).
int fitting_slice(const DeltaRuleForwardParams& p, int element_size, int chunk) {
  int slice = p.value_slice == 0 ? kDefaultValueSlice : p.value_slice;
  while (slice > 16 && scan_layout(element_size, chunk, slice, p.key_dim).bytes > static_cast<std::size_t>(max_shared_bytes()))
    slice /= 2;
  return slice;
}

template <class T, int C>
void register_scan_typed(const DeltaRuleForwardParams& p) {
  constexpr std::size_t smem = tc_scan_layout(C).bytes;
  const dim3 grid((p.value_dim + kTcSlice - 1) / kTcSlice, p.batch * p.heads);
  launch(chunk_scan_tc_kernel<T, C>, grid, kTcScanThreads, smem, p.stream,
         "chunk_scan_tc_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">", p);
}

template <class T, int C, bool Output>
void scan_or_output(const DeltaRuleForwardParams& p) {
  if constexpr (!kTensorCore<T>) {
    if constexpr (!Output) scan_sliced<T, C, 16>(p);
  } else {
    if (!Output && register_scan(p)) return register_scan_typed<T, C>(p);
    switch (Output ? (p.value_slice == 0 ? kDefaultValueSlice : p.value_slice) : fitting_slice(p, sizeof(T), C)) {
      case 16: return Output ? output_sliced<T, C, 16>(p) : scan_sliced<T, C, 16>(p);
      case 32: return Output ? output_sliced<T, C, 32>(p) : scan_sliced<T, C, 32>(p);
      default: return Output ? output_sliced<T, C, 64>(p) : scan_sliced<T, C, 64>(p);
    }
  }
}
template <class T, int C>
void scan_typed(const DeltaRuleForwardParams& p) { scan_or_output<T, C, false>(p); }
template <class T, int C>
void output_typed(const DeltaRuleForwardParams& p) { scan_or_output<T, C, true>(p); }

template <template <class, int> class Op>
void dispatch(const DeltaRuleForwardParams& p) {
  auto by_chunk = [&](auto type_tag) {
    using T = decltype(type_tag);
    switch (p.chunk_size) {
      case 16: return Op<T, 16>::run(p);
      case 32: return Op<T, 32>::run(p);
      default: return Op<T, 64>::run(p);
    }
  };
  switch (p.dtype) {
    case DType::f32: return by_chunk(float{});
    case DType::bf16: return by_chunk(__nv_bfloat16{});
    default: return by_chunk(__half{});
  }
}

template <class T, int C>
struct PrepareOp {
  static void run(const DeltaRuleForwardParams& p) { prepare_typed<T, C>(p); }
};
template <class T, int C>
struct ScanOp {
  static void run(const DeltaRuleForwardParams& p) { scan_typed<T, C>(p); }
};
template <class T, int C>
struct OutputOp {
  static void run(const DeltaRuleForwardParams& p) { output_typed<T, C>(p); }
};

template <class T>
void decode_typed(const DeltaRuleDecodeParams& p) {
  constexpr int rows_per_block = kDecodeThreads / 32;
  const dim3 grid((p.value_dim + rows_per_block - 1) / rows_per_block, p.batch * p.heads);
  const std::string name = "decode_kernel<" + name_of(p.dtype) + ">";
  if (p.key_dim <= 64) decode_kernel<T, 2><<<grid, kDecodeThreads, 0, p.stream>>>(p);
  else if (p.key_dim <= 128) decode_kernel<T, 4><<<grid, kDecodeThreads, 0, p.stream>>>(p);
  else decode_kernel<T, 8><<<grid, kDecodeThreads, 0, p.stream>>>(p);
  check_launch(name);
}

}  // namespace

void delta_rule_wy_prepare(const DeltaRuleForwardParams& params) {
  validate(params);
  dispatch<PrepareOp>(params);
}

void delta_rule_chunk_scan(const DeltaRuleForwardParams& params) {
  validate(params);
  dispatch<ScanOp>(params);
}

void delta_rule_chunk_output(const DeltaRuleForwardParams& params) {
  validate(params);
  if (split_output(params)) dispatch<OutputOp>(params);
}

void delta_rule_forward(const DeltaRuleForwardParams& params) {
  validate(params);
  dispatch<PrepareOp>(params);
  dispatch<ScanOp>(params);
  if (split_output(params)) dispatch<OutputOp>(params);
}

void delta_rule_decode(const DeltaRuleDecodeParams& p) {
  require_common(p.dtype, p.batch, p.heads, p.tokens, p.key_dim, p.value_dim, "tokens");
  require_data(p.q, p.dtype, "q");
  require_data(p.k, p.dtype, "k");
  require_data(p.v, p.dtype, "v");
  require_data(p.beta, p.dtype, "beta");
  require_data(p.output, p.dtype, "output");
  require_device_pointer(p.final_state, "final_state");
  require_aligned(p.final_state, 4, "final_state");
  require_optional(p.log_gate, "log_gate");
  require_optional(p.initial_state, "initial_state");
  switch (p.dtype) {
    case DType::f32: return decode_typed<float>(p);
    case DType::bf16: return decode_typed<__nv_bfloat16>(p);
    default: return decode_typed<__half>(p);
  }
}

}  // namespace deltaproof::cuda
