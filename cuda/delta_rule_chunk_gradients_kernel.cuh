// Stage 4 of the tensor-core DeltaNet / Gated DeltaNet backward: chunk_gradients_kernel, persistent blocks over
// (chunk, head) items (chunk_gradients_warps: 16 warps, 8 at C = 16). Included by
// delta_rule_backward_tensor_core_kernels.cuh, so that the CPU emulation (property_tests/support/cuda_emulation.hpp)
// compiles this source under its own namespace too. Each phase of an item is a member function of
// ChunkGradientsBlock, which holds the block's shared tiles and the thread's place; the kernel is the item loop.
#pragma once

#include "cuda/delta_rule_backward_tensor_core_kernels.cuh"

namespace deltaproof::cuda::DELTAPROOF_BACKWARD_TENSOR_CORE_KERNELS {

// Fragments from shared memory (ldmatrix.x4): A is 16×16 (rows m0.., k0..); B covers k0..k0+15 × two n8
// tiles n0.. (regs 0, 1 for n0, 2, 3 for n0 + 8).
template <class T>
__device__ __forceinline__ void a_rows(unsigned (&a)[4], const T* base, int pitch, int m0, int k0) {  // stored [m][k]
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, base + (m0 + lane % 16) * pitch + k0 + (lane / 16) * 8);
}
template <class T>
__device__ __forceinline__ void a_columns(unsigned (&a)[4], const T* base, int pitch, int m0, int k0) {  // stored [k][m]
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(a, base + (k0 + (lane & 7) + (lane >> 4) * 8) * pitch + m0 + ((lane >> 3) & 1) * 8);
}
template <class T>
__device__ __forceinline__ void b_rows(unsigned (&b)[4], const T* base, int pitch, int k0, int n0) {  // stored [n][k]
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, base + (n0 + (lane & 7) + ((lane >> 4) << 3)) * pitch + k0 + ((lane >> 3) & 1) * 8);
}
template <class T>
__device__ __forceinline__ void b_columns(unsigned (&b)[4], const T* base, int pitch, int k0, int n0) {  // stored [k][n]
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, base + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0 + (lane >> 4) * 8);
}
// d[n], d[n + 1] += a · b (two n8 tiles).
template <class T>
__device__ __forceinline__ void mma_pair(float (&d0)[4], float (&d1)[4], const unsigned (&a)[4], const unsigned (&b)[4]) {
  mma_16816<T>(d0, a, b[0], b[1]);
  mma_16816<T>(d1, a, b[2], b[3]);
}
__device__ __forceinline__ void negate(unsigned (&a)[4]) {
#pragma unroll
  for (int x = 0; x < 4; ++x) a[x] ^= 0x80008000u;  // flipping the sign bits is exact
}

// Value rows of S_[c] and G' per streamed tile, two tiles in flight: 32 (two k-steps per barrier) where the
// tiles fit in the space βV and βγK take later (C = 64), else 16, which keeps C = 32's shared memory small (its
// 512 threads at ≈ 128 registers hold it to one block per SM all the same).
__host__ __device__ constexpr int chunk_gradients_stream(int chunk) { return chunk >= 64 ? 32 : 16; }

// Warps per chunk-gradient block: 16 where C ≥ 32, so that the one block an SM holds (its shared memory) brings
// 16 warps, not 8, to hide the latencies (8 warps measured 12.5 % occupancy); a C × D product's 16 n8 tiles are then
// split four (C = 64) or eight (C = 32) ways. C = 16 keeps 8: sixteen ways would leave a warp one n8 tile, and
// the products go in pairs.
__host__ __device__ constexpr int chunk_gradients_warps(int chunk) { return chunk >= 32 ? 16 : 8; }
__host__ __device__ constexpr int chunk_gradients_threads(int chunk) { return 32 * chunk_gradients_warps(chunk); }
// Blocks per SM the registers must allow: two of 8 warps at C = 16 (≤ 128 registers a thread; its shared memory
// allows more), one of 16 warps at C ≥ 32 (shared memory holds one at C = 64).
__host__ __device__ constexpr int chunk_gradients_min_blocks(int chunk) { return chunk >= 32 ? 1 : 2; }
// Blocks of the persistent chunk-gradient kernel: one per resident slot (`resident`, from the occupancy), at
// most one per (chunk, head) item, at least one.
inline int chunk_gradients_blocks(int items, int resident) { return resident < 1 ? 1 : (items < resident ? items : resident); }

// One (chunk, head) of stage 4's persistent loop.
struct ChunkItem {
  int chunk, head, t0, n, bi, h;  // t0: the chunk's first token, n its length; bi, h: batch and head
  std::size_t token0;             // the chunk's first row in the packed intermediates
};

struct ChunkGradientsLayout {
  std::size_t queries, keys, values, d_out, v_new_hi, v_new_lo, d_v_new_hi, d_v_new_lo;
  std::size_t stream;                    // [2 buffers][S, G'][stream rows][kTcLd]; then βV, βγK (P3)
  std::size_t t, e_out, d_t;             // C×C operands: T; E_o, later X; dT, later F
  std::size_t scalars, partials, bytes;
};
__host__ __device__ constexpr ChunkGradientsLayout chunk_gradients_layout(int chunk) {
  ChunkGradientsLayout l{};
  const std::size_t rows = static_cast<std::size_t>(chunk) * kTcLd * 2;
  const std::size_t tile = static_cast<std::size_t>(chunk_gradients_stream(chunk)) * kTcLd * 2;
  const std::size_t square = static_cast<std::size_t>(chunk) * (chunk + 8) * 2;
  l.queries = 0;
  l.keys = l.queries + rows;
  l.values = l.keys + rows;
  l.d_out = l.values + rows;
  l.v_new_hi = l.d_out + rows;
  l.v_new_lo = l.v_new_hi + rows;
  l.d_v_new_hi = l.v_new_lo + rows;
  l.d_v_new_lo = l.d_v_new_hi + rows;
  l.stream = l.d_v_new_lo + rows;
  const std::size_t stream_bytes = 4 * tile > 2 * rows ? 4 * tile : 2 * rows;  // βV and βγK reuse it
  l.t = l.stream + stream_bytes;
  l.e_out = l.t + square;
  l.d_t = l.e_out + square;
  l.scalars = l.d_t + square;                        // β, G, γ, λ; the next item's β and log-gates: 6 × C floats
  l.partials = l.scalars + 6 * chunk * 4;  // row partial sums (see the kernel), floats
  l.bytes = l.partials + (4 * chunk_gradients_warps(chunk) * 16 + 3 * (chunk / 16) * chunk + 16) * 4;  // 4 · kParts · C
  return l;
}

// Per chunk (n = its length, rows past n are zero in every operand):
//   P1  E_o = (dO V̄ᵀ) ⊙ D on and below the diagonal (V̄ as hi + lo), rounded once; gated: the row and column
//       sums of Z_o = strictly_lower((dO V̄ᵀ) ⊙ P), P = Q Kᵀ ⊙ D.
//   P2  S_[c] and G' (each rounded once) streamed 32 value rows at a time (16 at C < 64): dO S, −dV̄ S (dV̄
//       hi + lo) and V̄ G' (V̄ hi + lo) accumulate in registers; <G', S> per thread.
//   P3  dq = diag(γ) dO S + E_o K; dW rounded once; dk ← diag(λ) V̄ G' + E_oᵀ Q; then
//       dT = dV̄ (diag(β) V)ᵀ + dW (diag(βγ) K)ᵀ (βV, βγK rounded once), rounded once.
//   P4  X = Tᵀ dT (T rounded once), rounded once; E = strictly_lower(−X Tᵀ); F = diag(β) (E ⊙ D) rounded
//       once; with K Kᵀ: the row sums of E ⊙ D ⊙ K Kᵀ (dβ) and, gated, of Z_2 = (E ⊙ D) ⊙ diag(β) K Kᵀ.
//   P5  Z_1 = Tᵀ dW; dk += diag(βγ) Z_1 + F K + Fᵀ K; dv = diag(β) Tᵀ dV̄ (dV̄ hi + lo);
//       dβ = rowsum(Tᵀ dV̄ ⊙ V) + γ ⊙ rowsum(Z_1 ⊙ K) + rowsum(E ⊙ D ⊙ K Kᵀ).
//   P6  gated: dG_r = (<dO_r, S q_r> + β_r <Z_1r, k_r>) γ_r + Σ_{i<r} Z_ri − Σ_{i>r} Z_ir − <(V̄G')_r, k_r> λ_r,
//       the last token also Σ_i <(V̄G')_i, k_i> λ_i + <G', S> γ_{n−1}; dg_j = Σ_{r ≥ j} dG_r.
// Every sum has a fixed order (row sums: lanes by butterfly, then warps' partials in order): no atomics.
template <class T, int C, bool Gated>
struct ChunkGradientsBlock {
  static constexpr int kThreads = chunk_gradients_threads(C), kWarps = kThreads / 32;
  static constexpr int kRowBlocks = C / 16;
  static constexpr int kParts = kWarps / kRowBlocks;        // warps sharing a row block in C × D products
  static constexpr int kDTiles = kTcKeys / 8 / kParts;      // n8 tiles of a warp's part of a C × D output
  static constexpr int kPitchC = C + 8;
  static constexpr int kUnrollK = C >= 32 ? 4 : 2;  // k-loops of the C × C products (ptxas: no spill at these)
  static constexpr int kStream = chunk_gradients_stream(C);
  static constexpr ChunkGradientsLayout lay = chunk_gradients_layout(C);
  static_assert(4 * C * C <= 2 * kStream * kTcLd * sizeof(T), "T's fp32 copy must fit in stream buffer 1 (copy_after_dt)");
  // The warp that stages the next item's β and log-gates: one with no tile of E (above the diagonal: cb > rb), which
  // waits for those loads while the others form E.
  static constexpr int kStager = kRowBlocks > 1 ? (kRowBlocks - 1) * kRowBlocks : 1;
  static_assert(kStager < kWarps, "the stager is a warp of the block");
  static constexpr bool gated = Gated;  // log-gates given; DeltaNet's instantiation has no gate arithmetic
  using Accumulator = float[kDTiles][4];  // a warp's part of a C × D product, mma.sync accumulator layout

  const BackwardStageParams& p;
  const TensorCoreBuffers& b;
  unsigned char* smem;
  T *q_s, *k_s, *v_s, *do_s, *vb_hi, *vb_lo, *dvb_hi, *dvb_lo;
  T* stream;  // tile j of buffer b at stream + (2b + j) · kStream · kTcLd: S, G'
  T *t_s, *eo_s, *dt_s;
  T* dw_s;          // dW rounded, once V̄ is no longer read (P3 on)
  T *bv_s, *bgk_s;  // βV and βγK over the dead stream tiles (P3): [C][kTcLd] each
  T* x_s;           // X over E_o (P4)
  T* f_s;           // F over dT (P4)
  float *beta, *gsum, *gamma, *lambda;
  float* staged_beta;  // the next item's β and log-gates as loaded (zero past its n), staged by kStager
  float* staged_gate;  // during P4, so that the top of an item reads no global memory
  float* rq;      // [kParts][C] <dO S, q> per row, by key part
  float* dlam;    // [kParts][C] <V̄ G', k>
  float* z1k;     // [kParts][C] <Z_1, k>
  float* tuv;     // [kParts][C] <Tᵀ dV̄, v>
  float* ekk;     // [C/16][C] row sums of E ⊙ D ⊙ K Kᵀ, by 16-column block
  float* z_row;   // [C/16][C] row sums of Z (Z_o in P1, then + Z_2 in P4), by column block
  float* z_col;   // [C/16][C] column sums of Z, by row block
  float* reduce;  // [kWarps] per-warp <G', S>
  int tid, lane, warp, g, t;
  int L, DK, DV, N, dv_steps, dk_steps;
  int row_block, part_index, i0, col0;
  // Item i is (chunk i % N, head i / N), head = batch · heads + h. The block's items are stride apart: the next one
  // comes from the current one by carries, the quotients of stride formed once (no division per item).
  int stride_chunks, stride_h, stride_b;

  __device__ __forceinline__ ChunkGradientsBlock(const BackwardStageParams& params, const TensorCoreBuffers& buffers,
                                                 unsigned char* shared)
      : p(params), b(buffers), smem(shared) {
    q_s = at(lay.queries), k_s = at(lay.keys), v_s = at(lay.values), do_s = at(lay.d_out);
    vb_hi = at(lay.v_new_hi), vb_lo = at(lay.v_new_lo), dvb_hi = at(lay.d_v_new_hi), dvb_lo = at(lay.d_v_new_lo);
    stream = at(lay.stream);
    t_s = at(lay.t), eo_s = at(lay.e_out), dt_s = at(lay.d_t);
    dw_s = vb_hi, bv_s = stream, bgk_s = stream + C * kTcLd, x_s = eo_s, f_s = dt_s;
    beta = reinterpret_cast<float*>(smem + lay.scalars);
    gsum = beta + C, gamma = gsum + C, lambda = gamma + C, staged_beta = lambda + C, staged_gate = staged_beta + C;
    float* part = reinterpret_cast<float*>(smem + lay.partials);
    rq = part, dlam = rq + kParts * C, z1k = dlam + kParts * C, tuv = z1k + kParts * C;
    ekk = part + 4 * kParts * C, z_row = ekk + kRowBlocks * C, z_col = z_row + kRowBlocks * C, reduce = z_col + kRowBlocks * C;
    tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
    L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
    dv_steps = (DV + 15) / 16, dk_steps = (DK + 15) / 16;
    row_block = warp % kRowBlocks, part_index = warp / kRowBlocks;
    i0 = 16 * row_block, col0 = part_index * (kTcKeys / kParts);
    const int stride = static_cast<int>(gridDim.x), stride_heads = stride / N;
    stride_chunks = stride % N, stride_h = stride_heads % p.heads, stride_b = stride_heads / p.heads;
  }
  __device__ __forceinline__ T* at(std::size_t offset) const { return reinterpret_cast<T*>(smem + offset); }

  // ---- items
  __device__ __forceinline__ ChunkItem derive(ChunkItem it) const {  // the fields that follow from (chunk, bi, h)
    it.head = it.bi * p.heads + it.h;
    it.t0 = it.chunk * C, it.n = min(C, L - it.t0);
    it.token0 = static_cast<std::size_t>(it.head) * L + it.t0;  // packed intermediates
    return it;
  }
  __device__ __forceinline__ ChunkItem item(int index) const {
    ChunkItem it;
    it.chunk = index % N, it.h = index / N % p.heads, it.bi = index / N / p.heads;
    return derive(it);
  }
  __device__ __forceinline__ ChunkItem advance(const ChunkItem& it) const {
    ChunkItem next;
    next.chunk = it.chunk + stride_chunks;  // < 2N: one carry at most
    const int chunk_carry = next.chunk >= N;
    next.chunk -= chunk_carry * N;
    next.h = it.h + stride_h + chunk_carry;  // < 2 heads
    const int head_carry = next.h >= p.heads;
    next.h -= head_carry * p.heads;
    next.bi = it.bi + stride_b + head_carry;
    return derive(next);
  }

  // ---- copies: every 16-bit operand by cp.async (zero past n rows and past the width), T in fp32.
  __device__ __forceinline__ void load_rows(T* dst, const T* src, std::int64_t row, int rows, int width) const {
    copy_rows_async<kThreads, C>(dst, src, row, rows, width, tid);
  }
  __device__ __forceinline__ static const T* packed(const void* data, std::size_t row0, int width) {
    return static_cast<const T*>(data) + row0 * width;
  }
  // The chunk's first row in each strided user tensor (q, k, v, dO rows 16-byte aligned: the launcher checked).
  __device__ __forceinline__ static const T* chunk_rows(const ChunkItem& it, const void* data, const Strides& s) {
    return static_cast<const T*>(data) + s.head_offset(it.bi, it.h) + std::int64_t(it.t0) * s.row;
  }
  __device__ __forceinline__ static T* chunk_rows_out(const ChunkItem& it, void* data, const Strides& s) {
    return static_cast<T*>(data) + s.head_offset(it.bi, it.h) + std::int64_t(it.t0) * s.row;
  }
  // Value rows r0.. of S_[c] and G' into stream buffer `buffer`.
  __device__ __forceinline__ void load_stream(const ChunkItem& it, int buffer, int r0) const {
    T* tiles = stream + 2 * buffer * kStream * kTcLd;
    const int rows = min(kStream, DV - r0);
    const std::size_t state_rows0 = (static_cast<std::size_t>(it.head) * N + it.chunk) * DV;  // S_[c]'s first row
    copy_rows_async<kThreads, kStream>(tiles, packed(b.state_pass.s, state_rows0 + r0, DK), DK, rows, DK, tid);
    copy_rows_async<kThreads, kStream>(tiles + kStream * kTcLd, packed(b.state_gradients, state_rows0 + r0, DK), DK, rows, DK, tid);
    copy_async_commit();
  }
  // A block runs chunk after chunk (persistent), and each chunk's operands come in while the one before is still
  // computing, as soon as the tile they land in is dead there: five copy groups, committed in this order.
  //   (a) dO and V̄'s lo part: from P3 on (P1 and P2 read them last);
  //   (b) Q, then T in fp32 into stream buffer 1; (c) the first state tile into buffer 0: once dT is formed (P3
  //       reads Q last; βV and βγK, over the stream tiles, are dead);
  //   (d) V̄'s hi part (dW's tile until P5) and K; (e) V and dV̄'s pair: from P6 on.
  // The top of a chunk waits for all but (e), which P2's first copy wait takes.
  __device__ __forceinline__ void copy_after_p2(const ChunkItem& it) const {
    load_rows(do_s, chunk_rows(it, p.d_output, p.d_output_strides), p.d_output_strides.row, it.n, DV);
    load_rows(vb_lo, packed(b.state_pass.v_lo, it.token0, DV), DV, it.n, DV);
    copy_async_commit();
  }
  __device__ __forceinline__ void copy_after_dt(const ChunkItem& it) const {
    load_rows(q_s, chunk_rows(it, p.q, p.q_strides), p.q_strides.row, it.n, DK);
    const float* t_src = b.wy_inverse + (static_cast<std::size_t>(it.head) * N + it.chunk) * C * C;
    float* t_staged = reinterpret_cast<float*>(stream + 2 * kStream * kTcLd);  // stream buffer 1 (4C² bytes fit)
    block_for<C * C / 4, kThreads>(tid, [&](int e) { copy_async_16(t_staged + 4 * e, t_src + 4 * e, true); });
    copy_async_commit();
    load_stream(it, 0, 0);
  }
  __device__ __forceinline__ void copy_after_p5(const ChunkItem& it) const {
    load_rows(vb_hi, packed(b.state_pass.v_hi, it.token0, DV), DV, it.n, DV);
    load_rows(k_s, chunk_rows(it, p.k, p.k_strides), p.k_strides.row, it.n, DK);
    copy_async_commit();
    load_rows(v_s, chunk_rows(it, p.v, p.v_strides), p.v_strides.row, it.n, DV);
    load_rows(dvb_hi, packed(b.d_v_new_hi, it.token0, DV), DV, it.n, DV);
    load_rows(dvb_lo, packed(b.d_v_new_lo, it.token0, DV), DV, it.n, DV);
    copy_async_commit();
  }
  __device__ __forceinline__ void stage_scalars(const ChunkItem& it) const {  // one warp
    const T* beta_in = chunk_rows(it, p.beta, p.beta_strides);
    const float* log_gate = gated ? static_cast<const float*>(p.log_gate) + p.log_gate_strides.head_offset(it.bi, it.h) +
                                        std::int64_t(it.t0) * p.log_gate_strides.row
                                  : nullptr;
    for (int i = lane; i < C; i += 32) {
      staged_beta[i] = i < it.n ? to_float(beta_in[i * p.beta_strides.row]) : 0.0f;
      if (gated) staged_gate[i] = i < it.n ? log_gate[i * p.log_gate_strides.row] : 0.0f;
    }
  }

  // ---- the top of an item: β, the gate sums G_i, γ and λ from the staged loads; T rounded once.
  __device__ __forceinline__ void item_scalars(const ChunkItem& it) const {
    if (warp == 0) {  // the same shuffle tree as every other kernel
      float lo = gated && lane < C ? staged_gate[lane] : 0.0f;
      float hi = gated && lane + 32 < C ? staged_gate[lane + 32] : 0.0f;
      if (gated) chunk_prefix_sums(lo, hi, lane);
      for (int half = 0; half < 2; ++half) {
        const int i = lane + 32 * half;
        if (i >= C) break;
        const float G = half ? hi : lo;
        beta[i] = staged_beta[i];
        gsum[i] = G;
        if (b.gate_sums != nullptr && i < it.n) b.gate_sums[it.token0 + i] = G;
      }
    }
    copy_async_wait<1>();  // all but (e): V and dV̄ may still fly (P2's first wait takes them)
    __syncthreads();
    {  // T rounded once, from its fp32 copy in stream buffer 1 (P2's first copy into that buffer follows a barrier)
      const float* t_staged = reinterpret_cast<const float*>(stream + 2 * kStream * kTcLd);
      block_for<C * C / 4, kThreads>(tid, [&](int e) {
        const float4 x = reinterpret_cast<const float4*>(t_staged)[e];
        const int r = (4 * e) / C, c = (4 * e) % C;
        *reinterpret_cast<uint2*>(t_s + r * kPitchC + c) = make_uint2(pack_pair<T>(x.x, x.y), pack_pair<T>(x.z, x.w));
      });
    }
    const float last = gsum[it.n - 1];
    for (int i = tid; i < C; i += kThreads) {  // without gates no decay: every one is exactly 1
      gamma[i] = gated ? gate_exp(gsum[i]) : 1.0f;
      lambda[i] = gated ? gate_exp(last - gsum[i]) : 1.0f;
    }
    // No barrier here: P1 reads only what the barrier above published (the copies, β and the gate sums); T's tile,
    // γ and λ are first read in P3 and P4, after P2's barriers.
  }
  // exp(G_i − G_j), used for i ≥ j; the loops below also form it for masked entries of a tile on the diagonal
  // block (no per-entry branch) and drop it with a select, an inf from a positive exponent included.
  __device__ __forceinline__ float decay(int i, int j) const { return gated ? gate_exp(gsum[i] - gsum[j]) : 1.0f; }

  // ---- P1: E_o, and gated the sums of Z_o. Tiles of 16 × 16 on and below the diagonal.
  __device__ __forceinline__ void output_adjoint() const {
    for (int tile = warp; tile < kRowBlocks * kRowBlocks; tile += kWarps) {
      const int rb = tile % kRowBlocks, cb = tile / kRowBlocks;
      float acc[2][4] = {}, qk[2][4] = {};
      if (cb <= rb) {
        float acc_lo[2][4] = {};  // V̄'s lo part in its own accumulators: two chains of MMAs, not one twice as long
#pragma unroll kUnrollK
        for (int kk = 0; kk < dv_steps; ++kk) {
          unsigned a[4], bh[4], bl[4];
          a_rows(a, do_s, kTcLd, 16 * rb, 16 * kk);
          b_rows(bh, vb_hi, kTcLd, 16 * kk, 16 * cb);
          b_rows(bl, vb_lo, kTcLd, 16 * kk, 16 * cb);
          mma_pair<T>(acc[0], acc[1], a, bh);
          mma_pair<T>(acc_lo[0], acc_lo[1], a, bl);
        }
#pragma unroll
        for (int x = 0; x < 4; ++x) acc[0][x] += acc_lo[0][x], acc[1][x] += acc_lo[1][x];
        if (gated)
#pragma unroll kUnrollK
          for (int kk = 0; kk < dk_steps; ++kk) {
            unsigned a[4], bk[4];
            a_rows(a, q_s, kTcLd, 16 * rb, 16 * kk);
            b_rows(bk, k_s, kTcLd, 16 * kk, 16 * cb);
            mma_pair<T>(qk[0], qk[1], a, bk);
          }
      }
      float row_sum[2] = {0.0f, 0.0f}, col_sum[2][2] = {};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * rb + g + 8 * half, j = 16 * cb + 8 * nt + 2 * t;
          float e[2];
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const float d_all = cb <= rb ? decay(i, j + x) : 0.0f;  // warp-uniform: tiles above the diagonal hold zeros
            const float d = j + x <= i ? d_all : 0.0f;
            e[x] = acc[nt][2 * half + x] * d;
            if (gated && j + x < i) {  // Z_o = (dO V̄ᵀ) ⊙ P, strictly lower
              const float z = acc[nt][2 * half + x] * (qk[nt][2 * half + x] * d);
              row_sum[half] += z;
              col_sum[nt][x] += z;
            }
          }
          *reinterpret_cast<unsigned*>(eo_s + i * kPitchC + j) = pack_pair<T>(e[0], e[1]);
        }
      if (gated) {
        // Row sums over the tile's 16 columns: lanes t = 0..3 by butterfly, the two n8 tiles in order.
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float r = row_sum[half];
          r += __shfl_xor_sync(0xffffffffu, r, 1);
          r += __shfl_xor_sync(0xffffffffu, r, 2);
          if (t == 0) z_row[cb * C + 16 * rb + g + 8 * half] = r;
        }
        // Column sums over the tile's 16 rows: lanes g = 0..7 by butterfly.
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            float c = col_sum[nt][x];
            c += __shfl_xor_sync(0xffffffffu, c, 4);
            c += __shfl_xor_sync(0xffffffffu, c, 8);
            c += __shfl_xor_sync(0xffffffffu, c, 16);
            if (g == 0) z_col[rb * C + 16 * cb + 8 * nt + 2 * t + x] = c;
          }
      }
    }
  }

  // ---- P2: the state products, S_[c] and G' (each rounded once) streamed one tile ahead.
  __device__ __forceinline__ void state_products(const ChunkItem& it, Accumulator& dq, Accumulator& dw, Accumulator& vg) const {
    float gs = 0.0f;  // this thread's part of <G', S>, of the rounded states as the tensor cores see them
    for (int r0 = 0, buffer = 0; r0 < DV; r0 += kStream, buffer ^= 1) {
      __syncthreads();  // the other buffer is consumed (and, the first time, P1's E_o is published)
      if (r0 + kStream < DV) {
        load_stream(it, buffer ^ 1, r0 + kStream);
        copy_async_wait<1>();
      } else {
        copy_async_wait<0>();
      }
      __syncthreads();
      const T* s_tile = stream + 2 * buffer * kStream * kTcLd;
      const T* g_tile = s_tile + kStream * kTcLd;
      if (gated)
        block_for<kStream * (kTcKeys / 2), kThreads>(tid, [&](int e) {
          const int at_pair = (e / (kTcKeys / 2)) * kTcLd + (e % (kTcKeys / 2)) * 2;
          const float2 sv = unpack_pair<T>(*reinterpret_cast<const unsigned*>(s_tile + at_pair));
          const float2 gv = unpack_pair<T>(*reinterpret_cast<const unsigned*>(g_tile + at_pair));
          gs = fmaf(gv.x, sv.x, gs);  // a product of two 16-bit values: exact in fp32
          gs = fmaf(gv.y, sv.y, gs);
        });
#pragma unroll
      for (int kk = 0; kk < kStream / 16; ++kk) {  // value rows past DV are zero in both operands
        unsigned ad[4], awh[4], awl[4], avh[4], avl[4];
        a_rows(ad, do_s, kTcLd, i0, r0 + 16 * kk);
        a_rows(awh, dvb_hi, kTcLd, i0, r0 + 16 * kk);
        a_rows(awl, dvb_lo, kTcLd, i0, r0 + 16 * kk);
        a_rows(avh, vb_hi, kTcLd, i0, r0 + 16 * kk);
        a_rows(avl, vb_lo, kTcLd, i0, r0 + 16 * kk);
        negate(awh);
        negate(awl);
#pragma unroll
        for (int nt = 0; nt < kDTiles; nt += 2) {
          unsigned bs[4], bg[4];
          b_columns(bs, s_tile, kTcLd, 16 * kk, col0 + 8 * nt);
          b_columns(bg, g_tile, kTcLd, 16 * kk, col0 + 8 * nt);
          mma_pair<T>(dq[nt], dq[nt + 1], ad, bs);
          mma_pair<T>(dw[nt], dw[nt + 1], awh, bs);
          mma_pair<T>(dw[nt], dw[nt + 1], awl, bs);
          mma_pair<T>(vg[nt], vg[nt + 1], avh, bg);
          mma_pair<T>(vg[nt], vg[nt + 1], avl, bg);
        }
      }
    }
    if (gated) {  // <G', S>: the warp's lanes by butterfly here, the warps in order in P6
#pragma unroll
      for (int m = 16; m >= 1; m /= 2) gs += __shfl_xor_sync(0xffffffffu, gs, m);
      if (lane == 0) reduce[warp] = gs;
    }
    __syncthreads();  // the stream tiles are consumed; V̄ is no longer read
  }

  // Row sums of a C × D accumulator times a 16-bit operand over this warp's columns: per row, lanes
  // t = 0..3 by butterfly; stored by key part.
  __device__ __forceinline__ void row_dot(const Accumulator& acc, const T* operand, float* out) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = i0 + g + 8 * half;
      float r = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt) {
        const float2 o = unpack_pair<T>(*reinterpret_cast<const unsigned*>(operand + i * kTcLd + col0 + 8 * nt + 2 * t));
        r = fmaf(acc[nt][2 * half], o.x, r);
        r = fmaf(acc[nt][2 * half + 1], o.y, r);
      }
      r += __shfl_xor_sync(0xffffffffu, r, 1);
      r += __shfl_xor_sync(0xffffffffu, r, 2);
      if (t == 0) out[part_index * C + i] = r;
    }
  }
  // Stores a C × D accumulator as the dtype into a strided user tensor (rows < n, columns < width; widths
  // are multiples of 8 and rows 4-byte aligned here, so every pair is whole and aligned).
  __device__ __forceinline__ void store_rows(const ChunkItem& it, const Accumulator& acc, void* data, const Strides& strides,
                                             int width) const {
    T* dst = chunk_rows_out(it, data, strides) + col0 + 2 * t;  // each of this thread's two rows addressed once
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = i0 + g + 8 * half;
      T* row = dst + i * strides.row;
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt)
        if (i < it.n && col0 + 8 * nt + 2 * t < width)
          *reinterpret_cast<unsigned*>(row + 8 * nt) = pack_pair<T>(acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
  }

  // ---- P3 (first half): dq, dW, the first terms of dk.
  __device__ __forceinline__ void query_gradients(const ChunkItem& it, Accumulator& dq, const Accumulator& dw, Accumulator& vg) const {
    row_dot(dq, q_s, rq);
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) dq[nt][x] *= gamma[i0 + g + (x / 2) * 8];
    for (int jj = 0; jj <= row_block; ++jj) {  // E_o K: E_o is zero above the diagonal
      unsigned a[4];
      a_rows(a, eo_s, kPitchC, i0, 16 * jj);
#pragma unroll
      for (int nt = 0; nt < kDTiles; nt += 2) {
        unsigned bk[4];
        b_columns(bk, k_s, kTcLd, 16 * jj, col0 + 8 * nt);
        mma_pair<T>(dq[nt], dq[nt + 1], a, bk);
      }
    }
    store_rows(it, dq, p.dq, p.dq_strides, DK);
    row_dot(vg, k_s, dlam);
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) vg[nt][x] *= lambda[i0 + g + (x / 2) * 8];  // vg is dk from here on
    for (int jj = row_block; jj < kRowBlocks; ++jj) {  // E_oᵀ Q: (E_oᵀ)_ij = E_o,ji, nonzero for j ≥ i
      unsigned a[4];
      a_columns(a, eo_s, kPitchC, i0, 16 * jj);
#pragma unroll
      for (int nt = 0; nt < kDTiles; nt += 2) {
        unsigned bq[4];
        b_columns(bq, q_s, kTcLd, 16 * jj, col0 + 8 * nt);
        mma_pair<T>(vg[nt], vg[nt + 1], a, bq);
      }
    }
    // dW: in fp32 when asked, rounded once to T over V̄'s dead hi tile.
#pragma unroll
    for (int nt = 0; nt < kDTiles; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + g + 8 * half, c = col0 + 8 * nt + 2 * t;
        *reinterpret_cast<unsigned*>(dw_s + i * kTcLd + c) = pack_pair<T>(dw[nt][2 * half], dw[nt][2 * half + 1]);
        if (b.d_w != nullptr && i < it.n && c < DK) {
          float* dst = b.d_w + (it.token0 + i) * DK + c;
          dst[0] = dw[nt][2 * half];
          if (c + 1 < DK) dst[1] = dw[nt][2 * half + 1];
        }
      }
  }

  // ---- P3 (second half): βV and βγK, then dT = dV̄ (βV)ᵀ + dW (βγK)ᵀ, all of it.
  __device__ __forceinline__ void wy_inverse_adjoint() const {
    block_for<C * (kTcKeys / 2), kThreads>(tid, [&](int e) {  // each product rounded once
      const int r = e / (kTcKeys / 2), c = (e % (kTcKeys / 2)) * 2;
      const float2 x = unpack_pair<T>(*reinterpret_cast<const unsigned*>(v_s + r * kTcLd + c));
      const float2 y = unpack_pair<T>(*reinterpret_cast<const unsigned*>(k_s + r * kTcLd + c));
      const float bg = beta[r] * gamma[r];
      *reinterpret_cast<unsigned*>(bv_s + r * kTcLd + c) = pack_pair<T>(beta[r] * x.x, beta[r] * x.y);
      *reinterpret_cast<unsigned*>(bgk_s + r * kTcLd + c) = pack_pair<T>(bg * y.x, bg * y.y);
    });
    __syncthreads();
    for (int tile = warp; tile < kRowBlocks * kRowBlocks; tile += kWarps) {
      const int rb = tile % kRowBlocks, cb = tile / kRowBlocks;
      float acc[2][4] = {}, acc_lo[2][4] = {}, acc_w[2][4] = {};  // three independent chains of MMAs
#pragma unroll kUnrollK
      for (int kk = 0; kk < dv_steps; ++kk) {
        unsigned ah[4], al[4], bv[4];
        a_rows(ah, dvb_hi, kTcLd, 16 * rb, 16 * kk);
        a_rows(al, dvb_lo, kTcLd, 16 * rb, 16 * kk);
        b_rows(bv, bv_s, kTcLd, 16 * kk, 16 * cb);
        mma_pair<T>(acc[0], acc[1], ah, bv);
        mma_pair<T>(acc_lo[0], acc_lo[1], al, bv);
      }
#pragma unroll kUnrollK
      for (int kk = 0; kk < dk_steps; ++kk) {
        unsigned a[4], bk[4];
        a_rows(a, dw_s, kTcLd, 16 * rb, 16 * kk);
        b_rows(bk, bgk_s, kTcLd, 16 * kk, 16 * cb);
        mma_pair<T>(acc_w[0], acc_w[1], a, bk);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int x = 0; x < 4; ++x) acc[nt][x] += acc_lo[nt][x] + acc_w[nt][x];
      store_square(dt_s, rb, cb, acc);
    }
    __syncthreads();
  }
  // A 16 × 16 tile (rb, cb) of a C × C operand, rounded once to T.
  __device__ __forceinline__ void store_square(T* dst, int rb, int cb, const float (&acc)[2][4]) const {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<unsigned*>(dst + (16 * rb + g + 8 * half) * kPitchC + 16 * cb + 8 * nt + 2 * t) =
            pack_pair<T>(acc[nt][2 * half], acc[nt][2 * half + 1]);
  }

  // ---- P4 (first half): X = Tᵀ dT (T lower: (Tᵀ)_ij nonzero for j ≥ i), rounded once over E_o.
  __device__ __forceinline__ void wy_adjoint_product() const {
    for (int tile = warp; tile < kRowBlocks * kRowBlocks; tile += kWarps) {
      const int rb = tile % kRowBlocks, cb = tile / kRowBlocks;
      float acc[2][4] = {};
      for (int jj = rb; jj < kRowBlocks; ++jj) {
        unsigned a[4], bd[4];
        a_columns(a, t_s, kPitchC, 16 * rb, 16 * jj);
        b_columns(bd, dt_s, kPitchC, 16 * jj, 16 * cb);
        mma_pair<T>(acc[0], acc[1], a, bd);
      }
      store_square(x_s, rb, cb, acc);
    }
    __syncthreads();
  }

  // ---- P4 (second half): E = strictly_lower(−X Tᵀ), F and the row and column sums with K Kᵀ.
  __device__ __forceinline__ void wy_system_adjoint(const ChunkItem& it) const {
    float* e_out = b.wy_system_adjoint != nullptr ? b.wy_system_adjoint + (static_cast<std::size_t>(it.head) * N + it.chunk) * C * C : nullptr;
    for (int tile = warp; tile < kRowBlocks * kRowBlocks; tile += kWarps) {
      const int rb = tile % kRowBlocks, cb = tile / kRowBlocks;
      float acc[2][4] = {}, kk_acc[2][4] = {};
      if (cb <= rb) {
        for (int ll = 0; ll <= cb; ++ll) {  // (Tᵀ)_lk = T_kl is zero for l > k
          unsigned a[4], bt[4];
          a_rows(a, x_s, kPitchC, 16 * rb, 16 * ll);
          b_rows(bt, t_s, kPitchC, 16 * ll, 16 * cb);
          negate(a);
          mma_pair<T>(acc[0], acc[1], a, bt);
        }
#pragma unroll kUnrollK
        for (int kk = 0; kk < dk_steps; ++kk) {
          unsigned a[4], bk[4];
          a_rows(a, k_s, kTcLd, 16 * rb, 16 * kk);
          b_rows(bk, k_s, kTcLd, 16 * kk, 16 * cb);
          mma_pair<T>(kk_acc[0], kk_acc[1], a, bk);
        }
      }
      float ekk_sum[2] = {0.0f, 0.0f}, z_sum[2] = {0.0f, 0.0f}, zc[2][2] = {};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * rb + g + 8 * half, j = 16 * cb + 8 * nt + 2 * t;
          float f[2];
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const bool lower = j + x < i;
            const float e = lower ? acc[nt][2 * half + x] : 0.0f;
            const float d_all = cb <= rb ? decay(i, j + x) : 0.0f;  // as in P1
            const float ed = lower ? e * d_all : 0.0f;  // E ⊙ D
            f[x] = beta[i] * ed;
            ekk_sum[half] = fmaf(ed, kk_acc[nt][2 * half + x], ekk_sum[half]);
            if (gated && lower) {  // Z_2 = (E ⊙ D) ⊙ β_i k_i·k_j
              const float z = f[x] * kk_acc[nt][2 * half + x];
              z_sum[half] += z;
              zc[nt][x] += z;
            }
            if (e_out != nullptr) e_out[i * C + j + x] = e;
          }
          *reinterpret_cast<unsigned*>(f_s + i * kPitchC + j) = pack_pair<T>(f[0], f[1]);
        }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float r = ekk_sum[half], z = z_sum[half];
        r += __shfl_xor_sync(0xffffffffu, r, 1);
        r += __shfl_xor_sync(0xffffffffu, r, 2);
        z += __shfl_xor_sync(0xffffffffu, z, 1);
        z += __shfl_xor_sync(0xffffffffu, z, 2);
        if (t == 0) {
          ekk[cb * C + 16 * rb + g + 8 * half] = r;
          if (gated) z_row[cb * C + 16 * rb + g + 8 * half] += z;  // this lane wrote the Z_o part in P1 (same tile owner)
        }
      }
      if (gated)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            float c = zc[nt][x];
            c += __shfl_xor_sync(0xffffffffu, c, 4);
            c += __shfl_xor_sync(0xffffffffu, c, 8);
            c += __shfl_xor_sync(0xffffffffu, c, 16);
            if (g == 0) z_col[rb * C + 16 * cb + 8 * nt + 2 * t + x] += c;
          }
    }
    __syncthreads();
  }

  // ---- P5: Z_1 = Tᵀ dW, the rest of dk; dv; the dβ row sums.
  __device__ __forceinline__ void key_value_gradients(const ChunkItem& it, Accumulator& vg) const {
    {
      float z1[kDTiles][4] = {};
      for (int jj = row_block; jj < kRowBlocks; ++jj) {
        unsigned a[4];
        a_columns(a, t_s, kPitchC, i0, 16 * jj);
#pragma unroll
        for (int nt = 0; nt < kDTiles; nt += 2) {
          unsigned bw[4];
          b_columns(bw, dw_s, kTcLd, 16 * jj, col0 + 8 * nt);
          mma_pair<T>(z1[nt], z1[nt + 1], a, bw);
        }
      }
      row_dot(z1, k_s, z1k);
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int i = i0 + g + (x / 2) * 8;
          vg[nt][x] = fmaf(beta[i] * gamma[i], z1[nt][x], vg[nt][x]);
        }
    }
    for (int jj = 0; jj < kRowBlocks; ++jj) {  // F K (F strictly lower: j ≤ i blocks) and Fᵀ K (j ≥ i blocks)
      unsigned bk[kDTiles / 2][4];
#pragma unroll
      for (int nt = 0; nt < kDTiles; nt += 2) b_columns(bk[nt / 2], k_s, kTcLd, 16 * jj, col0 + 8 * nt);
      if (jj <= row_block) {
        unsigned a[4];
        a_rows(a, f_s, kPitchC, i0, 16 * jj);
#pragma unroll
        for (int nt = 0; nt < kDTiles; nt += 2) mma_pair<T>(vg[nt], vg[nt + 1], a, bk[nt / 2]);
      }
      if (jj >= row_block) {
        unsigned a[4];
        a_columns(a, f_s, kPitchC, i0, 16 * jj);
#pragma unroll
        for (int nt = 0; nt < kDTiles; nt += 2) mma_pair<T>(vg[nt], vg[nt + 1], a, bk[nt / 2]);
      }
    }
    store_rows(it, vg, p.dk, p.dk_strides, DK);
    {
      float tu[kDTiles][4] = {};  // Tᵀ dV̄ (dV̄ hi + lo)
      for (int jj = row_block; jj < kRowBlocks; ++jj) {
        unsigned a[4];
        a_columns(a, t_s, kPitchC, i0, 16 * jj);
#pragma unroll
        for (int nt = 0; nt < kDTiles; nt += 2) {
          unsigned bh[4], bl[4];
          b_columns(bh, dvb_hi, kTcLd, 16 * jj, col0 + 8 * nt);
          b_columns(bl, dvb_lo, kTcLd, 16 * jj, col0 + 8 * nt);
          mma_pair<T>(tu[nt], tu[nt + 1], a, bh);
          mma_pair<T>(tu[nt], tu[nt + 1], a, bl);
        }
      }
      row_dot(tu, v_s, tuv);
#pragma unroll
      for (int nt = 0; nt < kDTiles; ++nt)
#pragma unroll
        for (int x = 0; x < 4; ++x) tu[nt][x] *= beta[i0 + g + (x / 2) * 8];
      store_rows(it, tu, p.dv, p.dv_strides, DV);
    }
    __syncthreads();
  }

  // ---- P6: dβ, and gated dG and dg; row partials summed in a fixed order.
  __device__ __forceinline__ void scalar_gradients(const ChunkItem& it) const {
    const int n = it.n;
    if (tid < C) {
      const int i = tid;
      float s_rq = 0.0f, s_dl = 0.0f, s_z1k = 0.0f, s_tuv = 0.0f, s_ekk = 0.0f;
      for (int q_part = 0; q_part < kParts; ++q_part) {
        s_rq += rq[q_part * C + i], s_dl += dlam[q_part * C + i];
        s_z1k += z1k[q_part * C + i], s_tuv += tuv[q_part * C + i];
      }
      for (int cb = 0; cb < kRowBlocks; ++cb) s_ekk += ekk[cb * C + i];
      if (i < n) chunk_rows_out(it, p.d_beta, p.d_beta_strides)[i * p.d_beta_strides.row] = from_float<T>(s_tuv + gamma[i] * s_z1k + s_ekk);
      if (gated) {
        float zr = 0.0f, zcs = 0.0f;
        for (int cb = 0; cb < kRowBlocks; ++cb) zr += z_row[cb * C + i];
        for (int rb = 0; rb < kRowBlocks; ++rb) zcs += z_col[rb * C + i];
        const float d_gamma = s_rq + beta[i] * s_z1k;
        dlam[i] = s_dl * lambda[i];  // reused: dλ_i λ_i (every reader of the partials is this thread)
        gsum[i] = d_gamma * gamma[i] + zr - zcs - s_dl * lambda[i];  // gsum now holds dG (G_i is no longer read)
      }
    }
    __syncthreads();
    if (gated && tid == 0) {
      float total = 0.0f, gs_total = 0.0f;
      for (int i = 0; i < n; ++i) total += dlam[i];
      for (int w = 0; w < kWarps; ++w) gs_total += reduce[w];
      gsum[n - 1] += total + gs_total * gamma[n - 1];
      float running = 0.0f;  // dg_j = Σ_{r ≥ j} dG_r
      float* dg = static_cast<float*>(p.d_log_gate) + p.d_log_gate_strides.head_offset(it.bi, it.h) + std::int64_t(it.t0) * p.d_log_gate_strides.row;
      for (int r = n - 1; r >= 0; --r) {
        running += gsum[r];
        dg[r * p.d_log_gate_strides.row] = running;
        if (b.gate_sum_gradients != nullptr) b.gate_sum_gradients[it.token0 + r] = gsum[r];
      }
    }
    __syncthreads();  // the scalars and partials are read; the next chunk writes them
  }
};

// The item loop: each phase's operands for the next item are copied in as the current item's tiles die.
template <class T, int C, bool Gated>
__global__ void __launch_bounds__(chunk_gradients_threads(C), chunk_gradients_min_blocks(C)) chunk_gradients_kernel(BackwardStageParams p, TensorCoreBuffers b) {
  using Block = ChunkGradientsBlock<T, C, Gated>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Block block(p, b, smem);
  const int first_item = static_cast<int>(blockIdx.x), stride = static_cast<int>(gridDim.x);
  const int items = block.N * p.batch * p.heads;  // (chunk, head) pairs, chunks of a head consecutive
  ChunkItem cur = block.item(first_item);
  if (first_item < items) {
    block.copy_after_p2(cur);
    block.copy_after_dt(cur);
    block.copy_after_p5(cur);
    if (block.warp == Block::kStager) block.stage_scalars(cur);
  }
  __syncthreads();  // the first item's scalars are staged

  for (int item = first_item; item < items; item += stride, cur = block.advance(cur)) {
    const bool has_next = item + stride < items;
    block.item_scalars(cur);
    block.output_adjoint();
    typename Block::Accumulator dq = {}, dw = {}, vg = {};
    block.state_products(cur, dq, dw, vg);
    if (has_next) block.copy_after_p2(block.advance(cur));  // formed where used: fewer live registers
    block.query_gradients(cur, dq, dw, vg);
    block.wy_inverse_adjoint();
    if (has_next) block.copy_after_dt(block.advance(cur));
    block.wy_adjoint_product();
    if (block.warp == Block::kStager && has_next) block.stage_scalars(block.advance(cur));  // read at the next item's top
    block.wy_system_adjoint(cur);
    block.key_value_gradients(cur, vg);
    if (has_next) block.copy_after_p5(block.advance(cur));
    block.scalar_gradients(cur);
  }
}

}  // namespace deltaproof::cuda::DELTAPROOF_BACKWARD_TENSOR_CORE_KERNELS
