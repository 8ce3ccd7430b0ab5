// The DeltaNet / Gated DeltaNet forward kernels (delta_rule.cu launches them; its header
// comment gives the precision plan). In a header so that the same source also runs on the CPU under the
// emulation of threads, barriers, warp shuffles and tensor-core instructions
// (property_tests/support/cuda_emulation.hpp): nothing here may depend on more than that.
//
// Three kernels for the chunkwise forward, named by what they do:
//   wy_prepare_async_kernel     stage 1, one block per (chunk, head): A, T = A⁻¹, W, U (delta_rule_prepare_kernels.cuh).
//   chunk_scan_registers_kernel stage 2, the fast path (16-bit inputs, DK ≤ 128, DK and DV multiples of 8):
//                               raw mma.sync, the fp32 state slice in registers (docs/kernels/delta_rule.md).
//   chunk_scan_shared_kernel    stage 2, the one fallback for every other input (fp32, DK > 128, head dims
//                               not multiples of 8): the state in shared memory, WMMA or plain FMA products.
// Superseded scans (a register prefetch; a separate parallel output kernel) were measured
// slower and removed; their code is at commit 0f86adb (cuda/delta_rule.cu), their figures in docs/kernels/delta_rule.md.
// So were the synchronous prepare (wy_prepare_kernel) and a decode of one warp per state row: at commit c5339b7, this file.
// Decode is cuda/decode_kernels.cuh.
#pragma once

#include "cuda/delta_rule_launch.h"
#include "cuda/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

// The CPU emulation compiles this source once more, under another namespace, so that its functions
// never share a name (and a link-time definition) with this build's kernel launch stubs.
#ifndef DELTAPROOF_FORWARD_KERNELS
#define DELTAPROOF_FORWARD_KERNELS forward_kernels
#endif

namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS {

using namespace nvcuda;
using delta_rule::ForwardStageParams;

constexpr int kMaxHeadDim = 256;
constexpr int kScanThreads = 256;
constexpr int kDefaultValueSlice = 64;  // value rows of S per fallback-scan block, halved while shared memory does not fit

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

template <class T>
constexpr bool kTensorCore = !std::is_same_v<T, float>;

// The instantiation of a kernel with a `Gated` parameter for the inputs: Gated DeltaNet's where log-gates are
// given, else DeltaNet's, which compiles without the gate arithmetic (its decays are exactly 1: the same values).
template <class Kernel>
Kernel for_gates(const void* log_gate, Kernel gated, Kernel ungated) { return log_gate != nullptr ? gated : ungated; }

template <class T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}

// The gate decays of every forward stage and of the tensor-core backward's scans are powers of two: 2^y by the
// special-function unit (`ex2.approx.ftz`, one instruction; expf takes nine, the masked scores one per entry:
// docs/kernels/delta_rule.md), of y = x · log2 e for e^x (`gate_exp`) or of exponents kept in that unit (the
// register scans' G_i · log2 e). Error (kernel_checks/delta_rule_stages.cpp, decay_error, and
// kernel_checks/delta_rule_backward_tensor_core_stages.cpp): the product with log2 e rounded to fp32 and the products' and
// differences' roundings add at most 5u·|exponent bound| to the exponent; exp2f's 2 ulp (CUDA's documented
// bound) for results above 2⁻¹²⁶, smaller ones flushed to zero (the stage bounds' floor counts that).
constexpr float kLog2e = 1.44269504f;
__device__ __forceinline__ float exp2_ftz(float y) {
#ifdef __CUDA_ARCH__
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
#else
  return exp2f(y);  // the CPU emulation
#endif
}
__device__ __forceinline__ float gate_exp(float x) { return exp2_ftz(x * kLog2e); }

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
// division in the index (the first loops' runtime div/mod cost more than the MMAs: docs/kernels/delta_rule.md).
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
__device__ void load_operand(T* dst, int pitch, const T* src, std::int64_t ld, int rows, int cols, int rows_pad, int cols_pad,
                             bool negate) {
  constexpr int V = 16 / sizeof(T);
  const bool vector = cols % V == 0 && ld % V == 0 && (reinterpret_cast<std::uintptr_t>(src) & 15) == 0;
  if (vector) {
    for_each_2d(rows_pad, cols_pad / V, [&](int r, int vec) {
      const int c = vec * V;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (r < rows && c < cols) {
        x = *reinterpret_cast<const uint4*>(src + r * ld + c);
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
      if (r < rows && c < cols) x = to_float(src[r * ld + c]);
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

// Loads the fp32 log-gates of one chunk (token i at log_gate[i·stride]) and forms their in-chunk
// cumulative sums G_i = Σ_{t≤i} g_t (zero for DeltaNet and past the end of a partial chunk, where g is
// taken as 0). Warp 0 only; the caller's barrier publishes the result.
__device__ inline void load_cumulative_gates(float* cumulative, const float* log_gate, std::int64_t stride, int size, int chunk_size) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  float lo = (log_gate != nullptr && lane < size) ? log_gate[lane * stride] : 0.0f;
  float hi = (log_gate != nullptr && lane + 32 < size) ? log_gate[(lane + 32) * stride] : 0.0f;
  chunk_prefix_sums(lo, hi, lane);
  if (lane < chunk_size) cumulative[lane] = lo;
  if (lane + 32 < chunk_size) cumulative[lane + 32] = hi;
}

// Raw tensor-core helpers (ldmatrix, mma.sync, 16-bit pairs, cp.async): cuda/tensor_core.cuh.
using namespace tensor_core;

// ---------------------------------------------------------------------------------------
// Stage 2, the fallback scan: state scan and chunk output, one block per (value slice, head), chunks in order.

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

// The fallback scan (every input the register scan does not take): one block per (BV value rows of S,
// head), the fp32 state in shared memory, products through block_gemm (WMMA for 16-bit operands, plain
// FMA for fp32), S rounded once to the input dtype as an operand. Per chunk: V̄ = U − W Sᵀ, O = diag(γ)
// Q Sᵀ + P V̄ and S ← γ_C S + (diag(γ_C/γ) V̄)ᵀ K, with four barriers.
template <class T, int C, int BV>
__global__ void __launch_bounds__(kScanThreads) chunk_scan_shared_kernel(ForwardStageParams p) {
  constexpr bool wide = !kTensorCore<T>;
  const int slice = blockIdx.x, head = blockIdx.y, b = head / p.heads, h = head % p.heads;
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

  // Row 0 of this head in each strided tensor.
  const T* q_head = static_cast<const T*>(p.q) + p.q_strides.head_offset(b, h);
  const T* k_head = static_cast<const T*>(p.k) + p.k_strides.head_offset(b, h);
  const float* gate_head = p.log_gate ? p.log_gate + p.log_gate_strides.head_offset(b, h) : nullptr;
  T* o = static_cast<T*>(p.output) + p.output_strides.head_offset(b, h);
  const float* initial = p.initial_state ? p.initial_state + p.initial_state_strides.head_offset(b, h) : nullptr;
  float* final_state = p.final_state + p.final_state_strides.head_offset(b, h);
  for_each_2d(BV, dkp, [&](int r, int c) {
    const float x = (initial && r < bv && c < DK) ? initial[(v0 + r) * p.initial_state_strides.row + c] : 0.0f;
    state[r * ps + c] = x;
    if constexpr (!wide) state_op[r * pso + c] = from_float<T>(x);
  });
  __syncthreads();  // the first chunk's boundary write reads other threads' entries
  const bool gated = p.log_gate != nullptr;

  for (int chunk = 0; chunk < N; ++chunk) {
    const int begin = chunk * C, size = min(C, L - begin);
    const std::size_t token0 = static_cast<std::size_t>(head) * L + begin;  // packed intermediates (W, U, V̄)
    if (p.boundary_states) {
      float* dst = p.boundary_states + (static_cast<std::size_t>(head) * N + chunk) * DV * DK;
      for_each_2d(bv, DK, [&](int r, int c) { dst[(v0 + r) * DK + c] = state[r * ps + c]; });
    }
    load_operand(ks, pk, k_head + begin * p.k_strides.row, p.k_strides.row, size, DK, C, dkp, false);
    load_operand(neg_w, pk, static_cast<const T*>(p.w) + token0 * DK, DK, size, DK, C, dkp, true);
    if constexpr (!wide) load_operand(qs, pk, q_head + begin * p.q_strides.row, p.q_strides.row, size, DK, C, dkp, false);
    for (int idx = threadIdx.x; idx < C * BV; idx += blockDim.x) {
      const int i = idx / BV, j = idx % BV;
      v_new[i * pv + j] = (i < size && j < bv) ? to_float(static_cast<const T*>(p.u)[(token0 + i) * DV + v0 + j]) : 0.0f;
    }
    load_cumulative_gates(gates, gate_head ? gate_head + begin * p.log_gate_strides.row : nullptr, p.log_gate_strides.row, size, C);
    __syncthreads();

    // V̄ = U + (−W) Sᵀ
    block_gemm<T, Layout::row, Layout::col>(neg_w, nullptr, pk, state_op, pso, v_new, pv, C, BV, dkp, true);
    if constexpr (wide) {  // W and Q share a buffer: Q comes in once W Sᵀ is done
      __syncthreads();
      load_operand(qs, pk, q_head + begin * p.q_strides.row, p.q_strides.row, size, DK, C, dkp, false);
      __syncthreads();
    }
    block_gemm<T, Layout::row, Layout::col>(qs, nullptr, pk, state_op, pso, out, pv, C, BV, dkp, false);  // Q Sᵀ
    block_gemm<T, Layout::row, Layout::col>(qs, nullptr, pk, ks, pk, scores, pp, C, C, dkp, false, true);  // Q Kᵀ
    __syncthreads();

    // Gate decays in fp32, then the roundings to operand precision.
    const float last = gates[size - 1];
    for (int idx = threadIdx.x; idx < C * BV; idx += blockDim.x) {
      const int i = idx / BV, j = idx % BV;
      const float x = v_new[i * pv + j];
      if (p.v_new && i < size && j < bv) p.v_new[(token0 + i) * DV + v0 + j] = x;
      // Without gates every decay is exactly 1 (= gate_exp(0)): skipping it changes no bit.
      v_decayed[i * pvd + j] = from_float<T>(gated ? x * gate_exp(last - gates[i]) : x);
      v_op[i * pvo + j] = from_float<T>(x);
      if (gated) out[i * pv + j] *= gate_exp(gates[i]);
    }
    for (int idx = threadIdx.x; idx < C * C; idx += blockDim.x) {
      const int i = idx / C, j = idx % C;
      scores_op[i * ppo + j] =
          j <= i ? from_float<T>(gated ? scores[i * pp + j] * gate_exp(gates[i] - gates[j]) : scores[i * pp + j]) : from_float<T>(0.0f);
    }
    if (gated) {
      const float decay = gate_exp(last);
      for_each_2d(BV, dkp, [&](int r, int c) { state[r * ps + c] *= decay; });
    }
    __syncthreads();

    // O += P V̄;  S ← γ_C S + (diag(γ_C/γ) V̄)ᵀ K
    block_gemm<T, Layout::row, Layout::row>(scores_op, nullptr, ppo, v_op, pvo, out, pv, C, BV, C, true, false, true);
    block_gemm<T, Layout::col, Layout::row>(v_decayed, nullptr, pvd, ks, pk, state, ps, BV, dkp, C, true);
    __syncthreads();

    for_each_2d(size, bv, [&](int i, int j) { o[(begin + i) * p.output_strides.row + v0 + j] = from_float<T>(out[i * pv + j]); });
    if constexpr (!wide)
      for_each_2d(BV, dkp, [&](int r, int c) { state_op[r * pso + c] = from_float<T>(state[r * ps + c]); });
    // The next chunk's loads touch none of out, state or state_op; its first barrier orders them.
  }
  __syncthreads();
  for_each_2d(bv, DK, [&](int r, int c) { final_state[(v0 + r) * p.final_state_strides.row + c] = state[r * ps + c]; });
}

// ---------------------------------------------------------------------------------------
// The register scan (the fast path; docs/kernels/delta_rule.md): raw tensor cores with the state in
// registers (16-bit inputs, DK ≤ 128, DK and DV multiples of 8). One block of 8 warps per head and 64
// value rows of S; two blocks per SM.

constexpr int kTcScanThreads = 256, kTcSlice = 64, kTcKeys = 128;
constexpr int kTcLd = kTcKeys + 8, kTcVLd = kTcSlice + 8;  // padded rows: ldmatrix without bank conflicts

// A warp's 16 × 64 part of a scan's state (registers, mma accumulator layout: 8 n8 tiles) published
// as hi + lo to the shared tiles the block's products read (row pitch kTcLd) and, when `out` is given,
// its hi part (the state rounded once) stored to global memory (`out` at the part's first row and key,
// row pitch `out_pitch`; `rows_left`/`keys_left` from there bound what is stored).
template <class T>
__device__ __forceinline__ void publish_state_part(const float (&S)[8][4], T* s_hi, T* s_lo, int part_row, int part_key,
                                                   T* out, int out_pitch, int rows_left, int keys_left, int g, int t) {
#pragma unroll
  for (int n = 0; n < 8; n += 2)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      unsigned hi[2], lo[2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int at = (part_row + r) * kTcLd + part_key + 8 * (n + m) + 2 * t;
        split_pair<T>(S[n + m][2 * half], S[n + m][2 * half + 1], hi[m], lo[m]);
        *reinterpret_cast<unsigned*>(s_hi + at) = hi[m];
        *reinterpret_cast<unsigned*>(s_lo + at) = lo[m];
      }
      if (out != nullptr)
        store_tile_pairs<T>(out + static_cast<std::size_t>(r) * out_pitch + 8 * n, hi[0], hi[1], t, r < rows_left, keys_left - 8 * n);
    }
}

struct TcScanLayout {
  std::size_t s_hi, s_lo, queries, keys, w, v_new, v_decayed, scores, gates, bytes;
};
// Row pitch of the scores tile: C + 8 elements, rows 16-byte aligned and ldmatrix without bank conflicts.
__host__ __device__ constexpr int tc_scores_pitch(int chunk) { return chunk + 8; }
__host__ __device__ constexpr TcScanLayout tc_scan_layout(int chunk) {
  TcScanLayout l{};
  l.s_hi = 0;
  l.s_lo = l.s_hi + kTcSlice * kTcLd * 2;
  l.queries = l.s_lo + kTcSlice * kTcLd * 2;
  l.keys = l.queries + chunk * kTcLd * 2;
  l.w = l.keys + chunk * kTcLd * 2;
  l.v_new = l.w + chunk * kTcLd * 2;
  l.v_decayed = l.v_new + chunk * kTcVLd * 2;
  l.scores = l.v_decayed + chunk * kTcVLd * 2;
  l.gates = l.scores + chunk * tc_scores_pitch(chunk) * 2;
  l.bytes = l.gates + chunk * 4;
  return l;
}

// f(e) for e = tid, tid + kThreads, … below kCount: the loop a block's threads share an index range by, with its trip
// count fixed at compile time (written as `for (e = tid; e < kCount; e += kThreads)`, the count is formed at run
// time, since the compiler does not know tid < kThreads).
template <int kCount, int kThreads, class F>
__device__ __forceinline__ void block_for(int tid, F&& f) {
#pragma unroll
  for (int k = 0; k < (kCount + kThreads - 1) / kThreads; ++k) {
    const int e = tid + k * kThreads;
    if (kCount % kThreads == 0 || e < kCount) f(e);
  }
}

// Rows of `src` (row stride `row` elements) into [kRows][kPitch] by 16-byte cp.async, kWidth columns a row, zero
// past `rows` and past `width`; the block's kThreads threads from `tid`. A thread copies the same 16-byte column
// of every (kThreads / pieces)-th row, so its column test, its addresses and its row step are formed once: the
// copies a kernel issues cost a few instructions each, not a division and a 64-bit product.
template <int kThreads, int kRows, int kWidth = kTcKeys, int kPitch = kTcLd, class T>
__device__ __forceinline__ void copy_rows_async(T* dst, const T* src, std::int64_t row, int rows, int width, int tid) {
  constexpr int kPieces = kWidth / 8, kRowStep = kThreads / kPieces;
  static_assert(kWidth % 8 == 0 && kThreads % kPieces == 0, "a thread keeps one column of every kRowStep-th row");
  const int r0 = tid / kPieces, c = (tid % kPieces) * 8;
  const bool in_width = c < width;
  const unsigned to = smem_address(dst + r0 * kPitch + c);
  std::int64_t offset = r0 * row + c;
  const std::int64_t step = kRowStep * row;
#pragma unroll
  for (int k = 0; k < (kRows + kRowStep - 1) / kRowStep; ++k) {
    const int r = r0 + k * kRowStep;
    if (kRows % kRowStep == 0 || r < kRows) {
      const bool valid = in_width && r < rows;
      copy_async_16(to + k * kRowStep * kPitch * unsigned(sizeof(T)), valid ? src + offset : src, valid);
    }
    offset += step;
  }
}
// A chunk's P ([C][C] rows at `src`) into [C][C + 8] by cp.async: the 16 × 16 tiles on and below the diagonal, the
// only ones the prepare writes and the products read.
template <int C, int kThreads, class T>
__device__ __forceinline__ void copy_scores_async(T* dst, const T* src, int tid) {
  block_for<C * (C / 8), kThreads>(tid, [&](int e) {
    const int r = e / (C / 8), c = (e % (C / 8)) * 8;
    if (c / 16 <= r / 16) copy_async_16(dst + r * tc_scores_pitch(C) + c, src + r * C + c, true);
  });
}


// Per chunk: (1) copy K, U and the masked scores P = Q Kᵀ ⊙ Γ ⊙ M in (cp.async; P rounded to T by the
// prepare, p.scores; Q, W and g were prefetched during the previous chunk), publish S_[c] from the
// registers to shared memory as hi + lo; barrier. (2) Each output warp (16 rows, 16 or 32 value
// columns): V̄ = U − W Sᵀ, written back in place of U rounded to T (and its decayed copy when gated);
// then Q Sᵀ; barrier. (3) Q and W of the next chunk start loading; O += P V̄ and the output stored
// from registers; every warp updates its 16 × 64 part of S ← γ_C S + (diag(γ_C/γ) V̄)ᵀ K in its
// accumulators; barrier. P depends on no state, so it is formed in the parallel prepare, not here in
// the sequential chain (docs/kernels/delta_rule.md, "Scores in the prepare").
//
// StatePass = true is the backward's own forward (cuda/delta_rule_backward_tensor_core.cu): no output, but every
// operand to ≈ 16 bits — W and U as the prepare's hi + lo pairs (w, w_lo; u, u_lo), so V̄ = (U_hi + U_lo) −
// (W_hi Sᵀ_hi + W_hi Sᵀ_lo + W_lo Sᵀ_hi), and the update's diag(γ_C/γ) V̄ as hi + lo (two products) — with
// S_[c] rounded once and V̄ as a hi + lo pair written for the chunk-gradient kernel (`pairs`, required), and
// S_[c] in fp32 where the caller asks for the boundary states. Q's buffer holds W_lo, and the two V̄ buffers
// hold U_hi / U_lo, then the decayed V̄'s hi / lo.
struct StatePassOutputs {
  void* s;            // [B, H, N, DV, DK] dtype: S_[c] rounded once (what the chunk gradients read)
  void *v_hi, *v_lo;  // [B, H, L, DV] dtype: V̄ = v_hi + v_lo
};
template <class T, int C, bool Gated, bool StatePass = false>
__global__ void __launch_bounds__(kTcScanThreads, 2) chunk_scan_registers_kernel(ForwardStageParams p, StatePassOutputs pairs) {
  constexpr int kRowBlocks = C / 16;                                                  // 16-row blocks of a chunk
  constexpr int kColumnGroups = 8 / kRowBlocks < 4 ? 8 / kRowBlocks : 4;             // output warps per row block
  constexpr int kOutTiles = kTcSlice / 8 / kColumnGroups;                            // n8 tiles per output warp
  constexpr int kScoresPitch = tc_scores_pitch(C);
  constexpr int kStateTiles = kTcKeys / 2 / 8;  // n8 tiles of the warp's 16 × 64 state part
  constexpr TcScanLayout lay = tc_scan_layout(C);
  extern __shared__ __align__(128) unsigned char smem[];
  T* s_hi = reinterpret_cast<T*>(smem + lay.s_hi);  // [64][kTcLd] S_[c] rows (value) × key, hi part
  T* s_lo = reinterpret_cast<T*>(smem + lay.s_lo);
  T* q_s = reinterpret_cast<T*>(smem + lay.queries);  // [C][kTcLd] chunk rows × key (StatePass: W_lo)
  T* k_s = reinterpret_cast<T*>(smem + lay.keys);
  T* w_s = reinterpret_cast<T*>(smem + lay.w);
  T* v_new_s = reinterpret_cast<T*>(smem + lay.v_new);       // [C][kTcVLd] U, then V̄ rounded to T
  T* v_decayed_s = reinterpret_cast<T*>(smem + lay.v_decayed);  // diag(γ_C/γ) V̄ rounded to T (gated)
  T* scores_s = reinterpret_cast<T*>(smem + lay.scores);        // [C][C + 8] P, tiles on and below the diagonal
  float* gates = reinterpret_cast<float*>(smem + lay.gates);   // G_i · log2 e

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int head = blockIdx.y, v0 = blockIdx.x * kTcSlice;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
  const int k_steps = (DK + 15) / 16;
  const int row_block = warp % kRowBlocks, column_group = warp / kRowBlocks;
  const bool computes_output = warp < kRowBlocks * kColumnGroups;  // C = 16 leaves 4 warps to the state alone
  const int i0 = 16 * row_block, out_col0 = column_group * (kTcSlice / kColumnGroups);
  const int state_rows = 16 * (warp % 4), state_key0 = (kTcKeys / 2) * (warp / 4);
  constexpr bool gated = Gated;  // log-gates given; DeltaNet's instantiation has no gate arithmetic
  const int b = head / p.heads, h = head % p.heads;
  // Row 0 of this head in each strided tensor (the launcher checked q and k rows 16-byte aligned).
  const T* q = static_cast<const T*>(p.q) + p.q_strides.head_offset(b, h);
  const T* k = static_cast<const T*>(p.k) + p.k_strides.head_offset(b, h);
  const float* gate_head = gated ? p.log_gate + p.log_gate_strides.head_offset(b, h) : nullptr;
  const T* w = static_cast<const T*>(p.w);
  const T* u = static_cast<const T*>(p.u);
  T* out = static_cast<T*>(p.output) + p.output_strides.head_offset(b, h);
  const std::size_t head_token0 = static_cast<std::size_t>(head) * L;  // packed intermediates (W, U, V̄)
  const T* w_head = w + head_token0 * DK;
  const T* w_lo_head = StatePass ? static_cast<const T*>(p.w_lo) + head_token0 * DK : nullptr;
  const T* u_lo = static_cast<const T*>(p.u_lo);
  // StatePass: W_lo comes in where Q would.
  const T* q_or_w_lo = StatePass ? w_lo_head : q;
  const std::int64_t q_or_w_lo_row = StatePass ? std::int64_t(DK) : p.q_strides.row;

  // Rows t0.. of a head's [L, DK] rows (row stride `row`) into [C][kTcLd] (zero past the chunk and past DK).
  auto load_rows = [&](T* dst, const T* head_rows, std::int64_t row, int t0, int size) {
    copy_rows_async<kTcScanThreads, C>(dst, head_rows + t0 * row, row, size, DK, threadIdx.x);
  };
  // Value columns v0.. of a [.., L, DV] tensor into [C][kTcVLd].
  auto load_slice = [&](T* dst, const T* src, std::size_t token0, int size) {
    copy_rows_async<kTcScanThreads, C, kTcSlice, kTcVLd>(dst, src + token0 * DV + v0, DV, size, DV - v0, threadIdx.x);
  };
  // The chunk's P ([C][C] rows of the prepare's scores): the 16×16 tiles on and below the diagonal, the
  // only ones the output reads (the prepare writes no others).
  auto load_scores = [&](int chunk) {
    copy_scores_async<C, kTcScanThreads>(scores_s, static_cast<const T*>(p.scores) + (static_cast<std::size_t>(head) * N + chunk) * C * C,
                                         threadIdx.x);
  };
  float g_lo = 0.0f, g_hi = 0.0f;  // warp 0: raw log-gates of the chunk being loaded (i = lane, lane + 32)
  auto load_gates = [&](int t0, int size) {
    if (gated && warp == 0) {
      g_lo = lane < size ? gate_head[(t0 + lane) * p.log_gate_strides.row] : 0.0f;
      g_hi = lane + 32 < size ? gate_head[(t0 + lane + 32) * p.log_gate_strides.row] : 0.0f;
    }
  };

  // State rows state_rows + {g, g+8}, key columns state_key0 + 8n + 2t + {0, 1}: accumulator layout.
  float S[kStateTiles][4];
#pragma unroll
  for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = v0 + state_rows + g + (x / 2) * 8, col = state_key0 + 8 * n + 2 * t + x % 2;
      S[n][x] = (p.initial_state && row < DV && col < DK)
                    ? p.initial_state[p.initial_state_strides.head_offset(b, h) + row * p.initial_state_strides.row + col]
                    : 0.0f;
    }

  load_rows(q_s, q_or_w_lo, q_or_w_lo_row, 0, min(C, L));
  load_rows(w_s, w_head, DK, 0, min(C, L));
  load_gates(0, min(C, L));
  for (int chunk = 0; chunk < N; ++chunk) {
    const int t0 = chunk * C, size = min(C, L - t0);
    const std::size_t token0 = head_token0 + t0;

    // (1) K and U in; S_[c] out (state pass: rounded once), and in fp32 when asked; G_i.
    load_rows(k_s, k, p.k_strides.row, t0, size);
    load_slice(v_new_s, u, token0, size);
    if constexpr (StatePass) load_slice(v_decayed_s, u_lo, token0, size);
    else load_scores(chunk);
    {
      T* out = nullptr;  // the state pass's S_[c], rounded once
      const std::size_t at = ((static_cast<std::size_t>(head) * N + chunk) * DV + v0 + state_rows) * DK + state_key0;
      if constexpr (StatePass) out = static_cast<T*>(pairs.s) + at;
      publish_state_part<T>(S, s_hi, s_lo, state_rows, state_key0, out, DK, DV - v0 - state_rows, DK - state_key0, g, t);
    }
    if (p.boundary_states)  // S_[c] in fp32, for the stage tests
#pragma unroll
      for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int r = state_rows + g + (x / 2) * 8, c = state_key0 + 8 * n + 2 * t + x % 2;
          if (v0 + r < DV && c < DK)
            p.boundary_states[((static_cast<std::size_t>(head) * N + chunk) * DV + v0 + r) * DK + c] = S[n][x];
        }
    if (gated && warp == 0) {
      float lo = g_lo, hi = g_hi;
      chunk_prefix_sums(lo, hi, lane);  // G_i, kept as G_i · log2 e: every decay below is one exp2_ftz
      if (lane < C) gates[lane] = lo * kLog2e;
      if (lane + 32 < C) gates[lane + 32] = hi * kLog2e;
    }
    copy_async_wait_all();  // this thread's copies have landed; the barrier publishes everyone's
    __syncthreads();

    // (2) V̄, then Q Sᵀ, for this warp's 16 rows.
    float O[kOutTiles][4];
    if (computes_output) {
      float V[kOutTiles][4];
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int at = (i0 + g + 8 * half) * kTcVLd + out_col0 + 8 * n + 2 * t;
          float2 x = unpack_pair<T>(*reinterpret_cast<const unsigned*>(v_new_s + at));
          if constexpr (StatePass) {  // U = U_hi + U_lo: exact in fp32
            const float2 lo = unpack_pair<T>(*reinterpret_cast<const unsigned*>(v_decayed_s + at));
            x.x += lo.x, x.y += lo.y;
          }
          V[n][2 * half] = x.x, V[n][2 * half + 1] = x.y;
        }
#pragma unroll
      for (int kk = 0; kk < kTcKeys / 16; ++kk) {
        if (kk >= k_steps) break;
        unsigned a[4], a_lo[4];
        ldmatrix_x4(a, w_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
        if constexpr (StatePass) ldmatrix_x4(a_lo, q_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int x = 0; x < 4; ++x) {  // −W: flipping the sign bits is exact
          a[x] ^= 0x80008000u;
          if constexpr (StatePass) a_lo[x] ^= 0x80008000u;
        }
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
          if constexpr (StatePass) {  // W_lo Sᵀ_hi; the W_lo Sᵀ_lo term (≤ u² |W||S|) is left out
            mma_16816<T>(V[n], a_lo, bh[0], bh[1]);
            mma_16816<T>(V[n + 1], a_lo, bh[2], bh[3]);
          }
        }
      }
      // V̄ in fp32 when asked; rounded to T in place of U (the operand of P V̄ and, ungated, of the
      // update); gated: the decay exp(G_last − G_i) in fp32 before its own rounding.
      const float last = gated ? gates[size - 1] : 0.0f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = i0 + g + 8 * half;
        const float decay = gated ? exp2_ftz(last - gates[r]) : 1.0f;
        if constexpr (StatePass) {  // V̄ itself as a pair for the chunk gradients
#pragma unroll
          for (int n = 0; n < kOutTiles; n += 2) {
            unsigned hi[2], lo[2];
            for (int m = 0; m < 2; ++m) split_pair<T>(V[n + m][2 * half], V[n + m][2 * half + 1], hi[m], lo[m]);
            const int c = out_col0 + 8 * n;
            const std::size_t at = (token0 + r) * DV + v0 + c;
            store_tile_pairs<T>(static_cast<T*>(pairs.v_hi) + at, hi[0], hi[1], t, r < size, DV - v0 - c);
            store_tile_pairs<T>(static_cast<T*>(pairs.v_lo) + at, lo[0], lo[1], t, r < size, DV - v0 - c);
          }
        }
#pragma unroll
        for (int n = 0; n < kOutTiles; ++n) {
          const int c = out_col0 + 8 * n + 2 * t;
          const float x0 = V[n][2 * half], x1 = V[n][2 * half + 1];
          if (!StatePass && p.v_new && r < size && v0 + c < DV) {
            float* dst = p.v_new + (token0 + r) * DV + v0 + c;
            dst[0] = x0, dst[1] = x1;
          }
          if constexpr (StatePass) {  // the update's operand diag(γ_C/γ) V̄ as hi + lo (the same positions this lane read)
            unsigned hi, lo;
            split_pair<T>(gated ? x0 * decay : x0, gated ? x1 * decay : x1, hi, lo);
            *reinterpret_cast<unsigned*>(v_new_s + r * kTcVLd + c) = hi;
            *reinterpret_cast<unsigned*>(v_decayed_s + r * kTcVLd + c) = lo;
            continue;
          }
          *reinterpret_cast<unsigned*>(v_new_s + r * kTcVLd + c) = pack_pair<T>(x0, x1);
          if (gated) *reinterpret_cast<unsigned*>(v_decayed_s + r * kTcVLd + c) = pack_pair<T>(x0 * decay, x1 * decay);
        }
      }
    }
    if constexpr (!StatePass) if (computes_output) {
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kTcKeys / 16; ++kk) {
        if (kk >= k_steps) break;
        unsigned a[4];
        ldmatrix_x4(a, q_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
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
      if (gated)  // O = diag(γ) Q Sᵀ
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float decay = exp2_ftz(gates[i0 + g + 8 * half]);
#pragma unroll
          for (int n = 0; n < kOutTiles; ++n) O[n][2 * half] *= decay, O[n][2 * half + 1] *= decay;
        }
    }
    __syncthreads();  // V̄ published; Q and W are no longer read

    // (3) The next chunk's Q, W and g start loading; O += P V̄; the state update.
    if (chunk + 1 < N) {
      const int next_size = min(C, L - t0 - C);
      load_rows(q_s, q_or_w_lo, q_or_w_lo_row, t0 + C, next_size);
      load_rows(w_s, w_head, DK, t0 + C, next_size);
      load_gates(t0 + C, next_size);
    }
    if constexpr (!StatePass) if (computes_output) {
#pragma unroll
      for (int jj = 0; jj < kRowBlocks; ++jj) {
        if (jj > row_block) break;
        unsigned a[4];  // P's 16 × 16 block (row block, jj) as the A operand
        ldmatrix_x4(a, scores_s + (i0 + lane % 16) * kScoresPitch + jj * 16 + (lane / 16) * 8);
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
          if (r < size && c < DV)
            *reinterpret_cast<unsigned*>(out + (t0 + r) * p.output_strides.row + c) = pack_pair<T>(O[n][2 * half], O[n][2 * half + 1]);
        }
    }
    if (gated) {
      const float decay = exp2_ftz(gates[size - 1]);
#pragma unroll
      for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) S[n][x] *= decay;
    }
    const T* v_update = (gated && !StatePass) ? v_decayed_s : v_new_s;
#pragma unroll
    for (int jj = 0; jj < kRowBlocks; ++jj) {
      if (jj * 16 >= size) break;  // zero rows add nothing
      unsigned a[4], a_lo[4];  // V̄ᵀ rows = value, from V̄ stored [token][value]: transposed ldmatrix
      const int at = (jj * 16 + (lane & 7) + (lane >> 4) * 8) * kTcVLd + state_rows + ((lane >> 3) & 1) * 8;
      ldmatrix_x4_trans(a, v_update + at);
      if constexpr (StatePass) ldmatrix_x4_trans(a_lo, v_decayed_s + at);
#pragma unroll
      for (int n = 0; n < kStateTiles; n += 2) {
        if (state_key0 + n * 8 >= k_steps * 16) break;
        unsigned bk[4];  // K stored [token][key]: transposed ldmatrix gives the col-major B
        ldmatrix_x4_trans(bk, k_s + (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcLd + state_key0 + 8 * n + (lane >> 4) * 8);
        mma_16816<T>(S[n], a, bk[0], bk[1]);
        mma_16816<T>(S[n + 1], a, bk[2], bk[3]);
        if constexpr (StatePass) {
          mma_16816<T>(S[n], a_lo, bk[0], bk[1]);
          mma_16816<T>(S[n + 1], a_lo, bk[2], bk[3]);
        }
      }
    }
    __syncthreads();  // K, V̄ and S_hi/lo are rewritten by the next chunk
  }
#pragma unroll
  for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = v0 + state_rows + g + (x / 2) * 8, col = state_key0 + 8 * n + 2 * t + x % 2;
      if (p.final_state && row < DV && col < DK)
        p.final_state[p.final_state_strides.head_offset(b, h) + row * p.final_state_strides.row + col] = S[n][x];
    }
}

// The training forward's output (ForwardParams::saved, cuda/delta_rule.cu). The state pass above has written
// S_[c] rounded once and V̄ as its hi + lo pair; from those every chunk's output is independent of the others:
//   O = diag(γ) Q Ŝ_[c]ᵀ + P (V̄_hi + V̄_lo),  P = the prepare's scores (rounded once), γ_i = 2^(G_i · log2 e)
// as the register scan forms it. One block per (chunk, head) over every value column (DV ≤ 128): warp (row
// block rb, column group cg) owns rows 16 rb.. and value columns 32 cg..; one copy wait, one barrier.
struct ChunkOutputLayout {
  std::size_t queries, states, v_hi, v_lo, scores, gates, bytes;
};
__host__ __device__ constexpr int chunk_output_threads(int chunk) { return 32 * (chunk / 16) * (kTcKeys / 32); }
__host__ __device__ constexpr ChunkOutputLayout chunk_output_layout(int chunk) {
  ChunkOutputLayout l{};
  const std::size_t rows = static_cast<std::size_t>(chunk) * kTcLd * 2;
  l.queries = 0;
  l.states = l.queries + rows;                             // [DV ≤ 128][kTcLd] value rows × key
  l.v_hi = l.states + static_cast<std::size_t>(kTcKeys) * kTcLd * 2;  // [C][kTcLd] token rows × value
  l.v_lo = l.v_hi + rows;
  l.scores = l.v_lo + rows;
  l.gates = l.scores + static_cast<std::size_t>(chunk) * tc_scores_pitch(chunk) * 2;
  l.bytes = l.gates + chunk * 4;
  return l;
}
template <class T, int C, bool Gated>
__global__ void __launch_bounds__(chunk_output_threads(C)) chunk_output_kernel(ForwardStageParams p, StatePassOutputs pairs) {
  constexpr int kThreads = chunk_output_threads(C), kOutTiles = 4;  // 32 value columns a warp
  constexpr int kScoresPitch = tc_scores_pitch(C);
  constexpr ChunkOutputLayout lay = chunk_output_layout(C);
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + lay.queries);
  T* s_s = reinterpret_cast<T*>(smem + lay.states);
  T* vh_s = reinterpret_cast<T*>(smem + lay.v_hi);
  T* vl_s = reinterpret_cast<T*>(smem + lay.v_lo);
  T* scores_s = reinterpret_cast<T*>(smem + lay.scores);
  float* gates = reinterpret_cast<float*>(smem + lay.gates);  // G_i · log2 e

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int chunk = blockIdx.x, head = blockIdx.y;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
  const int t0 = chunk * C, size = min(C, L - t0);
  const int b = head / p.heads, h = head % p.heads;
  constexpr bool gated = Gated;  // log-gates given; DeltaNet's instantiation has no gate arithmetic
  const std::size_t token0 = static_cast<std::size_t>(head) * L + t0;  // packed intermediates (V̄)

  copy_rows_async<kThreads, C>(q_s, static_cast<const T*>(p.q) + p.q_strides.head_offset(b, h) + std::int64_t(t0) * p.q_strides.row,
                               p.q_strides.row, size, DK, tid);
  const std::size_t state0 = (static_cast<std::size_t>(head) * N + chunk) * DV;  // S_[c]'s first value row
  copy_rows_async<kThreads, kTcKeys>(s_s, static_cast<const T*>(pairs.s) + state0 * DK, DK, DV, DK, tid);
  copy_rows_async<kThreads, C>(vh_s, static_cast<const T*>(pairs.v_hi) + token0 * DV, DV, size, DV, tid);
  copy_rows_async<kThreads, C>(vl_s, static_cast<const T*>(pairs.v_lo) + token0 * DV, DV, size, DV, tid);
  copy_scores_async<C, kThreads>(scores_s, static_cast<const T*>(p.scores) + (static_cast<std::size_t>(head) * N + chunk) * C * C, tid);
  copy_async_commit();
  if (gated && warp == 0) {  // G_i by the scan's shuffle tree, kept as G_i · log2 e
    const float* gate = p.log_gate + p.log_gate_strides.head_offset(b, h) + std::int64_t(t0) * p.log_gate_strides.row;
    float lo = lane < size ? gate[lane * p.log_gate_strides.row] : 0.0f;
    float hi = lane + 32 < size ? gate[(lane + 32) * p.log_gate_strides.row] : 0.0f;
    chunk_prefix_sums(lo, hi, lane);
    if (lane < C) gates[lane] = lo * kLog2e;
    if (lane + 32 < C) gates[lane + 32] = hi * kLog2e;
  }
  copy_async_wait_all();
  __syncthreads();

  const int row_block = warp % (C / 16), col0 = 32 * (warp / (C / 16)), i0 = 16 * row_block;
  if (col0 >= DV || i0 >= size) return;  // no barrier follows
  float O[kOutTiles][4] = {};
  for (int kk = 0; kk < (DK + 15) / 16; ++kk) {  // Q Ŝᵀ
    unsigned a[4];
    ldmatrix_x4(a, q_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int n = 0; n < kOutTiles; n += 2) {  // Ŝ stored [value][key]: plain ldmatrix gives the col-major B
      unsigned bs[4];
      ldmatrix_x4(bs, s_s + (col0 + 8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8);
      mma_16816<T>(O[n], a, bs[0], bs[1]);
      mma_16816<T>(O[n + 1], a, bs[2], bs[3]);
    }
  }
  if (gated)  // diag(γ) Q Ŝᵀ
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float decay = exp2_ftz(gates[i0 + g + 8 * half]);
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) O[n][2 * half] *= decay, O[n][2 * half + 1] *= decay;
    }
  for (int jj = 0; jj <= row_block; ++jj) {  // + P V̄_hi + P V̄_lo
    unsigned a[4];
    ldmatrix_x4(a, scores_s + (i0 + lane % 16) * kScoresPitch + jj * 16 + (lane / 16) * 8);
#pragma unroll
    for (int n = 0; n < kOutTiles; n += 2) {  // V̄ stored [token][value]: transposed ldmatrix gives the col-major B
      const int at = (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcLd + col0 + 8 * n + (lane >> 4) * 8;
      unsigned bh[4], bl[4];
      ldmatrix_x4_trans(bh, vh_s + at);
      ldmatrix_x4_trans(bl, vl_s + at);
      mma_16816<T>(O[n], a, bh[0], bh[1]);
      mma_16816<T>(O[n + 1], a, bh[2], bh[3]);
      mma_16816<T>(O[n], a, bl[0], bl[1]);
      mma_16816<T>(O[n + 1], a, bl[2], bl[3]);
    }
  }
  T* out = static_cast<T*>(p.output) + p.output_strides.head_offset(b, h);
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = i0 + g + 8 * half, c = col0 + 8 * n + 2 * t;
      if (r < size && c < DV)
        *reinterpret_cast<unsigned*>(out + (t0 + r) * p.output_strides.row + c) = pack_pair<T>(O[n][2 * half], O[n][2 * half + 1]);
    }
}

}  // namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS

// Stage 1: wy_prepare_async_kernel (its own header; it uses the helpers above).
#include "cuda/delta_rule_prepare_kernels.cuh"
