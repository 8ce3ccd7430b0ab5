// DeltaNet / Gated DeltaNet backward on tensor cores (bf16 inputs, DK and DV ≤ 128 and multiples of 8,
// 16-byte aligned rows), host side. Four launches:
//   1. wy_prepare_async_kernel (the forward's stage 1), writing T = A⁻¹ in fp32 and W, U as hi + lo pairs in bf16;
//   2. chunk_scan_registers_kernel<StatePass> (the forward's register scan, no output), writing V̄ as the hi + lo
//      pair that W, U, S and the update's V̄ also enter the tensor cores as, and S_[c] rounded once;
//   3. gradient_scan_registers_kernel: dV̄ (as a pair) and G_[c+1] = dL/dS_[c+1] (rounded once), chunks in reverse;
//   4. chunk_gradients_kernel (delta_rule_chunk_gradients_kernel.cuh): dq, dk, dv, dβ, dg, persistent blocks taking
//      the chunks in turn.
// A training forward's saved buffer (cuda/delta_rule.h) replaces launches 1 and 2. Every other input takes
// delta_rule_backward.cu's fp32 FMA kernels. Design, precision plan and
// measurements: docs/kernels/delta_rule.md (the tensor-core backward).
#include "cuda/delta_rule_backward_tensor_core.h"

#include "cuda/arguments.hpp"
#include "cuda/check.hpp"
#include "cuda/delta_rule_backward_tensor_core_kernels.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

namespace deltaproof::cuda::delta_rule {
namespace {

using namespace backward_tensor_core_kernels;

bool aligned_to(const void* pointer, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0; }
bool strides_multiple_of(const Strides& s, int batch, int heads, int rows, std::int64_t elements) {
  return (batch == 1 || s.batch % elements == 0) && (heads == 1 || s.head % elements == 0) && (rows == 1 || s.row % elements == 0);
}
// Rows a kernel copies 16 bytes at a time (cp.async), or writes 4 bytes (a bf16 pair) at a time.
bool copyable_rows(const void* data, const Strides& s, const BackwardParams& p) {
  return aligned_to(data, 16) && strides_multiple_of(s, p.batch, p.heads, p.length, 8);
}
bool pair_rows(const void* data, const Strides& s, const BackwardParams& p) {
  return aligned_to(data, 4) && strides_multiple_of(s, p.batch, p.heads, p.length, 2);
}

// The intermediates, carved out of the workspace in a fixed order: T (fp32) in the caller's buffer when given;
// W, U and what stage 4 reads (S_[c], V̄, dV̄, G_[c+1]) always in the workspace; T, W, U, S_[c] and V̄ from a
// training forward's saved buffer when given (their workspace space then unused). Where the caller gives the fp32
// intermediates (the stage checks), the pairs are copied out as hi + lo (exactly), and the scans write S_[c]
// and G_[c+1] in fp32 from their registers.
TensorCoreBuffers resolve_tensor_core_buffers(const BackwardStageParams& p, std::size_t* bytes) {
  const std::size_t heads = std::size_t(p.batch) * p.heads, L = p.length, C = p.chunk_size;
  const std::size_t N = (L + C - 1) / C, DK = p.key_dim, DV = p.value_dim;
  WorkspaceCarver workspace(p.workspace);
  const auto sixteen_bit = [&](std::size_t count) { return workspace.take(nullptr, heads * count * 2); };  // count entries a head
  TensorCoreBuffers b{};
  b.wy_inverse = static_cast<float*>(workspace.take(p.wy_inverse, heads * N * C * C * 4));
  b.w = sixteen_bit(L * DK), b.w_lo = sixteen_bit(L * DK), b.u = sixteen_bit(L * DV), b.u_lo = sixteen_bit(L * DV);
  b.state_pass.s = sixteen_bit(N * DV * DK);
  b.state_pass.v_hi = sixteen_bit(L * DV), b.state_pass.v_lo = sixteen_bit(L * DV);
  b.d_v_new_hi = sixteen_bit(L * DV), b.d_v_new_lo = sixteen_bit(L * DV);
  b.state_gradients = sixteen_bit(N * DV * DK);
  if (p.saved != nullptr) {  // a training forward's: read only (stages 1 and 2 do not run), so the const goes
    const SavedTensors s = saved_tensors(const_cast<void*>(p.saved), p.batch, p.heads, p.length, p.key_dim, p.value_dim,
                                         p.chunk_size, nullptr);
    b.wy_inverse = s.wy_inverse, b.w = s.w, b.w_lo = s.w_lo, b.u = s.u, b.u_lo = s.u_lo;
    b.state_pass = {s.s, s.v_hi, s.v_lo};
  }
  b.gate_sums = static_cast<float*>(p.gate_sums);
  b.d_w = static_cast<float*>(p.d_w);
  b.wy_system_adjoint = static_cast<float*>(p.wy_system_adjoint);
  b.gate_sum_gradients = static_cast<float*>(p.gate_sum_gradients);
  if (bytes != nullptr) *bytes = workspace.bytes();
  return b;
}

// The forward's parameters for stages 1 and 2: the user's inputs, this backward's buffers (the final state
// only where the caller asks for it, packed).
ForwardStageParams forward_params(const BackwardStageParams& p, const TensorCoreBuffers& b) {
  ForwardStageParams f;
  f.dtype = p.dtype;
  f.batch = p.batch, f.heads = p.heads, f.length = p.length, f.key_dim = p.key_dim, f.value_dim = p.value_dim;
  f.chunk_size = p.chunk_size;
  f.q = p.q, f.k = p.k, f.v = p.v, f.beta = p.beta, f.log_gate = static_cast<const float*>(p.log_gate);
  f.q_strides = p.q_strides, f.k_strides = p.k_strides, f.v_strides = p.v_strides, f.beta_strides = p.beta_strides;
  f.log_gate_strides = p.log_gate_strides;
  f.initial_state = static_cast<const float*>(p.initial_state), f.initial_state_strides = p.initial_state_strides;
  f.final_state = static_cast<float*>(p.final_state), f.final_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
  f.w = b.w, f.u = b.u, f.w_lo = b.w_lo, f.u_lo = b.u_lo;
  f.wy_system = static_cast<float*>(p.wy_system);
  f.wy_inverse = b.wy_inverse;
  f.boundary_states = static_cast<float*>(p.boundary_states);
  return f;
}

template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t stream, const std::string& name, const Args&... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "shared-memory size of " + name);
  kernel<<<grid, threads, smem, stream>>>(args...);
  check_launch(name);
}

// out = hi + lo (exact in fp32), for the caller's fp32 copy of an intermediate.
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
void run_typed(const BackwardStageParams& p, const TensorCoreBuffers& b, TensorCoreStage first, TensorCoreStage last, cudaStream_t stream) {
  using T = __nv_bfloat16;
  const int N = chunk_count(p.length, C), heads = p.batch * p.heads, slices = (p.value_dim + kTcSlice - 1) / kTcSlice;
  const std::string suffix = "<bf16, C=" + std::to_string(C) + ">";
  const ForwardStageParams f = forward_params(p, b);
  const std::size_t tokens = std::size_t(heads) * p.length;
  const auto runs = [&](TensorCoreStage s) { return first <= s && s <= last; };
  if (runs(TensorCoreStage::prepare) && p.saved == nullptr) {
    const auto kernel = for_gates(p.log_gate, wy_prepare_async_kernel<T, C, true>, wy_prepare_async_kernel<T, C, false>);
    launch(kernel, dim3(N, heads), wy_prepare_async_threads(C),
           wy_prepare_async_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes, stream, "wy_prepare_async_kernel" + suffix, f);
    expose_pairs(b.w, b.w_lo, p.w, tokens * p.key_dim, stream);
    expose_pairs(b.u, b.u_lo, p.u, tokens * p.value_dim, stream);
  }
  if (runs(TensorCoreStage::state_pass) && p.saved == nullptr) {
    const auto kernel = for_gates(p.log_gate, chunk_scan_registers_kernel<T, C, true, true>, chunk_scan_registers_kernel<T, C, false, true>);
    launch(kernel, dim3(slices, heads), kTcScanThreads, tc_scan_layout(C).bytes, stream, "chunk_scan_registers_kernel<StatePass>" + suffix,
           f, b.state_pass);
    expose_pairs(b.state_pass.v_hi, b.state_pass.v_lo, p.v_new, tokens * p.value_dim, stream);
  }
  if (runs(TensorCoreStage::gradient_scan)) {
    const auto kernel = for_gates(p.log_gate, gradient_scan_registers_kernel<T, C, true>, gradient_scan_registers_kernel<T, C, false>);
    launch(kernel, dim3(slices, heads), kTcScanThreads, gradient_scan_layout(C).bytes, stream, "gradient_scan_registers_kernel" + suffix,
           p, b);
    expose_pairs(b.d_v_new_hi, b.d_v_new_lo, p.d_v_new, tokens * p.value_dim, stream);
  }
  if (runs(TensorCoreStage::chunk_gradients)) {
    // Persistent: as many blocks as the device holds at once, each taking chunk after chunk.
    const auto kernel = for_gates(p.log_gate, chunk_gradients_kernel<T, C, true>, chunk_gradients_kernel<T, C, false>);
    const int threads = chunk_gradients_threads(C);
    const std::size_t smem = chunk_gradients_layout(C).bytes;
    const std::string name = "chunk_gradients_kernel" + suffix;
    int device = 0, sms = 0, per_sm = 0;
    check(cudaGetDevice(&device), "device of " + name);
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count for " + name);
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "shared-memory size of " + name);
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), "occupancy of " + name);
    const int resident = p.chunk_gradient_blocks > 0 ? p.chunk_gradient_blocks : per_sm * sms;
    launch(kernel, dim3(chunk_gradients_blocks(N * heads, resident)), threads, smem, stream, name, p, b);
  }
}

}  // namespace

bool tensor_core_backward_shape(DType dtype, int key_dim, int value_dim) {
  return dtype == DType::bf16 && key_dim <= kTcKeys && value_dim <= kTcKeys && key_dim % 8 == 0 && value_dim % 8 == 0;
}

SavedTensors saved_tensors(void* saved, int batch, int heads, int length, int key_dim, int value_dim, int chunk,
                           std::size_t* bytes) {
  const std::size_t rows = std::size_t(batch) * heads, L = length, C = chunk, N = (L + C - 1) / C;
  WorkspaceCarver carver(saved);
  SavedTensors s{};
  s.wy_inverse = static_cast<float*>(carver.take(nullptr, rows * N * C * C * 4));
  s.w = carver.take(nullptr, rows * L * key_dim * 2), s.w_lo = carver.take(nullptr, rows * L * key_dim * 2);
  s.u = carver.take(nullptr, rows * L * value_dim * 2), s.u_lo = carver.take(nullptr, rows * L * value_dim * 2);
  s.s = carver.take(nullptr, rows * N * value_dim * key_dim * 2);
  s.v_hi = carver.take(nullptr, rows * L * value_dim * 2), s.v_lo = carver.take(nullptr, rows * L * value_dim * 2);
  if (bytes != nullptr) *bytes = carver.bytes();
  return s;
}

std::size_t saved_tensor_bytes(DType dtype, int batch, int heads, int length, int key_dim, int value_dim, int chunk) {
  if (!tensor_core_backward_shape(dtype, key_dim, value_dim)) return 0;
  std::size_t bytes = 0;
  saved_tensors(nullptr, batch, heads, length, key_dim, value_dim, chunk, &bytes);
  return bytes;
}

bool tensor_core_backward_applies(const BackwardParams& p) {
  return tensor_core_backward_shape(p.dtype, p.key_dim, p.value_dim) && copyable_rows(p.q, p.q_strides, p) &&
         copyable_rows(p.k, p.k_strides, p) && copyable_rows(p.v, p.v_strides, p) &&
         copyable_rows(p.d_output, p.d_output_strides, p) &&
         pair_rows(p.dq, p.dq_strides, p) && pair_rows(p.dk, p.dk_strides, p) && pair_rows(p.dv, p.dv_strides, p);
}

std::size_t tensor_core_backward_workspace_bytes(const BackwardStageParams& p) {
  std::size_t bytes = 0;
  resolve_tensor_core_buffers(p, &bytes);
  return bytes;
}

void tensor_core_backward(const BackwardStageParams& p, TensorCoreStage first, TensorCoreStage last, cudaStream_t stream) {
  const TensorCoreBuffers b = resolve_tensor_core_buffers(p, nullptr);
  switch (p.chunk_size) {
    case 16: return run_typed<16>(p, b, first, last, stream);
    case 32: return run_typed<32>(p, b, first, last, stream);
    default: return run_typed<64>(p, b, first, last, stream);
  }
}

}  // namespace deltaproof::cuda::delta_rule
