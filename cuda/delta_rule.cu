// DeltaNet and Gated DeltaNet: chunkwise WY forward (two kernels) and recurrent decode, host side.
// The kernels are in delta_rule_forward_kernels.cuh (also compiled by the CPU emulation).
//
// Precision plan (where values are rounded to the input dtype, and why):
//   * Every product runs with fp32 accumulation: tensor cores (WMMA or raw mma.sync, bf16/fp16 operands) for
//     bf16/fp16 inputs, plain fp32 FMA for fp32 inputs.
//   * A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ) and its inverse T stay in fp32 (the inverse
//     amplifies errors in A when keys are not normalized, so A is never rounded).
//   * W = T diag(βγ) K and U = T diag(β) V: the fp32 factor T diag(βγ) is split into a hi and a
//     lo part in the input dtype (x = hi + lo + O(u²|x|)), so the tensor-core product sees T to
//     about 16 bits instead of 8, at the cost of a second cheap MMA.
//   * W and U are stored in the input dtype: they are tensor-core operands of the scan anyway.
//   * The state S lives in fp32 for the whole scan. The register scan (the fast path) feeds it to W Sᵀ
//     and Q Sᵀ as a hi + lo pair in the input dtype (≈ 16 bits, two MMAs); the fallback scan rounds it
//     once to the input dtype (the one rounding that the best public kernels also make).
//   * V̄ = U − W Sᵀ is accumulated in fp32 and rounded to the input dtype only as an operand of
//     P V̄ and of the state update; the gate decay is applied in fp32 before that rounding.
//   * P = Q Kᵀ ⊙ Γ ⊙ M is formed in fp32 and rounded to the input dtype as an MMA operand.
#include "cuda/delta_rule.h"

#include "cuda/check.hpp"
#include "cuda/delta_rule_forward_kernels.cuh"

#include <cstdint>
#include <string>
#include <utility>

namespace deltaproof::cuda {
namespace {

using namespace forward_kernels;

// ---------------------------------------------------------------------------------------
// Host side: validation, then launch.

bool aligned_to(const void* pointer, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0; }

// The register scan when the inputs allow it: 16-bit, DK ≤ 128, DK and DV multiples of 8 and 16-byte
// aligned rows (cp.async). Otherwise the fallback scan runs.
bool register_scan(const DeltaRuleForwardParams& p) {
  return p.dtype != DType::f32 && p.key_dim <= kTcKeys && p.key_dim % 8 == 0 && p.value_dim % 8 == 0 &&
         aligned_to(p.q, 16) && aligned_to(p.k, 16) && aligned_to(p.w, 16) && aligned_to(p.u, 16) && aligned_to(p.output, 4);
}

void require_data(const void* pointer, DType dtype, const std::string& name) {
  require_device_pointer(pointer, name);
  require_aligned(pointer, size_of(dtype), name);
}
void require_optional(const void* pointer, const std::string& name) {
  if (pointer == nullptr) return;
  require_device_pointer(pointer, name);
  require_aligned(pointer, 4, name);
}

void require_common(DType dtype, int batch, int heads, int length, int key_dim, int value_dim, const char* length_name) {
  require_argument(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, "dtype",
                   "must be fp32, bf16 or fp16, got " + name_of(dtype));
  require_argument(batch >= 1, "batch", "must be >= 1, got " + std::to_string(batch));
  require_argument(heads >= 1, "heads", "must be >= 1, got " + std::to_string(heads));
  require_argument(static_cast<long long>(batch) * heads <= 65535, "batch*heads",
                   "must be <= 65535, got " + std::to_string(static_cast<long long>(batch) * heads));
  require_sequence_length(length, length_name);
  require_argument(key_dim >= 1 && key_dim <= kMaxHeadDim, "key_dim",
                   "must be in 1..256, got " + std::to_string(key_dim));
  require_argument(value_dim >= 1 && value_dim <= kMaxHeadDim, "value_dim",
                   "must be in 1..256, got " + std::to_string(value_dim));
}

void validate(const DeltaRuleForwardParams& p) {
  require_common(p.dtype, p.batch, p.heads, p.length, p.key_dim, p.value_dim, "length");
  require_argument(p.chunk_size == 16 || p.chunk_size == 32 || p.chunk_size == 64, "chunk_size",
                   "must be 16, 32 or 64, got " + std::to_string(p.chunk_size));
  require_data(p.q, p.dtype, "q");
  require_data(p.k, p.dtype, "k");
  require_data(p.v, p.dtype, "v");
  require_data(p.beta, p.dtype, "beta");
  require_data(p.output, p.dtype, "output");
  require_data(p.w, p.dtype, "w");
  require_data(p.u, p.dtype, "u");
  require_device_pointer(p.final_state, "final_state");
  require_aligned(p.final_state, 4, "final_state");
  require_optional(p.log_gate, "log_gate");
  require_optional(p.initial_state, "initial_state");
  require_optional(p.wy_system, "wy_system");
  require_optional(p.wy_inverse, "wy_inverse");
  require_optional(p.v_new, "v_new");
  require_optional(p.boundary_states, "boundary_states");
  for (auto [pointer, name] : {std::pair<const void*, const char*>{p.w_lo, "w_lo"}, {p.u_lo, "u_lo"}}) {
    if (pointer == nullptr) continue;
    require_argument(p.dtype != DType::f32, name, "is for 16-bit inputs only (fp32 W and U are stored exactly)");
    require_data(pointer, p.dtype, name);
  }
}

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t stream, const std::string& name,
            const DeltaRuleForwardParams& p) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "shared-memory size of " + name);
  kernel<<<grid, threads, smem, stream>>>(p);
  check_launch(name);
}

template <class T, int C>
void prepare_typed(const DeltaRuleForwardParams& p) {
  const std::size_t smem = prepare_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes;
  const dim3 grid(chunk_count(p.length, C), p.batch * p.heads);
  launch(wy_prepare_kernel<T, C>, grid, kPrepareThreads, smem, p.stream,
         "wy_prepare_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">", p);
}

template <class T, int C, int BV>
void fallback_scan(const DeltaRuleForwardParams& p) {
  const std::size_t smem = scan_layout(sizeof(T), C, BV, p.key_dim).bytes;
  const dim3 grid((p.value_dim + BV - 1) / BV, p.batch * p.heads);
  launch(chunk_scan_shared_kernel<T, C, BV>, grid, kScanThreads, smem, p.stream,
         "chunk_scan_shared_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ", BV=" + std::to_string(BV) + ">", p);
}

int max_shared_bytes() {
  static const int bytes = [] {
    int device = 0, value = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    return value;
  }();
  return bytes;
}

// Value rows of S per fallback-scan block: 64, halved until its shared memory fits (DK = 256 with 64
// does not on the H200); fp32 inputs always 16 (shared memory).
int fitting_slice(const DeltaRuleForwardParams& p, int element_size, int chunk) {
  int slice = kDefaultValueSlice;
  while (slice > 16 && scan_layout(element_size, chunk, slice, p.key_dim).bytes > static_cast<std::size_t>(max_shared_bytes()))
    slice /= 2;
  return slice;
}

template <class T, int C>
void scan_typed(const DeltaRuleForwardParams& p) {
  if constexpr (!kTensorCore<T>) {
    fallback_scan<T, C, 16>(p);
  } else if (register_scan(p)) {
    constexpr std::size_t smem = tc_scan_layout(C).bytes;
    const dim3 grid((p.value_dim + kTcSlice - 1) / kTcSlice, p.batch * p.heads);
    launch(chunk_scan_registers_kernel<T, C>, grid, kTcScanThreads, smem, p.stream,
           "chunk_scan_registers_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">", p);
  } else {
    switch (fitting_slice(p, sizeof(T), C)) {
      case 16: return fallback_scan<T, C, 16>(p);
      case 32: return fallback_scan<T, C, 32>(p);
      default: return fallback_scan<T, C, 64>(p);
    }
  }
}

template <template <class, int> class Op>
void dispatch(const DeltaRuleForwardParams& p) {
  auto by_chunk = [&](auto type_tag) {
    using T = decltype(type_tag);
    switch (p.chunk_size) {
      case 16: return Op<T, 16>::run(p);
      case 32: return Op<T, 32>::run(p);
      default: return Op<T, 64>::run(p);
    }
  };
  switch (p.dtype) {
    case DType::f32: return by_chunk(float{});
    case DType::bf16: return by_chunk(__nv_bfloat16{});
    default: return by_chunk(__half{});
  }
}

template <class T, int C>
struct PrepareOp {
  static void run(const DeltaRuleForwardParams& p) { prepare_typed<T, C>(p); }
};
template <class T, int C>
struct ScanOp {
  static void run(const DeltaRuleForwardParams& p) { scan_typed<T, C>(p); }
};

template <class T>
void decode_typed(const DeltaRuleDecodeParams& p) {
  constexpr int rows_per_block = kDecodeThreads / 32;
  const dim3 grid((p.value_dim + rows_per_block - 1) / rows_per_block, p.batch * p.heads);
  const std::string name = "decode_kernel<" + name_of(p.dtype) + ">";
  if (p.key_dim <= 64) decode_kernel<T, 2><<<grid, kDecodeThreads, 0, p.stream>>>(p);
  else if (p.key_dim <= 128) decode_kernel<T, 4><<<grid, kDecodeThreads, 0, p.stream>>>(p);
  else decode_kernel<T, 8><<<grid, kDecodeThreads, 0, p.stream>>>(p);
  check_launch(name);
}

}  // namespace

void delta_rule_wy_prepare(const DeltaRuleForwardParams& params) {
  validate(params);
  dispatch<PrepareOp>(params);
}

void delta_rule_chunk_scan(const DeltaRuleForwardParams& params) {
  validate(params);
  dispatch<ScanOp>(params);
}

void delta_rule_forward(const DeltaRuleForwardParams& params) {
  validate(params);
  dispatch<PrepareOp>(params);
  dispatch<ScanOp>(params);
}

void delta_rule_decode(const DeltaRuleDecodeParams& p) {
  require_common(p.dtype, p.batch, p.heads, p.tokens, p.key_dim, p.value_dim, "tokens");
  require_data(p.q, p.dtype, "q");
  require_data(p.k, p.dtype, "k");
  require_data(p.v, p.dtype, "v");
  require_data(p.beta, p.dtype, "beta");
  require_data(p.output, p.dtype, "output");
  require_device_pointer(p.final_state, "final_state");
  require_aligned(p.final_state, 4, "final_state");
  require_optional(p.log_gate, "log_gate");
  require_optional(p.initial_state, "initial_state");
  switch (p.dtype) {
    case DType::f32: return decode_typed<float>(p);
    case DType::bf16: return decode_typed<__nv_bfloat16>(p);
    default: return decode_typed<__half>(p);
  }
}

}  // namespace deltaproof::cuda
