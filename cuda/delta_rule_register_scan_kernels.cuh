// Stage 2 of the chunkwise DeltaNet / Gated DeltaNet forward on the tensor cores: chunk_scan_registers_kernel (the
// register scan, also the tensor-core backward's state pass) and the training forward's chunk_output_kernel, with
// the warp-level pieces they share with the backward's gradient scan. Included by delta_rule_forward_kernels.cuh,
// so that the CPU emulation (property_tests/support/cuda_emulation.hpp) compiles this source under its own
// namespace too.
#pragma once

#include "cuda/delta_rule_forward_kernels.cuh"

namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS {

// The register scan (the fast path; docs/kernels/delta_rule.md): raw tensor cores with the state in
// registers (16-bit inputs, DK ≤ 128, DK and DV multiples of 8). One block of 8 warps per head and 64
// value rows of S; two blocks per SM.

constexpr int kTcScanThreads = 256, kTcSlice = 64, kTcKeys = 128;
constexpr int kTcLd = kTcKeys + 8, kTcVLd = kTcSlice + 8;  // padded rows: ldmatrix without bank conflicts

// The part's entries of the identity: 1 where row − key = `diagonal` (the part's first row minus its first key), zero
// elsewhere and past rows_left / keys_left (the transition summary's S_0 = I).
__device__ __forceinline__ void load_identity_part(float (&S)[8][4], int diagonal, int rows_left, int keys_left, int g, int t) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = g + (x / 2) * 8, c = 8 * n + 2 * t + x % 2;
      S[n][x] = (r < rows_left && c < keys_left && r + diagonal == c) ? 1.0f : 0.0f;
    }
}

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

// The part's fp32 entries (same layout) from and to a strided fp32 tensor: `at` addresses the part's first row
// and key, rows `pitch` apart; entries past rows_left / keys_left read as zero and are not written; a null
// `at` reads zeros and writes nothing.
__device__ __forceinline__ void load_state_part(float (&S)[8][4], const float* at, std::int64_t pitch, int rows_left,
                                                int keys_left, int g, int t) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = g + (x / 2) * 8, c = 8 * n + 2 * t + x % 2;
      S[n][x] = (at != nullptr && r < rows_left && c < keys_left) ? at[r * pitch + c] : 0.0f;
    }
}
__device__ __forceinline__ void store_state_part(const float (&S)[8][4], float* at, std::int64_t pitch, int rows_left,
                                                 int keys_left, int g, int t) {
  if (at == nullptr) return;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = g + (x / 2) * 8, c = 8 * n + 2 * t + x % 2;
      if (r < rows_left && c < keys_left) at[r * pitch + c] = S[n][x];
    }
}

// D[n], D[n + 1] += a · Xᵀ for the n8 tiles n, n + 1 of rows col0.. of a [rows][kTcLd] state tile X given as
// hi + lo (X stored [value][key]: plain ldmatrix gives the col-major B), k-step kk.
template <class T, int kTiles>
__device__ __forceinline__ void mma_state_transposed(float (&D)[kTiles][4], int n, const unsigned (&a)[4], const T* x_hi,
                                                     const T* x_lo, int col0, int kk, int lane) {
  const int at = (col0 + 8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8;
  unsigned bh[4], bl[4];
  ldmatrix_x4(bh, x_hi + at);
  ldmatrix_x4(bl, x_lo + at);
  mma_16816<T>(D[n], a, bh[0], bh[1]);
  mma_16816<T>(D[n + 1], a, bh[2], bh[3]);
  mma_16816<T>(D[n], a, bl[0], bl[1]);
  mma_16816<T>(D[n + 1], a, bl[2], bl[3]);
}

__device__ __forceinline__ void scale_state_part(float (&S)[8][4], float factor) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) S[n][x] *= factor;
}
// S += V̄ᵀ K for a warp's part of the state (rows state_rows.. of V̄ᵀ, keys state_key0..): V̄ from [C][kTcVLd]
// rows (kHiLo: V̄ = v + v_lo, two products), K from [C][kTcLd] rows; tokens past `size` add nothing.
template <class T, int C, bool kHiLo>
__device__ __forceinline__ void update_state_part(float (&S)[8][4], const T* v, const T* v_lo, const T* k_s, int size,
                                                  int k_steps, int state_rows, int state_key0, int lane) {
#pragma unroll
  for (int jj = 0; jj < C / 16; ++jj) {
    if (jj * 16 >= size) break;  // zero rows add nothing
    unsigned a[4], a_lo[4];  // V̄ᵀ rows = value, from V̄ stored [token][value]: transposed ldmatrix
    const int at = (jj * 16 + (lane & 7) + (lane >> 4) * 8) * kTcVLd + state_rows + ((lane >> 3) & 1) * 8;
    ldmatrix_x4_trans(a, v + at);
    if constexpr (kHiLo) ldmatrix_x4_trans(a_lo, v_lo + at);
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
      if (state_key0 + n * 8 >= k_steps * 16) break;
      unsigned bk[4];  // K stored [token][key]: transposed ldmatrix gives the col-major B
      ldmatrix_x4_trans(bk, k_s + (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcLd + state_key0 + 8 * n + (lane >> 4) * 8);
      mma_16816<T>(S[n], a, bk[0], bk[1]);
      mma_16816<T>(S[n + 1], a, bk[2], bk[3]);
      if constexpr (kHiLo) {
        mma_16816<T>(S[n], a_lo, bk[0], bk[1]);
        mma_16816<T>(S[n + 1], a_lo, bk[2], bk[3]);
      }
    }
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

// V −= W (S_hi + S_lo)ᵀ for a warp's 16 rows i0.. and n8 tiles of value columns col0.. (kLo: W's lo part in
// `w_lo`, one more product W_lo S_hiᵀ; the W_lo S_loᵀ term, ≤ u² |W||S|, is left out).
template <class T, bool kLo, int kTiles>
__device__ __forceinline__ void subtract_w_state_product(float (&V)[kTiles][4], const T* w_s, const T* w_lo, const T* s_hi,
                                                         const T* s_lo, int i0, int col0, int k_steps, int lane) {
#pragma unroll
  for (int kk = 0; kk < kTcKeys / 16; ++kk) {
    if (kk >= k_steps) break;
    unsigned a[4], a_lo[4];
    ldmatrix_x4(a, w_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
    if constexpr (kLo) ldmatrix_x4(a_lo, w_lo + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int x = 0; x < 4; ++x) {  // −W: flipping the sign bits is exact
      a[x] ^= 0x80008000u;
      if constexpr (kLo) a_lo[x] ^= 0x80008000u;
    }
#pragma unroll
    for (int n = 0; n < kTiles; n += 2) {
      const T* row = s_hi + (col0 + 8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8;
      unsigned bh[4], bl[4];  // Sᵀ: S stored [value][key], plain ldmatrix gives the col-major B
      ldmatrix_x4(bh, row);
      ldmatrix_x4(bl, row + (s_lo - s_hi));
      mma_16816<T>(V[n], a, bh[0], bh[1]);
      mma_16816<T>(V[n + 1], a, bh[2], bh[3]);
      mma_16816<T>(V[n], a, bl[0], bl[1]);
      mma_16816<T>(V[n + 1], a, bl[2], bl[3]);
      if constexpr (kLo) {
        mma_16816<T>(V[n], a_lo, bh[0], bh[1]);
        mma_16816<T>(V[n + 1], a_lo, bh[2], bh[3]);
      }
    }
  }
}
// O = diag(γ) Q (S_hi + S_lo)ᵀ for a warp's 16 rows i0.. and value columns col0.. (γ_i = 2^gates[i]: the gates
// kept as G · log2 e).
template <class T, bool Gated, int kTiles>
__device__ __forceinline__ void query_state_product(float (&O)[kTiles][4], const T* q_s, const T* s_hi, const T* s_lo,
                                                    const float* gates, int i0, int col0, int k_steps, int lane) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kTcKeys / 16; ++kk) {
    if (kk >= k_steps) break;
    unsigned a[4];
    ldmatrix_x4(a, q_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int n = 0; n < kTiles; n += 2) mma_state_transposed<T>(O, n, a, s_hi, s_lo, col0, kk, lane);
  }
  if (Gated)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float decay = exp2_ftz(gates[i0 + lane / 4 + 8 * half]);
#pragma unroll
      for (int n = 0; n < kTiles; ++n) O[n][2 * half] *= decay, O[n][2 * half + 1] *= decay;
    }
}
// O += P V̄ for a warp's row block: P's 16 × 16 blocks on and below the diagonal ([C][C + 8] tile), V̄ from
// [C][kTcVLd] rows, value columns col0...
template <class T, int C, int kTiles>
__device__ __forceinline__ void add_scores_values(float (&O)[kTiles][4], const T* scores_s, const T* v_s, int row_block, int col0,
                                                  int lane) {
  const int i0 = 16 * row_block;
#pragma unroll
  for (int jj = 0; jj < C / 16; ++jj) {
    if (jj > row_block) break;
    unsigned a[4];  // P's 16 × 16 block (row block, jj) as the A operand
    ldmatrix_x4(a, scores_s + (i0 + lane % 16) * tc_scores_pitch(C) + jj * 16 + (lane / 16) * 8);
#pragma unroll
    for (int n = 0; n < kTiles; n += 2) {
      unsigned bv[4];  // V̄ stored [token][value]: transposed ldmatrix gives the col-major B
      ldmatrix_x4_trans(bv, v_s + (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcVLd + col0 + 8 * n + (lane >> 4) * 8);
      mma_16816<T>(O[n], a, bv[0], bv[1]);
      mma_16816<T>(O[n + 1], a, bv[2], bv[3]);
    }
  }
}
// A warp's 16 × (8 kTiles) output rounded to T, two values per store, into the chunk's rows (`rows`, row pitch
// `pitch`; rows < size and value columns < DV only).
template <class T, int kTiles>
__device__ __forceinline__ void store_output_rows(const float (&O)[kTiles][4], T* rows, std::int64_t pitch, int size, int DV,
                                                  int v0, int i0, int col0, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = i0 + g + 8 * half, c = v0 + col0 + 8 * n + 2 * t;
      if (r < size && c < DV) *reinterpret_cast<unsigned*>(rows + r * pitch + c) = pack_pair<T>(O[n][2 * half], O[n][2 * half + 1]);
    }
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
//
// Summary != none is a segment's summary (delta_rule_segments.cuh): the state chain alone, no Q, no scores, no
// output, the final state written. Summary::state starts from p.initial_state (null: 0) and reads U: the
// segment's X. Summary::transition starts from the identity (p.value_dim = DK rows) and takes U ≡ 0 (U is not
// read): the segment's transition P = M_first ⋯ M_last, gates included. Each is the one-walk scan's state
// arithmetic bit for bit, on those inputs.
struct StatePassOutputs {
  void* s;            // [B, H, N, DV, DK] dtype: S_[c] rounded once (what the chunk gradients read)
  void *v_hi, *v_lo;  // [B, H, L, DV] dtype: V̄ = v_hi + v_lo
};
enum class Summary { none, state, transition };
template <class T, int C, bool Gated, bool StatePass = false, Summary kSummary = Summary::none>
__global__ void __launch_bounds__(kTcScanThreads, 2) chunk_scan_registers_kernel(ForwardStageParams p, StatePassOutputs pairs) {
  static_assert(!(StatePass && kSummary != Summary::none), "a summary is a forward scan");
  constexpr bool kOutput = kSummary == Summary::none, kReadsU = kSummary != Summary::transition;
  constexpr int kRowBlocks = C / 16;                                                  // 16-row blocks of a chunk
  constexpr int kColumnGroups = 8 / kRowBlocks < 4 ? 8 / kRowBlocks : 4;             // output warps per row block
  constexpr int kOutTiles = kTcSlice / 8 / kColumnGroups;                            // n8 tiles per output warp
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
  const int part_rows_left = DV - v0 - state_rows, part_keys_left = DK - state_key0;
  const auto state_part_of = [&](auto* state, const Strides& s) {  // this warp's part of a strided [DV, DK] state
    return state ? state + s.head_offset(b, h) + (v0 + state_rows) * s.row + state_key0 : nullptr;
  };
  float S[kStateTiles][4];
  if constexpr (kSummary == Summary::transition)
    load_identity_part(S, v0 + state_rows - state_key0, part_rows_left, part_keys_left, g, t);
  else
    load_state_part(S, state_part_of(p.initial_state, p.initial_state_strides), p.initial_state_strides.row, part_rows_left,
                    part_keys_left, g, t);

  if constexpr (kOutput) load_rows(q_s, q_or_w_lo, q_or_w_lo_row, 0, min(C, L));
  load_rows(w_s, w_head, DK, 0, min(C, L));
  load_gates(0, min(C, L));
  for (int chunk = 0; chunk < N; ++chunk) {
    const int t0 = chunk * C, size = min(C, L - t0);
    const std::size_t token0 = head_token0 + t0;

    // (1) K and U in; S_[c] out (state pass: rounded once), and in fp32 when asked; G_i.
    load_rows(k_s, k, p.k_strides.row, t0, size);
    if constexpr (kReadsU) load_slice(v_new_s, u, token0, size);
    if constexpr (StatePass) load_slice(v_decayed_s, u_lo, token0, size);
    else if constexpr (kOutput) load_scores(chunk);
    {
      T* out = nullptr;  // the state pass's S_[c], rounded once
      const std::size_t at = ((static_cast<std::size_t>(head) * N + chunk) * DV + v0 + state_rows) * DK + state_key0;
      if constexpr (StatePass) out = static_cast<T*>(pairs.s) + at;
      publish_state_part<T>(S, s_hi, s_lo, state_rows, state_key0, out, DK, DV - v0 - state_rows, DK - state_key0, g, t);
    }
    if (p.boundary_states)  // S_[c] in fp32, for the stage tests
      store_state_part(S, p.boundary_states + ((static_cast<std::size_t>(head) * N + chunk) * DV + v0 + state_rows) * DK + state_key0,
                       DK, part_rows_left, part_keys_left, g, t);
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
          float2 x = kReadsU ? unpack_pair<T>(*reinterpret_cast<const unsigned*>(v_new_s + at)) : float2{0.0f, 0.0f};
          if constexpr (StatePass) {  // U = U_hi + U_lo: exact in fp32
            const float2 lo = unpack_pair<T>(*reinterpret_cast<const unsigned*>(v_decayed_s + at));
            x.x += lo.x, x.y += lo.y;
          }
          V[n][2 * half] = x.x, V[n][2 * half + 1] = x.y;
        }
      subtract_w_state_product<T, StatePass>(V, w_s, q_s, s_hi, s_lo, i0, out_col0, k_steps, lane);
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
    if constexpr (!StatePass && kOutput) if (computes_output) query_state_product<T, Gated>(O, q_s, s_hi, s_lo, gates, i0, out_col0, k_steps, lane);
    __syncthreads();  // V̄ published; Q and W are no longer read

    // (3) The next chunk's Q, W and g start loading; O += P V̄; the state update.
    if (chunk + 1 < N) {
      const int next_size = min(C, L - t0 - C);
      if constexpr (kOutput) load_rows(q_s, q_or_w_lo, q_or_w_lo_row, t0 + C, next_size);
      load_rows(w_s, w_head, DK, t0 + C, next_size);
      load_gates(t0 + C, next_size);
    }
    if constexpr (!StatePass && kOutput) if (computes_output) {
      add_scores_values<T, C>(O, scores_s, v_new_s, row_block, out_col0, lane);
      store_output_rows<T>(O, out + t0 * p.output_strides.row, p.output_strides.row, size, DV, v0, i0, out_col0, lane);
    }
    if (gated) scale_state_part(S, exp2_ftz(gates[size - 1]));
    update_state_part<T, C, StatePass>(S, (gated && !StatePass) ? v_decayed_s : v_new_s, v_decayed_s, k_s, size, k_steps,
                                       state_rows, state_key0, lane);
    __syncthreads();  // K, V̄ and S_hi/lo are rewritten by the next chunk
  }
  store_state_part(S, state_part_of(p.final_state, p.final_state_strides), p.final_state_strides.row, part_rows_left,
                   part_keys_left, g, t);
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

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4;
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
  store_output_rows<T>(O, out + t0 * p.output_strides.row, p.output_strides.row, size, DV, 0, i0, col0, lane);
}

}  // namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS
