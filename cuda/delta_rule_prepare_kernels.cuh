// Stage 1 of the chunkwise DeltaNet / Gated DeltaNet forward (and of the tensor-core backward's own
// forward): wy_prepare_async_kernel, one block per (chunk, head) (docs/kernels/delta_rule.md; the synchronous
// wy_prepare_kernel before it measured slower on the H200 and was removed: commit c5339b7 has it). Included by delta_rule_forward_kernels.cuh, so that the CPU
// emulation (property_tests/support/cuda_emulation.hpp) compiles this source under its own namespace too.
//
//   A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ)   fp32, Gram on mma.sync (bf16/fp16) or fp32 FMA
//   T = A⁻¹                                     fp32 FMA: 16×16 forward substitution, merges 16→32→64
//   W = T diag(βγ) K,  U = T diag(β) V          fp32 factor split hi + lo in the dtype, two mma.sync
//   P = Q Kᵀ ⊙ Γ ⊙ M (p.scores given)            the register scan's masked scores, rounded once to the dtype:
//                                                formed here, beside K Kᵀ, so that the sequential scan does not
//                                                (docs/kernels/delta_rule.md, "Scores in the prepare")
//
// What differs from the synchronous prepare (whose time went to waiting, docs/kernels/delta_rule.md): K (and Q, when the scores are formed)
// is requested at once by cp.async, β and g alongside, and V once A is built (it lands while T is); the
// Gram product is mma.sync straight into registers, where A is formed and stored; T is built in place of A
// in one fp32 buffer, whose bytes then hold the factors' hi and lo parts (no separate factor space: 53 KB
// at C = 64, DK = DV = 128); the W and U products pair a short and a long row block per warp so that every
// warp does the same work.
#pragma once

#include "cuda/delta_rule_forward_kernels.cuh"

namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS {

// Planted bugs for the emulation tests, as compile-time policies (no bug code runs in the product):
// the faithful kernel reads row i of A for row i of a diagonal block, and keeps every term of a merge.
struct FaithfulPrepare {
  __host__ __device__ static constexpr int substitution_row(int i) { return i; }
  __host__ __device__ static constexpr bool keeps_merge_term(int /*row*/, int /*m*/) { return true; }
};

// Warps per block: 8 at C = 64 (the merges and products have work for all), 4 at C = 32, 2 at C = 16, where a
// block's work is small and more blocks per SM keep more loads in flight (16 at C = 16, registers permitting).
__host__ __device__ constexpr int wy_prepare_async_threads(int chunk) { return chunk == 64 ? 256 : chunk == 32 ? 128 : 64; }
// Blocks per SM the launch bounds ask registers for (64 registers per thread at each C).
__host__ __device__ constexpr int wy_prepare_async_min_blocks(int chunk) { return chunk == 64 ? 4 : chunk == 32 ? 8 : 16; }

// fp32 system buffer: A, then T in place (the upper blocks park the merges' A21 T11), then the factor's
// hi and lo parts in the dtype, [C][C + 8] each: (C + 8) floats per row hold exactly both.
__host__ __device__ constexpr int system_pitch(int chunk) { return chunk + 8; }

struct WyAsyncLayout {
  std::size_t keys, values, system, beta, gates, w_scale, bytes;
};

__host__ __device__ inline WyAsyncLayout wy_prepare_async_layout(int element_size, int chunk, int key_dim, int value_dim) {
  WyAsyncLayout l{};
  Carver c;
  l.keys = c.take(static_cast<std::size_t>(chunk) * operand_pitch(round_up(key_dim, 16)) * element_size);
  // V's buffer holds Q first when the scores are formed (Q is read by the Gram loop, V only by U's product).
  const int widest = round_up(value_dim > key_dim ? value_dim : key_dim, 16);
  l.values = c.take(static_cast<std::size_t>(chunk) * operand_pitch(widest) * element_size);
  l.system = c.take(static_cast<std::size_t>(chunk) * system_pitch(chunk) * 4);
  l.beta = c.take(chunk * 4);
  l.gates = c.take(chunk * 4);
  l.w_scale = c.take(chunk * 4);
  l.bytes = c.offset;
  return l;
}

// Where token t of this block's chunk lives: the one place that knows the layouts. Inputs follow the user's
// strides (cuda/layout.hpp: the chunk's first row and the row stride, in elements); the intermediates W, U,
// w_lo and u_lo are packed [B, H, L, D] (row token0 + t).
template <class P>
struct ChunkRows {
  P* first;
  std::int64_t stride;
  __device__ __forceinline__ P* row(int t) const { return first + t * stride; }
};
template <class P>
__device__ __forceinline__ ChunkRows<P> chunk_rows(P* data, const Strides& s, int b, int h, int begin) {
  return {data != nullptr ? data + s.head_offset(b, h) + std::int64_t{begin} * s.row : nullptr, s.row};
}
struct ChunkTokens {
  std::size_t token0;  // head · L + first token of the chunk
  template <class P>
  __device__ __forceinline__ P* row(P* base, int t, int dim) const {
    return base + (token0 + t) * static_cast<std::size_t>(dim);
  }
};

// (bi, bj), bj ≤ bi, of the tile-th 16×16 tile on or below the diagonal, row by row (C ≤ 64: ten tiles), read
// from two constant bit fields (2 bits a tile) instead of a loop: it runs for every pair of T a thread owns.
__host__ __device__ constexpr unsigned lower_tile_field(bool column) {
  unsigned field = 0;
  for (int bi = 0, tile = 0; bi < 4; ++bi)
    for (int bj = 0; bj <= bi; ++bj, ++tile) field |= unsigned(column ? bj : bi) << (2 * tile);
  return field;
}
__device__ __forceinline__ void lower_tile(int tile, int& bi, int& bj) {
  constexpr unsigned kRows = lower_tile_field(false), kColumns = lower_tile_field(true);
  bi = (kRows >> (2 * tile)) & 3, bj = (kColumns >> (2 * tile)) & 3;
}

// f(x0, x1, row, col) for each pair of an m16n8k16 accumulator pair acc[2][4] holding the 16×16 tile at (row0,
// col0): rows row0 + g + 8·half, columns col0 + 8n + 2t and the next (mma.sync's accumulator layout).
template <class F>
__device__ __forceinline__ void for_each_accumulator_pair(const float (&acc)[2][4], int row0, int col0, F&& f) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) f(acc[n][2 * half], acc[n][2 * half + 1], row0 + g + 8 * half, col0 + 8 * n + 2 * t);
}

// Rows of a chunk (dim columns each, zero past size rows and dim columns, up to cols_pad) into [C][pitch]:
// cp.async when the rows are whole 16-byte vectors (the caller commits and waits), plain loads otherwise
// (odd head dims, unaligned pointers: the rare case, left slow).
template <class T, int C, int kThreads>
__device__ void load_chunk_rows(T* dst, int pitch, ChunkRows<const T> src, int dim, int size, int cols_pad) {
  constexpr int V = 16 / sizeof(T);
  if (dim % V == 0 && (reinterpret_cast<std::uintptr_t>(src.first) & 15) == 0 && (size == 1 || src.stride % V == 0)) {
    const int vecs = cols_pad / V;  // per row
    auto copy = [&](int r, int c) {
      const bool valid = r < size && c < dim;
      copy_async_16(dst + r * pitch + c, valid ? src.row(r) + c : src.first, valid);
    };
    if constexpr (sizeof(T) == 2) {  // whole rows of the widest head dim: the shared row copy
      if (cols_pad == kTcKeys && pitch == kTcLd) {
        copy_rows_async<kThreads, C>(dst, src.first, src.stride, size, dim, int(threadIdx.x));
        return;
      }
    }
    if (kThreads % vecs == 0) {  // every lane busy: one column per thread, rows kThreads / vecs apart
      const int c = int(threadIdx.x) % vecs * V;
      for (int r = int(threadIdx.x) / vecs; r < C; r += kThreads / vecs) copy(r, c);
    } else {
      for_each_2d(C, vecs, [&](int r, int vec) { copy(r, vec * V); });
    }
    return;
  }
  for_each_2d(C, cols_pad, [&](int r, int c) { dst[r * pitch + c] = (r < size && c < dim) ? src.row(r)[c] : from_float<T>(0.0f); });
}

// Two consecutive fp32 entries of an optional [.., C, C] output (4-byte aligned by the API: one 8-byte
// store when it is 8-byte aligned).
__device__ __forceinline__ void store_float2(float* dst, float x, float y) {
  if ((reinterpret_cast<std::uintptr_t>(dst) & 7) == 0) {
    *reinterpret_cast<float2*>(dst) = make_float2(x, y);
  } else {
    dst[0] = x, dst[1] = y;
  }
}

// The 16×16 diagonal blocks of T by forward substitution, all at once, one half-warp each, lane j
// owning column j (x_jj = 1, x_ij = −Σ_{j≤m<i} a_im x_mj: fmaf in m order, at most 15 roundings deep),
// written over A's diagonal blocks once the warp has read them. Whole warps run it (at C = 16 the second
// half-warp repeats block 0 and does not write), so that __syncwarp has every lane.
template <int C, class Policy>
__device__ __forceinline__ void invert_diagonal_blocks(float* sys) {
  constexpr int ps = system_pitch(C), kBlocks = C / 16;
  const int half = threadIdx.x / 16, j = threadIdx.x % 16;
  if (half >= round_up(kBlocks, 2)) return;
  const int r0 = 16 * (half % kBlocks);
  float x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float* row = sys + (r0 + Policy::substitution_row(i)) * ps + r0;
    float sum = 0.0f;  // a_im one load each: float4 rows let ptxas hoist them all and spill (64 registers)
#pragma unroll
    for (int m = 0; m < i; ++m)
      if (m >= j) sum = fmaf(row[m], x[m], sum);
    x[i] = i < j ? 0.0f : (i == j ? 1.0f : -sum);
  }
  __syncwarp();
  if (half < kBlocks)
#pragma unroll
    for (int i = 0; i < 16; ++i) sys[(r0 + i) * ps + r0 + j] = x[i];
}

// One merge level S → 2S on every pair of S-blocks (r0 = 2S·pair): T21 = −T22 (A21 T11), fp32 fmaf, the
// sums in m order (the synchronous prepare's, so the same bits). Pass 1: X = A21 T11 (≤ S terms), parked in the pair's upper
// block; T11 is block lower triangular, so the threads of column group cg (16 columns) start at m = 16 cg.
// Pass 2: T21 = −T22 X (≤ S terms, m ≤ i) in place of A21. Rows of A21 and T22 are read four at a time
// (float4: every row and r0 are 16-byte aligned); each thread owns R rows of one column. Two barriers.
template <int C, int S, int kThreads, class Policy>
__device__ __forceinline__ void merge_level(float* sys) {
  constexpr int ps = system_pitch(C), kPairs = C / (2 * S), R = kPairs * S * S / kThreads;
  constexpr int kGroups = S / 16, kGroupThreads = kThreads / kGroups;
  static_assert(R >= 1 && R * kThreads == kPairs * S * S && kGroupThreads % 32 == 0, "whole rows, warp-uniform groups");
  const int tid = threadIdx.x;
  float acc[R];
  {
    const int group = tid / kGroupThreads, j = 16 * group + tid % 16, first = (tid % kGroupThreads / 16) * R;
    const int r0 = first / S * 2 * S, i0 = first % S;
    const float* a21 = sys + (r0 + S) * ps + r0;
    const float* t11 = sys + r0 * ps + r0;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int m0 = 0; m0 < S; m0 += 4) {
      if (m0 < 16 * group) continue;  // T11's blocks above the diagonal are zero
      float t[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) t[e] = m0 + e >= j ? t11[(m0 + e) * ps + j] : 0.0f;  // above: parked X; + 0 is exact
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 a = *reinterpret_cast<const float4*>(a21 + (i0 + r) * ps + m0);
        acc[r] = fmaf(a.x, t[0], acc[r]);
        acc[r] = fmaf(a.y, t[1], acc[r]);
        acc[r] = fmaf(a.z, t[2], acc[r]);
        acc[r] = fmaf(a.w, t[3], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) sys[(r0 + i0 + r) * ps + r0 + S + j] = acc[r];
  }
  __syncthreads();
  {
    const int j = tid % S, first = (tid / S) * R;
    const int r0 = first / S * 2 * S, i0 = first % S;
    const float* x_block = sys + r0 * ps + r0 + S;
    const float* t22 = sys + (r0 + S) * ps + r0 + S;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int m0 = 0; m0 < S; m0 += 4) {
      if (m0 > i0 + R - 1) break;  // T22 is lower triangular: row i needs m ≤ i
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = x_block[(m0 + e) * ps + j];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 v = *reinterpret_cast<const float4*>(t22 + (i0 + r) * ps + m0);
        const float t[4] = {v.x, v.y, v.z, v.w};
        if (m0 + 3 <= i0) {  // the whole group is on or left of every row's diagonal (m0 + 3 ≤ i0 ≤ i0 + r)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (Policy::keeps_merge_term(i0 + r, m0 + e)) acc[r] = fmaf(t[e], x[e], acc[r]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (m0 + e <= i0 + r && Policy::keeps_merge_term(i0 + r, m0 + e)) acc[r] = fmaf(t[e], x[e], acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) sys[(r0 + S + i0 + r) * ps + r0 + j] = -acc[r];
  }
  __syncthreads();
}

// out (size × cols rows of a [.., L, ld] tensor) ← factor · operand on mma.sync: the factor's hi and lo
// parts (A, ldmatrix) times the operand rows (B, transposed ldmatrix), accumulators rounded to T and
// stored from registers (and, kLo, what the rounding left into out_lo: the backward's W, U as hi + lo;
// a compile-time choice, so that the forward's product does not compute residuals it never stores). The
// factor is lower triangular: row block rb needs k blocks 0..rb. Each warp takes row blocks p and R − 1 − p
// (R + 1 k blocks in all, the same for every warp) and every G-th 16-column block.
template <class T, int C, int kWarps, bool kLo>
__device__ void wy_product_paired(const T* hi, const T* lo, const T* operand, int op_pitch, T* out, T* out_lo,
                                  ChunkTokens at, int ld, int size, int cols) {
  constexpr int R = C / 16, kPairs = R > 1 ? R / 2 : 1, G = kWarps / kPairs, pf = system_pitch(C);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int pair = warp % kPairs;
  const bool pairs = cols % 2 == 0 && (reinterpret_cast<std::uintptr_t>(out) & 3) == 0 &&
                     (!kLo || (reinterpret_cast<std::uintptr_t>(out_lo) & 3) == 0);
  // Whole tiles through store_tile_pairs (8 bytes a lane) where rows are 8-byte aligned; elsewhere 4-byte pair
  // stores, which fill half of two sectors each (the pattern that cost the state pass half its time).
  const bool sectors = pairs && cols % 4 == 0 && (reinterpret_cast<std::uintptr_t>(out) & 7) == 0 &&
                       (!kLo || (reinterpret_cast<std::uintptr_t>(out_lo) & 7) == 0);
  // The pair (x0, x1) rounded to T and, kLo, the residual x − rounded.
  auto round_pair = [](float x0, float x1, unsigned& rounded, unsigned& residual) {
    if constexpr (kLo) split_pair<T>(x0, x1, rounded, residual);
    else rounded = pack_pair<T>(x0, x1);
  };
#pragma unroll 1
  for (int which = 0; which < (R > 1 ? 2 : 1); ++which) {
    const int rb = which == 0 ? pair : R - 1 - pair, i0 = 16 * rb;
    for (int cb = warp / kPairs; cb < (cols + 15) / 16; cb += G) {
      float acc[2][4] = {};
      for (int kk = 0; kk <= rb; ++kk) {
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
      if (sectors && i0 + 16 <= size && cb * 16 + 16 <= cols) {  // a whole tile (warp-uniform): no checks, and
        const std::size_t eight_rows = std::size_t(8) * ld;      // a row's four lanes write one whole sector
        T* row = at.row(out, i0 + lane / 4, ld) + cb * 16;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          unsigned rounded[2], residual[2];
#pragma unroll
          for (int n = 0; n < 2; ++n) round_pair(acc[n][2 * half], acc[n][2 * half + 1], rounded[n], residual[n]);
          store_tile_pairs<T>(row + half * eight_rows, rounded[0], rounded[1], lane % 4, true, 16);
          if constexpr (kLo) {
            T* row_lo = at.row(out_lo, i0 + lane / 4, ld) + cb * 16;
            store_tile_pairs<T>(row_lo + half * eight_rows, residual[0], residual[1], lane % 4, true, 16);
          }
        }
        continue;
      }
      for_each_accumulator_pair(acc, i0, cb * 16, [&](float x0, float x1, int i, int c) {
        if (i >= size || c >= cols) return;
        T* dst = at.row(out, i, ld) + c;
        T* dst_lo = kLo ? at.row(out_lo, i, ld) + c : nullptr;
        unsigned rounded, residual;
        round_pair(x0, x1, rounded, residual);
        if (pairs) {
          *reinterpret_cast<unsigned*>(dst) = rounded;
          if constexpr (kLo) *reinterpret_cast<unsigned*>(dst_lo) = residual;
        } else {
          dst[0] = reinterpret_cast<const T*>(&rounded)[0];
          if constexpr (kLo) dst_lo[0] = reinterpret_cast<const T*>(&residual)[0];
          if (c + 1 < cols) {
            dst[1] = reinterpret_cast<const T*>(&rounded)[1];
            if constexpr (kLo) dst_lo[1] = reinterpret_cast<const T*>(&residual)[1];
          }
        }
      });
    }
  }
}

// acc += X_bi Kᵀ_bj over `steps` k-steps of 16 (X, K stored [token][key], row pitch `pitch`): the 16×16 tile
// (bi, bj) of X Kᵀ on mma.sync, k in order.
template <class T>
__device__ __forceinline__ void gram_tile(float (&acc)[2][4], const T* x, const T* keys, int pitch, int bi, int bj, int steps) {
  const int lane = threadIdx.x % 32;
  for (int kk = 0; kk < steps; ++kk) {
    unsigned a[4], b[4];  // Kᵀ as B: K stored [token][key], plain ldmatrix gives the col-major B
    ldmatrix_x4(a, x + (16 * bi + lane % 16) * pitch + kk * 16 + (lane / 16) * 8);
    ldmatrix_x4(b, keys + (16 * bj + (lane & 7) + ((lane >> 4) << 3)) * pitch + kk * 16 + ((lane >> 3) & 1) * 8);
    mma_16816<T>(acc[0], a, b[0], b[1]);
    mma_16816<T>(acc[1], a, b[2], b[3]);
  }
}

// The register scan's masked scores P = Q Kᵀ ⊙ Γ ⊙ M for the 16×16 tile (bi, bj) on or below the diagonal,
// from its fp32 accumulators, rounded once to T into the chunk's [C][C] block (`pitch` = C): the decay
// exp2(G_i log2 e − G_j log2 e) and the select that masks j > i exactly as the scan formed them (the same
// bits; `gates` G_i, null without gates, where every decay is 1). Tiles above the diagonal are never
// written: the scan does not read them.
template <class T>
__device__ __forceinline__ void store_scores(const float (&qk)[2][4], T* block, int pitch, const float* gates, int bi, int bj) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * bi + g + 8 * half;
    const float gate_i = gates != nullptr ? gates[i] * kLog2e : 0.0f;
    unsigned pair[2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int j = 16 * bj + 8 * n + 2 * t;
      float x0 = qk[n][2 * half], x1 = qk[n][2 * half + 1];
      if (gates != nullptr) x0 *= exp2_ftz(gate_i - gates[j] * kLog2e), x1 *= exp2_ftz(gate_i - gates[j + 1] * kLog2e);
      pair[n] = pack_pair<T>(j <= i ? x0 : 0.0f, j + 1 <= i ? x1 : 0.0f);
    }
    store_tile_pairs<T>(block + i * pitch + 16 * bj, pair[0], pair[1], t, true, 16);
  }
}

// fp32 inputs (the correctness path): out_in = Σ_{k ≤ i} fl(T_ik s_k) operand_kn by fmaf, T read in place.
template <int C>
__device__ void wy_product_fp32(const float* sys, const float* scale, const float* operand, int op_pitch, float* out,
                                ChunkTokens at, int ld, int size, int cols) {
  constexpr int ps = system_pitch(C);
  for_each_2d(size, cols, [&](int i, int n) {
    float sum = 0.0f;
    for (int k = 0; k <= i; ++k) sum = fmaf(sys[i * ps + k] * scale[k], operand[k * op_pitch + n], sum);
    at.row(out, i, ld)[n] = sum;
  });
}

template <class T, int C, bool Gated, class Policy = FaithfulPrepare>
__global__ void __launch_bounds__(wy_prepare_async_threads(C), wy_prepare_async_min_blocks(C)) wy_prepare_async_kernel(ForwardStageParams p) {
  constexpr int kThreads = wy_prepare_async_threads(C), kWarps = kThreads / 32, R = C / 16, kTiles = R * (R + 1) / 2;
  constexpr int ps = system_pitch(C);
  const int chunk = blockIdx.x, head = blockIdx.y, b = head / p.heads, h = head % p.heads, N = gridDim.x;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim;
  const int begin = chunk * C, size = min(C, L - begin);
  const int dkp = round_up(DK, 16), dvp = round_up(DV, 16), pk = operand_pitch(dkp), pv = operand_pitch(dvp);
  // The chunk's C×C block of wy_system / wy_inverse (packed), computed where used: fewer live registers.
  auto block_cc = [&] { return (static_cast<std::size_t>(head) * N + chunk) * C * C; };
  const int warp = threadIdx.x / 32;
  constexpr bool gated = Gated;  // log-gates given; DeltaNet's instantiation has no gate arithmetic

  extern __shared__ __align__(128) unsigned char smem[];
  const WyAsyncLayout lay = wy_prepare_async_layout(sizeof(T), C, DK, DV);
  T* keys = reinterpret_cast<T*>(smem + lay.keys);      // (C, DK) zero-padded
  T* values = reinterpret_cast<T*>(smem + lay.values);  // (C, DV), lands while T is built; Q before it (scores)
  float* sys = reinterpret_cast<float*>(smem + lay.system);  // (C, C): A, then T, then the factors
  float* beta = reinterpret_cast<float*>(smem + lay.beta);
  float* gates = reinterpret_cast<float*>(smem + lay.gates);
  float* w_scale = reinterpret_cast<float*>(smem + lay.w_scale);  // β_j γ_j (β_j without gates)

  // (1) The loads: K (and with the scores Q, into V's buffer) by cp.async, β and g; V once the Gram loop is
  // done (it lands while T is built).
  const bool scores = kTensorCore<T> && p.scores != nullptr;
  load_chunk_rows<T, C, kThreads>(keys, pk, chunk_rows(static_cast<const T*>(p.k), p.k_strides, b, h, begin), DK, size, dkp);
  if (scores) load_chunk_rows<T, C, kThreads>(values, pk, chunk_rows(static_cast<const T*>(p.q), p.q_strides, b, h, begin), DK, size, dkp);
  copy_async_commit();
  const int tid = threadIdx.x;
  const ChunkRows<const T> beta_in = chunk_rows(static_cast<const T*>(p.beta), p.beta_strides, b, h, begin);
  if (tid < C) beta[tid] = tid < size ? to_float(*beta_in.row(tid)) : 0.0f;
  load_cumulative_gates(gates, chunk_rows(p.log_gate, p.log_gate_strides, b, h, begin).first, p.log_gate_strides.row, size, C);
  copy_async_wait_all();  // this thread's keys (and queries); the barrier publishes everyone's
  __syncthreads();

  // (2) A_ij = β_i exp(G_i − G_j) k_i·k_j for j < i, in fp32, into the system buffer (and wy_system);
  // exp of a non-positive number only, and no gate_exp at all without gates (exactly 1: the same bits).
  auto system_entry = [&](int i, int j, float gram) {
    return j < i ? (gated ? beta[i] * gram * gate_exp(gates[i] - gates[j]) : beta[i] * gram) : 0.0f;
  };
  if constexpr (kTensorCore<T>) {
    for (int tile = warp; tile < kTiles; tile += kWarps) {
      int bi, bj;
      lower_tile(tile, bi, bj);
      float acc[2][4] = {};
      gram_tile<T>(acc, keys, keys, pk, bi, bj, dkp / 16);
      for_each_accumulator_pair(acc, 16 * bi, 16 * bj, [&](float x0, float x1, int i, int j) {
        const float2 value = make_float2(system_entry(i, j, x0), system_entry(i, j + 1, x1));
        *reinterpret_cast<float2*>(sys + i * ps + j) = value;
        if (p.wy_system) store_float2(p.wy_system + block_cc() + i * C + j, i == j ? 1.0f : value.x, i == j + 1 ? 1.0f : value.y);
      });
    }
    if (scores)  // P = Q Kᵀ ⊙ Γ ⊙ M, Q in V's buffer
      for (int tile = warp; tile < kTiles; tile += kWarps) {
        int bi, bj;
        lower_tile(tile, bi, bj);
        float qk[2][4] = {};
        gram_tile<T>(qk, values, keys, pk, bi, bj, dkp / 16);
        store_scores<T>(qk, static_cast<T*>(p.scores) + block_cc(), C, gated ? gates : nullptr, bi, bj);
      }
  } else {
    for (int idx = threadIdx.x; idx < C * C; idx += kThreads) {
      const int i = idx / C, j = idx % C;
      if (j / 16 > i / 16) continue;
      float gram = 0.0f;
      if (j < i)
        for (int c = 0; c < DK; ++c) gram = fmaf(to_float(keys[i * pk + c]), to_float(keys[j * pk + c]), gram);
      const float value = system_entry(i, j, gram);
      sys[i * ps + j] = value;
      if (p.wy_system) p.wy_system[block_cc() + idx] = i == j ? 1.0f : value;
    }
  }
  if (p.wy_system)  // above the diagonal blocks: zero
    for (int idx = threadIdx.x; idx < C * C; idx += kThreads)
      if ((idx % C) / 16 > (idx / C) / 16) p.wy_system[block_cc() + idx] = 0.0f;
  if (tid < C) w_scale[tid] = gated ? beta[tid] * gate_exp(gates[tid]) : beta[tid];
  __syncthreads();
  // V into its buffer (Q there has been read: the barrier above); it lands while T is built.
  load_chunk_rows<T, C, kThreads>(values, pv, chunk_rows(static_cast<const T*>(p.v), p.v_strides, b, h, begin), DV, size, dvp);
  copy_async_commit();

  // (3) T = A⁻¹ in place: diagonal blocks, then the merges (16 → 32 → 64).
  invert_diagonal_blocks<C, Policy>(sys);
  __syncthreads();
  if constexpr (C >= 32) merge_level<C, 16, kThreads, Policy>(sys);
  if constexpr (C >= 64) merge_level<C, 32, kThreads, Policy>(sys);

  // (4) This thread's pairs (i, j..j+1) of T's lower tiles into registers (wy_inverse written from them).
  constexpr int kPairs = kTiles * 128 / kThreads;
  static_assert(kPairs * kThreads == kTiles * 128, "every thread whole pairs");
  auto pair_at = [&](int q, int& i, int& j) {  // recomputed where needed: cheaper than registers held across W
    const int index = tid + q * kThreads, e = index % 128;
    int bi, bj;
    lower_tile(index / 128, bi, bj);
    i = 16 * bi + e / 8, j = 16 * bj + 2 * (e % 8);
  };
  float2 tv[kPairs];
#pragma unroll
  for (int q = 0; q < kPairs; ++q) {
    int i, j;
    pair_at(q, i, j);
    tv[q] = make_float2(j <= i ? sys[i * ps + j] : 0.0f, j + 1 <= i ? sys[i * ps + j + 1] : 0.0f);
    if (p.wy_inverse) store_float2(p.wy_inverse + block_cc() + i * C + j, tv[q].x, tv[q].y);
  }
  if (p.wy_inverse) {  // above the diagonal blocks: zero, four entries a step (whole float4s when aligned)
    float* out = p.wy_inverse + block_cc();
    const bool aligned = (reinterpret_cast<std::uintptr_t>(out) & 15) == 0;
    block_for<C * C / 4, kThreads>(tid, [&](int e) {
      const int i = e / (C / 4), j = 4 * (e % (C / 4));
      if (j / 16 <= i / 16) return;
      if (aligned) *reinterpret_cast<float4*>(out + i * C + j) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      else out[i * C + j] = out[i * C + j + 1] = out[i * C + j + 2] = out[i * C + j + 3] = 0.0f;
    });
  }

  const ChunkTokens at{static_cast<std::size_t>(head) * L + begin};  // W, U (packed)
  if constexpr (kTensorCore<T>) {
    // (5) The factor T diag(s) in fp32, split hi + lo in T, over T's own bytes (s = βγ for W, β for U).
    T* f_hi = reinterpret_cast<T*>(sys);
    T* f_lo = f_hi + C * ps;
    auto write_factors = [&](const float* scale) {
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        int i, j;
        pair_at(q, i, j);
        unsigned hi, lo;
        split_pair<T>(tv[q].x * scale[j], tv[q].y * scale[j + 1], hi, lo);
        *reinterpret_cast<unsigned*>(f_hi + i * ps + j) = hi;
        *reinterpret_cast<unsigned*>(f_lo + i * ps + j) = lo;
      }
    };
    __syncthreads();  // every thread has read its T
    write_factors(w_scale);
    __syncthreads();
    // W and U from the factor; their lo parts only where asked (the backward's own forward).
    auto product = [&](const T* operand, int pitch, void* out, void* out_lo, int dim) {
      T* const hi_out = static_cast<T*>(out);
      if (out_lo != nullptr)
        wy_product_paired<T, C, kWarps, true>(f_hi, f_lo, operand, pitch, hi_out, static_cast<T*>(out_lo), at, dim, size, dim);
      else
        wy_product_paired<T, C, kWarps, false>(f_hi, f_lo, operand, pitch, hi_out, nullptr, at, dim, size, dim);
    };
    product(keys, pk, p.w, p.w_lo, DK);
    if (gated) {  // U's factor T diag(β); without gates it is W's (the same numbers)
      __syncthreads();
      write_factors(beta);
    }
    copy_async_wait_all();
    __syncthreads();
    product(values, pv, p.u, p.u_lo, DV);
  } else {
    wy_product_fp32<C>(sys, w_scale, keys, pk, static_cast<float*>(p.w), at, DK, size, DK);
    copy_async_wait_all();
    __syncthreads();
    wy_product_fp32<C>(sys, beta, values, pv, static_cast<float*>(p.u), at, DV, size, DV);
  }
}

}  // namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS
