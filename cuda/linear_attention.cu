// Additive linear attention kernels. See linear_attention.h for the API and NOTES.md for the
// versions, their times and the roofline.
//
// One kernel shape serves the whole chunkwise family: a *pass* scans the chunks of one sequence,
//   out_[c] = Q_[c] S_[c]ᵀ + (Q_[c] K_[c]ᵀ ⊙ M) V_[c],   S_[c+1] = S_[c] + V_[c]ᵀ K_[c],
// with the state tile of a block of value columns held on chip for the whole sequence.
// The backward is three passes of the same kernel with other operands (reference/
// linear_attention.hpp, chunkwise_backward, rewritten):
//   dQ = dO S_[c] + (dO Vᵀ ⊙ M) K         forward pass, q'=dO, k'=V,  v'=K,  S'_0 = S_0ᵀ
//   dK = V G_[c+1] + (V dOᵀ ⊙ Mᵀ) Q       reversed pass, q'=V, k'=dO, v'=Q,  S'_0 = dS_Lᵀ
//   dV = K G_[c+1]ᵀ + (K Qᵀ ⊙ Mᵀ) dO      reversed pass, q'=K, k'=Q,  v'=dO, S'_0 = dS_L, S'_L = dS_0
// A reversed pass reads tokens from the end (token L−1−t), so Mᵀ becomes the causal mask and the
// state it carries is G, the gradient of the state after the chunk.
#include "cuda/linear_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <string>

namespace deltaproof::cuda::linear_attention {
namespace {

// ---------------------------------------------------------------------------------------
// Element conversions (accumulation in A: float, or double for fp64 inputs)

template <class A> __device__ __forceinline__ A to_acc(float x) { return x; }
template <class A> __device__ __forceinline__ A to_acc(double x) { return x; }
template <class A> __device__ __forceinline__ A to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class A> __device__ __forceinline__ A to_acc(__half x) { return __half2float(x); }

template <class T> __device__ __forceinline__ T from_acc(float x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <class T> __device__ __forceinline__ T from_acc(double x) { return x; }

// One scan over the chunks of every (batch, head) sequence. Token t of the pass is token
// L−1−t of the tensors when `reversed`.
struct Pass {
  const void* q; const void* k; const void* v; void* out;
  Strides q_s, k_s, v_s, out_s;
  // State (value rows × key cols of the pass) with full strides, so that a transposed state is free.
  const void* s0; std::int64_t s0_b, s0_h, s0_r, s0_c;
  void* s_final; std::int64_t sf_b, sf_h, sf_r, sf_c;
  void* boundary;  // packed [B, H, N, value_dim, key_dim], or null
  int batch, heads, length, key_dim, value_dim, chunk_size;
  bool reversed;
};

__device__ __forceinline__ std::int64_t token_row(const Pass& p, int t) { return p.reversed ? p.length - 1 - t : t; }

// ---------------------------------------------------------------------------------------
// Generic pass: any dtype, key_dim ≤ 256, any value_dim; CUDA cores, accumulation in A.
// Block = (32 value columns of one head); 256 threads. Shared memory (in A):
//   S [32][K+1] state tile · Qs, Ks [C][33] key slabs · Vt [C][32] · As [C][C] scores.
// Summation order per entry: scores and Q Sᵀ over the key dim in order, then the masked
// scores times V over the chunk in order; the state adds one token at a time (an FMA chain).

constexpr int kGenericThreads = 256, kGenericTileV = 32, kGenericSlab = 32;

template <class A>
std::size_t generic_smem_bytes(int key_dim, int chunk) {
  return sizeof(A) * (std::size_t(kGenericTileV) * (key_dim + 1) + 2 * std::size_t(chunk) * (kGenericSlab + 1) +
                      std::size_t(chunk) * kGenericTileV + std::size_t(chunk) * chunk);
}

template <class T, class A, int C>
__global__ void __launch_bounds__(kGenericThreads) pass_generic(Pass p) {
  constexpr int TV = kGenericTileV, KS = kGenericSlab, NT = kGenericThreads;
  constexpr int kOutPerThread = C * TV / NT, kScorePerThread = (C * C + NT - 1) / NT;
  const int tid = threadIdx.x;
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int v0 = blockIdx.x * TV;
  const int K = p.key_dim, V = p.value_dim, L = p.length, Kp = K + 1;

  extern __shared__ unsigned char smem_raw[];
  A* S = reinterpret_cast<A*>(smem_raw);  // [TV][Kp]
  A* Qs = S + TV * Kp;                     // [C][KS+1]
  A* Ks = Qs + C * (KS + 1);               // [C][KS+1]
  A* Vt = Ks + C * (KS + 1);               // [C][TV]
  A* As = Vt + C * TV;                     // [C][C]

  const T* q = static_cast<const T*>(p.q) + b * p.q_s.batch + h * p.q_s.head;
  const T* k = static_cast<const T*>(p.k) + b * p.k_s.batch + h * p.k_s.head;
  const T* v = static_cast<const T*>(p.v) + b * p.v_s.batch + h * p.v_s.head;
  T* out = static_cast<T*>(p.out) + b * p.out_s.batch + h * p.out_s.head;

  for (int e = tid; e < TV * K; e += NT) {
    const int r = e / K, c = e % K;
    A s = 0;
    if (p.s0 && v0 + r < V) s = static_cast<const A*>(p.s0)[b * p.s0_b + h * p.s0_h + (v0 + r) * p.s0_r + c * p.s0_c];
    S[r * Kp + c] = s;
  }

  const int chunks = (L + C - 1) / C;
  for (int n = 0; n < chunks; ++n) {
    const int t0 = n * C, cn = min(C, L - t0);
    for (int e = tid; e < C * TV; e += NT) {
      const int j = e / TV, c = e % TV;
      Vt[e] = (j < cn && v0 + c < V) ? to_acc<A>(v[token_row(p, t0 + j) * p.v_s.row + v0 + c]) : A(0);
    }
    A out_acc[kOutPerThread], score_acc[kScorePerThread];
    for (int r = 0; r < kOutPerThread; ++r) out_acc[r] = 0;
    for (int r = 0; r < kScorePerThread; ++r) score_acc[r] = 0;

    for (int s0 = 0; s0 < K; s0 += KS) {
      const int width = min(KS, K - s0);
      __syncthreads();  // the previous slab's readers are done
      for (int e = tid; e < C * KS; e += NT) {
        const int i = e / KS, kk = e % KS;
        const bool in = i < cn && kk < width;
        const std::int64_t row = in ? token_row(p, t0 + i) : 0;
        Qs[i * (KS + 1) + kk] = in ? to_acc<A>(q[row * p.q_s.row + s0 + kk]) : A(0);
        Ks[i * (KS + 1) + kk] = in ? to_acc<A>(k[row * p.k_s.row + s0 + kk]) : A(0);
      }
      __syncthreads();
      for (int r = 0; r < kScorePerThread; ++r) {
        const int idx = tid + r * NT, i = idx / C, j = idx % C;
        if (idx < C * C && j <= i)
          for (int kk = 0; kk < width; ++kk) score_acc[r] = fma(Qs[i * (KS + 1) + kk], Ks[j * (KS + 1) + kk], score_acc[r]);
      }
      for (int r = 0; r < kOutPerThread; ++r) {
        const int idx = tid + r * NT, i = idx / TV, c = idx % TV;
        for (int kk = 0; kk < width; ++kk) out_acc[r] = fma(Qs[i * (KS + 1) + kk], S[c * Kp + s0 + kk], out_acc[r]);
      }
      __syncthreads();  // Q Sᵀ has read this slab of S: now it may change
      for (int e = tid; e < TV * KS; e += NT) {
        const int c = e / KS, kk = e % KS;
        if (kk >= width) continue;
        A s = S[c * Kp + s0 + kk];
        if (p.boundary && v0 + c < V)
          static_cast<A*>(p.boundary)[((std::int64_t(b) * p.heads + h) * chunks + n) * V * K + std::int64_t(v0 + c) * K + s0 + kk] = s;
        for (int j = 0; j < cn; ++j) s = fma(Vt[j * TV + c], Ks[j * (KS + 1) + kk], s);
        S[c * Kp + s0 + kk] = s;
      }
    }
    for (int r = 0; r < kScorePerThread; ++r) {
      const int idx = tid + r * NT;
      if (idx < C * C) As[idx] = (idx % C <= idx / C) ? score_acc[r] : A(0);
    }
    __syncthreads();
    for (int r = 0; r < kOutPerThread; ++r) {
      const int idx = tid + r * NT, i = idx / TV, c = idx % TV;
      for (int j = 0; j <= i; ++j) out_acc[r] = fma(As[i * C + j], Vt[j * TV + c], out_acc[r]);
      if (i < cn && v0 + c < V) out[token_row(p, t0 + i) * p.out_s.row + v0 + c] = from_acc<T>(out_acc[r]);
    }
    __syncthreads();  // Vt and As are rewritten by the next chunk
  }
  if (p.s_final)
    for (int e = tid; e < TV * K; e += NT) {
      const int r = e / K, c = e % K;
      if (v0 + r < V)
        static_cast<A*>(p.s_final)[b * p.sf_b + h * p.sf_h + (v0 + r) * p.sf_r + c * p.sf_c] = S[r * Kp + c];
    }
}

// ---------------------------------------------------------------------------------------
// Decode: the token recurrence, streaming the state once through registers.
// A warp owns kDecodeRows state rows; lane l holds columns l, l+32, … (NC of them).
// o_r = Σ_c S_rc q_c: each lane sums its NC columns in order, then a butterfly over the warp
// (the same tree every run: deterministic).

constexpr int kDecodeWarps = 4, kDecodeRows = 4;

template <class T, class A, int NC>
__global__ void __launch_bounds__(kDecodeWarps * 32) decode_kernel(DecodeParams p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int row0 = (blockIdx.x * kDecodeWarps + warp) * kDecodeRows;
  const int K = p.key_dim, V = p.value_dim;
  const A* s_in = static_cast<const A*>(p.initial_state);
  A* s_out = static_cast<A*>(p.final_state);
  const std::int64_t in_base = b * p.initial_state_strides.batch + h * p.initial_state_strides.head;
  const std::int64_t out_base = b * p.final_state_strides.batch + h * p.final_state_strides.head;

  A s[kDecodeRows][NC];
  for (int r = 0; r < kDecodeRows; ++r)
    for (int j = 0; j < NC; ++j) {
      const int row = row0 + r, col = lane + 32 * j;
      s[r][j] = (s_in && row < V && col < K) ? s_in[in_base + row * p.initial_state_strides.row + col] : A(0);
    }
  const T* q = static_cast<const T*>(p.q) + b * p.q_strides.batch + h * p.q_strides.head;
  const T* k = static_cast<const T*>(p.k) + b * p.k_strides.batch + h * p.k_strides.head;
  const T* v = static_cast<const T*>(p.v) + b * p.v_strides.batch + h * p.v_strides.head;
  T* o = static_cast<T*>(p.output) + b * p.output_strides.batch + h * p.output_strides.head;
  for (int t = 0; t < p.tokens; ++t) {
    A kc[NC], qc[NC];
    for (int j = 0; j < NC; ++j) {
      const int col = lane + 32 * j;
      kc[j] = col < K ? to_acc<A>(k[t * p.k_strides.row + col]) : A(0);
      qc[j] = col < K ? to_acc<A>(q[t * p.q_strides.row + col]) : A(0);
    }
    for (int r = 0; r < kDecodeRows; ++r) {
      const int row = row0 + r;
      const A vr = row < V ? to_acc<A>(v[t * p.v_strides.row + row]) : A(0);
      A partial = 0;
      for (int j = 0; j < NC; ++j) {
        s[r][j] = fma(vr, kc[j], s[r][j]);
        partial = fma(s[r][j], qc[j], partial);
      }
      for (int offset = 16; offset > 0; offset /= 2) partial += __shfl_xor_sync(0xffffffffu, partial, offset);
      if (lane == 0 && row < V) o[t * p.output_strides.row + row] = from_acc<T>(partial);
    }
  }
  for (int r = 0; r < kDecodeRows; ++r)
    for (int j = 0; j < NC; ++j) {
      const int row = row0 + r, col = lane + 32 * j;
      if (row < V && col < K) s_out[out_base + row * p.final_state_strides.row + col] = s[r][j];
    }
}

// ---------------------------------------------------------------------------------------
// Tensor-core pass (bf16 inputs, key_dim ≤ 128; WMMA 16×16×16, fp32 accumulate).
// Block = 64 value columns of one head, 8 warps. The fp32 state tile lives in shared memory for
// the whole sequence; the two fp32 operands of the products (the state S and the masked scores
// P) enter the tensor cores as a pair hi + lo of bf16 numbers (hi = bf16(x), lo = bf16(x − hi)),
// which carries x to a relative 2⁻¹⁶: the output error stays at fp32-accumulation level instead
// of the bf16 rounding a single cast would add (see the bound in linear_attention_gpu_test.cpp).

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
constexpr int kTcThreads = 256, kTcWarps = 8, kTcTileV = 64, kTcKeyDim = 128;

template <int C>
struct TcLayout {
  static constexpr int sf_ld = kTcKeyDim + 4, sb_ld = kTcKeyDim + 8, qk_ld = kTcKeyDim + 8, v_ld = kTcTileV + 8,
                       af_ld = (C > kTcTileV ? C : kTcTileV) + 4, p_ld = C + 8;
  static constexpr std::size_t sf = 0, shi = sf + kTcTileV * sf_ld * 4, slo = shi + kTcTileV * sb_ld * 2,
                               qs = slo + kTcTileV * sb_ld * 2, ks = qs + C * qk_ld * 2, vs = ks + C * qk_ld * 2,
                               af = vs + C * v_ld * 2, phi = af + C * af_ld * 4, plo = phi + C * p_ld * 2,
                               bytes = plo + C * p_ld * 2;
};

// Rows [t0, t0+cn) of a [L, width] bf16 matrix into shared [C][ld], zero outside, cols [col0, col0+cols).
template <int C>
__device__ __forceinline__ void load_tile(bf16* dst, int ld, const bf16* src, std::int64_t row_stride, const Pass& p,
                                          int t0, int cn, int col0, int cols, int valid_cols, bool vec) {
  if (vec) {  // 8 columns per 16-byte load; valid_cols and the strides are multiples of 8
    const int groups = cols / 8;
    for (int e = threadIdx.x; e < C * groups; e += kTcThreads) {
      const int i = e / groups, g = e % groups, c = g * 8;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (i < cn && col0 + c < valid_cols)
        x = *reinterpret_cast<const uint4*>(src + token_row(p, t0 + i) * row_stride + col0 + c);
      *reinterpret_cast<uint4*>(dst + i * ld + c) = x;
    }
  } else {
    for (int e = threadIdx.x; e < C * cols; e += kTcThreads) {
      const int i = e / cols, c = e % cols;
      dst[i * ld + c] = (i < cn && col0 + c < valid_cols) ? src[token_row(p, t0 + i) * row_stride + col0 + c]
                                                          : __float2bfloat16_rn(0.f);
    }
  }
}

template <int C>
__global__ void __launch_bounds__(kTcThreads) pass_tensor_core(Pass p, bool vec) {
  using Lay = TcLayout<C>;
  extern __shared__ __align__(128) unsigned char smem[];
  float* Sf = reinterpret_cast<float*>(smem + Lay::sf);  // [64][sf_ld] state tile, fp32
  bf16* Shi = reinterpret_cast<bf16*>(smem + Lay::shi);  // [64][sb_ld]
  bf16* Slo = reinterpret_cast<bf16*>(smem + Lay::slo);
  bf16* Qs = reinterpret_cast<bf16*>(smem + Lay::qs);    // [C][qk_ld]
  bf16* Ks = reinterpret_cast<bf16*>(smem + Lay::ks);
  bf16* Vs = reinterpret_cast<bf16*>(smem + Lay::vs);    // [C][v_ld]
  float* Af = reinterpret_cast<float*>(smem + Lay::af);  // [C][af_ld] scores, then the output tile
  bf16* Phi = reinterpret_cast<bf16*>(smem + Lay::phi);  // [C][p_ld]
  bf16* Plo = reinterpret_cast<bf16*>(smem + Lay::plo);

  const int tid = threadIdx.x, warp = tid / 32;
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int v0 = blockIdx.x * kTcTileV;
  const int K = p.key_dim, V = p.value_dim, L = p.length;
  const int k_end = (K + 15) / 16 * 16;  // key columns that take part in products
  constexpr int nt = C / 16;

  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_s.batch + h * p.q_s.head;
  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_s.batch + h * p.k_s.head;
  const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_s.batch + h * p.v_s.head;
  bf16* out = static_cast<bf16*>(p.out) + b * p.out_s.batch + h * p.out_s.head;

  for (int e = tid; e < kTcTileV * kTcKeyDim; e += kTcThreads) {
    const int r = e / kTcKeyDim, c = e % kTcKeyDim;
    float s = 0;
    if (p.s0 && v0 + r < V && c < K)
      s = static_cast<const float*>(p.s0)[b * p.s0_b + h * p.s0_h + (v0 + r) * p.s0_r + c * p.s0_c];
    Sf[r * Lay::sf_ld + c] = s;
  }
  __syncthreads();

  const int chunks = (L + C - 1) / C;
  for (int n = 0; n < chunks; ++n) {
    const int t0 = n * C, cn = min(C, L - t0);
    // 1. Load the chunk; split S_[c] into hi + lo (and expose it when asked).
    load_tile<C>(Qs, Lay::qk_ld, q, p.q_s.row, p, t0, cn, 0, kTcKeyDim, K, vec);
    load_tile<C>(Ks, Lay::qk_ld, k, p.k_s.row, p, t0, cn, 0, kTcKeyDim, K, vec);
    load_tile<C>(Vs, Lay::v_ld, v, p.v_s.row, p, t0, cn, v0, kTcTileV, V, vec);
    for (int e = tid; e < kTcTileV * kTcKeyDim; e += kTcThreads) {
      const int r = e / kTcKeyDim, c = e % kTcKeyDim;
      const float s = Sf[r * Lay::sf_ld + c];
      if (p.boundary && v0 + r < V && c < K)
        static_cast<float*>(p.boundary)[((std::int64_t(b) * p.heads + h) * chunks + n) * V * K + std::int64_t(v0 + r) * K + c] = s;
      const bf16 hi = __float2bfloat16_rn(s);
      Shi[r * Lay::sb_ld + c] = hi;
      Slo[r * Lay::sb_ld + c] = __float2bfloat16_rn(s - __bfloat162float(hi));
    }
    __syncthreads();

    // 2. Scores Q Kᵀ (tiles on and below the diagonal) and the state update S += Vᵀ K.
    for (int tile = warp; tile < nt * nt; tile += kTcWarps) {
      const int ti = tile / nt, tj = tile % nt;
      if (tj > ti) continue;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < k_end; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bt;
        wmma::load_matrix_sync(a, Qs + ti * 16 * Lay::qk_ld + kk, Lay::qk_ld);
        wmma::load_matrix_sync(bt, Ks + tj * 16 * Lay::qk_ld + kk, Lay::qk_ld);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(Af + ti * 16 * Lay::af_ld + tj * 16, acc, Lay::af_ld, wmma::mem_row_major);
    }
    const int j_end = (cn + 15) / 16 * 16;
    for (int tile = warp; tile < (kTcTileV / 16) * (kTcKeyDim / 16); tile += kTcWarps) {
      const int tr = tile / (kTcKeyDim / 16), tc = tile % (kTcKeyDim / 16);
      if (tc * 16 >= k_end) continue;
      float* s_tile = Sf + tr * 16 * Lay::sf_ld + tc * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, s_tile, Lay::sf_ld, wmma::mem_row_major);
      for (int j = 0; j < j_end; j += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> vt;  // Vᵀ
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> kb;
        wmma::load_matrix_sync(vt, Vs + j * Lay::v_ld + tr * 16, Lay::v_ld);
        wmma::load_matrix_sync(kb, Ks + j * Lay::qk_ld + tc * 16, Lay::qk_ld);
        wmma::mma_sync(acc, vt, kb, acc);
      }
      wmma::store_matrix_sync(s_tile, acc, Lay::sf_ld, wmma::mem_row_major);
    }
    __syncthreads();

    // 3. Causal mask, then P = hi + lo.
    for (int e = tid; e < C * C; e += kTcThreads) {
      const int i = e / C, j = e % C;
      const float x = j <= i ? Af[i * Lay::af_ld + j] : 0.f;
      const bf16 hi = __float2bfloat16_rn(x);
      Phi[i * Lay::p_ld + j] = hi;
      Plo[i * Lay::p_ld + j] = __float2bfloat16_rn(x - __bfloat162float(hi));
    }
    __syncthreads();

    // 4. Output tile: Q (S_hi + S_lo)ᵀ + (P_hi + P_lo) V.
    for (int tile = warp; tile < nt * (kTcTileV / 16); tile += kTcWarps) {
      const int ti = tile / (kTcTileV / 16), tc = tile % (kTcTileV / 16);
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < k_end; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> s_hi, s_lo;
        wmma::load_matrix_sync(a, Qs + ti * 16 * Lay::qk_ld + kk, Lay::qk_ld);
        wmma::load_matrix_sync(s_hi, Shi + tc * 16 * Lay::sb_ld + kk, Lay::sb_ld);
        wmma::load_matrix_sync(s_lo, Slo + tc * 16 * Lay::sb_ld + kk, Lay::sb_ld);
        wmma::mma_sync(acc, a, s_hi, acc);
        wmma::mma_sync(acc, a, s_lo, acc);
      }
      for (int j = 0; j <= ti; ++j) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> p_hi, p_lo;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> vb;
        wmma::load_matrix_sync(p_hi, Phi + ti * 16 * Lay::p_ld + j * 16, Lay::p_ld);
        wmma::load_matrix_sync(p_lo, Plo + ti * 16 * Lay::p_ld + j * 16, Lay::p_ld);
        wmma::load_matrix_sync(vb, Vs + j * 16 * Lay::v_ld + tc * 16, Lay::v_ld);
        wmma::mma_sync(acc, p_hi, vb, acc);
        wmma::mma_sync(acc, p_lo, vb, acc);
      }
      wmma::store_matrix_sync(Af + ti * 16 * Lay::af_ld + tc * 16, acc, Lay::af_ld, wmma::mem_row_major);
    }
    __syncthreads();

    // 5. Round the output tile to bf16 and store it.
    if (vec) {
      for (int e = tid; e < C * (kTcTileV / 8); e += kTcThreads) {
        const int i = e / (kTcTileV / 8), c = (e % (kTcTileV / 8)) * 8;
        if (i >= cn || v0 + c >= V) continue;
        alignas(16) bf16 packed[8];
        for (int x = 0; x < 8; ++x) packed[x] = __float2bfloat16_rn(Af[i * Lay::af_ld + c + x]);
        *reinterpret_cast<uint4*>(out + token_row(p, t0 + i) * p.out_s.row + v0 + c) = *reinterpret_cast<const uint4*>(packed);
      }
    } else {
      for (int e = tid; e < C * kTcTileV; e += kTcThreads) {
        const int i = e / kTcTileV, c = e % kTcTileV;
        if (i < cn && v0 + c < V) out[token_row(p, t0 + i) * p.out_s.row + v0 + c] = __float2bfloat16_rn(Af[i * Lay::af_ld + c]);
      }
    }
    // Next chunk: step 1 writes Qs, Ks, Vs, Shi, Slo (last read in step 4, before the barrier);
    // Af is next written in step 2, after step 1's barrier.
  }
  if (p.s_final)
    for (int e = tid; e < kTcTileV * kTcKeyDim; e += kTcThreads) {
      const int r = e / kTcKeyDim, c = e % kTcKeyDim;
      if (v0 + r < V && c < K)
        static_cast<float*>(p.s_final)[b * p.sf_b + h * p.sf_h + (v0 + r) * p.sf_r + c * p.sf_c] = Sf[r * Lay::sf_ld + c];
    }
}

// ---------------------------------------------------------------------------------------
// Host side: validation, pass construction, dispatch.

bool is_supported_chunk(int c) {
  for (int s : supported_chunk_sizes)
    if (c == s) return true;
  return false;
}

void require_dtype(DType d) {
  require_argument(d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16, "dtype",
                   "must be fp32, fp64, bf16 or fp16");
}

void require_sizes(int batch, int heads, int length, const char* length_name, int key_dim, int value_dim) {
  require_argument(batch >= 1, "batch", "must be >= 1");
  require_argument(heads >= 1, "heads", "must be >= 1");
  require_argument(std::int64_t{batch} * heads <= 65535, "batch*heads", "must be <= 65535 (one grid row per head)");
  require_argument(length >= 1, length_name, "must be >= 1");
  require_argument(key_dim >= 1 && key_dim <= max_head_dim, "key_dim", "must be in 1..256");
  require_argument(value_dim >= 1 && value_dim <= max_head_dim, "value_dim", "must be in 1..256");
}

// Strides that keep every (b, h, i, j) apart: rows inside heads inside batches.
void require_strides(const Strides& s, int heads, int rows, int cols, const std::string& name) {
  require_argument(s.row >= cols, name + "_strides.row", "must be >= the column count " + std::to_string(cols));
  require_argument(s.head >= (std::int64_t{rows} - 1) * s.row + cols, name + "_strides.head", "must be >= (rows-1)*row + cols");
  require_argument(s.batch >= (std::int64_t{heads} - 1) * s.head + (std::int64_t{rows} - 1) * s.row + cols,
                   name + "_strides.batch", "must be >= (heads-1)*head + (rows-1)*row + cols");
}

void require_tensor(const void* pointer, DType dtype, const std::string& name) {
  require_device_pointer(pointer, name);
  require_aligned(pointer, size_of(dtype), name);
}
void require_optional_tensor(const void* pointer, DType dtype, const std::string& name) {
  if (pointer) require_tensor(pointer, dtype, name);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
bool multiple_of_8(const Strides& s) { return s.batch % 8 == 0 && s.head % 8 == 0 && s.row % 8 == 0; }

template <class A>
Pass make_pass(const void* q, Strides qs, const void* k, Strides ks, const void* v, Strides vs, void* out, Strides os,
               int batch, int heads, int length, int key_dim, int value_dim, int chunk, bool reversed) {
  Pass p{};
  p.q = q, p.k = k, p.v = v, p.out = out;
  p.q_s = qs, p.k_s = ks, p.v_s = vs, p.out_s = os;
  p.batch = batch, p.heads = heads, p.length = length, p.key_dim = key_dim, p.value_dim = value_dim;
  p.chunk_size = chunk, p.reversed = reversed;
  return p;
}

void set_initial(Pass& p, const void* s0, const Strides& s, bool transposed) {
  p.s0 = s0;
  p.s0_b = s.batch, p.s0_h = s.head;
  p.s0_r = transposed ? 1 : s.row;
  p.s0_c = transposed ? s.row : 1;
}
void set_final(Pass& p, void* sf, const Strides& s) {
  p.s_final = sf;
  p.sf_b = s.batch, p.sf_h = s.head, p.sf_r = s.row, p.sf_c = 1;
}

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t stream, const Pass& p,
            const std::string& name) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "cudaFuncSetAttribute for " + name);
  kernel<<<grid, threads, smem, stream>>>(p);
  check_launch(name);
}

template <class T, class A>
void run_generic(const Pass& p, cudaStream_t stream) {
  const dim3 grid((p.value_dim + kGenericTileV - 1) / kGenericTileV, p.batch * p.heads);
  const std::size_t smem = generic_smem_bytes<A>(p.key_dim, p.chunk_size);
  switch (p.chunk_size) {
    case 16: launch(pass_generic<T, A, 16>, grid, kGenericThreads, smem, stream, p, "linear_attention pass_generic<C=16>"); break;
    case 32: launch(pass_generic<T, A, 32>, grid, kGenericThreads, smem, stream, p, "linear_attention pass_generic<C=32>"); break;
    default: launch(pass_generic<T, A, 64>, grid, kGenericThreads, smem, stream, p, "linear_attention pass_generic<C=64>"); break;
  }
}

template <int C>
void launch_tensor_core(const Pass& p, bool vec, cudaStream_t stream) {
  const std::string name = "linear_attention pass_tensor_core<C=" + std::to_string(C) + ">";
  constexpr std::size_t smem = TcLayout<C>::bytes;
  check(cudaFuncSetAttribute(pass_tensor_core<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "cudaFuncSetAttribute for " + name);
  const dim3 grid((p.value_dim + kTcTileV - 1) / kTcTileV, p.batch * p.heads);
  pass_tensor_core<C><<<grid, kTcThreads, smem, stream>>>(p, vec);
  check_launch(name);
}

void run_pass(const Pass& p, DType dtype, bool vec, cudaStream_t stream) {
  if (uses_tensor_cores(dtype, p.key_dim, p.value_dim)) {
    switch (p.chunk_size) {
      case 16: launch_tensor_core<16>(p, vec, stream); break;
      case 32: launch_tensor_core<32>(p, vec, stream); break;
      default: launch_tensor_core<64>(p, vec, stream); break;
    }
    return;
  }
  switch (dtype) {
    case DType::f32: run_generic<float, float>(p, stream); break;
    case DType::f64: run_generic<double, double>(p, stream); break;
    case DType::bf16: run_generic<__nv_bfloat16, float>(p, stream); break;
    case DType::f16: run_generic<__half, float>(p, stream); break;
  }
}

}  // namespace

bool uses_tensor_cores(DType dtype, int key_dim, int value_dim) {
  return dtype == DType::bf16 && key_dim <= kTcKeyDim && value_dim <= kTcKeyDim;
}

void set_contiguous_strides(ForwardParams& p) {
  p.q_strides = p.k_strides = contiguous(p.heads, p.length, p.key_dim);
  p.v_strides = p.output_strides = contiguous(p.heads, p.length, p.value_dim);
  p.initial_state_strides = p.final_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}
void set_contiguous_strides(BackwardParams& p) {
  p.q_strides = p.k_strides = p.dq_strides = p.dk_strides = contiguous(p.heads, p.length, p.key_dim);
  p.v_strides = p.d_output_strides = p.dv_strides = contiguous(p.heads, p.length, p.value_dim);
  p.initial_state_strides = p.d_final_state_strides = p.d_initial_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}
void set_contiguous_strides(DecodeParams& p) {
  p.q_strides = p.k_strides = contiguous(p.heads, p.tokens, p.key_dim);
  p.v_strides = p.output_strides = contiguous(p.heads, p.tokens, p.value_dim);
  p.initial_state_strides = p.final_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}

// Order: everything that needs no CUDA call first (dtype, sizes, chunk size, strides, null
// pointers), then device-pointer and alignment checks.
void validate(const ForwardParams& p) {
  require_dtype(p.dtype);
  require_sizes(p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_argument(is_supported_chunk(p.chunk_size), "chunk_size", "must be 16, 32 or 64");
  require_strides(p.q_strides, p.heads, p.length, p.key_dim, "q");
  require_strides(p.k_strides, p.heads, p.length, p.key_dim, "k");
  require_strides(p.v_strides, p.heads, p.length, p.value_dim, "v");
  require_strides(p.output_strides, p.heads, p.length, p.value_dim, "output");
  if (p.initial_state) require_strides(p.initial_state_strides, p.heads, p.value_dim, p.key_dim, "initial_state");
  if (p.final_state) require_strides(p.final_state_strides, p.heads, p.value_dim, p.key_dim, "final_state");
  for (auto [ptr, name] : {std::pair{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {static_cast<const void*>(p.output), "output"}})
    require_argument(ptr != nullptr, name, "must not be null");
  require_tensor(p.q, p.dtype, "q");
  require_tensor(p.k, p.dtype, "k");
  require_tensor(p.v, p.dtype, "v");
  require_tensor(p.output, p.dtype, "output");
  require_optional_tensor(p.initial_state, state_dtype(p.dtype), "initial_state");
  require_optional_tensor(p.final_state, state_dtype(p.dtype), "final_state");
  require_optional_tensor(p.boundary_states, state_dtype(p.dtype), "boundary_states");
}

void validate(const BackwardParams& p) {
  require_dtype(p.dtype);
  require_sizes(p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_argument(is_supported_chunk(p.chunk_size), "chunk_size", "must be 16, 32 or 64");
  require_strides(p.q_strides, p.heads, p.length, p.key_dim, "q");
  require_strides(p.k_strides, p.heads, p.length, p.key_dim, "k");
  require_strides(p.v_strides, p.heads, p.length, p.value_dim, "v");
  require_strides(p.d_output_strides, p.heads, p.length, p.value_dim, "d_output");
  require_strides(p.dq_strides, p.heads, p.length, p.key_dim, "dq");
  require_strides(p.dk_strides, p.heads, p.length, p.key_dim, "dk");
  require_strides(p.dv_strides, p.heads, p.length, p.value_dim, "dv");
  if (p.initial_state) require_strides(p.initial_state_strides, p.heads, p.value_dim, p.key_dim, "initial_state");
  if (p.d_final_state) require_strides(p.d_final_state_strides, p.heads, p.value_dim, p.key_dim, "d_final_state");
  if (p.d_initial_state) require_strides(p.d_initial_state_strides, p.heads, p.value_dim, p.key_dim, "d_initial_state");
  for (auto [ptr, name] : {std::pair{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.d_output, "d_output"},
                           {static_cast<const void*>(p.dq), "dq"}, {static_cast<const void*>(p.dk), "dk"},
                           {static_cast<const void*>(p.dv), "dv"}})
    require_argument(ptr != nullptr, name, "must not be null");
  require_tensor(p.q, p.dtype, "q");
  require_tensor(p.k, p.dtype, "k");
  require_tensor(p.v, p.dtype, "v");
  require_tensor(p.d_output, p.dtype, "d_output");
  require_tensor(p.dq, p.dtype, "dq");
  require_tensor(p.dk, p.dtype, "dk");
  require_tensor(p.dv, p.dtype, "dv");
  require_optional_tensor(p.initial_state, state_dtype(p.dtype), "initial_state");
  require_optional_tensor(p.d_final_state, state_dtype(p.dtype), "d_final_state");
  require_optional_tensor(p.d_initial_state, state_dtype(p.dtype), "d_initial_state");
}

void validate(const DecodeParams& p) {
  require_dtype(p.dtype);
  require_sizes(p.batch, p.heads, p.tokens, "tokens", p.key_dim, p.value_dim);
  require_strides(p.q_strides, p.heads, p.tokens, p.key_dim, "q");
  require_strides(p.k_strides, p.heads, p.tokens, p.key_dim, "k");
  require_strides(p.v_strides, p.heads, p.tokens, p.value_dim, "v");
  require_strides(p.output_strides, p.heads, p.tokens, p.value_dim, "output");
  require_strides(p.final_state_strides, p.heads, p.value_dim, p.key_dim, "final_state");
  if (p.initial_state) require_strides(p.initial_state_strides, p.heads, p.value_dim, p.key_dim, "initial_state");
  if (p.initial_state == p.final_state)  // in place: each entry is read, then written, by one thread
    require_argument(p.initial_state_strides.batch == p.final_state_strides.batch &&
                         p.initial_state_strides.head == p.final_state_strides.head &&
                         p.initial_state_strides.row == p.final_state_strides.row,
                     "initial_state_strides", "must equal final_state_strides when the state is updated in place");
  for (auto [ptr, name] : {std::pair{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {static_cast<const void*>(p.output), "output"},
                           {static_cast<const void*>(p.final_state), "final_state"}})
    require_argument(ptr != nullptr, name, "must not be null");
  require_tensor(p.q, p.dtype, "q");
  require_tensor(p.k, p.dtype, "k");
  require_tensor(p.v, p.dtype, "v");
  require_tensor(p.output, p.dtype, "output");
  require_tensor(p.final_state, state_dtype(p.dtype), "final_state");
  require_optional_tensor(p.initial_state, state_dtype(p.dtype), "initial_state");
}

void forward(const ForwardParams& fp, cudaStream_t stream) {
  validate(fp);
  Pass p = make_pass<float>(fp.q, fp.q_strides, fp.k, fp.k_strides, fp.v, fp.v_strides, fp.output, fp.output_strides,
                            fp.batch, fp.heads, fp.length, fp.key_dim, fp.value_dim, fp.chunk_size, false);
  set_initial(p, fp.initial_state, fp.initial_state_strides, false);
  set_final(p, fp.final_state, fp.final_state_strides);
  p.boundary = fp.boundary_states;
  const bool vec = fp.key_dim % 8 == 0 && fp.value_dim % 8 == 0 && aligned16(fp.q) && aligned16(fp.k) && aligned16(fp.v) &&
                   aligned16(fp.output) && multiple_of_8(fp.q_strides) && multiple_of_8(fp.k_strides) &&
                   multiple_of_8(fp.v_strides) && multiple_of_8(fp.output_strides);
  run_pass(p, fp.dtype, vec, stream);
}

void backward(const BackwardParams& bp, cudaStream_t stream) {
  validate(bp);
  const int B = bp.batch, H = bp.heads, L = bp.length, DK = bp.key_dim, DV = bp.value_dim, C = bp.chunk_size;
  const bool vec = DK % 8 == 0 && DV % 8 == 0 && aligned16(bp.q) && aligned16(bp.k) && aligned16(bp.v) &&
                   aligned16(bp.d_output) && aligned16(bp.dq) && aligned16(bp.dk) && aligned16(bp.dv) &&
                   multiple_of_8(bp.q_strides) && multiple_of_8(bp.k_strides) && multiple_of_8(bp.v_strides) &&
                   multiple_of_8(bp.d_output_strides) && multiple_of_8(bp.dq_strides) && multiple_of_8(bp.dk_strides) &&
                   multiple_of_8(bp.dv_strides);
  // dQ = dO S_[c] + (dO Vᵀ ⊙ M) K: forward pass over (dO, V, K) with state Sᵀ.
  Pass dq = make_pass<float>(bp.d_output, bp.d_output_strides, bp.v, bp.v_strides, bp.k, bp.k_strides, bp.dq,
                             bp.dq_strides, B, H, L, DV, DK, C, false);
  set_initial(dq, bp.initial_state, bp.initial_state_strides, true);
  set_final(dq, nullptr, {});
  dq.boundary = nullptr;
  run_pass(dq, bp.dtype, vec, stream);
  // dK = V G + (V dOᵀ ⊙ Mᵀ) Q: reversed pass over (V, dO, Q) with state Gᵀ, G starting at dS_L.
  Pass dk = make_pass<float>(bp.v, bp.v_strides, bp.d_output, bp.d_output_strides, bp.q, bp.q_strides, bp.dk,
                             bp.dk_strides, B, H, L, DV, DK, C, true);
  set_initial(dk, bp.d_final_state, bp.d_final_state_strides, true);
  set_final(dk, nullptr, {});
  dk.boundary = nullptr;
  run_pass(dk, bp.dtype, vec, stream);
  // dV = K Gᵀ + (K Qᵀ ⊙ Mᵀ) dO: reversed pass over (K, Q, dO) with state G; its final state is dS_0.
  Pass dv = make_pass<float>(bp.k, bp.k_strides, bp.q, bp.q_strides, bp.d_output, bp.d_output_strides, bp.dv,
                             bp.dv_strides, B, H, L, DK, DV, C, true);
  set_initial(dv, bp.d_final_state, bp.d_final_state_strides, false);
  set_final(dv, bp.d_initial_state, bp.d_initial_state_strides);
  dv.boundary = nullptr;
  run_pass(dv, bp.dtype, vec, stream);
}

namespace {
template <class T, class A>
void run_decode(const DecodeParams& p, cudaStream_t stream) {
  const dim3 grid((p.value_dim + kDecodeWarps * kDecodeRows - 1) / (kDecodeWarps * kDecodeRows), p.batch * p.heads);
  const int columns_per_lane = (p.key_dim + 31) / 32;
  const std::string name = "linear_attention decode_kernel";
  if (columns_per_lane <= 1) decode_kernel<T, A, 1><<<grid, kDecodeWarps * 32, 0, stream>>>(p);
  else if (columns_per_lane <= 2) decode_kernel<T, A, 2><<<grid, kDecodeWarps * 32, 0, stream>>>(p);
  else if (columns_per_lane <= 4) decode_kernel<T, A, 4><<<grid, kDecodeWarps * 32, 0, stream>>>(p);
  else decode_kernel<T, A, 8><<<grid, kDecodeWarps * 32, 0, stream>>>(p);
  check_launch(name);
}
}  // namespace

void decode(const DecodeParams& p, cudaStream_t stream) {
  validate(p);
  switch (p.dtype) {
    case DType::f32: run_decode<float, float>(p, stream); break;
    case DType::f64: run_decode<double, double>(p, stream); break;
    case DType::bf16: run_decode<__nv_bfloat16, float>(p, stream); break;
    case DType::f16: run_decode<__half, float>(p, stream); break;
  }
}

}  // namespace deltaproof::cuda::linear_attention
