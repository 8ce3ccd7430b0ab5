// The DeltaNet / Gated DeltaNet forward kernels (delta_rule.cu launches them; its header
// comment gives the precision plan). In a header so that the same source also runs on the CPU under the
// emulation of threads, barriers, warp shuffles and tensor-core instructions
// (property_tests/support/cuda_emulation.hpp): nothing here may depend on more than that.
//
// Three kernels for the chunkwise forward, named by what they do:
//   wy_prepare_async_kernel     stage 1, one block per (chunk, head): A, T = A⁻¹, W, U (delta_rule_prepare_kernels.cuh).
//   chunk_scan_registers_kernel stage 2, the fast path (16-bit inputs, DK ≤ 128, DK and DV multiples of 8):
//                               raw mma.sync, the fp32 state slice in registers (docs/kernels/delta_rule.md;
//                               delta_rule_register_scan_kernels.cuh, with the training forward's chunk_output_kernel).
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

}  // namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS

// Stage 2's register scan and the training forward's output kernel, then stage 1: wy_prepare_async_kernel (their
// own headers; they use the helpers above, the prepare also the register scan's copy helpers).
#include "cuda/delta_rule_register_scan_kernels.cuh"
#include "cuda/delta_rule_prepare_kernels.cuh"
