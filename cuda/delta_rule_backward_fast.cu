// DeltaNet / Gated DeltaNet backward on tensor cores (bf16 inputs, DK and DV ≤ 128 and multiples of 8,
// 16-byte aligned rows), host side. Four launches:
//   1. wy_prepare_kernel (the forward's), writing T = A⁻¹ in fp32 and W, U as hi + lo pairs in bf16;
//   2. chunk_scan_registers_kernel<StatePass> (the forward's register scan, no output), writing S_[c] and V̄ in
//      fp32 with W, U, S and the update's V̄ entering the tensor cores as hi + lo;
//   3. gradient_scan_registers_kernel: dV̄ and G_[c+1] = dL/dS_[c+1], chunks in reverse;
//   4. chunk_gradients_kernel: dq, dk, dv, dβ, dg for every chunk at once.
// Every other input takes delta_rule_backward.cu's fp32 FMA kernels. Design, precision plan and
// measurements: cuda/NOTES_delta.md ("Backward v2").
#include "cuda/delta_rule_backward_fast.h"

#include "cuda/check.hpp"
#include "cuda/delta_rule_backward_fast_kernels.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

namespace deltaproof::cuda {
namespace {

using namespace backward_fast_kernels;

constexpr std::size_t kAlignment = 256;
std::size_t aligned(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
bool aligned_to(const void* pointer, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0; }

// The intermediates the caller did not give, carved out of the workspace in a fixed order (fp32 ones given
// by the caller are used in place; W and U are bf16 pairs here, so they always live in the workspace and are
// copied out in fp32, hi + lo exactly, when the caller asks for them).
FastBuffers resolve_fast(const DeltaRuleBackwardParams& p, std::size_t* bytes) {
  const std::size_t heads = std::size_t(p.batch) * p.heads, L = p.length, C = p.chunk_size;
  const std::size_t N = (L + C - 1) / C, DK = p.key_dim, DV = p.value_dim;
  char* base = static_cast<char*>(p.workspace);
  std::size_t offset = 0;
  auto take = [&](void* given, std::size_t count, std::size_t element) -> void* {
    if (given != nullptr) return given;
    void* at = base != nullptr ? base + offset : nullptr;
    offset += aligned(heads * count * element);
    return at;
  };
  FastBuffers b{};
  b.wy_inverse = static_cast<float*>(take(p.wy_inverse, N * C * C, 4));
  b.w = take(nullptr, L * DK, 2);
  b.w_lo = take(nullptr, L * DK, 2);
  b.u = take(nullptr, L * DV, 2);
  b.u_lo = take(nullptr, L * DV, 2);
  b.boundary_states = static_cast<float*>(take(p.boundary_states, N * DV * DK, 4));
  b.v_new = static_cast<float*>(take(p.v_new, L * DV, 4));
  b.d_v_new = static_cast<float*>(take(p.d_v_new, L * DV, 4));
  b.state_gradients = static_cast<float*>(take(p.state_gradients, N * DV * DK, 4));
  b.gate_sums = static_cast<float*>(p.gate_sums);
  b.d_w = static_cast<float*>(p.d_w);
  b.wy_system_adjoint = static_cast<float*>(p.wy_system_adjoint);
  b.gate_sum_gradients = static_cast<float*>(p.gate_sum_gradients);
  if (bytes != nullptr) *bytes = offset;
  return b;
}

// The forward's parameters for stages 1 and 2, pointing at this backward's buffers.
DeltaRuleForwardParams forward_params(const DeltaRuleBackwardParams& p, const FastBuffers& b, float* final_state) {
  DeltaRuleForwardParams f;
  f.dtype = p.dtype;
  f.batch = p.batch, f.heads = p.heads, f.length = p.length, f.key_dim = p.key_dim, f.value_dim = p.value_dim;
  f.chunk_size = p.chunk_size;
  f.q = p.q, f.k = p.k, f.v = p.v, f.beta = p.beta;
  f.log_gate = static_cast<const float*>(p.log_gate);
  f.initial_state = static_cast<const float*>(p.initial_state);
  f.final_state = final_state;
  f.w = b.w, f.u = b.u, f.w_lo = b.w_lo, f.u_lo = b.u_lo;
  f.wy_system = static_cast<float*>(p.wy_system);
  f.wy_inverse = b.wy_inverse;
  f.v_new = b.v_new;
  f.boundary_states = b.boundary_states;
  f.stream = p.stream;
  return f;
}

template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t stream, const std::string& name, Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "shared-memory size of " + name);
  kernel<<<grid, threads, smem, stream>>>(args...);
  check_launch(name);
}

// out = hi + lo (exact in fp32), for the caller's fp32 W or U.
__global__ void sum_pairs_kernel(const __nv_bfloat16* hi, const __nv_bfloat16* lo, float* out, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(hi[i]) + __bfloat162float(lo[i]);
}

void expose_pairs(const void* hi, const void* lo, void* out, std::size_t count, cudaStream_t stream) {
  if (out == nullptr) return;
  const int blocks = static_cast<int>((count + 255) / 256 < 4096 ? (count + 255) / 256 : 4096);
  sum_pairs_kernel<<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(hi), static_cast<const __nv_bfloat16*>(lo),
                                               static_cast<float*>(out), count);
  check_launch("sum_pairs_kernel");
}

template <int C>
void run_typed(const DeltaRuleBackwardParams& p, const FastBuffers& b, FastBackwardStage first, FastBackwardStage last) {
  using T = __nv_bfloat16;
  const int N = chunk_count(p.length, C), heads = p.batch * p.heads, slices = (p.value_dim + kTcSlice - 1) / kTcSlice;
  const std::string suffix = "<bf16, C=" + std::to_string(C) + ">";
  const DeltaRuleForwardParams f = forward_params(p, b, static_cast<float*>(p.final_state));
  const auto runs = [&](FastBackwardStage s) { return first <= s && s <= last; };
  if (runs(FastBackwardStage::prepare)) {
    launch(wy_prepare_kernel<T, C>, dim3(N, heads), kPrepareThreads, prepare_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes,
           p.stream, "wy_prepare_kernel" + suffix, f);
    const std::size_t tokens = std::size_t(heads) * p.length;
    expose_pairs(b.w, b.w_lo, p.w, tokens * p.key_dim, p.stream);
    expose_pairs(b.u, b.u_lo, p.u, tokens * p.value_dim, p.stream);
  }
  if (runs(FastBackwardStage::state_pass))
    launch(chunk_scan_registers_kernel<T, C, true>, dim3(slices, heads), kTcScanThreads, tc_scan_layout(C).bytes, p.stream,
           "chunk_scan_registers_kernel<StatePass>" + suffix, f);
  if (runs(FastBackwardStage::gradient_scan))
    launch(gradient_scan_registers_kernel<T, C>, dim3(slices, heads), kTcScanThreads, gradient_scan_layout(C).bytes, p.stream,
           "gradient_scan_registers_kernel" + suffix, p, b);
  if (runs(FastBackwardStage::chunk_gradients))
    launch(chunk_gradients_kernel<T, C>, dim3(N, heads), kFastThreads, chunk_gradients_layout(C).bytes, p.stream,
           "chunk_gradients_kernel" + suffix, p, b);
}

void run(const DeltaRuleBackwardParams& p, FastBackwardStage first, FastBackwardStage last) {
  const FastBuffers b = resolve_fast(p, nullptr);
  switch (p.chunk_size) {
    case 16: return run_typed<16>(p, b, first, last);
    case 32: return run_typed<32>(p, b, first, last);
    default: return run_typed<64>(p, b, first, last);
  }
}

}  // namespace

bool delta_rule_backward_uses_tensor_cores(const DeltaRuleBackwardParams& p) {
  return p.dtype == DType::bf16 && p.key_dim <= kTcKeys && p.value_dim <= kTcKeys && p.key_dim % 8 == 0 &&
         p.value_dim % 8 == 0 && aligned_to(p.q, 16) && aligned_to(p.k, 16) && aligned_to(p.v, 16) &&
         aligned_to(p.d_output, 16) && aligned_to(p.dq, 4) && aligned_to(p.dk, 4) && aligned_to(p.dv, 4);
}

std::size_t delta_rule_backward_fast_workspace_bytes(const DeltaRuleBackwardParams& p) {
  std::size_t bytes = 0;
  resolve_fast(p, &bytes);
  return bytes;
}

void delta_rule_backward_fast(const DeltaRuleBackwardParams& p) {
  run(p, FastBackwardStage::prepare, FastBackwardStage::chunk_gradients);
}
void delta_rule_backward_fast_stage(const DeltaRuleBackwardParams& p, FastBackwardStage stage) { run(p, stage, stage); }

}  // namespace deltaproof::cuda
