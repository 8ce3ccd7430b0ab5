// The tensor-core DeltaNet / Gated DeltaNet backward (16-bit inputs, DK and DV ≤ 128 and multiples of 8):
// the kernels of stages 3 and 4. Stages 1 and 2 are the forward's own kernels (delta_rule_forward_kernels.cuh)
// run in their backward modes: the WY prepare writing T and W, U as hi + lo pairs, and the register scan's
// StatePass writing S_[c] and V̄ in fp32 with every operand to ≈ 16 bits. cuda/delta_rule_backward_tensor_core.cu
// launches them; docs/kernels/delta_rule.md has the design, the precision plan and its measured cost in accuracy.
//
//   3. gradient_scan_registers_kernel (one block per head and 64 value rows of G, chunks in reverse): the
//      mirror of the register scan. G = dL/dS in fp32 registers; per chunk G' = G_[c+1] is published as
//      hi + lo (and stored rounded once for stage 4), dV̄ = diag(λ) K G'ᵀ + Pᵀ dO (P = Q Kᵀ ⊙ Γ ⊙ M as
//      hi + lo), then G_[c] = γ_C G' + (diag(γ) dO)ᵀ Q − dV̄ᵀ W with dV̄, diag(γ) dO and W rounded once.
//   4. chunk_gradients_kernel (persistent blocks, each taking (chunk, head) items in turn; the next item's
//      operands copied in as the current one's tiles die): the products with the
//      states first, S_[c] and G' (each rounded once) streamed through shared memory 32 value rows at a time
//      (16 at C < 64): dq = diag(γ) dO S + E_o K, dW = −dV̄ S, V̄ G'; then the WY adjoint (dT, X = Tᵀ dT, E = −X Tᵀ
//      strictly lower), dk, dv, dβ and, gated, the gate-sum gradients dG and dg.
// Operands that are intermediates enter the tensor cores either as one rounding to the input dtype or
// as a hi + lo pair (x = hi + lo + O(u²|x|)): which one, per product, is fixed by the precision plan
// (docs/kernels/delta_rule.md) and counted by kernel_checks/delta_rule_backward_tensor_core_stages.cpp's bounds.
#pragma once

#include "cuda/delta_rule_forward_kernels.cuh"
#include "cuda/delta_rule_launch.h"

#ifndef DELTAPROOF_BACKWARD_TENSOR_CORE_KERNELS
#define DELTAPROOF_BACKWARD_TENSOR_CORE_KERNELS backward_tensor_core_kernels
#endif

namespace deltaproof::cuda::DELTAPROOF_BACKWARD_TENSOR_CORE_KERNELS {

using namespace DELTAPROOF_FORWARD_KERNELS;
using delta_rule::BackwardStageParams;

// The intermediates of the tensor-core backward, resolved to the caller's buffers or to the workspace by
// the host. Those that stage 4 reads as tensor-core operands are written by stages 2 and 3 in the form it
// uses (V̄ and dV̄ as hi + lo pairs, x = hi + lo, each in the dtype; S_[c] and G_[c+1] rounded once), so that
// it copies them in without converting.
struct TensorCoreBuffers {
  float* wy_inverse;       // [B, H, N, C, C] fp32 T = A⁻¹ (stage 1)
  void* w;                 // [B, H, L, DK] dtype: W rounded (stage 1)
  void* w_lo;              // [B, H, L, DK] dtype: W − w rounded (stage 1)
  void* u;                 // [B, H, L, DV] dtype (stage 1)
  void* u_lo;              // [B, H, L, DV] dtype (stage 1)
  StatePassOutputs state_pass;  // S_[c] and V̄ as pairs (stage 2)
  void *d_v_new_hi, *d_v_new_lo;              // [B, H, L, DV] dtype: dV̄ (stage 3)
  void* state_gradients;   // [B, H, N, DV, DK] dtype: G_[c+1] = dL/dS_[c+1] rounded once (stage 3)
  // Written only when given (stage checks):
  float* gate_sums;           // [B, H, L] G_i
  float* d_w;                 // [B, H, L, DK] dW = −dV̄ S_[c]
  float* wy_system_adjoint;   // [B, H, N, C, C] E = dL/dA
  float* gate_sum_gradients;  // [B, H, L] dL/dG_i
};

// The reverse scan's shared memory: G' as hi + lo, Q, K, W rows, the dO slice, dV̄ rounded. The register scan's
// tiles in the same places (G' for S, dO and dV̄ for its two value tiles), with the gates where its scores begin.
struct GradientScanLayout {
  std::size_t g_hi, g_lo, queries, keys, w, d_out, d_v_new, gates, bytes;
};
__host__ __device__ constexpr GradientScanLayout gradient_scan_layout(int chunk) {
  const TcScanLayout scan = tc_scan_layout(chunk);
  GradientScanLayout l{};
  l.g_hi = scan.s_hi, l.g_lo = scan.s_lo, l.queries = scan.queries, l.keys = scan.keys, l.w = scan.w;
  l.d_out = scan.v_new, l.d_v_new = scan.v_decayed, l.gates = scan.scores;
  l.bytes = l.gates + chunk * 4;
  return l;
}

// G += (diag(γ) dO)ᵀ Q − dV̄ᵀ W for a warp's part of G (rows state_rows.. of the transposed operands, keys
// state_key0..): dO and dV̄ (rounded) from [C][kTcVLd] rows, Q and W from [C][kTcLd] rows; gated, diag(γ) dO is
// formed in the A fragments (γ_j of each held token, the gates kept as G · log2 e), rounded once to T; tokens past
// `size` add nothing.
template <class T, int C, bool Gated>
__device__ __forceinline__ void update_state_gradient_part(float (&G)[8][4], const T* do_s, const T* dvb_s, const T* q_s, const T* w_s,
                                                           const float* gates, int size, int k_steps, int state_rows, int state_key0,
                                                           int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int jj = 0; jj < C / 16; ++jj) {
    if (jj * 16 >= size) break;  // zero rows add nothing
    const int at = (jj * 16 + (lane & 7) + (lane >> 4) * 8) * kTcVLd + state_rows + ((lane >> 3) & 1) * 8;
    unsigned ad[4], av[4];  // dOᵀ and dV̄ᵀ rows = value: transposed ldmatrix
    ldmatrix_x4_trans(ad, do_s + at);
    ldmatrix_x4_trans(av, dvb_s + at);
    if (Gated) {  // A fragment registers hold tokens jj·16 + 2t + {0, 1} (regs 0, 1) and + 8 (regs 2, 3)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int j = jj * 16 + 2 * t + (x / 2) * 8;
        const float2 v = unpack_pair<T>(ad[x]);
        ad[x] = pack_pair<T>(v.x * exp2_ftz(gates[j]), v.y * exp2_ftz(gates[j + 1]));
      }
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) av[x] ^= 0x80008000u;  // −dV̄: exact
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
      if (state_key0 + n * 8 >= k_steps * 16) break;
      const int row = (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcLd + state_key0 + 8 * n + (lane >> 4) * 8;
      unsigned bq[4], bw[4];  // Q and W stored [token][key]: transposed ldmatrix gives the col-major B
      ldmatrix_x4_trans(bq, q_s + row);
      ldmatrix_x4_trans(bw, w_s + row);
      mma_16816<T>(G[n], ad, bq[0], bq[1]);
      mma_16816<T>(G[n + 1], ad, bq[2], bq[3]);
      mma_16816<T>(G[n], av, bw[0], bw[1]);
      mma_16816<T>(G[n + 1], av, bw[2], bw[3]);
    }
  }
}

// Per chunk, last to first: (1) Q, K, W and the dO slice in (cp.async), G' = G_[c+1] published from the
// registers as hi + lo and written in fp32; G_i; barrier. (2) Each output warp (16 rows, 16 or 32 value
// columns): K G'ᵀ and Pᵀ (K Qᵀ ⊙ Γᵀ, j ≥ i) from one K fragment per k-step, then dV̄ = diag(λ) K G'ᵀ +
// Pᵀ dO with Pᵀ as hi + lo A operands from registers; dV̄ written in fp32 and rounded in place for the
// update; barrier. (3) G ← γ_C G' + (diag(γ) dO)ᵀ Q − dV̄ᵀ W in each warp's 16 × 64 part of G; barrier.
template <class T, int C, bool Gated>
__global__ void __launch_bounds__(kTcScanThreads, 2) gradient_scan_registers_kernel(BackwardStageParams p, TensorCoreBuffers b) {
  constexpr int kRowBlocks = C / 16;
  constexpr int kColumnGroups = 8 / kRowBlocks < 4 ? 8 / kRowBlocks : 4;
  constexpr int kOutTiles = kTcSlice / 8 / kColumnGroups;
  constexpr int kScoreTiles = C / 8;
  constexpr int kStateTiles = kTcKeys / 2 / 8;
  constexpr GradientScanLayout lay = gradient_scan_layout(C);
  extern __shared__ __align__(128) unsigned char smem[];
  T* g_hi = reinterpret_cast<T*>(smem + lay.g_hi);  // [64][kTcLd] G' rows (value) × key
  T* g_lo = reinterpret_cast<T*>(smem + lay.g_lo);
  T* q_s = reinterpret_cast<T*>(smem + lay.queries);  // [C][kTcLd]
  T* k_s = reinterpret_cast<T*>(smem + lay.keys);
  T* w_s = reinterpret_cast<T*>(smem + lay.w);
  T* do_s = reinterpret_cast<T*>(smem + lay.d_out);       // [C][kTcVLd] dO, value columns v0..
  T* dvb_s = reinterpret_cast<T*>(smem + lay.d_v_new);    // [C][kTcVLd] dV̄ rounded to T
  float* gates = reinterpret_cast<float*>(smem + lay.gates);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int head = blockIdx.y, v0 = blockIdx.x * kTcSlice;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
  const int k_steps = (DK + 15) / 16;
  // Row blocks mirrored in warps 4..7: a scheduler holds warps w and w + 4, which then carry a long and a short
  // share of the triangular Pᵀ work (j ≥ i: row block 0 has the most), not two long ones.
  const int row_block = warp / 4 % 2 ? kRowBlocks - 1 - warp % kRowBlocks : warp % kRowBlocks;
  const int column_group = warp / kRowBlocks;
  const bool computes_output = warp < kRowBlocks * kColumnGroups;
  const int i0 = 16 * row_block, out_col0 = column_group * (kTcSlice / kColumnGroups);
  const int state_rows = 16 * (warp % 4), state_key0 = (kTcKeys / 2) * (warp / 4);
  constexpr bool gated = Gated;  // log-gates given; DeltaNet's instantiation has no gate arithmetic
  const int bi = head / p.heads, h = head % p.heads;
  // Row 0 of this head in each strided user tensor (tensor_core_backward_applies checked q, k and dO rows
  // 16-byte aligned); W, dV̄ and G_[c+1] are packed.
  const float* gate_head = gated ? static_cast<const float*>(p.log_gate) + p.log_gate_strides.head_offset(bi, h) : nullptr;
  const T* q = static_cast<const T*>(p.q) + p.q_strides.head_offset(bi, h);
  const T* k = static_cast<const T*>(p.k) + p.k_strides.head_offset(bi, h);
  const T* d_out = static_cast<const T*>(p.d_output) + p.d_output_strides.head_offset(bi, h);
  const std::size_t head_token0 = static_cast<std::size_t>(head) * L;
  const T* w_head = static_cast<const T*>(b.w) + head_token0 * DK;

  // Rows t0.. of a head's rows (row stride `row`) into [C][kTcLd], zero past the chunk and past DK.
  auto load_rows = [&](T* dst, const T* head_rows, std::int64_t row, int t0, int size) {
    copy_rows_async<kTcScanThreads, C>(dst, head_rows + t0 * row, row, size, DK, threadIdx.x);
  };
  // Value columns v0.. of rows t0.. of dO into [C][kTcVLd].
  auto load_slice = [&](T* dst, int t0, int size) {
    const std::int64_t row = p.d_output_strides.row;
    copy_rows_async<kTcScanThreads, C, kTcSlice, kTcVLd>(dst, d_out + t0 * row + v0, row, size, DV - v0, threadIdx.x);
  };

  // G rows state_rows + {g, g+8}, key columns state_key0 + 8n + 2t + {0, 1}: accumulator layout. G_[N] = dS_L.
  const int part_rows_left = DV - v0 - state_rows, part_keys_left = DK - state_key0;
  const auto state_part_of = [&](auto* state, const Strides& s) {  // this warp's part of a strided [DV, DK] state
    return state ? state + s.head_offset(bi, h) + (v0 + state_rows) * s.row + state_key0 : nullptr;
  };
  float G[kStateTiles][4];
  load_state_part(G, state_part_of(static_cast<const float*>(p.d_final_state), p.d_final_state_strides), p.d_final_state_strides.row,
                  part_rows_left, part_keys_left, g, t);

  for (int chunk = N - 1; chunk >= 0; --chunk) {
    const int t0 = chunk * C, size = min(C, L - t0);
    const std::size_t token0 = head_token0 + t0;

    // (1) The chunk's rows in; G' out as hi + lo, rounded once for stage 4 and in fp32 when asked; G_i.
    load_rows(q_s, q, p.q_strides.row, t0, size);
    load_rows(k_s, k, p.k_strides.row, t0, size);
    load_rows(w_s, w_head, DK, t0, size);
    load_slice(do_s, t0, size);
    {
      const std::size_t at = ((static_cast<std::size_t>(head) * N + chunk) * DV + v0 + state_rows) * DK + state_key0;
      publish_state_part<T>(G, g_hi, g_lo, state_rows, state_key0, static_cast<T*>(b.state_gradients) + at, DK,
                            DV - v0 - state_rows, DK - state_key0, g, t);
      if (p.state_gradients != nullptr)  // G_[c+1] in fp32, for the stage tests
        store_state_part(G, static_cast<float*>(p.state_gradients) + at, DK, part_rows_left, part_keys_left, g, t);
    }
    if (gated && warp == 0) {
      float lo = lane < size ? gate_head[(t0 + lane) * p.log_gate_strides.row] : 0.0f;
      float hi = lane + 32 < size ? gate_head[(t0 + lane + 32) * p.log_gate_strides.row] : 0.0f;
      chunk_prefix_sums(lo, hi, lane);  // G_i, kept as G_i · log2 e: every decay below is one exp2_ftz
      if (lane < C) gates[lane] = lo * kLog2e;
      if (lane + 32 < C) gates[lane + 32] = hi * kLog2e;
    }
    copy_async_wait_all();
    __syncthreads();

    // (2) dV̄ for this warp's 16 rows and value columns.
    if (computes_output) {
      float D[kOutTiles][4];  // K G'ᵀ, then dV̄
      float Pt[kScoreTiles][4];  // (K Qᵀ)_ij for the warp's rows i and every j
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) D[n][0] = D[n][1] = D[n][2] = D[n][3] = 0.0f;
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n) Pt[n][0] = Pt[n][1] = Pt[n][2] = Pt[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kTcKeys / 16; ++kk) {
        if (kk >= k_steps) break;
        unsigned a[4];  // K rows i0.. (exact)
        ldmatrix_x4(a, k_s + (i0 + lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int n = 0; n < kOutTiles; n += 2) mma_state_transposed<T>(D, n, a, g_hi, g_lo, out_col0, kk, lane);  // G'ᵀ
#pragma unroll
        for (int n = 0; n < kScoreTiles; n += 2) {
          if (n / 2 < row_block) continue;  // below the diagonal block: masked anyway (j ≥ i only)
          unsigned bq[4];  // Qᵀ: Q stored [token][key], plain ldmatrix gives the col-major B
          ldmatrix_x4(bq, q_s + (8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8);
          mma_16816<T>(Pt[n], a, bq[0], bq[1]);
          mma_16816<T>(Pt[n + 1], a, bq[2], bq[3]);
        }
      }
      // dV̄ = diag(λ) K G'ᵀ + Pᵀ dO, Pᵀ_ij = (k_i·q_j) exp(G_j − G_i) for j ≥ i (a non-positive exponent), as
      // hi + lo A operands. Without gates no decay at all (every one is exactly 1: the same bits as g = 0).
      unsigned P_hi[kScoreTiles][2], P_lo[kScoreTiles][2];
      const float last = gated ? gates[size - 1] : 0.0f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + g + 8 * half;
        const float gate_i = gated ? gates[i] : 0.0f;
        if (gated) {
          const float lambda = exp2_ftz(last - gate_i);
#pragma unroll
          for (int n = 0; n < kOutTiles; ++n) D[n][2 * half] *= lambda, D[n][2 * half + 1] *= lambda;
        }
#pragma unroll
        for (int n = 0; n < kScoreTiles; ++n) {
          const int j = 8 * n + 2 * t;
          float x0 = Pt[n][2 * half], x1 = Pt[n][2 * half + 1];
          if (gated && n / 2 >= row_block) {  // decayed without a per-entry branch, masked entries too (as the forward)
            const float2 gj = *reinterpret_cast<const float2*>(gates + j);
            x0 *= exp2_ftz(gj.x - gate_i), x1 *= exp2_ftz(gj.y - gate_i);
          }
          split_pair<T>(j >= i ? x0 : 0.0f, j + 1 >= i ? x1 : 0.0f, P_hi[n][half], P_lo[n][half]);
        }
      }
#pragma unroll
      for (int jj = 0; jj < kRowBlocks; ++jj) {
        if (jj < row_block) continue;
        const unsigned ah[4] = {P_hi[2 * jj][0], P_hi[2 * jj][1], P_hi[2 * jj + 1][0], P_hi[2 * jj + 1][1]};
        const unsigned al[4] = {P_lo[2 * jj][0], P_lo[2 * jj][1], P_lo[2 * jj + 1][0], P_lo[2 * jj + 1][1]};
#pragma unroll
        for (int n = 0; n < kOutTiles; n += 2) {
          unsigned bd[4];  // dO stored [token][value]: transposed ldmatrix gives the col-major B
          ldmatrix_x4_trans(bd, do_s + (jj * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kTcVLd + out_col0 + 8 * n + (lane >> 4) * 8);
          mma_16816<T>(D[n], ah, bd[0], bd[1]);
          mma_16816<T>(D[n + 1], ah, bd[2], bd[3]);
          mma_16816<T>(D[n], al, bd[0], bd[1]);
          mma_16816<T>(D[n + 1], al, bd[2], bd[3]);
        }
      }
      // dV̄ as a hi + lo pair for stage 4; its hi part (one rounding) for the update, in its own buffer (dO is
      // still read).
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = i0 + g + 8 * half;
#pragma unroll
        for (int n = 0; n < kOutTiles; n += 2) {
          unsigned hi[2], lo[2];
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            split_pair<T>(D[n + m][2 * half], D[n + m][2 * half + 1], hi[m], lo[m]);
            *reinterpret_cast<unsigned*>(dvb_s + r * kTcVLd + out_col0 + 8 * (n + m) + 2 * t) = hi[m];
          }
          const int c = out_col0 + 8 * n;
          const std::size_t at = (token0 + r) * DV + v0 + c;
          store_tile_pairs<T>(static_cast<T*>(b.d_v_new_hi) + at, hi[0], hi[1], t, r < size, DV - v0 - c);
          store_tile_pairs<T>(static_cast<T*>(b.d_v_new_lo) + at, lo[0], lo[1], t, r < size, DV - v0 - c);
        }
      }
    }
    __syncthreads();  // dV̄ published

    // (3) G ← γ_C G' + (diag(γ) dO)ᵀ Q − dV̄ᵀ W. Gated: diag(γ) dO is formed in the A fragments (γ_j of
    // each held token), rounded once to T.
    if (gated) scale_state_part(G, exp2_ftz(gates[size - 1]));
    update_state_gradient_part<T, C, Gated>(G, do_s, dvb_s, q_s, w_s, gates, size, k_steps, state_rows, state_key0, lane);
    __syncthreads();  // every buffer is rewritten by the next chunk
  }
  store_state_part(G, state_part_of(static_cast<float*>(p.d_initial_state), p.d_initial_state_strides), p.d_initial_state_strides.row,
                   part_rows_left, part_keys_left, g, t);
}

}  // namespace deltaproof::cuda::DELTAPROOF_BACKWARD_TENSOR_CORE_KERNELS

// Stage 4: chunk_gradients_kernel (its own header; it uses the buffers above).
#include "cuda/delta_rule_chunk_gradients_kernel.cuh"
