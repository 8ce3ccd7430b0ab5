// Decode kernels of both families (the token recurrence over T new tokens, fp32 state in and out,
// fp64 for fp64 linear attention): a stream of the state through registers, built to run at the
// memory roofline (docs/kernels/linear_attention.md and docs/kernels/delta_rule.md, decode).
// Launched by delta_rule.cu (DeltaNet, Gated DeltaNet) and linear_attention_kernels.cuh (linear
// attention); also compiled by the CPU emulation (property_tests/decode_cpu_emulation_test.cpp), so
// nothing here may depend on more than it offers: threads, warp shuffles, plain loads and stores.
//
// Both recurrences are row-local: row r of S_t needs only row r of S_{t-1}, v_t[r] and the token's
// k_t, q_t (and β_t, α_t). So a *group* of kLanes consecutive lanes owns one state row, each lane
// kVectors runs of 4 consecutive columns: lane `part` holds columns 4·(part + kLanes·j) + e, j <
// kVectors, e < 4. One load instruction of a warp then reads 32/kLanes rows × 4·kLanes columns,
// whole 128-byte lines at kLanes = 8, as 16-byte accesses; each lane has all its kVectors loads in
// flight before it uses any. A row's dot product (S k, S q) is each lane's sum over its columns in
// that order, then a butterfly over the group (log2 kLanes shuffles instead of 5, and every lane of
// the group ends with the same bits: a + b == b + a). The summation tree changes with kLanes, but no
// product passes through more than DK roundings (each merges in at least one more of the DK terms;
// the zero columns past DK add exactly), the depth the decode bounds already allow
// (kernel_checks/delta_rule_stages.cpp, kernel_checks/linear_attention_kernel_bound.hpp): no bound changes, and
// every run sums in the same order. The updated state goes out as soon as the last token has updated
// it, before that token's output reduction.
#pragma once

#include "cuda/delta_rule.h"
#include "cuda/layout.hpp"
#include "cuda/linear_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

// As in delta_rule_forward_kernels.cuh: the CPU emulation compiles this source under another namespace.
#ifndef DELTAPROOF_FORWARD_KERNELS
#define DELTAPROOF_FORWARD_KERNELS forward_kernels
#endif

namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS::decoding {

// 8 warps per block; at ≤ 64 registers four blocks (32 warps, 64 KB of state loads) fit on an SM.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMinBlocksPerSm = 4;

// One decode launch, whatever the family: every tensor with its strides (cuda/layout.hpp). Rows of q,
// k, v, output, beta and log_gate are tokens; rows of the states are value indices.
struct DecodeView {
  const void* q = nullptr;              // [B, H, T, DK]
  const void* k = nullptr;              // [B, H, T, DK]
  const void* v = nullptr;              // [B, H, T, DV]
  void* output = nullptr;               // [B, H, T, DV]
  const void* beta = nullptr;           // [B, H, T, 1] DeltaNet only
  const float* log_gate = nullptr;      // [B, H, T, 1] Gated DeltaNet only (null: α = 1)
  const void* initial_state = nullptr;  // [B, H, DV, DK]; null: S_0 = 0; may equal final_state
  void* final_state = nullptr;          // [B, H, DV, DK]
  Strides q_s, k_s, v_s, output_s, beta_s, gate_s, initial_s, final_s;
  int batch = 0, heads = 0, tokens = 0, key_dim = 0, value_dim = 0;
  bool vector = false;  // runs of 4 columns as one access (set_vector_access decides)
};

// Both families' addressing, in one place: their DecodeParams name the shared tensors alike, and
// DeltaNet's adds β and g.
template <class Params>
DecodeView view_of(const Params& p) {
  DecodeView v;
  v.q = p.q, v.k = p.k, v.v = p.v, v.output = p.output, v.initial_state = p.initial_state, v.final_state = p.final_state;
  v.q_s = p.q_strides, v.k_s = p.k_strides, v.v_s = p.v_strides, v.output_s = p.output_strides;
  v.initial_s = p.initial_state_strides, v.final_s = p.final_state_strides;
  if constexpr (std::is_same_v<Params, ::deltaproof::cuda::delta_rule::DecodeParams>) {
    v.beta = p.beta, v.log_gate = p.log_gate, v.beta_s = p.beta_strides, v.gate_s = p.log_gate_strides;
  }
  v.batch = p.batch, v.heads = p.heads, v.tokens = p.tokens, v.key_dim = p.key_dim, v.value_dim = p.value_dim;
  return v;
}

// Runs of 4 columns move as one 8-, 16- or 32-byte access when every row of q, k and the states starts
// on such a boundary: DK and all their strides multiples of 4, the bases aligned to 4 elements.
// Either way the arithmetic is the same, so are the bits.
inline void set_vector_access(DecodeView& v, std::size_t input_bytes, std::size_t state_bytes) {
  const auto aligned = [](const void* base, const Strides& s, std::size_t element_bytes) {
    return base == nullptr || (reinterpret_cast<std::uintptr_t>(base) % (4 * element_bytes) == 0 && s.batch % 4 == 0 &&
                               s.head % 4 == 0 && s.row % 4 == 0);
  };
  v.vector = v.key_dim % 4 == 0 && aligned(v.q, v.q_s, input_bytes) && aligned(v.k, v.k_s, input_bytes) &&
             aligned(v.initial_state, v.initial_s, state_bytes) && aligned(v.final_state, v.final_s, state_bytes);
}

// Lanes per row, runs of 4 columns per lane (kLanes · kVectors · 4 ≥ DK), and whether a run moves as
// one access: a compile-time choice, since a run-time branch between both paths in one kernel took the
// 16-byte path to 80 registers (spills under the 64 that four blocks per SM allow).
template <int kLanesValue, int kVectorsValue, bool kVectorValue>
struct RowShape {
  static constexpr int kLanes = kLanesValue, kVectors = kVectorsValue;
  static constexpr bool kVector = kVectorValue;
};

// Calls f(RowShape) with the narrowest shape that covers DK (at most 256): 8 lanes per row up to
// DK = 128 (whole 128-byte lines per run, 3 shuffles per sum), 16 beyond.
template <bool kVector, class F>
void with_row_shape(int key_dim, F&& f) {
  if (key_dim <= 32) f(RowShape<8, 1, kVector>{});
  else if (key_dim <= 64) f(RowShape<8, 2, kVector>{});
  else if (key_dim <= 128) f(RowShape<8, 4, kVector>{});
  else f(RowShape<16, 4, kVector>{});
}
template <class F>
void with_row_shape(const DecodeView& v, F&& f) {
  if (v.vector) with_row_shape<true>(v.key_dim, f);
  else with_row_shape<false>(v.key_dim, f);
}

// Blocks of kWarps warps, 32 / kLanes rows each, over the value rows; one grid row per (batch, head).
inline dim3 grid_of(const DecodeView& v, int lanes) {
  const int rows_per_block = kWarps * (32 / lanes);
  return dim3(unsigned((v.value_dim + rows_per_block - 1) / rows_per_block), unsigned(v.batch * v.heads));
}

template <class A, class T>
__device__ __forceinline__ A to_acc(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return A(__bfloat162float(x));
  else if constexpr (std::is_same_v<T, __half>) return A(__half2float(x));
  else return A(x);
}

// Round to nearest even in T.
template <class T, class A>
__device__ __forceinline__ T from_acc(A x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return T(x);
}

// a·b + c rounded once.
template <class A>
__device__ __forceinline__ A multiply_add(A a, A b, A c) {
  if constexpr (std::is_same_v<A, float>) return fmaf(a, b, c);
  else return fma(a, b, c);
}

// Sum over the kLanes lanes of a row group: a butterfly, the same bits in every lane of the group.
template <int kLanes, class A>
__device__ __forceinline__ A group_sum(A x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <class T>
struct alignas(4 * sizeof(T)) Run {
  T x[4];
};

// One 16-byte store per run of fp32 (two for fp64), as the instruction itself: written as a float4
// store, nvcc split one of the four runs into four 4-byte stores (the other three stayed whole).
template <class A>
__device__ __forceinline__ void store_run(A* p, const Run<A>& r) {
#ifdef DELTAPROOF_CUDA_EMULATION
  *reinterpret_cast<Run<A>*>(p) = r;
#else
  if constexpr (std::is_same_v<A, float>) {
    __stwb(reinterpret_cast<float4*>(p), make_float4(r.x[0], r.x[1], r.x[2], r.x[3]));
  } else {
    __stwb(reinterpret_cast<double2*>(p), make_double2(r.x[0], r.x[1]));
    __stwb(reinterpret_cast<double2*>(p) + 1, make_double2(r.x[2], r.x[3]));
  }
#endif
}

// This thread's place: (batch, head), its state row, and its part of that row.
template <int kLanes, int kVectors, bool kVector>
struct RowSlice {
  static constexpr int kRowsPerWarp = 32 / kLanes;
  int b, h, row, part;
  bool live;  // row < DV; a lane past the last row holds zeros and writes nothing

  __device__ explicit RowSlice(const DecodeView& p) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
    row = (blockIdx.x * kWarps + warp) * kRowsPerWarp + lane / kLanes;
    part = lane % kLanes;
    live = row < p.value_dim;
  }
  // Whether any row of this warp exists (warp-uniform: a warp without rows may leave at once).
  __device__ bool warp_has_rows(const DecodeView& p) const { return row - int(threadIdx.x % 32) / kLanes < p.value_dim; }

  __device__ std::int64_t offset(const Strides& s, std::int64_t i) const { return s.head_offset(b, h) + i * s.row; }
  __device__ static int column(int part, int j) { return 4 * (part + kLanes * j); }

  // x[j].x[e] = entry (i, column(part, j) + e) of the tensor, 0 past `columns`; kept in T (16-bit
  // inputs stay packed, two to a register, until they are used).
  template <class T>
  __device__ void load(Run<T> (&x)[kVectors], const T* base, const Strides& s, std::int64_t i, int columns) const {
    const std::int64_t at = offset(s, i);  // base is only offset where an entry is read: it may be null
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      const int c = column(part, j);
      if constexpr (kVector) {
        x[j] = c < columns ? *reinterpret_cast<const Run<T>*>(base + at + c) : Run<T>{{T(0.0f), T(0.0f), T(0.0f), T(0.0f)}};
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[j].x[e] = c + e < columns ? base[at + c + e] : T(0.0f);
      }
    }
  }

  // This lane's part of its state row: S_0 (zero when `read` is false) in, S_t out.
  template <class A>
  __device__ void load_state(Run<A> (&s)[kVectors], const DecodeView& p, bool read) const {
    load(s, static_cast<const A*>(p.initial_state), p.initial_s, row, read && live ? p.key_dim : 0);
  }
  template <class A>
  __device__ void store_state(const Run<A> (&s)[kVectors], const DecodeView& p) const {
    if (!live) return;
    A* out = static_cast<A*>(p.final_state) + offset(p.final_s, row);
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      const int c = column(part, j);
      if constexpr (kVector) {
        if (c < p.key_dim) store_run(out + c, s[j]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (c + e < p.key_dim) out[c + e] = s[j].x[e];
      }
    }
  }

  // Token t's value for this row (0 for a lane past the last row), and the row's output, stored by the
  // group's first lane.
  template <class A, class T>
  __device__ A value(const DecodeView& p, int t) const {
    return live ? to_acc<A>(static_cast<const T*>(p.v)[offset(p.v_s, t) + row]) : A(0);
  }
  template <class T, class A>
  __device__ void store_output(const DecodeView& p, int t, A o) const {
    if (live && part == 0) static_cast<T*>(p.output)[offset(p.output_s, t) + row] = from_acc<T>(o);
  }
};

// The seams through which a test runs a decode kernel broken on purpose (the design page's numerical policy),
// named as in linear attention's Policy (linear_attention_kernels.cuh), which its kernel takes instead.
// The product instantiates Faithful alone.
struct Faithful {
  static constexpr bool reads_initial_state = true;         // S_0 when given
  static constexpr bool decode_reads_updated_state = true;  // o_t = S_t q_t, not S_{t-1} q_t
};

// Σ s k over this lane's columns, in order.
template <class A, class T, int kVectors>
__device__ __forceinline__ A partial_dot(const Run<A> (&s)[kVectors], const Run<T> (&k)[kVectors]) {
  A sum = 0;
#pragma unroll
  for (int j = 0; j < kVectors; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) sum = multiply_add(s[j].x[e], to_acc<A>(k[j].x[e]), sum);
  return sum;
}

// s ← update(s, k) entry by entry, and Σ s q over this lane's columns in order, each entry read after
// its update (or before it, where Policy plants the stale-state bug).
template <class Policy, class A, class T, int kVectors, class Update>
__device__ __forceinline__ A update_then_dot(Run<A> (&s)[kVectors], const Run<T> (&k)[kVectors], const Run<T> (&q)[kVectors],
                                             Update&& update) {
  A sum = 0;
#pragma unroll
  for (int j = 0; j < kVectors; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      A& x = s[j].x[e];
      const A qx = to_acc<A>(q[j].x[e]);
      if constexpr (!Policy::decode_reads_updated_state) sum = multiply_add(x, qx, sum);
      x = update(x, to_acc<A>(k[j].x[e]));
      if constexpr (Policy::decode_reads_updated_state) sum = multiply_add(x, qx, sum);
    }
  return sum;
}

// The stream both families share: this lane's part of its state row in registers across the tokens;
// per token, token(slice, s, k, q, t) updates it and returns the lane's part of o_t[row]; the state goes
// out once the last token has updated it.
template <class T, class A, class Shape, class Policy, class Token>
__device__ __forceinline__ void stream_rows(const DecodeView& p, Token&& token) {
  constexpr int kVectors = Shape::kVectors;
  const RowSlice<Shape::kLanes, kVectors, Shape::kVector> slice(p);
  if (!slice.warp_has_rows(p)) return;  // no block-level barrier follows
  Run<A> s[kVectors];
  slice.load_state(s, p, p.initial_state != nullptr && Policy::reads_initial_state);
  for (int t = 0; t < p.tokens; ++t) {
    Run<T> k[kVectors], q[kVectors];
    slice.load(k, static_cast<const T*>(p.k), p.k_s, t, p.key_dim);
    slice.load(q, static_cast<const T*>(p.q), p.q_s, t, p.key_dim);
    const A o = token(slice, s, k, q, t);
    if (t + 1 == p.tokens) slice.store_state(s, p);
    slice.template store_output<T>(p, t, group_sum<Shape::kLanes>(o));
  }
}

// DeltaNet / Gated DeltaNet, per token and row (the previous decode_kernel's arithmetic):
//   u = S k (group sum), δ = β (v − α u), S ← α S + δ kᵀ (one FMA per entry), o = S q (group sum).
template <class T, class Shape, class Policy = Faithful>
__global__ void __launch_bounds__(kThreads, Shape::kVector ? kMinBlocksPerSm : 1) delta_rule_decode_kernel(DecodeView p) {
  stream_rows<T, float, Shape, Policy>(p, [&](const auto& slice, auto& s, const auto& k, const auto& q, int t) {
    const float alpha = p.log_gate ? expf(p.log_gate[slice.offset(p.gate_s, t)]) : 1.0f;
    const float beta = to_acc<float>(static_cast<const T*>(p.beta)[slice.offset(p.beta_s, t)]);
    const float delta = beta * (slice.template value<float, T>(p, t) - alpha * group_sum<Shape::kLanes>(partial_dot(s, k)));
    return update_then_dot<Policy>(s, k, q, [&](float x, float kx) { return fmaf(delta, kx, alpha * x); });
  });
}

}  // namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS::decoding

namespace deltaproof::cuda::linear_attention {
namespace {

namespace decoding = ::deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS::decoding;

// Linear attention, per token and row: S ← S + v kᵀ (one FMA per entry), o = S q (group sum). Policy is
// linear_attention_kernels.cuh's (reads_initial_state, decode_reads_updated_state).
template <class T, class A, class Shape, class Policy>
__global__ void __launch_bounds__(decoding::kThreads, Shape::kVector ? decoding::kMinBlocksPerSm : 1)
    decode_rows_kernel(decoding::DecodeView p) {
  decoding::stream_rows<T, A, Shape, Policy>(p, [&](const auto& slice, auto& s, const auto& k, const auto& q, int t) {
    const A value = slice.template value<A, T>(p, t);
    return decoding::update_then_dot<Policy>(s, k, q, [&](A x, A kx) { return decoding::multiply_add(value, kx, x); });
  });
}

}  // namespace
}  // namespace deltaproof::cuda::linear_attention
