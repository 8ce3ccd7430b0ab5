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

// The reverse scan's shared memory: G' as hi + lo, Q, K, W rows, the dO slice, dV̄ rounded.
struct GradientScanLayout {
  std::size_t g_hi, g_lo, queries, keys, w, d_out, d_v_new, gates, bytes;
};
__host__ __device__ constexpr GradientScanLayout gradient_scan_layout(int chunk) {
  GradientScanLayout l{};
  l.g_hi = 0;
  l.g_lo = l.g_hi + kTcSlice * kTcLd * 2;
  l.queries = l.g_lo + kTcSlice * kTcLd * 2;
  l.keys = l.queries + chunk * kTcLd * 2;
  l.w = l.keys + chunk * kTcLd * 2;
  l.d_out = l.w + chunk * kTcLd * 2;
  l.d_v_new = l.d_out + chunk * kTcVLd * 2;
  l.gates = l.d_v_new + chunk * kTcVLd * 2;
  l.bytes = l.gates + chunk * 4;
  return l;
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
  const float* d_final = p.d_final_state ? static_cast<const float*>(p.d_final_state) + p.d_final_state_strides.head_offset(bi, h) : nullptr;
  float G[kStateTiles][4];
#pragma unroll
  for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = v0 + state_rows + g + (x / 2) * 8, col = state_key0 + 8 * n + 2 * t + x % 2;
      G[n][x] = (d_final && row < DV && col < DK) ? d_final[row * p.d_final_state_strides.row + col] : 0.0f;
    }

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
#pragma unroll
        for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const int r = g + (x / 2) * 8, c = 8 * n + 2 * t + x % 2;
            if (v0 + state_rows + r < DV && state_key0 + c < DK) static_cast<float*>(p.state_gradients)[at + r * DK + c] = G[n][x];
          }
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
        for (int n = 0; n < kOutTiles; n += 2) {
          const T* row = g_hi + (out_col0 + 8 * n + (lane & 7) + ((lane >> 4) << 3)) * kTcLd + kk * 16 + ((lane >> 3) & 1) * 8;
          unsigned bh[4], bl[4];  // G'ᵀ: G' stored [value][key], plain ldmatrix gives the col-major B
          ldmatrix_x4(bh, row);
          ldmatrix_x4(bl, row + (g_lo - g_hi));
          mma_16816<T>(D[n], a, bh[0], bh[1]);
          mma_16816<T>(D[n + 1], a, bh[2], bh[3]);
          mma_16816<T>(D[n], a, bl[0], bl[1]);
          mma_16816<T>(D[n + 1], a, bl[2], bl[3]);
        }
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
    if (gated) {
      const float decay = exp2_ftz(gates[size - 1]);
#pragma unroll
      for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) G[n][x] *= decay;
    }
#pragma unroll
    for (int jj = 0; jj < kRowBlocks; ++jj) {
      if (jj * 16 >= size) break;  // zero rows add nothing
      const int at = (jj * 16 + (lane & 7) + (lane >> 4) * 8) * kTcVLd + state_rows + ((lane >> 3) & 1) * 8;
      unsigned ad[4], av[4];  // dOᵀ and dV̄ᵀ rows = value: transposed ldmatrix
      ldmatrix_x4_trans(ad, do_s + at);
      ldmatrix_x4_trans(av, dvb_s + at);
      if (gated) {  // A fragment registers hold tokens jj·16 + 2t + {0, 1} (regs 0, 1) and + 8 (regs 2, 3)
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
      for (int n = 0; n < kStateTiles; n += 2) {
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
    __syncthreads();  // every buffer is rewritten by the next chunk
  }
  if (p.d_initial_state != nullptr) {
    float* d_initial = static_cast<float*>(p.d_initial_state) + p.d_initial_state_strides.head_offset(bi, h);
#pragma unroll
    for (int n = 0; n < kStateTiles; ++n)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int row = v0 + state_rows + g + (x / 2) * 8, col = state_key0 + 8 * n + 2 * t + x % 2;
        if (row < DV && col < DK) d_initial[row * p.d_initial_state_strides.row + col] = G[n][x];
      }
  }
}

// ---------------------------------------------------------------------------------------
// Stage 4: the chunk gradients, persistent blocks over (chunk, head) items (chunk_gradients_warps: 16 warps, 8
// at C = 16).

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
__global__ void __launch_bounds__(chunk_gradients_threads(C), chunk_gradients_min_blocks(C)) chunk_gradients_kernel(BackwardStageParams p, TensorCoreBuffers b) {
  constexpr int kThreads = chunk_gradients_threads(C), kWarps = kThreads / 32;
  constexpr int kRowBlocks = C / 16;
  constexpr int kParts = kWarps / kRowBlocks;        // warps sharing a row block in C × D products
  constexpr int kDTiles = kTcKeys / 8 / kParts;      // n8 tiles of a warp's part of a C × D output
  constexpr int kPitchC = C + 8;
  [[maybe_unused]] constexpr int kUnrollK = C >= 32 ? 4 : 2;  // k-loops of the C × C products (ptxas: no spill at these)
  constexpr int kStream = chunk_gradients_stream(C);
  constexpr ChunkGradientsLayout lay = chunk_gradients_layout(C);
  static_assert(4 * C * C <= 2 * kStream * kTcLd * sizeof(T), "T's fp32 copy must fit in stream buffer 1 (copy_after_dt)");
  extern __shared__ __align__(128) unsigned char smem[];
  auto at = [&](std::size_t offset) { return reinterpret_cast<T*>(smem + offset); };
  T *q_s = at(lay.queries), *k_s = at(lay.keys), *v_s = at(lay.values), *do_s = at(lay.d_out);
  T *vb_hi = at(lay.v_new_hi), *vb_lo = at(lay.v_new_lo), *dvb_hi = at(lay.d_v_new_hi), *dvb_lo = at(lay.d_v_new_lo);
  T* stream = at(lay.stream);      // tile j of buffer b at stream + (2b + j) · kStream · kTcLd: S, G'
  T *t_s = at(lay.t), *eo_s = at(lay.e_out), *dt_s = at(lay.d_t);
  T* dw_s = vb_hi;                  // dW rounded, once V̄ is no longer read (P3 on)
  T *bv_s = stream, *bgk_s = stream + C * kTcLd;  // βV and βγK over the dead stream tiles (P3): [C][kTcLd] each
  T* x_s = eo_s;                    // X over E_o (P4)
  T* f_s = dt_s;                    // F over dT (P4)
  float* beta = reinterpret_cast<float*>(smem + lay.scalars);
  float* gsum = beta + C;
  float* gamma = gsum + C;
  float* lambda = gamma + C;
  float* staged_beta = lambda + C;  // the next item's β and log-gates as loaded (zero past its n), staged by kStager
  float* staged_gate = staged_beta + C;  // during P4, so that the top of an item reads no global memory
  float* part = reinterpret_cast<float*>(smem + lay.partials);
  float* rq = part;                        // [kParts][C] <dO S, q> per row, by key part
  float* dlam = rq + kParts * C;           // [kParts][C] <V̄ G', k>
  float* z1k = dlam + kParts * C;          // [kParts][C] <Z_1, k>
  float* tuv = z1k + kParts * C;           // [kParts][C] <Tᵀ dV̄, v>
  float* ekk = part + 4 * kParts * C;      // [C/16][C] row sums of E ⊙ D ⊙ K Kᵀ, by 16-column block
  float* z_row = ekk + kRowBlocks * C;     // [C/16][C] row sums of Z (Z_o in P1, then + Z_2 in P4), by column block
  float* z_col = z_row + kRowBlocks * C;   // [C/16][C] column sums of Z, by row block
  float* reduce = z_col + kRowBlocks * C;  // [kWarps] per-warp <G', S>

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
  const int items = N * p.batch * p.heads;  // (chunk, head) pairs, chunks of a head consecutive
  constexpr bool gated = Gated;  // log-gates given; DeltaNet's instantiation has no gate arithmetic
  const int row_block = warp % kRowBlocks, part_index = warp / kRowBlocks;
  const int i0 = 16 * row_block, col0 = part_index * (kTcKeys / kParts);

  // ---- copies: every 16-bit operand by cp.async (zero past n rows and past the width), T in fp32.
  auto load_rows = [&](T* dst, const T* src, std::int64_t row, int rows, int width) {
    copy_rows_async<kThreads, C>(dst, src, row, rows, width, tid);
  };
  const auto packed = [](const void* data, std::size_t row0, int width) { return static_cast<const T*>(data) + row0 * width; };
  // The chunk's first row in each strided user tensor (q, k, v, dO rows 16-byte aligned: the launcher checked).
  const auto chunk_rows = [&](const ChunkItem& it, const void* data, const Strides& s) {
    return static_cast<const T*>(data) + s.head_offset(it.bi, it.h) + std::int64_t(it.t0) * s.row;
  };
  // Value rows r0.. of S_[c] and G' into stream buffer `buffer`.
  auto load_stream = [&](const ChunkItem& it, int buffer, int r0) {
    T* tiles = stream + 2 * buffer * kStream * kTcLd;
    const int rows = min(kStream, DV - r0);
    const std::size_t state_rows0 = (static_cast<std::size_t>(it.head) * N + it.chunk) * DV;  // S_[c]'s first row
    copy_rows_async<kThreads, kStream>(tiles, packed(b.state_pass.s, state_rows0 + r0, DK), DK, rows, DK, tid);
    copy_rows_async<kThreads, kStream>(tiles + kStream * kTcLd, packed(b.state_gradients, state_rows0 + r0, DK), DK, rows, DK, tid);
    copy_async_commit();
  };
  // A block runs chunk after chunk (persistent), and each chunk's operands come in while the one before is still
  // computing, as soon as the tile they land in is dead there: five copy groups, committed in this order.
  //   (a) dO and V̄'s lo part: from P3 on (P1 and P2 read them last);
  //   (b) Q, then T in fp32 into stream buffer 1; (c) the first state tile into buffer 0: once dT is formed (P3
  //       reads Q last; βV and βγK, over the stream tiles, are dead);
  //   (d) V̄'s hi part (dW's tile until P5) and K; (e) V and dV̄'s pair: from P6 on.
  // The top of a chunk waits for all but (e), which P2's first copy wait takes.
  auto copy_after_p2 = [&](const ChunkItem& it) {
    load_rows(do_s, chunk_rows(it, p.d_output, p.d_output_strides), p.d_output_strides.row, it.n, DV);
    load_rows(vb_lo, packed(b.state_pass.v_lo, it.token0, DV), DV, it.n, DV);
    copy_async_commit();
  };
  auto copy_after_dt = [&](const ChunkItem& it) {
    load_rows(q_s, chunk_rows(it, p.q, p.q_strides), p.q_strides.row, it.n, DK);
    const float* t_src = b.wy_inverse + (static_cast<std::size_t>(it.head) * N + it.chunk) * C * C;
    float* t_staged = reinterpret_cast<float*>(stream + 2 * kStream * kTcLd);  // stream buffer 1 (4C² bytes fit)
    block_for<C * C / 4, kThreads>(tid, [&](int e) { copy_async_16(t_staged + 4 * e, t_src + 4 * e, true); });
    copy_async_commit();
    load_stream(it, 0, 0);
  };
  auto copy_after_p5 = [&](const ChunkItem& it) {
    load_rows(vb_hi, packed(b.state_pass.v_hi, it.token0, DV), DV, it.n, DV);
    load_rows(k_s, chunk_rows(it, p.k, p.k_strides), p.k_strides.row, it.n, DK);
    copy_async_commit();
    load_rows(v_s, chunk_rows(it, p.v, p.v_strides), p.v_strides.row, it.n, DV);
    load_rows(dvb_hi, packed(b.d_v_new_hi, it.token0, DV), DV, it.n, DV);
    load_rows(dvb_lo, packed(b.d_v_new_lo, it.token0, DV), DV, it.n, DV);
    copy_async_commit();
  };
  // The warp that stages the next item's β and log-gates: one with no tile of E (above the diagonal: cb > rb), which
  // waits for those loads while the others form E.
  constexpr int kStager = kRowBlocks > 1 ? (kRowBlocks - 1) * kRowBlocks : 1;
  static_assert(kStager < kWarps, "the stager is a warp of the block");
  const auto stage_scalars = [&](const ChunkItem& it) {  // one warp
    const T* beta_in = chunk_rows(it, p.beta, p.beta_strides);
    const float* log_gate = gated ? static_cast<const float*>(p.log_gate) + p.log_gate_strides.head_offset(it.bi, it.h) +
                                        std::int64_t(it.t0) * p.log_gate_strides.row
                                  : nullptr;
    for (int i = lane; i < C; i += 32) {
      staged_beta[i] = i < it.n ? to_float(beta_in[i * p.beta_strides.row]) : 0.0f;
      if (gated) staged_gate[i] = i < it.n ? log_gate[i * p.log_gate_strides.row] : 0.0f;
    }
  };
  // Item i is (chunk i % N, head i / N), head = batch · heads + h. The block's items are stride apart: the next one
  // comes from the current one by carries, the quotients of stride formed once (no division per item).
  const int first_item = static_cast<int>(blockIdx.x), stride = static_cast<int>(gridDim.x);
  const int stride_chunks = stride % N, stride_heads = stride / N;
  const int stride_h = stride_heads % p.heads, stride_b = stride_heads / p.heads;
  const auto derive = [&](ChunkItem it) {  // the fields that follow from (chunk, bi, h)
    it.head = it.bi * p.heads + it.h;
    it.t0 = it.chunk * C, it.n = min(C, L - it.t0);
    it.token0 = static_cast<std::size_t>(it.head) * L + it.t0;  // packed intermediates
    return it;
  };
  const auto advance = [&](const ChunkItem& it) {
    ChunkItem next;
    next.chunk = it.chunk + stride_chunks;  // < 2N: one carry at most
    const int chunk_carry = next.chunk >= N;
    next.chunk -= chunk_carry * N;
    next.h = it.h + stride_h + chunk_carry;  // < 2 heads
    const int head_carry = next.h >= p.heads;
    next.h -= head_carry * p.heads;
    next.bi = it.bi + stride_b + head_carry;
    return derive(next);
  };
  ChunkItem cur;
  cur.chunk = first_item % N, cur.h = first_item / N % p.heads, cur.bi = first_item / N / p.heads;
  cur = derive(cur);
  if (first_item < items) {
    copy_after_p2(cur);
    copy_after_dt(cur);
    copy_after_p5(cur);
    if (warp == kStager) stage_scalars(cur);
  }
  __syncthreads();  // the first item's scalars are staged

  for (int item = first_item; item < items; item += stride, cur = advance(cur)) {
    const int chunk = cur.chunk, head = cur.head, t0 = cur.t0, n = cur.n, bi = cur.bi, h = cur.h;
    const std::size_t token0 = cur.token0;
    const bool has_next = item + stride < items;
    const auto chunk_rows_out = [&](void* data, const Strides& s) {
      return static_cast<T*>(data) + s.head_offset(bi, h) + std::int64_t(t0) * s.row;
    };
    if (warp == 0) {  // β and the gate sums G_i from the staged loads (the same shuffle tree as every other kernel)
      float lo = gated && lane < C ? staged_gate[lane] : 0.0f;
      float hi = gated && lane + 32 < C ? staged_gate[lane + 32] : 0.0f;
      if (gated) chunk_prefix_sums(lo, hi, lane);
      for (int half = 0; half < 2; ++half) {
        const int i = lane + 32 * half;
        if (i >= C) break;
        const float G = half ? hi : lo;
        beta[i] = staged_beta[i];
        gsum[i] = G;
        if (b.gate_sums != nullptr && i < n) b.gate_sums[token0 + i] = G;
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
    const float last = gsum[n - 1];
    for (int i = tid; i < C; i += kThreads) {  // without gates no decay: every one is exactly 1
      gamma[i] = gated ? gate_exp(gsum[i]) : 1.0f;
      lambda[i] = gated ? gate_exp(last - gsum[i]) : 1.0f;
    }
    // No barrier here: P1 reads only what the barrier above published (the copies, β and the gate sums); T's tile,
    // γ and λ are first read in P3 and P4, after P2's barriers.
    // exp(G_i − G_j), used for i ≥ j; the loops below also form it for masked entries of a tile on the diagonal
    // block (no per-entry branch) and drop it with a select, an inf from a positive exponent included.
    auto decay = [&](int i, int j) { return gated ? gate_exp(gsum[i] - gsum[j]) : 1.0f; };
    const int dv_steps = (DV + 15) / 16, dk_steps = (DK + 15) / 16;

    // ---- P1: E_o, and gated the sums of Z_o. Tiles of 16 × 16 on and below the diagonal.
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

    // ---- P2: the state products, S_[c] and G' (each rounded once) streamed one tile ahead.
    float dq[kDTiles][4] = {}, dw[kDTiles][4] = {}, vg[kDTiles][4] = {};
    float gs = 0.0f;  // this thread's part of <G', S>, of the rounded states as the tensor cores see them
    for (int r0 = 0, buffer = 0; r0 < DV; r0 += kStream, buffer ^= 1) {
      __syncthreads();  // the other buffer is consumed (and, the first time, P1's E_o is published)
      if (r0 + kStream < DV) {
        load_stream(cur, buffer ^ 1, r0 + kStream);
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
    if (has_next) copy_after_p2(advance(cur));  // formed where used: fewer live registers

    // Row sums of a C × D accumulator times a 16-bit operand over this warp's columns: per row, lanes
    // t = 0..3 by butterfly; stored by key part.
    auto row_dot = [&](const float (&acc)[kDTiles][4], const T* operand, float* out) {
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
    };
    // Stores a C × D accumulator as the dtype into a strided user tensor (rows < n, columns < width; widths
    // are multiples of 8 and rows 4-byte aligned here, so every pair is whole and aligned).
    auto store_rows = [&](const float (&acc)[kDTiles][4], void* data, const Strides& strides, int width) {
      T* dst = chunk_rows_out(data, strides) + col0 + 2 * t;  // each of this thread's two rows addressed once
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = i0 + g + 8 * half;
        T* row = dst + i * strides.row;
#pragma unroll
        for (int nt = 0; nt < kDTiles; ++nt)
          if (i < n && col0 + 8 * nt + 2 * t < width)
            *reinterpret_cast<unsigned*>(row + 8 * nt) = pack_pair<T>(acc[nt][2 * half], acc[nt][2 * half + 1]);
      }
    };

    // ---- P3: dq, dW, the first terms of dk; then βV, βγK and dT.
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
    store_rows(dq, p.dq, p.dq_strides, DK);
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
        if (b.d_w != nullptr && i < n && c < DK) {
          float* dst = b.d_w + (token0 + i) * DK + c;
          dst[0] = dw[nt][2 * half];
          if (c + 1 < DK) dst[1] = dw[nt][2 * half + 1];
        }
      }
    block_for<C * (kTcKeys / 2), kThreads>(tid, [&](int e) {  // βV and βγK, each product rounded once
      const int r = e / (kTcKeys / 2), c = (e % (kTcKeys / 2)) * 2;
      const float2 x = unpack_pair<T>(*reinterpret_cast<const unsigned*>(v_s + r * kTcLd + c));
      const float2 y = unpack_pair<T>(*reinterpret_cast<const unsigned*>(k_s + r * kTcLd + c));
      const float bg = beta[r] * gamma[r];
      *reinterpret_cast<unsigned*>(bv_s + r * kTcLd + c) = pack_pair<T>(beta[r] * x.x, beta[r] * x.y);
      *reinterpret_cast<unsigned*>(bgk_s + r * kTcLd + c) = pack_pair<T>(bg * y.x, bg * y.y);
    });
    __syncthreads();
    for (int tile = warp; tile < kRowBlocks * kRowBlocks; tile += kWarps) {  // dT = dV̄ (βV)ᵀ + dW (βγK)ᵀ, all of it
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
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<unsigned*>(dt_s + (16 * rb + g + 8 * half) * kPitchC + 16 * cb + 8 * nt + 2 * t) =
              pack_pair<T>(acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
    __syncthreads();
    if (has_next) copy_after_dt(advance(cur));

    // ---- P4: X = Tᵀ dT (T lower: (Tᵀ)_ij nonzero for j ≥ i), rounded once over E_o; then E, F and K Kᵀ.
    for (int tile = warp; tile < kRowBlocks * kRowBlocks; tile += kWarps) {
      const int rb = tile % kRowBlocks, cb = tile / kRowBlocks;
      float acc[2][4] = {};
      for (int jj = rb; jj < kRowBlocks; ++jj) {
        unsigned a[4], bd[4];
        a_columns(a, t_s, kPitchC, 16 * rb, 16 * jj);
        b_columns(bd, dt_s, kPitchC, 16 * jj, 16 * cb);
        mma_pair<T>(acc[0], acc[1], a, bd);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<unsigned*>(x_s + (16 * rb + g + 8 * half) * kPitchC + 16 * cb + 8 * nt + 2 * t) =
              pack_pair<T>(acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
    __syncthreads();
    if (warp == kStager && has_next) stage_scalars(advance(cur));  // read at the next item's top, barriers away
    float* e_out = b.wy_system_adjoint != nullptr ? b.wy_system_adjoint + (static_cast<std::size_t>(head) * N + chunk) * C * C : nullptr;
    for (int tile = warp; tile < kRowBlocks * kRowBlocks; tile += kWarps) {  // E = strictly_lower(−X Tᵀ)
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

    // ---- P5: Z_1 = Tᵀ dW, the rest of dk; dv; the dβ row sums.
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
    store_rows(vg, p.dk, p.dk_strides, DK);
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
      store_rows(tu, p.dv, p.dv_strides, DV);
    }
    __syncthreads();
    if (has_next) copy_after_p5(advance(cur));

    // ---- P6: dβ, and gated dG and dg; row partials summed in a fixed order.
    if (tid < C) {
      const int i = tid;
      float s_rq = 0.0f, s_dl = 0.0f, s_z1k = 0.0f, s_tuv = 0.0f, s_ekk = 0.0f;
      for (int q_part = 0; q_part < kParts; ++q_part) {
        s_rq += rq[q_part * C + i], s_dl += dlam[q_part * C + i];
        s_z1k += z1k[q_part * C + i], s_tuv += tuv[q_part * C + i];
      }
      for (int cb = 0; cb < kRowBlocks; ++cb) s_ekk += ekk[cb * C + i];
      if (i < n) chunk_rows_out(p.d_beta, p.d_beta_strides)[i * p.d_beta_strides.row] = from_float<T>(s_tuv + gamma[i] * s_z1k + s_ekk);
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
      float* dg = static_cast<float*>(p.d_log_gate) + p.d_log_gate_strides.head_offset(bi, h) + std::int64_t(t0) * p.d_log_gate_strides.row;
      for (int r = n - 1; r >= 0; --r) {
        running += gsum[r];
        dg[r * p.d_log_gate_strides.row] = running;
        if (b.gate_sum_gradients != nullptr) b.gate_sum_gradients[token0 + r] = gsum[r];
      }
    }
    __syncthreads();  // the scalars and partials are read; the next chunk writes them
  }
}

}  // namespace deltaproof::cuda::DELTAPROOF_BACKWARD_TENSOR_CORE_KERNELS
