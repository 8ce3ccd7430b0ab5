// Additive linear attention kernels (linear_attention_kernels.cuh builds their passes and launches them;
// linear_attention.cu validates first). See linear_attention.h for the API and docs/kernels/linear_attention.md for the design, its times and the roofline.
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
// state it carries is G, the gradient of the state after the chunk. On tensor cores the dK and dV
// passes run as one fused reversed scan (they share their tiles and G).
//
// Every kernel takes a Policy: the seams through which the planted-bug tests run kernels broken on
// purpose (the design page's numerical policy), as reference/linear_attention.hpp's Faithful does for the
// oracle. The product library instantiates Faithful alone; the mutants live in the test-only target
// (cuda/testing/linear_attention_planted.cu). Everything here has internal linkage: each .cu that
// includes this header compiles its own instantiations.
#pragma once

#include "cuda/check.hpp"
#include "cuda/decode_kernels.cuh"
#include "cuda/linear_attention.h"
#include "cuda/tensor_core.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace deltaproof::cuda::linear_attention {
namespace {

struct Faithful {
  __device__ __forceinline__ static constexpr bool in_causal_mask(int i, int j) { return j <= i; }
  static constexpr bool keeps_partial_chunk = true;         // the last chunk when L % C != 0
  static constexpr bool reads_initial_state = true;         // S_0, and dS_L in the backward's passes
  static constexpr bool splits_operands = true;             // S and P enter tensor cores as bf16 hi + lo
  static constexpr bool decode_reads_updated_state = true;  // o_t = S_t q_t
  static constexpr bool exclusive_segment_scan = true;      // a segment starts from the sums before it
};


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
  // A pass over segments (docs/context_parallel.md): each sequence's tokens cut into `segments` runs of
  // `segment_length` (the last ones shorter, or empty), a block row each: blockIdx.y = (b·heads + h)·segments + r.
  // Segment r starts from s0 + r·s0_seg (the pass's strides within it); it writes its final state at
  // s_final + r·sf_seg, or, with sf_seg = 0, only the pass's last segment writes s_final. out null: no output.
  int segments = 1, segment_length = 0;
  std::int64_t s0_seg = 0, sf_seg = 0;
};

template <class Policy>
__device__ __forceinline__ bool reads_initial(const Pass& p) { return p.s0 && Policy::reads_initial_state; }
template <class Policy, int C>
__device__ __forceinline__ int chunks_of(const Pass& p) {
  return Policy::keeps_partial_chunk ? (p.length + C - 1) / C : p.length / C;
}

__device__ __forceinline__ std::int64_t token_row(const Pass& p, int t) { return p.reversed ? p.length - 1 - t : t; }

// The block's sequence (b, h) and its pass: for a pass over segments, the pass narrowed to segment r
// (its tokens, its initial and final states), so the kernels walk a segment as they walk a sequence. The
// kernels take it in their kSegments instantiation only: the one walk keeps the code it had without segments.
template <class T, class A>
__device__ __forceinline__ Pass block_sequence(Pass p, int& b, int& h) {
  const int bh = blockIdx.y / p.segments, r = blockIdx.y % p.segments;
  b = bh / p.heads, h = bh % p.heads;
  if (p.segments == 1) return p;
  const std::int64_t first = std::int64_t(r) * p.segment_length;
  p.q = static_cast<const T*>(p.q) + first * p.q_s.row;
  p.k = static_cast<const T*>(p.k) + first * p.k_s.row;
  p.v = static_cast<const T*>(p.v) + first * p.v_s.row;
  if (p.out) p.out = static_cast<T*>(p.out) + first * p.out_s.row;
  const std::int64_t left = p.length - first;  // ≤ 0: an empty segment past the sequence's end
  p.length = left <= 0 ? 0 : left < p.segment_length ? int(left) : p.segment_length;
  if (p.s0) p.s0 = static_cast<const A*>(p.s0) + r * p.s0_seg;
  if (p.sf_seg) p.s_final = static_cast<A*>(p.s_final) + r * p.sf_seg;
  else if (r != (p.reversed ? 0 : p.segments - 1)) p.s_final = nullptr;
  return p;
}

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

template <class T, class A, int C, class Policy, bool kSegments = false>
__global__ void __launch_bounds__(kGenericThreads) pass_generic(Pass pass) {
  constexpr int TV = kGenericTileV, KS = kGenericSlab, NT = kGenericThreads;
  constexpr int kOutPerThread = C * TV / NT, kScorePerThread = (C * C + NT - 1) / NT;
  const int tid = threadIdx.x;
  int b = blockIdx.y / pass.heads, h = blockIdx.y % pass.heads;
  const Pass p = kSegments ? block_sequence<T, A>(pass, b, h) : pass;
  const bool outputs = !kSegments || p.out != nullptr;  // a segment-sum pass computes the state alone
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
  T* out = outputs ? static_cast<T*>(p.out) + b * p.out_s.batch + h * p.out_s.head : nullptr;

  for (int e = tid; e < TV * K; e += NT) {
    const int r = e / K, c = e % K;
    A s = 0;
    if (reads_initial<Policy>(p) && v0 + r < V) s = static_cast<const A*>(p.s0)[b * p.s0_b + h * p.s0_h + (v0 + r) * p.s0_r + c * p.s0_c];
    S[r * Kp + c] = s;
  }

  const int chunks = chunks_of<Policy, C>(p);
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
      if (outputs) {
        for (int r = 0; r < kScorePerThread; ++r) {
          const int idx = tid + r * NT, i = idx / C, j = idx % C;
          if (idx < C * C && Policy::in_causal_mask(i, j))
            for (int kk = 0; kk < width; ++kk) score_acc[r] = fma(Qs[i * (KS + 1) + kk], Ks[j * (KS + 1) + kk], score_acc[r]);
        }
        for (int r = 0; r < kOutPerThread; ++r) {
          const int idx = tid + r * NT, i = idx / TV, c = idx % TV;
          for (int kk = 0; kk < width; ++kk) out_acc[r] = fma(Qs[i * (KS + 1) + kk], S[c * Kp + s0 + kk], out_acc[r]);
        }
      }
      __syncthreads();  // Q Sᵀ has read this slab of S: now it may change
      for (int e = tid; e < TV * KS; e += NT) {
        const int c = e / KS, kk = e % KS;
        if (kk >= width) continue;
        A s = S[c * Kp + s0 + kk];
        if (p.boundary && v0 + c < V)
          static_cast<A*>(p.boundary)[((std::int64_t(b) * p.heads + h) * ((L + C - 1) / C) + n) * V * K + std::int64_t(v0 + c) * K + s0 + kk] = s;
        for (int j = 0; j < cn; ++j) s = fma(Vt[j * TV + c], Ks[j * (KS + 1) + kk], s);
        S[c * Kp + s0 + kk] = s;
      }
    }
    if (outputs) {
      for (int r = 0; r < kScorePerThread; ++r) {
        const int idx = tid + r * NT;
        if (idx < C * C) As[idx] = Policy::in_causal_mask(idx / C, idx % C) ? score_acc[r] : A(0);
      }
      __syncthreads();
      for (int r = 0; r < kOutPerThread; ++r) {
        const int idx = tid + r * NT, i = idx / TV, c = idx % TV;
        for (int j = 0; j <= i; ++j) out_acc[r] = fma(As[i * C + j], Vt[j * TV + c], out_acc[r]);
        if (i < cn && v0 + c < V) out[token_row(p, t0 + i) * p.out_s.row + v0 + c] = from_acc<T>(out_acc[r]);
      }
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
// Tensor-core pass (bf16 inputs, head dims ≤ 128): mma.sync m16n8k16 bf16 → fp32 with ldmatrix.
// Block = one head (all value columns, zero-padded to 128), 16 warps, one block per SM: Q and K
// are read once per head and each score block is computed once.
// The fp32 state lives in registers as mma accumulators: warp w owns state rows 16·(w%8).. +15
// and key columns 64·(w/8).. +63.
// The fp32 operands of the products, the state S and the masked scores P, enter the tensor cores
// as a pair hi + lo of bf16 numbers (hi = bf16(x), lo = bf16(x − hi)), which carries x to a
// relative 2⁻¹⁶: the error stays at fp32-accumulation level instead of the bf16 rounding a
// single cast would add (bound: kernel_checks/linear_attention_kernel_bound.hpp). The input tiles
// are double-buffered: chunk c+1 is copied in (cp.async) while chunk c is computed.
// The forward-type passes (forward, dQ) run pass_tensor_core_forward (below), where the state never
// leaves the registers. The fused dK/dV pass, pass_tensor_core_dk_dv, runs the dV pass (q'=K, k'=Q,
// v'=dO, state G) and, on the same chunk tiles and the same published G, the dK output
// dK = V G + (V dOᵀ ⊙ Mᵀ) Q: one reversed scan instead of two. Per chunk:
//   1. each warp writes its state rows to shared memory as hi/lo; wait for chunk c's copy; barrier;
//   2. each 16×16 score block is computed once, masked and written to shared memory as hi/lo,
//      while the warps with fewer blocks update their state rows (S += Vᵀ K); barrier;
//   3. each warp computes O = P V + Q Sᵀ for 16 rows and a group of value columns; barrier;
//   4. steps 2 and 3 once more for dK, with G read transposed.
// Consecutive warps share a row block, so each scheduler (warp % 4) gets a mix of the light (top)
// and heavy (far from the diagonal) row blocks.

using bf16 = __nv_bfloat16;
using namespace tensor_core;
constexpr int kTcWarps = 16, kTcThreads = 32 * kTcWarps, kTcDim = 128;  // head dims padded to 128
constexpr int kTcStateRowBlocks = kTcDim / 16;                        // 16-row slices of the state
constexpr int kTcStateKeys = kTcDim * kTcStateRowBlocks / kTcWarps;   // key columns of the state each warp owns
constexpr int kTcLd = kTcDim + 8, kTcPLd = 64 + 8;  // padded rows (elements): ldmatrix without bank conflicts

// The fused dK/dV pass's byte offsets: the state as hi/lo, the masked scores as hi/lo, then the chunk
// tiles [64][kTcLd] (K, Q, dO, V), two buffers each.
struct TcLayout {
  static constexpr unsigned tile = 64 * kTcLd * 2;
  static constexpr unsigned shi = 0, slo = shi + kTcDim * kTcLd * 2, phi = slo + kTcDim * kTcLd * 2,
                            plo = phi + 64 * kTcPLd * 2, tiles = plo + 64 * kTcPLd * 2;
  static constexpr unsigned bytes = tiles + 2 * 4 * tile;
};
static_assert(TcLayout::bytes <= 227 * 1024, "the fused pass must fit one SM's shared memory");

// An fp32 operand pair as bf16 hi + lo (tensor_core.cuh), or hi alone where a policy plants that bug.
template <class Policy>
__device__ __forceinline__ void split_operand(float x0, float x1, unsigned& hi, unsigned& lo) {
  split_pair<bf16>(x0, x1, hi, lo);
  if constexpr (!Policy::splits_operands) lo = 0u;
}

// acc[n] += a · B_n over a row of n8 tiles for one k16 step; b[m] holds tiles 2m and 2m+1.
template <int kTiles>
__device__ __forceinline__ void mma_row(float (&acc)[kTiles][4], const unsigned (&a)[4], const unsigned (&b)[kTiles / 2][4]) {
#pragma unroll
  for (int n = 0; n < kTiles; n += 2) {
    mma_16816<bf16>(acc[n], a, b[n / 2][0], b[n / 2][1]);
    mma_16816<bf16>(acc[n + 1], a, b[n / 2][2], b[n / 2][3]);
  }
}

// Per-lane byte offsets of the ldmatrix row addresses inside a row-major tile of pitch ld:
// A operand (16×16) from [m][k]; B operand (two n8 tiles × k16) from [n][k] (plain) or from
// [k][n] (.trans); A operand from [k][m] (.trans).
struct LaneOffsets {
  unsigned a, b, b_trans, a_trans;
  __device__ LaneOffsets(int lane, int ld)
      : a(((lane % 16) * ld + (lane / 16) * 8) * 2),
        b((((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8) * 2),
        b_trans((((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8) * 2),
        a_trans((((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8) * 2) {}
};

// Rows [t0, t0+cn) of a bf16 matrix into a shared [64][kTcLd] tile, columns [0, 128), zero
// outside the chunk and beyond valid_cols (so padded products add exact zeros).
__device__ __forceinline__ void load_tile(bf16* dst, const void* matrix, const Strides& s, int b, int h, const Pass& p,
                                         int t0, int cn, int valid_cols, bool vec) {
  const bf16* src = static_cast<const bf16*>(matrix) + b * s.batch + h * s.head;
  if (vec) {  // 8 columns per 16-byte copy; valid_cols and the strides are multiples of 8
    // A thread copies columns [c, c + 8) of rows i0, i0 + kRowStep, …: one source address per tile, advanced by a
    // fixed step. (Per-row addresses, hoisted by the compiler out of the chunk loop, cost the fused dK/dV pass 104
    // bytes of spills at C = 64: docs/kernels/linear_attention.md.)
    constexpr int kGroups = kTcDim / 8, kRowStep = kTcThreads / kGroups, kCopiesPerThread = 64 / kRowStep;
    static_assert(kTcThreads % kGroups == 0 && 64 % kRowStep == 0);
    const int i0 = threadIdx.x / kGroups, c = (threadIdx.x % kGroups) * 8;
    const bf16* at = src + token_row(p, t0 + i0) * s.row + c;
    const std::int64_t step = (p.reversed ? -kRowStep : kRowStep) * s.row;
#pragma unroll
    for (int r = 0; r < kCopiesPerThread; ++r) {
      const int i = i0 + r * kRowStep;
      const bool valid = i < cn && c < valid_cols;
      copy_async_16(dst + i * kTcLd + c, valid ? at + r * step : src, valid);
    }
  } else {
    for (int e = threadIdx.x; e < 64 * kTcDim; e += kTcThreads) {
      const int i = e / kTcDim, c = e % kTcDim;
      dst[i * kTcLd + c] = (i < cn && c < valid_cols) ? src[token_row(p, t0 + i) * s.row + c] : __float2bfloat16_rn(0.f);
    }
  }
}

template <int C>
struct TcShape {
  static constexpr int kRowBlocks = C / 16;                  // 16-row blocks of a chunk
  static constexpr int kMaxGroups = kTcDim / 16;             // each group keeps ≥ 2 output tiles
  static constexpr int kColumnGroups = kTcWarps / kRowBlocks < kMaxGroups ? kTcWarps / kRowBlocks : kMaxGroups;
  static constexpr int kOutTiles = kTcDim / 8 / kColumnGroups;  // n8 output tiles per warp
};

// Step 2: the warp of row block r and column group cg computes the score blocks (r, jj) with
// jj ≤ r and jj ≡ cg (mod kColumnGroups) of A Bᵀ (A rows from a_tile, B rows from b_tile, both
// [64][kTcLd]), applies the causal mask and writes P = hi + lo to shared memory.
template <int C, class Policy>
__device__ __forceinline__ void tc_scores(unsigned a_tile, unsigned b_tile, bf16* Phi, bf16* Plo,
                                          const LaneOffsets& lo136, int row_block, int column_group, int lane) {
  using Shape = TcShape<C>;
  const int i0 = 16 * row_block, g = lane / 4, t = lane % 4;
  for (int jj = column_group; jj <= row_block; jj += Shape::kColumnGroups) {
    // Fragments are loaded one k-step ahead, and even and odd k-steps go to separate
    // accumulators, so neither a load nor the previous product is waited for at each mma.
    float P[2][2][4] = {};  // [k-step parity][n8 tile]
    const unsigned a_row = a_tile + lo136.a + i0 * kTcLd * 2, b_row = b_tile + lo136.b + 16 * jj * kTcLd * 2;
    unsigned a[2][4], bk[2][4];  // B rows j stored [j][key]: plain ldmatrix gives the col-major B
    ldmatrix_x4(a[0], a_row);
    ldmatrix_x4(bk[0], b_row);
#pragma unroll
    for (int kk = 0; kk < kTcDim / 16; ++kk) {
      if (kk + 1 < kTcDim / 16) {
        ldmatrix_x4(a[(kk + 1) % 2], a_row + (kk + 1) * 32);
        ldmatrix_x4(bk[(kk + 1) % 2], b_row + (kk + 1) * 32);
      }
      mma_16816<bf16>(P[kk % 2][0], a[kk % 2], bk[kk % 2][0], bk[kk % 2][1]);
      mma_16816<bf16>(P[kk % 2][1], a[kk % 2], bk[kk % 2][2], bk[kk % 2][3]);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + g + 8 * half, j = 16 * jj + 8 * n + 2 * t;
        const float x0 = Policy::in_causal_mask(i, j) ? P[0][n][2 * half] + P[1][n][2 * half] : 0.f;
        const float x1 = Policy::in_causal_mask(i, j + 1) ? P[0][n][2 * half + 1] + P[1][n][2 * half + 1] : 0.f;
        unsigned hi, lo;
        split_operand<Policy>(x0, x1, hi, lo);
        *reinterpret_cast<unsigned*>(Phi + i * kTcPLd + j) = hi;
        *reinterpret_cast<unsigned*>(Plo + i * kTcPLd + j) = lo;
      }
  }
}

// Step 3: O = (P_hi + P_lo) X + A (S_hi + S_lo)ᵀ for 16 rows and this warp's output columns,
// rounded to bf16 and stored to out (rows of the pass p). X: [64][kTcLd] tile (rows = chunk
// tokens); A: [64][kTcLd] tile; the state is [n][k] (plain) or, when kStateTransposed, [k][n].
template <int C, bool kStateTransposed>
__device__ __forceinline__ void tc_output(const Pass& p, void* out_matrix, const Strides& out_s, int valid_cols,
                                          unsigned x_tile, unsigned a_tile, unsigned smem_base,
                                          const LaneOffsets& lo136, const LaneOffsets& lo72, int row_block,
                                          int column_group, int lane, int b, int h, int t0, int cn, bool vec) {
  using Shape = TcShape<C>;
  constexpr int kOutTiles = Shape::kOutTiles;
  const int i0 = 16 * row_block, out_col0 = column_group * (kTcDim / Shape::kColumnGroups), g = lane / 4, t = lane % 4;
  float O[kOutTiles][4];
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.f;
  const unsigned p_row = smem_base + TcLayout::phi + lo72.a + i0 * kTcPLd * 2;
  const unsigned x_row = x_tile + lo136.b_trans + out_col0 * 2;
#pragma unroll
  for (int jj = 0; jj < Shape::kRowBlocks; ++jj) {
    if (jj > row_block) break;
    // All of a step's fragments are loaded before its products (here and below).
    unsigned ah[4], al[4], bx[kOutTiles / 2][4];  // X stored [j][c]: transposed ldmatrix gives the col-major B
    ldmatrix_x4(ah, p_row + jj * 32);
    ldmatrix_x4(al, p_row + (TcLayout::plo - TcLayout::phi) + jj * 32);
#pragma unroll
    for (int n = 0; n < kOutTiles; n += 2) ldmatrix_x4_trans(bx[n / 2], x_row + (jj * 16 * kTcLd + 8 * n) * 2);
    mma_row(O, ah, bx);
    mma_row(O, al, bx);
  }
  const unsigned a_row = a_tile + lo136.a + i0 * kTcLd * 2;
  const unsigned s_row = kStateTransposed ? smem_base + TcLayout::shi + lo136.b_trans + out_col0 * 2
                                          : smem_base + TcLayout::shi + lo136.b + out_col0 * kTcLd * 2;
#pragma unroll
  for (int kk = 0; kk < kTcDim / 16; ++kk) {
    unsigned a[4], bh[kOutTiles / 2][4], bl[kOutTiles / 2][4];
    ldmatrix_x4(a, a_row + kk * 32);
#pragma unroll
    for (int n = 0; n < kOutTiles; n += 2) {
      const unsigned at = s_row + (kStateTransposed ? kk * 16 * kTcLd + 8 * n : 8 * n * kTcLd + kk * 16) * 2;
      if constexpr (kStateTransposed) {
        ldmatrix_x4_trans(bh[n / 2], at);
        ldmatrix_x4_trans(bl[n / 2], at + (TcLayout::slo - TcLayout::shi));
      } else {
        ldmatrix_x4(bh[n / 2], at);
        ldmatrix_x4(bl[n / 2], at + (TcLayout::slo - TcLayout::shi));
      }
    }
    mma_row(O, a, bh);
    mma_row(O, a, bl);
  }
  bf16* out = static_cast<bf16*>(out_matrix) + b * out_s.batch + h * out_s.head;
  if (vec) {  // rows 16-byte aligned, widths multiples of 8: whole 32-byte sectors per instruction
#pragma unroll
    for (int n = 0; n < kOutTiles; n += 2)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + g + 8 * half, c = out_col0 + 8 * n;
        store_tile_pairs<bf16>(out + token_row(p, t0 + (i < cn ? i : 0)) * out_s.row + c,
                               pack_pair<bf16>(O[n][2 * half], O[n][2 * half + 1]),
                               pack_pair<bf16>(O[n + 1][2 * half], O[n + 1][2 * half + 1]), t, i < cn, valid_cols - c);
      }
    return;
  }
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = i0 + g + 8 * half, c = out_col0 + 8 * n + 2 * t;
      if (i >= cn) continue;
      bf16* dst = out + token_row(p, t0 + i) * out_s.row + c;
      if (c < valid_cols) dst[0] = __float2bfloat16_rn(O[n][2 * half]);
      if (c + 1 < valid_cols) dst[1] = __float2bfloat16_rn(O[n][2 * half + 1]);
    }
}

// A warp's state slice in the accumulator layout: rows row + {0, 8} (row = the warp's first state row + g),
// columns col + 8·n + {0, 1} (col = its first key column + 2t). Entries outside V × K are zero, never stored.
template <class Policy>
__device__ __forceinline__ void load_state_slice(float (&S)[kTcStateKeys / 8][4], const Pass& p, int b, int h, int row,
                                                 int col) {
#pragma unroll
  for (int n = 0; n < kTcStateKeys / 8; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = row + (x / 2) * 8, c = col + 8 * n + x % 2;
      S[n][x] = (reads_initial<Policy>(p) && r < p.value_dim && c < p.key_dim)
                    ? static_cast<const float*>(p.s0)[b * p.s0_b + h * p.s0_h + r * p.s0_r + c * p.s0_c]
                    : 0.f;
    }
}
__device__ __forceinline__ void store_state_slice(const float (&S)[kTcStateKeys / 8][4], float* dst, std::int64_t row_stride,
                                                  std::int64_t col_stride, int V, int K, int row, int col) {
#pragma unroll
  for (int n = 0; n < kTcStateKeys / 8; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = row + (x / 2) * 8, c = col + 8 * n + x % 2;
      if (r < V && c < K) dst[r * row_stride + c * col_stride] = S[n][x];
    }
}

// The fused dK/dV pass: p is the dV pass and dk the dK pass of the same reversed scan (dk.q = V; its k
// and v are p's v and k).
template <int C, class Policy>
__global__ void __launch_bounds__(kTcThreads, 1) pass_tensor_core_dk_dv(Pass p, Pass dk, bool vec) {
  using Shape = TcShape<C>;
  constexpr int kTiles = 4;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Shi = reinterpret_cast<bf16*>(smem + TcLayout::shi);  // [kTcDim][kTcLd] state rows (value) × key
  bf16* Slo = reinterpret_cast<bf16*>(smem + TcLayout::slo);
  bf16* Phi = reinterpret_cast<bf16*>(smem + TcLayout::phi);  // [64][kTcPLd] masked scores
  bf16* Plo = reinterpret_cast<bf16*>(smem + TcLayout::plo);
  bf16* tiles = reinterpret_cast<bf16*>(smem + TcLayout::tiles);  // [2][kTiles][64][kTcLd]: q', k', v' (, V)
  const unsigned smem_base = smem_address(smem);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int K = p.key_dim, V = p.value_dim, L = p.length;
  const int row_block = warp / Shape::kColumnGroups, column_group = warp % Shape::kColumnGroups;
  const bool computes_output = warp < Shape::kRowBlocks * Shape::kColumnGroups;  // C = 16 leaves 8 warps to the state alone
  const int state_rows = 16 * (warp % kTcStateRowBlocks), state_key0 = kTcStateKeys * (warp / kTcStateRowBlocks);
  const LaneOffsets lo136(lane, kTcLd), lo72(lane, kTcPLd);

  float S[kTcStateKeys / 8][4];
  load_state_slice<Policy>(S, p, b, h, state_rows + g, state_key0 + 2 * t);

  const int chunks = chunks_of<Policy, C>(p);
  const auto tile = [&](int n, int which) { return tiles + ((n % 2) * kTiles + which) * 64 * kTcLd; };
  // Copy chunk n into buffer n % 2 (one commit group per chunk).
  const auto copy_chunk = [&](int n) {
    const int t0 = n * C, cn = min(C, L - t0);
    load_tile(tile(n, 0), p.q, p.q_s, b, h, p, t0, cn, K, vec);
    load_tile(tile(n, 1), p.k, p.k_s, b, h, p, t0, cn, K, vec);
    load_tile(tile(n, 2), p.v, p.v_s, b, h, p, t0, cn, V, vec);
    load_tile(tile(n, 3), dk.q, dk.q_s, b, h, p, t0, cn, V, vec);
    copy_async_commit();
  };
  if (chunks > 0) copy_chunk(0);
  for (int n_chunk = 0; n_chunk < chunks; ++n_chunk) {
    const int t0 = n_chunk * C, cn = min(C, L - t0);
    const unsigned qt = smem_address(tile(n_chunk, 0)), kt = smem_address(tile(n_chunk, 1)),
                   vt = smem_address(tile(n_chunk, 2));
    // 1. Start copying the next chunk (its buffer was last read before the previous barrier);
    //    publish S_[c] as hi + lo (and expose it when asked).
    if (n_chunk + 1 < chunks) copy_chunk(n_chunk + 1);
#pragma unroll
    for (int n = 0; n < kTcStateKeys / 8; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = state_rows + g + 8 * half, c = state_key0 + 8 * n + 2 * t;
        unsigned hi, lo;
        split_operand<Policy>(S[n][2 * half], S[n][2 * half + 1], hi, lo);
        *reinterpret_cast<unsigned*>(Shi + r * kTcLd + c) = hi;
        *reinterpret_cast<unsigned*>(Slo + r * kTcLd + c) = lo;
      }
    if (p.boundary)
      store_state_slice(S, static_cast<float*>(p.boundary) + ((std::int64_t(b) * p.heads + h) * ((L + C - 1) / C) + n_chunk) * V * K,
                        K, 1, V, K, state_rows + g, state_key0 + 2 * t);
    // This thread's copies of chunk c have landed (only the next chunk's group may be pending);
    // the barrier publishes everyone's.
    if (n_chunk + 1 < chunks) copy_async_wait<1>();
    else copy_async_wait<0>();
    __syncthreads();

    // 2. Scores Q Kᵀ, and the state update of this warp's rows, S += Vᵀ K over the chunk
    //    (S_[c] is already in shared memory).
    if (computes_output) tc_scores<C, Policy>(qt, kt, Phi, Plo, lo136, row_block, column_group, lane);
    const unsigned v_rows = vt + lo136.a_trans + state_rows * 2, k_cols = kt + lo136.b_trans + state_key0 * 2;
#pragma unroll
    for (int jj = 0; jj < Shape::kRowBlocks; ++jj) {
      if (jj * 16 >= cn) break;  // zero rows add nothing
      // Vᵀ rows c = state rows, from V stored [j][c], and K stored [j][key]: transposed ldmatrix.
      unsigned a[4], bk[kTcStateKeys / 16][4];
      ldmatrix_x4_trans(a, v_rows + jj * 16 * kTcLd * 2);
#pragma unroll
      for (int n = 0; n < kTcStateKeys / 8; n += 2) ldmatrix_x4_trans(bk[n / 2], k_cols + (jj * 16 * kTcLd + 8 * n) * 2);
      mma_row(S, a, bk);
    }
    __syncthreads();  // P is published
    // 3. O = P V + Q Sᵀ.
    if (computes_output)
      tc_output<C, false>(p, p.out, p.out_s, V, vt, qt, smem_base, lo136, lo72, row_block, column_group, lane, b, h, t0,
                          cn, vec);
    // The dK pass on the same tiles: scores V dOᵀ, then dK = P Q + V G (G = S_[c] read transposed).
    const unsigned vt_dk = smem_address(tile(n_chunk, 3));
    __syncthreads();  // P has been read
    if (computes_output) tc_scores<C, Policy>(vt_dk, vt, Phi, Plo, lo136, row_block, column_group, lane);
    __syncthreads();  // P is published
    if (computes_output)
      tc_output<C, true>(dk, dk.out, dk.out_s, K, kt, vt_dk, smem_base, lo136, lo72, row_block, column_group, lane, b, h,
                         t0, cn, vec);
    __syncthreads();  // S_hi/lo, P and this chunk's tiles are rewritten next
  }
  if (p.s_final)
    store_state_slice(S, static_cast<float*>(p.s_final) + b * p.sf_b + h * p.sf_h, p.sf_r, p.sf_c, V, K, state_rows + g,
                      state_key0 + 2 * t);
}

// ---------------------------------------------------------------------------------------
// Tensor-core forward pass (the forward and the dQ pass): the state never goes through shared
// memory. ncu on the earlier pass that staged it there (docs/kernels/linear_attention.md) put the shared-memory pipe at 69 % of its wavefronts,
// 40 % of them the state's hi/lo copy that each of four row-block warps read for Q Sᵀ. Here each warp
// multiplies its own state slice (the accumulators of pass_tensor_core_dk_dv's layout: rows 16·(w%8).., keys
// 64·(w/8)..) into the output, transposed: Oᵀ = S Qᵀ, the accumulators split hi + lo in registers as the A
// operand (two neighbouring n8 accumulator tiles are one k16 A fragment). Oᵀ += Vᵀ Pᵀ over half of P's
// column blocks (the other half in the other key half's warp, the same work), and the two key halves'
// partial Oᵀ meet in shared memory: each half publishes its partial of the other half's token tiles and adds
// the other's into its own, writing O as bf16 into a tile that the block stores row by row (docs/kernels/linear_attention.md).
// Per chunk:
//   1. wait for chunk c; barrier; start copying chunk c + 1 (every read of its buffer, chunk c − 1's, is
//      behind that barrier);
//   2. score blocks → P as hi/lo (tc_scores); Oᵀ = S_[c] Qᵀ over this warp's keys; S += Vᵀ K; barrier;
//   3. Oᵀ += Vᵀ Pᵀ over this warp's column blocks of P; barrier; the pair's partials summed into the
//      output tile; barrier; O stored.
// Sums: the same products as tc_output (the same hi/lo operands), in another order: per key half, the
// state products k-step by k-step, then P's; the halves added once.

struct TcForwardLayout {
  static constexpr unsigned tile = 64 * kTcLd * 2;
  static constexpr unsigned phi = 0, plo = phi + 64 * kTcPLd * 2, tiles = plo + 64 * kTcPLd * 2,
                            partials = tiles + 2 * 3 * tile,              // [8 row blocks][64 / 8][32 lanes] float4
                            out = partials + kTcStateRowBlocks * 64 * 16 * 4,  // [64][kTcLd] bf16 output tile
                            bytes = out + tile;
};
static_assert(TcForwardLayout::bytes <= 227 * 1024, "the forward pass must fit one SM's shared memory");

template <int C, class Policy, bool kSegments = false>
__global__ void __launch_bounds__(kTcThreads, 1) pass_tensor_core_forward(Pass pass, bool vec) {
  constexpr int kBlocks = C / 16, kTokenTiles = C / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Phi = reinterpret_cast<bf16*>(smem + TcForwardLayout::phi);  // [64][kTcPLd] masked scores
  bf16* Plo = reinterpret_cast<bf16*>(smem + TcForwardLayout::plo);
  bf16* tiles = reinterpret_cast<bf16*>(smem + TcForwardLayout::tiles);  // [2][3][64][kTcLd]: q', k', v'
  float4* partials = reinterpret_cast<float4*>(smem + TcForwardLayout::partials);
  bf16* out_tile = reinterpret_cast<bf16*>(smem + TcForwardLayout::out);  // [64][kTcLd]: O rows (tokens)
  const unsigned smem_base = smem_address(smem);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  int b = blockIdx.y / pass.heads, h = blockIdx.y % pass.heads;
  const Pass p = kSegments ? block_sequence<bf16, float>(pass, b, h) : pass;
  const bool outputs = !kSegments || p.out != nullptr;  // a segment-sum pass computes the state alone
  const int K = p.key_dim, V = p.value_dim, L = p.length;
  const int state_block = warp % kTcStateRowBlocks, key_half = warp / kTcStateRowBlocks;
  const int state_rows = 16 * state_block, state_key0 = kTcStateKeys * key_half;
  const LaneOffsets lo136(lane, kTcLd), lo72(lane, kTcPLd);

  float S[kTcStateKeys / 8][4];
  load_state_slice<Policy>(S, p, b, h, state_rows + g, state_key0 + 2 * t);

  const int chunks = chunks_of<Policy, C>(p);
  const auto tile = [&](int n, int which) { return tiles + ((n % 2) * 3 + which) * 64 * kTcLd; };
  const auto copy_chunk = [&](int n) {  // chunk n into buffer n % 2, one commit group
    const int t0 = n * C, cn = min(C, L - t0);
    if (outputs) load_tile(tile(n, 0), p.q, p.q_s, b, h, p, t0, cn, K, vec);
    load_tile(tile(n, 1), p.k, p.k_s, b, h, p, t0, cn, K, vec);
    load_tile(tile(n, 2), p.v, p.v_s, b, h, p, t0, cn, V, vec);
    copy_async_commit();
  };
  if (chunks > 0) copy_chunk(0);
  for (int n_chunk = 0; n_chunk < chunks; ++n_chunk) {
    const int t0 = n_chunk * C, cn = min(C, L - t0);
    const unsigned qt = smem_address(tile(n_chunk, 0)), kt = smem_address(tile(n_chunk, 1)),
                   vt = smem_address(tile(n_chunk, 2));
    // 1. S_[c] exposed when asked; chunk c landed and published; chunk c + 1 requested.
    if (p.boundary)
      store_state_slice(S, static_cast<float*>(p.boundary) + ((std::int64_t(b) * p.heads + h) * ((L + C - 1) / C) + n_chunk) * V * K,
                        K, 1, V, K, state_rows + g, state_key0 + 2 * t);
    copy_async_wait<0>();
    __syncthreads();
    if (n_chunk + 1 < chunks) copy_chunk(n_chunk + 1);

    // 2. Score blocks; Oᵀ = S_[c] Qᵀ over this warp's keys (Q stored [token][key]: plain ldmatrix gives the
    //    col-major B); then S += Vᵀ K.
    // Score block k, in the order (0, 0), (1, 0), (1, 1), (2, 0), …, on warp k: consecutive warps sit on different
    // schedulers (warp % 4), so each scheduler computes 2 or 3 of the 10 blocks at C = 64, where the (row block,
    // column group) mapping of pass_tensor_core_dk_dv gives its schedulers 4, 3, 2 and 1. tc_scores with column
    // group jj computes block (row block, jj) alone, as its column groups are at least C / 16. (Formed here, not
    // kept from the kernel's start: kept, they cost 108 bytes of spills at C = 64.)
    static_assert(TcShape<C>::kColumnGroups >= kBlocks);
    if (outputs && warp < kBlocks * (kBlocks + 1) / 2) {
      const int rb = warp < 1 ? 0 : warp < 3 ? 1 : warp < 6 ? 2 : 3;
      tc_scores<C, Policy>(qt, kt, Phi, Plo, lo136, rb, warp - rb * (rb + 1) / 2, lane);
    }
    float O[kTokenTiles][4];
#pragma unroll
    for (int n = 0; n < kTokenTiles; ++n) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.f;
    const unsigned q_rows = qt + lo136.b + state_key0 * 2;
    if (outputs) {
#pragma unroll
      for (int kk = 0; kk < kTcStateKeys / 16; ++kk) {
        unsigned ah[4], al[4], bq[kBlocks][4];
#pragma unroll
        for (int m = 0; m < kBlocks; ++m) ldmatrix_x4(bq[m], q_rows + (16 * m * kTcLd + 16 * kk) * 2);
        split_operand<Policy>(S[2 * kk][0], S[2 * kk][1], ah[0], al[0]);
        split_operand<Policy>(S[2 * kk][2], S[2 * kk][3], ah[1], al[1]);
        split_operand<Policy>(S[2 * kk + 1][0], S[2 * kk + 1][1], ah[2], al[2]);
        split_operand<Policy>(S[2 * kk + 1][2], S[2 * kk + 1][3], ah[3], al[3]);
        mma_row(O, ah, bq);
        mma_row(O, al, bq);
      }
    }
    const unsigned v_rows = vt + lo136.a_trans + state_rows * 2, k_cols = kt + lo136.b_trans + state_key0 * 2;
#pragma unroll
    for (int jj = 0; jj < kBlocks; ++jj) {
      if (jj * 16 >= cn) break;  // zero rows add nothing
      unsigned a[4], bk[kTcStateKeys / 16][4];
      ldmatrix_x4_trans(a, v_rows + jj * 16 * kTcLd * 2);
#pragma unroll
      for (int n = 0; n < kTcStateKeys / 8; n += 2) ldmatrix_x4_trans(bk[n / 2], k_cols + (jj * 16 * kTcLd + 8 * n) * 2);
      mma_row(S, a, bk);
    }
    if (!outputs) continue;  // the next chunk's first barrier orders the tiles' reuse
    __syncthreads();  // P is published

    // 3. Oᵀ += Vᵀ Pᵀ over the column blocks jj of P this key half takes (jj = 0, 3 and 1, 2 at C = 64: the
    //    same number of tiles); Pᵀ's B fragments are P's rows i ≥ jj, stored [i][j]: plain ldmatrix.
#pragma unroll
    for (int jj = 0; jj < kBlocks; ++jj) {
      if (((jj + 1) >> 1 & 1) != key_half) continue;
      unsigned a[4];
      ldmatrix_x4_trans(a, v_rows + jj * 16 * kTcLd * 2);
      const unsigned p_rows = smem_base + TcForwardLayout::phi + lo72.b + jj * 32;
      // Every hi product before the lo ones: a tile's two products are then kBlocks − jj pairs apart, not
      // back to back (the same order per tile: the same bits).
#pragma unroll
      for (int ib = jj; ib < kBlocks; ++ib) {
        unsigned bh[4];
        ldmatrix_x4(bh, p_rows + 16 * ib * kTcPLd * 2);
        mma_16816<bf16>(O[2 * ib], a, bh[0], bh[1]);
        mma_16816<bf16>(O[2 * ib + 1], a, bh[2], bh[3]);
      }
#pragma unroll
      for (int ib = jj; ib < kBlocks; ++ib) {
        unsigned bl[4];
        ldmatrix_x4(bl, p_rows + (TcForwardLayout::plo - TcForwardLayout::phi) + 16 * ib * kTcPLd * 2);
        mma_16816<bf16>(O[2 * ib], a, bl[0], bl[1]);
        mma_16816<bf16>(O[2 * ib + 1], a, bl[2], bl[3]);
      }
    }
    // Full barriers: the upper half has nothing to do before the next chunk's first barrier anyway. (A version
    // with named barriers, one per warp pair and one for the lower half, made racecheck report hazards between
    // P's writes and reads on runs of several chunks; why was not pinned down.)
    // Each half sums the pair's partials of half of the token tiles (the lower half the first ones): it publishes
    // its partial of the other half's tiles and adds the other's into its own (fp32 addition commutes: the bits
    // of lower + upper).
    float4* pair = partials + state_block * kTokenTiles * 32 + lane;
    constexpr int kHalf = kTokenTiles / 2;
    const auto publish = [&](int n) { pair[n * 32] = make_float4(O[n][0], O[n][1], O[n][2], O[n][3]); };
    // Oᵀ rows state_rows + g (+ 8), columns (tokens) 8n + 2t (+ 1) → O[token][value] in the bf16 tile.
    const auto finish = [&](int n) {
      const float4 other = pair[n * 32];
      const float sum[4] = {O[n][0] + other.x, O[n][1] + other.y, O[n][2] + other.z, O[n][3] + other.w};
#pragma unroll
      for (int x = 0; x < 4; ++x)
        out_tile[(8 * n + 2 * t + x % 2) * kTcLd + state_rows + g + 8 * (x / 2)] = __float2bfloat16_rn(sum[x]);
    };
    if (key_half == 0) {
#pragma unroll
      for (int n = kHalf; n < kTokenTiles; ++n) publish(n);
    } else {
#pragma unroll
      for (int n = 0; n < kHalf; ++n) publish(n);
    }
    __syncthreads();  // the partials are published
    if (key_half == 0) {
#pragma unroll
      for (int n = 0; n < kHalf; ++n) finish(n);
    } else {
#pragma unroll
      for (int n = kHalf; n < kTokenTiles; ++n) finish(n);
    }
    __syncthreads();  // the output tile is complete
    bf16* out = static_cast<bf16*>(p.out) + b * p.out_s.batch + h * p.out_s.head;
    if (vec) {  // rows 16-byte aligned, V a multiple of 8: 16 bytes a thread, whole rows per warp
      for (int e = threadIdx.x; e < cn * (kTcDim / 8); e += kTcThreads) {
        const int i = e / (kTcDim / 8), c = (e % (kTcDim / 8)) * 8;
        if (c < V) *reinterpret_cast<uint4*>(out + token_row(p, t0 + i) * p.out_s.row + c) =
                       *reinterpret_cast<const uint4*>(out_tile + i * kTcLd + c);
      }
    } else {
      for (int e = threadIdx.x; e < cn * kTcDim; e += kTcThreads) {
        const int i = e / kTcDim, c = e % kTcDim;
        if (c < V) out[token_row(p, t0 + i) * p.out_s.row + c] = out_tile[i * kTcLd + c];
      }
    }
  }
  if (p.s_final)
    store_state_slice(S, static_cast<float*>(p.s_final) + b * p.sf_b + h * p.sf_h, p.sf_r, p.sf_c, V, K, state_rows + g,
                      state_key0 + 2 * t);
}

}  // namespace
}  // namespace deltaproof::cuda::linear_attention
