// The four kernels of the DeltaNet / Gated DeltaNet backward (delta_rule_backward.cu launches them;
// the header comment there says how they are written and why). In a header so that the same source
// also runs on the CPU under property_tests/delta_rule_backward_cpu_emulation_test.cpp's emulation of
// threads, barriers and warp shuffles: nothing here may depend on more than that.
#pragma once

#include "cuda/delta_rule_launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <type_traits>

// The CPU emulation compiles this source once more, under another namespace, so that its functions
// never share a name (and a link-time definition) with this build's kernel launch stubs.
#ifndef DELTAPROOF_BACKWARD_KERNELS
#define DELTAPROOF_BACKWARD_KERNELS backward_kernels
#endif

namespace deltaproof::cuda::DELTAPROOF_BACKWARD_KERNELS {

using delta_rule::BackwardStageParams;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSlice = 16;  // value rows of S (or of G) per scan block
constexpr int kMaxHeadDim = 256;

template <class T>
struct AccumulatorOf {
  using type = float;
};
template <>
struct AccumulatorOf<double> {
  using type = double;
};
template <class T>
using acc_t = typename AccumulatorOf<T>::type;

// Exact conversion of an input element to the accumulation type.
template <class A, class T>
__device__ __forceinline__ A load(const T* p, std::size_t i) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(p[i]);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(p[i]);
  else return static_cast<A>(p[i]);
}

// Rows of one (batch, head) of a strided user tensor from a first row on: element (i, c) at
// data[i·row + c], a per-token vector's token i at (i, 0). E is const for inputs; null stays null.
template <class E>
struct Rows {
  E* data;
  std::int64_t row;
  __device__ explicit operator bool() const { return data != nullptr; }
  __device__ E& at(int i, int c = 0) const { return data[i * row + c]; }
};
template <class E, class Pointer>
__device__ __forceinline__ Rows<E> chunk_rows(Pointer data, const Strides& s, const BackwardStageParams& p, int head, int first) {
  if (data == nullptr) return {nullptr, s.row};
  return {static_cast<E*>(data) + s.head_offset(head / p.heads, head % p.heads) + first * s.row, s.row};
}
// Exact conversion of element (i, c) of strided rows to the accumulation type.
template <class A, class E>
__device__ __forceinline__ A load(const Rows<E>& rows, int i, int c = 0) {
  return load<A>(rows.data + i * rows.row + c, std::size_t(0));
}

// Round to nearest even in T (the only rounding to the input dtype: stored gradients).
template <class T, class A>
__device__ __forceinline__ T store_as(A x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return static_cast<T>(x);
}

// expf is within 2 ulp, exp within 1 ulp (CUDA programming guide, full range): the bounds' ε_D.
__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
__device__ __forceinline__ float fma_acc(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_acc(double a, double b, double c) { return fma(a, b, c); }

// Butterfly over the warp: every lane ends with the same bits.
template <class A>
__device__ __forceinline__ A warp_sum(A x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Every intermediate, resolved to the caller's buffer or a part of the workspace (acc type).
struct Buffers {
  void *gate_sums, *wy_inverse, *w, *u, *scores, *boundary_states, *v_new, *d_v_new, *state_gradients, *d_w;
};

// ---------------------------------------------------------------------------------------
// Stage 1: G, A, T, W, U, P of one chunk (one block per chunk and head).

template <class A, int C>
constexpr std::size_t prepare_shared_bytes() {
  return (2 * C * (C + 1) + 3 * C) * sizeof(A);
}

template <class T, int C>
__global__ void __launch_bounds__(kThreads) backward_prepare_kernel(const BackwardStageParams p, const Buffers b) {
  using A = acc_t<T>;
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int pc = C + 1;  // pitch of the C×C tiles
  const int chunk = blockIdx.x, head = blockIdx.y, N = gridDim.x;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim;
  const int begin = chunk * C, n = min(C, L - begin);
  const int lane = tid % 32, warp = tid / 32;
  const std::size_t token0 = std::size_t(head) * L + begin;         // first token of the chunk (packed intermediates)
  const std::size_t block0 = (std::size_t(head) * N + chunk) * C * C;  // its C×C block
  const Rows<const T> q = chunk_rows<const T>(p.q, p.q_strides, p, head, begin), k = chunk_rows<const T>(p.k, p.k_strides, p, head, begin);
  const Rows<const T> v = chunk_rows<const T>(p.v, p.v_strides, p, head, begin), beta_in = chunk_rows<const T>(p.beta, p.beta_strides, p, head, begin);
  const Rows<const A> log_gate = chunk_rows<const A>(p.log_gate, p.log_gate_strides, p, head, begin);

  extern __shared__ __align__(16) unsigned char smem[];
  A* a = reinterpret_cast<A*>(smem);  // (C, C) A = I + strictly_lower(diag(β)(K Kᵀ ⊙ D))
  A* t = a + C * pc;                  // (C, C) T = A⁻¹
  A* gsum = t + C * pc;               // (C) G_i
  A* beta = gsum + C;                 // (C) β_i
  A* beta_gamma = beta + C;           // (C) β_i γ_i, γ_i = exp(G_i)

  // G_i = Σ_{t ≤ i} g_t, one thread, in token order: later kernels read these bits, never re-sum.
  if (tid == 0) {
    A running = 0;
    for (int i = 0; i < n; ++i) {
      running += log_gate ? log_gate.at(i) : A(0);
      gsum[i] = running;
      static_cast<A*>(b.gate_sums)[token0 + i] = running;
    }
  }
  for (int i = tid; i < C; i += kThreads) beta[i] = i < n ? load<A>(beta_in, i) : A(0);
  __syncthreads();
  for (int i = tid; i < n; i += kThreads) beta_gamma[i] = beta[i] * exp_acc(gsum[i]);

  // A_ij = (β_i k_i·k_j) D_ij for j < i, P_ij = (q_i·k_j) D_ij for j <= i: row · row, a warp per (i, j).
  A* scores = static_cast<A*>(b.scores) + block0;
  for (int pair = warp; pair < C * C; pair += kWarps) {
    const int i = pair / C, j = pair % C;
    A kk = 0, qk = 0;
    if (i < n && j <= i)
      for (int d = lane; d < DK; d += 32) {
        const A kj = load<A>(k, j, d);
        kk = fma_acc(load<A>(k, i, d), kj, kk);
        qk = fma_acc(load<A>(q, i, d), kj, qk);
      }
    kk = warp_sum(kk);
    qk = warp_sum(qk);
    if (lane == 0) {
      const A decay = i < n && j <= i ? exp_acc(gsum[i] - gsum[j]) : A(0);
      const A a_ij = j < i && i < n ? beta[i] * kk * decay : A(i == j ? 1 : 0);
      a[i * pc + j] = a_ij;
      t[i * pc + j] = i == j ? A(1) : A(0);
      scores[pair] = i < n && j <= i ? qk * decay : A(0);
      if (p.wy_system != nullptr) static_cast<A*>(p.wy_system)[block0 + pair] = a_ij;
    }
  }
  __syncthreads();

  // T = A⁻¹ by forward substitution, thread j owns column j: t_ij = −Σ_{j ≤ m < i} a_im t_mj.
  if (tid < n) {
    const int j = tid;
    for (int i = j + 1; i < n; ++i) {
      A sum = 0;
      for (int m = j; m < i; ++m) sum = fma_acc(a[i * pc + m], t[m * pc + j], sum);
      t[i * pc + j] = -sum;
    }
  }
  __syncthreads();
  A* inverse = static_cast<A*>(b.wy_inverse) + block0;
  for (int idx = tid; idx < C * C; idx += kThreads) inverse[idx] = t[(idx / C) * pc + idx % C];

  // W = T diag(βγ) K, U = T diag(β) V: row × matrix, the factor t_ij (β_j γ_j) rounded once.
  A* w = static_cast<A*>(b.w) + token0 * DK;
  A* u = static_cast<A*>(b.u) + token0 * DV;
  for (int i = warp; i < n; i += kWarps) {
    for (int d = lane; d < DK; d += 32) {
      A sum = 0;
      for (int j = 0; j <= i; ++j) sum = fma_acc(t[i * pc + j] * beta_gamma[j], load<A>(k, j, d), sum);
      w[std::size_t(i) * DK + d] = sum;
    }
    for (int e = lane; e < DV; e += 32) {
      A sum = 0;
      for (int j = 0; j <= i; ++j) sum = fma_acc(t[i * pc + j] * beta[j], load<A>(v, j, e), sum);
      u[std::size_t(i) * DV + e] = sum;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Stages 2 and 3: the scans over chunks, one block per (head, kSlice value rows).

template <class A, int C>
std::size_t scan_shared_bytes(int key_dim) {
  return (std::size_t(kSlice) * key_dim + C * kSlice + 3 * C) * sizeof(A);
}

// Stage 2: S_[c] forward, V̄ = U − W S_[c]ᵀ, and (when asked) O = diag(γ) Q S_[c]ᵀ + P V̄.
template <class T, int C>
__global__ void __launch_bounds__(kThreads) backward_state_scan_kernel(const BackwardStageParams p, const Buffers b) {
  using A = acc_t<T>;
  const int tid = static_cast<int>(threadIdx.x);
  const int slice = blockIdx.x, head = blockIdx.y;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
  const int r0 = slice * kSlice, rows = min(kSlice, DV - r0);
  const int lane = tid % 32, warp = tid / 32;

  extern __shared__ __align__(16) unsigned char smem[];
  A* s = reinterpret_cast<A*>(smem);  // (kSlice, DK): rows r0.. of S
  A* vbar = s + kSlice * DK;           // (C, kSlice): V̄ of the chunk
  A* gsum = vbar + C * kSlice;         // (C)
  A* lambda = gsum + C;                // (C) λ_i = exp(G_{n−1} − G_i)
  A* gamma = lambda + C;               // (C) γ_i = exp(G_i)

  const std::size_t state0 = std::size_t(head) * DV * DK;  // the packed final_state's (a stage output)
  const Rows<const A> initial = chunk_rows<const A>(p.initial_state, p.initial_state_strides, p, head, r0);
  for (int idx = tid; idx < kSlice * DK; idx += kThreads) {
    const int r = idx / DK, d = idx % DK;
    s[idx] = initial && r < rows ? initial.at(r, d) : A(0);
  }
  __syncthreads();

  for (int chunk = 0; chunk < N; ++chunk) {
    const int begin = chunk * C, n = min(C, L - begin);
    const std::size_t token0 = std::size_t(head) * L + begin;
    const std::size_t states0 = (std::size_t(head) * N + chunk) * DV * DK;
    A* boundary = static_cast<A*>(b.boundary_states) + states0;
    for (int idx = tid; idx < rows * DK; idx += kThreads) boundary[std::size_t(r0) * DK + idx] = s[idx];
    for (int i = tid; i < n; i += kThreads) gsum[i] = static_cast<const A*>(b.gate_sums)[token0 + i];
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      lambda[i] = exp_acc(gsum[n - 1] - gsum[i]);
      gamma[i] = exp_acc(gsum[i]);
    }

    // V̄[i][r] = U[i][r] − W_i · S_r: row · row, a warp per (i, r).
    const A* w = static_cast<const A*>(b.w) + token0 * DK;
    for (int pair = warp; pair < n * rows; pair += kWarps) {
      const int i = pair / rows, r = pair % rows;
      A ws = 0;
      for (int d = lane; d < DK; d += 32) ws = fma_acc(w[std::size_t(i) * DK + d], s[r * DK + d], ws);
      ws = warp_sum(ws);
      if (lane == 0) {
        const std::size_t at = (token0 + i) * DV + r0 + r;
        const A x = static_cast<const A*>(b.u)[at] - ws;
        vbar[i * kSlice + r] = x;
        static_cast<A*>(b.v_new)[at] = x;
      }
    }
    __syncthreads();

    // O[i][r] = γ_i (q_i · S_r) + Σ_{j ≤ i} P_ij V̄[j][r]: a warp per (i, r); only for the forward.
    if (p.output != nullptr) {
      const Rows<const T> q = chunk_rows<const T>(p.q, p.q_strides, p, head, begin);
      const A* scores = static_cast<const A*>(b.scores) + (std::size_t(head) * N + chunk) * C * C;
      for (int pair = warp; pair < n * rows; pair += kWarps) {
        const int i = pair / rows, r = pair % rows;
        A qs = 0, pv = 0;
        for (int d = lane; d < DK; d += 32) qs = fma_acc(load<A>(q, i, d), s[r * DK + d], qs);
        for (int j = lane; j <= i; j += 32) pv = fma_acc(scores[i * C + j], vbar[j * kSlice + r], pv);
        qs = warp_sum(qs);
        pv = warp_sum(pv);
        if (lane == 0) static_cast<T*>(p.output)[(token0 + i) * DV + r0 + r] = store_as<T>(fma_acc(gamma[i], qs, pv));
      }
    }
    __syncthreads();  // every read of S_[c] is done

    // S_[c+1][r][d] = γ_{n−1} S[r][d] + Σ_i (V̄[i][r] λ_i) k_i[d]: row × matrix.
    const Rows<const T> k = chunk_rows<const T>(p.k, p.k_strides, p, head, begin);
    const A gamma_end = gamma[n - 1];
    for (int r = warp; r < rows; r += kWarps)
      for (int d = lane; d < DK; d += 32) {
        A sum = 0;
        for (int i = 0; i < n; ++i) sum = fma_acc(vbar[i * kSlice + r] * lambda[i], load<A>(k, i, d), sum);
        s[r * DK + d] = fma_acc(gamma_end, s[r * DK + d], sum);
      }
    __syncthreads();
  }
  if (p.final_state != nullptr)
    for (int idx = tid; idx < rows * DK; idx += kThreads)
      static_cast<A*>(p.final_state)[state0 + std::size_t(r0) * DK + idx] = s[idx];
}

// Stage 3: G_[c+1] = dL/dS_[c+1] backward from dS_L, dV̄, and dS_0 = G_[0].
template <class T, int C>
__global__ void __launch_bounds__(kThreads) backward_gradient_scan_kernel(const BackwardStageParams p, const Buffers b) {
  using A = acc_t<T>;
  const int tid = static_cast<int>(threadIdx.x);
  const int slice = blockIdx.x, head = blockIdx.y;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = (L + C - 1) / C;
  const int r0 = slice * kSlice, rows = min(kSlice, DV - r0);
  const int lane = tid % 32, warp = tid / 32;

  extern __shared__ __align__(16) unsigned char smem[];
  A* grad = reinterpret_cast<A*>(smem);  // (kSlice, DK): rows r0.. of G_[c+1]
  A* dvbar = grad + kSlice * DK;          // (C, kSlice): dV̄ of the chunk
  A* gsum = dvbar + C * kSlice;           // (C)
  A* lambda = gsum + C;                   // (C)
  A* gamma = lambda + C;                  // (C)

  const Rows<const A> d_final = chunk_rows<const A>(p.d_final_state, p.d_final_state_strides, p, head, r0);
  for (int idx = tid; idx < kSlice * DK; idx += kThreads) {
    const int r = idx / DK, d = idx % DK;
    grad[idx] = d_final && r < rows ? d_final.at(r, d) : A(0);
  }
  __syncthreads();

  for (int chunk = N - 1; chunk >= 0; --chunk) {
    const int begin = chunk * C, n = min(C, L - begin);
    const std::size_t token0 = std::size_t(head) * L + begin;
    A* next_gradient = static_cast<A*>(b.state_gradients) + (std::size_t(head) * N + chunk) * DV * DK;
    for (int idx = tid; idx < rows * DK; idx += kThreads) next_gradient[std::size_t(r0) * DK + idx] = grad[idx];
    for (int i = tid; i < n; i += kThreads) gsum[i] = static_cast<const A*>(b.gate_sums)[token0 + i];
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      lambda[i] = exp_acc(gsum[n - 1] - gsum[i]);
      gamma[i] = exp_acc(gsum[i]);
    }
    __syncthreads();

    // dV̄[j][r] = Σ_{i ≥ j} P_ij dO[i][r] + λ_j (k_j · G_r): a warp per (j, r).
    const Rows<const T> k = chunk_rows<const T>(p.k, p.k_strides, p, head, begin);
    const Rows<const T> d_out = chunk_rows<const T>(p.d_output, p.d_output_strides, p, head, begin);
    const A* scores = static_cast<const A*>(b.scores) + (std::size_t(head) * N + chunk) * C * C;
    for (int pair = warp; pair < n * rows; pair += kWarps) {
      const int j = pair / rows, r = pair % rows;
      A kg = 0, pd = 0;
      for (int d = lane; d < DK; d += 32) kg = fma_acc(load<A>(k, j, d), grad[r * DK + d], kg);
      for (int i = j + lane; i < n; i += 32) pd = fma_acc(scores[i * C + j], load<A>(d_out, i, r0 + r), pd);
      kg = warp_sum(kg);
      pd = warp_sum(pd);
      if (lane == 0) {
        const A x = fma_acc(lambda[j], kg, pd);
        dvbar[j * kSlice + r] = x;
        static_cast<A*>(b.d_v_new)[(token0 + j) * DV + r0 + r] = x;
      }
    }
    __syncthreads();

    // G_[c][r][d] = γ_{n−1} G[r][d] + Σ_i ((dO[i][r] γ_i) q_i[d] − dV̄[i][r] W_i[d]): row × matrix.
    const Rows<const T> q = chunk_rows<const T>(p.q, p.q_strides, p, head, begin);
    const A* w = static_cast<const A*>(b.w) + token0 * DK;
    const A gamma_end = gamma[n - 1];
    for (int r = warp; r < rows; r += kWarps)
      for (int d = lane; d < DK; d += 32) {
        A sum = 0;
        for (int i = 0; i < n; ++i) {
          sum = fma_acc(load<A>(d_out, i, r0 + r) * gamma[i], load<A>(q, i, d), sum);
          sum = fma_acc(-dvbar[i * kSlice + r], w[std::size_t(i) * DK + d], sum);
        }
        grad[r * DK + d] = fma_acc(gamma_end, grad[r * DK + d], sum);
      }
    __syncthreads();
  }
  if (p.d_initial_state != nullptr) {
    const Rows<A> d_initial = chunk_rows<A>(p.d_initial_state, p.d_initial_state_strides, p, head, r0);
    for (int idx = tid; idx < rows * DK; idx += kThreads) d_initial.at(idx / DK, idx % DK) = grad[idx];
  }
}

// ---------------------------------------------------------------------------------------
// Stage 4: the gradients of one chunk (one block per chunk and head), all chunks in parallel.

template <class A, int C>
constexpr std::size_t chunk_shared_bytes() {
  return (6 * C * (C + 1) + 10 * C + kThreads) * sizeof(A);
}

// <x, y> over `count` entries by the whole block: fixed per-thread strides, then a fixed tree in `reduction`
// (kThreads entries), where the sum lands at [0]; ends at a barrier.
template <class A>
__device__ __forceinline__ void block_dot(const A* x, const A* y, std::size_t count, A* reduction, int tid) {
  A partial = 0;
  for (std::size_t idx = std::size_t(tid); idx < count; idx += kThreads) partial = fma_acc(x[idx], y[idx], partial);
  reduction[tid] = partial;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (tid < half) reduction[tid] += reduction[tid + half];
    __syncthreads();
  }
}
// One thread: the last token also carries λ's and γ_{n−1}'s cotangents (λ_i = exp(G_{n−1} − G_i), S_[c+1] ∝
// γ_{n−1} S: `state_dot` = <G', S>); then dg_j = Σ_{r ≥ j} dG_r in reverse token order (d_gsum holds dG; written to
// `gate_sum_gradients` when given).
template <class A>
__device__ __forceinline__ void log_gate_gradients(A* d_gsum, const A* k_x2, const A* lambda, A gamma_last, A state_dot, int n,
                                                   const Rows<A>& d_log_gate, A* gate_sum_gradients) {
  A end = 0;
  for (int i = 0; i < n; ++i) end = fma_acc(k_x2[i], lambda[i], end);
  d_gsum[n - 1] += fma_acc(state_dot, gamma_last, end);
  A running = 0;
  for (int r = n - 1; r >= 0; --r) {
    running += d_gsum[r];
    if (gate_sum_gradients != nullptr) gate_sum_gradients[r] = d_gsum[r];
    if (d_log_gate) d_log_gate.at(r) = running;
  }
}

template <class T, int C>
__global__ void __launch_bounds__(kThreads) backward_chunk_kernel(const BackwardStageParams p, const Buffers b) {
  using A = acc_t<T>;
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int pc = C + 1;
  const int chunk = blockIdx.x, head = blockIdx.y, N = gridDim.x;
  const int L = p.length, DK = p.key_dim, DV = p.value_dim;
  const int begin = chunk * C, n = min(C, L - begin);
  const int lane = tid % 32, warp = tid / 32;
  const std::size_t token0 = std::size_t(head) * L + begin;
  const std::size_t block0 = (std::size_t(head) * N + chunk) * C * C;
  const std::size_t states0 = (std::size_t(head) * N + chunk) * DV * DK;
  const Rows<const T> q = chunk_rows<const T>(p.q, p.q_strides, p, head, begin), k = chunk_rows<const T>(p.k, p.k_strides, p, head, begin);
  const Rows<const T> v = chunk_rows<const T>(p.v, p.v_strides, p, head, begin);
  const Rows<const T> d_out = chunk_rows<const T>(p.d_output, p.d_output_strides, p, head, begin);
  const Rows<const T> beta_in = chunk_rows<const T>(p.beta, p.beta_strides, p, head, begin);
  const Rows<T> dq = chunk_rows<T>(p.dq, p.dq_strides, p, head, begin), dk = chunk_rows<T>(p.dk, p.dk_strides, p, head, begin);
  const Rows<T> dv = chunk_rows<T>(p.dv, p.dv_strides, p, head, begin);
  const Rows<T> d_beta = chunk_rows<T>(p.d_beta, p.d_beta_strides, p, head, begin);
  const Rows<A> d_log_gate = chunk_rows<A>(p.d_log_gate, p.d_log_gate_strides, p, head, begin);
  const A* state = static_cast<const A*>(b.boundary_states) + states0;         // S = S_[c], (DV, DK)
  const A* next_grad = static_cast<const A*>(b.state_gradients) + states0;     // G' = G_[c+1], (DV, DK)
  const A* vbar = static_cast<const A*>(b.v_new) + token0 * DV;                 // (n, DV)
  const A* dvbar = static_cast<const A*>(b.d_v_new) + token0 * DV;              // (n, DV) = dU
  const A* scores = static_cast<const A*>(b.scores) + block0;                  // (C, C) P
  A* dw = static_cast<A*>(b.d_w) + token0 * DK;                                 // (n, DK)

  extern __shared__ __align__(16) unsigned char smem[];
  A* t = reinterpret_cast<A*>(smem);  // (C, C) T
  A* kk = t + C * pc;                 // (C, C) k_i · k_j, j < i
  A* eo = kk + C * pc;                // (C, C) E_o = (dO V̄ᵀ) ⊙ D, j <= i
  A* z = eo + C * pc;                 // (C, C) dL/dD_ij · D_ij, j < i
  A* dt = z + C * pc;                 // (C, C) dT (j < i), then E ⊙ D
  A* x = dt + C * pc;                 // (C, C) Tᵀ dT (b < i)
  A* gsum = x + C * pc;               // (C) G_i
  A* beta = gsum + C;                 // (C) β_i
  A* gamma = beta + C;                // (C) γ_i
  A* lambda = gamma + C;              // (C) λ_i
  A* beta_gamma = lambda + C;         // (C) β_i γ_i
  A* q_sq = beta_gamma + C;           // (C) <(dO S)_i, q_i>, the O term of dγ_i
  A* k_y = q_sq + C;                  // (C) <(Tᵀ dW)_i, k_i>
  A* k_x2 = k_y + C;                  // (C) <(V̄ G')_i, k_i> = dλ_i
  A* v_y = k_x2 + C;                  // (C) <(Tᵀ dU)_i, v_i>
  A* d_gsum = v_y + C;                // (C) dL/dG_i
  A* reduction = d_gsum + C;          // (kThreads)

  // Per token: G, β, γ, λ, βγ; T from stage 1; k_i · k_j.
  for (int i = tid; i < C; i += kThreads) {
    gsum[i] = i < n ? static_cast<const A*>(b.gate_sums)[token0 + i] : A(0);
    beta[i] = i < n ? load<A>(beta_in, i) : A(0);
  }
  const A* inverse = static_cast<const A*>(b.wy_inverse) + block0;
  for (int idx = tid; idx < C * C; idx += kThreads) t[(idx / C) * pc + idx % C] = inverse[idx];
  __syncthreads();
  for (int i = tid; i < n; i += kThreads) {
    gamma[i] = exp_acc(gsum[i]);
    lambda[i] = exp_acc(gsum[n - 1] - gsum[i]);
    beta_gamma[i] = beta[i] * gamma[i];
  }
  // Row · row, a warp per (i, j) with j <= i: kk = k_i·k_j; dO_i·V̄_j gives E_o = (dO V̄ᵀ) D and
  // Z1 = (dO V̄ᵀ) ⊙ P, the output's share of dL/dD ⊙ D.
  for (int pair = warp; pair < n * n; pair += kWarps) {
    const int i = pair / n, j = pair % n;
    if (j > i) continue;  // warp-uniform
    A kdot = 0, dov = 0;
    for (int d = lane; d < DK; d += 32) kdot = fma_acc(load<A>(k, i, d), load<A>(k, j, d), kdot);
    for (int e = lane; e < DV; e += 32) dov = fma_acc(load<A>(d_out, i, e), vbar[std::size_t(j) * DV + e], dov);
    kdot = warp_sum(kdot);
    dov = warp_sum(dov);
    if (lane == 0) {
      kk[i * pc + j] = kdot;
      eo[i * pc + j] = dov * exp_acc(gsum[i] - gsum[j]);
      z[i * pc + j] = j < i ? dov * scores[i * C + j] : A(0);
    }
  }
  __syncthreads();

  // dW = −dV̄ S and dq = γ_i (dO S)_i + Σ_{j ≤ i} E_o[i][j] k_j: row × matrix, S read once for both.
  for (int i = warp; i < n; i += kWarps) {
    A partial = 0;  // <(dO S)_i, q_i>
    for (int d = lane; d < DK; d += 32) {
      A dos = 0, dvs = 0;
      for (int r = 0; r < DV; ++r) {
        const A s_rd = state[std::size_t(r) * DK + d];
        dos = fma_acc(load<A>(d_out, i, r), s_rd, dos);
        dvs = fma_acc(dvbar[std::size_t(i) * DV + r], s_rd, dvs);
      }
      dw[std::size_t(i) * DK + d] = -dvs;
      A eok = 0;
      for (int j = 0; j <= i; ++j) eok = fma_acc(eo[i * pc + j], load<A>(k, j, d), eok);
      dq.at(i, d) = store_as<T>(fma_acc(gamma[i], dos, eok));
      partial = fma_acc(dos, load<A>(q, i, d), partial);
    }
    partial = warp_sum(partial);
    if (lane == 0) q_sq[i] = partial;
  }
  __syncthreads();  // dW (global) is read below by other warps

  // dT_ij = β_j (dU_i · v_j) + β_j γ_j (dW_i · k_j) for j < i (only these reach E): a warp per pair.
  for (int pair = warp; pair < n * n; pair += kWarps) {
    const int i = pair / n, j = pair % n;
    if (j >= i) continue;
    A uv = 0, wk = 0;
    for (int e = lane; e < DV; e += 32) uv = fma_acc(dvbar[std::size_t(i) * DV + e], load<A>(v, j, e), uv);
    for (int d = lane; d < DK; d += 32) wk = fma_acc(dw[std::size_t(i) * DK + d], load<A>(k, j, d), wk);
    uv = warp_sum(uv);
    wk = warp_sum(wk);
    if (lane == 0) dt[i * pc + j] = fma_acc(uv, beta[j], wk * beta_gamma[j]);
  }
  __syncthreads();

  // X = Tᵀ dT for b < i: X_ib = Σ_{a ≥ i} t_ai dT_ab (dT_ab with a > b only).
  for (int idx = tid; idx < C * C; idx += kThreads) {
    const int i = idx / C, bcol = idx % C;
    if (i >= n || bcol >= i) continue;
    A sum = 0;
    for (int a2 = i; a2 < n; ++a2) sum = fma_acc(t[a2 * pc + i], dt[a2 * pc + bcol], sum);
    x[i * pc + bcol] = sum;
  }
  __syncthreads();

  // E_ij = −Σ_{b ≤ j} X_ib t_jb for j < i (= dL/dA); then E ⊙ D in dT's place, and Z += (E ⊙ D) β_i kk.
  for (int idx = tid; idx < C * C; idx += kThreads) {
    const int i = idx / C, j = idx % C;
    A e_ij = 0;
    if (i < n && j < i) {
      A sum = 0;
      for (int bcol = 0; bcol <= j; ++bcol) sum = fma_acc(x[i * pc + bcol], t[j * pc + bcol], sum);
      e_ij = -sum;
    }
    if (p.wy_system_adjoint != nullptr) static_cast<A*>(p.wy_system_adjoint)[block0 + idx] = e_ij;
    if (i < n && j < i) {
      const A ed = e_ij * exp_acc(gsum[i] - gsum[j]);
      dt[i * pc + j] = ed;
      z[i * pc + j] = fma_acc(ed * beta[i], kk[i * pc + j], z[i * pc + j]);
    }
  }
  __syncthreads();

  // dk_i = Σ_{r ≥ i} E_o[r][i] q_r + Σ_j F_ij... (F + Fᵀ) k with F_ij = β_i (E ⊙ D)_ij, then
  // + λ_i (V̄ G')_i + β_i γ_i (Tᵀ dW)_i: row × matrix.
  for (int i = warp; i < n; i += kWarps) {
    A ky = 0, kx2 = 0;
    for (int d = lane; d < DK; d += 32) {
      A sum = 0;
      for (int r = i; r < n; ++r) sum = fma_acc(eo[r * pc + i], load<A>(q, r, d), sum);
      for (int j = 0; j < n; ++j) {
        const A f = j < i ? beta[i] * dt[i * pc + j] : j > i ? beta[j] * dt[j * pc + i] : A(0);
        sum = fma_acc(f, load<A>(k, j, d), sum);
      }
      A x2 = 0, y = 0;
      for (int e = 0; e < DV; ++e) x2 = fma_acc(vbar[std::size_t(i) * DV + e], next_grad[std::size_t(e) * DK + d], x2);
      for (int j = i; j < n; ++j) y = fma_acc(t[j * pc + i], dw[std::size_t(j) * DK + d], y);
      const A k_id = load<A>(k, i, d);
      dk.at(i, d) = store_as<T>(fma_acc(lambda[i], x2, fma_acc(beta_gamma[i], y, sum)));
      ky = fma_acc(y, k_id, ky);
      kx2 = fma_acc(x2, k_id, kx2);
    }
    ky = warp_sum(ky);
    kx2 = warp_sum(kx2);
    if (lane == 0) k_y[i] = ky, k_x2[i] = kx2;
  }
  // dv_i = β_i (Tᵀ dU)_i: row × matrix.
  for (int i = warp; i < n; i += kWarps) {
    A vy = 0;
    for (int e = lane; e < DV; e += 32) {
      A y = 0;
      for (int j = i; j < n; ++j) y = fma_acc(t[j * pc + i], dvbar[std::size_t(j) * DV + e], y);
      dv.at(i, e) = store_as<T>(beta[i] * y);
      vy = fma_acc(y, load<A>(v, i, e), vy);
    }
    vy = warp_sum(vy);
    if (lane == 0) v_y[i] = vy;
  }
  block_dot(next_grad, state, std::size_t(DV) * DK, reduction, tid);  // <G', S>, the end decay's cotangent

  // Per token r: dβ_r, and dG_r = dγ_r γ_r + Σ_{i<r} Z_ri − Σ_{i>r} Z_ir − dλ_r λ_r.
  for (int r = tid; r < n; r += kThreads) {
    A sum = 0;
    for (int j = 0; j < r; ++j) sum = fma_acc(dt[r * pc + j], kk[r * pc + j], sum);
    const A d_beta_r = fma_acc(gamma[r], k_y[r], sum) + v_y[r];
    d_beta.at(r) = store_as<T>(d_beta_r);
    const A d_gamma = fma_acc(beta[r], k_y[r], q_sq[r]);
    A zsum = 0;
    for (int i = 0; i < r; ++i) zsum += z[r * pc + i];
    for (int i = r + 1; i < n; ++i) zsum -= z[i * pc + r];
    d_gsum[r] = fma_acc(d_gamma, gamma[r], zsum) - k_x2[r] * lambda[r];
  }
  __syncthreads();
  if (tid == 0)
    log_gate_gradients(d_gsum, k_x2, lambda, gamma[n - 1], reduction[0], n, d_log_gate,
                       p.gate_sum_gradients != nullptr ? static_cast<A*>(p.gate_sum_gradients) + token0 : nullptr);
}

// ---------------------------------------------------------------------------------------
// Which kernel runs each stage, on which grid, with how much shared memory (the launcher and the
// CPU emulation both read this).

enum class Stage { prepare, state_scan, gradient_scan, chunk_gradients };

using Kernel = void (*)(const BackwardStageParams, const Buffers);

struct LaunchShape {
  Kernel kernel;
  dim3 grid;
  std::size_t shared_bytes;
  const char* name;
};

template <class T, int C>
LaunchShape launch_shape(Stage stage, const BackwardStageParams& p) {
  using A = acc_t<T>;
  const unsigned heads = unsigned(p.batch) * unsigned(p.heads);
  const unsigned N = unsigned((p.length + C - 1) / C), slices = unsigned((p.value_dim + kSlice - 1) / kSlice);
  switch (stage) {
    case Stage::prepare: return {backward_prepare_kernel<T, C>, dim3(N, heads), prepare_shared_bytes<A, C>(), "backward_prepare_kernel"};
    case Stage::state_scan:
      return {backward_state_scan_kernel<T, C>, dim3(slices, heads), scan_shared_bytes<A, C>(p.key_dim), "backward_state_scan_kernel"};
    case Stage::gradient_scan:
      return {backward_gradient_scan_kernel<T, C>, dim3(slices, heads), scan_shared_bytes<A, C>(p.key_dim),
              "backward_gradient_scan_kernel"};
    default: return {backward_chunk_kernel<T, C>, dim3(N, heads), chunk_shared_bytes<A, C>(), "backward_chunk_kernel"};
  }
}

}  // namespace deltaproof::cuda::DELTAPROOF_BACKWARD_KERNELS
