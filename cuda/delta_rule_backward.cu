// DeltaNet and Gated DeltaNet: backward of the chunkwise WY form, four kernels (delta_rule.h has the
// API and the stage list; docs/kernels/delta_rule.md the design, the precision plan and what has been run).
//
// Two implementations sit behind backward(): bf16 inputs that the tensor cores can take go to
// delta_rule_backward_tensor_core.cu (tensor_core_backward_applies); every other input — and the test seams'
// per-stage entries below — to the fp32 FMA kernels here, which also serve fp64.
//
// These kernels are written to be checked first: each loop is one line of reference/gated_delta_rule.hpp's
// chunk_backward, in the accumulation type A (fp32, or fp64 for fp64 inputs), by plain FMA. Two
// loop shapes carry every product, and their rounding depths are what kernel_checks/
// delta_rule_backward_stages.cpp's bounds count:
//   row × matrix  out[i][c] = Σ_m x[i][m] y[m][c]: warps over rows i, lanes over columns c (y read
//                 coalesced), the m loop sequential: an m-term sum is m chained roundings.
//   row · row     out[i][j] = Σ_d x[i][d] y[j][d]: one warp per (i, j), lane l sums d ≡ l (mod 32)
//                 in order, then a butterfly over the 32 lanes: ⌈D/32⌉ + 5 chained roundings.
// Every sum has a fixed order (no atomics, no order that depends on scheduling), so repeated runs
// give the same bits, and every lane of a butterfly ends with the same bits (a + b == b + a).
// The gates enter only through G_i (sequential in-chunk sums, one thread) and exp(G_e − G_s) with
// e ≥ s; for DeltaNet G ≡ 0 and every decay is exp(0) = 1 exactly, so Gated DeltaNet with g = 0
// runs the very same arithmetic.
#include "cuda/arguments.hpp"
#include "cuda/check.hpp"
#include "cuda/delta_rule.h"
#include "cuda/delta_rule_backward_tensor_core.h"
#include "cuda/delta_rule_backward_kernels.cuh"
#include "cuda/testing/delta_rule_stages.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace deltaproof::cuda::delta_rule {
namespace {

using namespace backward_kernels;

// Carves the intermediates the caller left null out of the workspace, in a fixed order; `bytes`
// receives the workspace size those need.
Buffers resolve(const BackwardStageParams& p, std::size_t* bytes) {
  const std::size_t heads = std::size_t(p.batch) * p.heads, L = p.length, C = p.chunk_size;
  const std::size_t N = (L + C - 1) / C, DK = p.key_dim, DV = p.value_dim, es = size_of(accumulator_dtype(p.dtype));
  WorkspaceCarver workspace(p.workspace);
  const auto take = [&](void* given, std::size_t count) { return workspace.take(given, heads * count * es); };
  Buffers b{};
  b.gate_sums = take(p.gate_sums, L);
  b.wy_inverse = take(p.wy_inverse, N * C * C);
  b.w = take(p.w, L * DK);
  b.u = take(p.u, L * DV);
  b.scores = take(p.scores, N * C * C);
  b.boundary_states = take(p.boundary_states, N * DV * DK);
  b.v_new = take(p.v_new, L * DV);
  b.d_v_new = take(p.d_v_new, L * DV);
  b.state_gradients = take(p.state_gradients, N * DV * DK);
  b.d_w = take(p.d_w, L * DK);
  if (bytes != nullptr) *bytes = workspace.bytes();
  return b;
}

// ---------------------------------------------------------------------------------------
// Host side.

void require_shape(const BackwardParams& p) {
  require_dtype(p.dtype, {DType::f32, DType::f64, DType::bf16, DType::f16});
  require_sizes(p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_chunk_size(p.chunk_size);
}

// What a launch reads and writes: the whole backward, or stages 1 and 2 alone (its own forward).
enum class Run { backward, forward };

std::vector<TensorArgument> tensors_of(const BackwardStageParams& p, Run run) {
  const std::size_t es = size_of(p.dtype), acc = size_of(accumulator_dtype(p.dtype));
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, H = p.heads, C = p.chunk_size, N = chunk_count(L, C);
  const bool backward = run == Run::backward, forward = run == Run::forward;
  const auto packed = [&](const char* name, const void* data, int rows, int cols, std::size_t element_size, bool required = false) {
    return TensorArgument{name, data, contiguous(H, rows, cols), rows, cols, element_size, true, required};
  };
  return {{"q", p.q, p.q_strides, L, DK, es},
          {"k", p.k, p.k_strides, L, DK, es},
          {"v", p.v, p.v_strides, L, DV, es},
          {"beta", p.beta, p.beta_strides, L, 1, es},
          {"log_gate", p.log_gate, p.log_gate_strides, L, 1, acc, false, false},
          {"initial_state", p.initial_state, p.initial_state_strides, DV, DK, acc, false, false},
          {"d_output", backward ? p.d_output : nullptr, p.d_output_strides, L, DV, es, false, backward},
          {"d_final_state", backward ? p.d_final_state : nullptr, p.d_final_state_strides, DV, DK, acc, false, false},
          {"dq", backward ? p.dq : nullptr, p.dq_strides, L, DK, es, true, backward},
          {"dk", backward ? p.dk : nullptr, p.dk_strides, L, DK, es, true, backward},
          {"dv", backward ? p.dv : nullptr, p.dv_strides, L, DV, es, true, backward},
          {"d_beta", backward ? p.d_beta : nullptr, p.d_beta_strides, L, 1, es, true, backward},
          {"d_log_gate", backward ? p.d_log_gate : nullptr, p.d_log_gate_strides, L, 1, acc, true, false},
          {"d_initial_state", backward ? p.d_initial_state : nullptr, p.d_initial_state_strides, DV, DK, acc, true, false},
          packed("gate_sums", p.gate_sums, L, 1, acc),
          packed("wy_inverse", p.wy_inverse, N, C * C, acc),
          packed("w", p.w, L, DK, acc),
          packed("u", p.u, L, DV, acc),
          packed("scores", p.scores, N, C * C, acc),
          packed("boundary_states", p.boundary_states, N, DV * DK, acc),
          packed("v_new", p.v_new, L, DV, acc),
          packed("d_v_new", p.d_v_new, L, DV, acc),
          packed("state_gradients", p.state_gradients, N, DV * DK, acc),
          packed("d_w", p.d_w, L, DK, acc),
          packed("wy_system", p.wy_system, N, C * C, acc),
          packed("wy_system_adjoint", p.wy_system_adjoint, N, C * C, acc),
          packed("gate_sum_gradients", p.gate_sum_gradients, L, 1, acc),
          packed("output", p.output, L, DV, es, forward),
          packed("final_state", p.final_state, DV, DK, acc, forward)};
}

// Order: everything that needs no CUDA call first (dtype, sizes, chunk size, strides, null pointers,
// aliasing), so that these fail the same with or without a device; then device pointers and alignment.
void validate_for(const BackwardStageParams& p, Run run) {
  require_shape(p);
  if (run == Run::backward) {
    require_argument(p.log_gate == nullptr || p.d_log_gate != nullptr, "d_log_gate", "must be given with log_gate (Gated DeltaNet)");
    require_argument(p.log_gate != nullptr || p.d_log_gate == nullptr, "d_log_gate", "must be null without log_gate (DeltaNet)");
  }
  // A training forward's buffer: for the sizes it exists for, with no intermediate of stages 1 and 2 asked for
  // (those kernels do not run); read where the tensor-core path runs (alignment decides), else ignored.
  std::size_t saved = 0;
  if (run == Run::backward && p.saved != nullptr) {
    saved = saved_tensor_bytes(p.dtype, p.batch, p.heads, p.length, p.key_dim, p.value_dim, p.chunk_size);
    require_argument(saved != 0, "saved", "must be null: a training forward keeps nothing for these inputs (saved_bytes is 0)");
    for (auto [pointer, name] : {std::pair<const void*, const char*>{p.wy_inverse, "wy_inverse"}, {p.w, "w"}, {p.u, "u"},
                                 {p.wy_system, "wy_system"}, {p.v_new, "v_new"}, {p.boundary_states, "boundary_states"},
                                 {p.final_state, "final_state"}})
      require_argument(pointer == nullptr, name, "must be null with saved (the kernels that write it do not run)");
  }
  const bool fast = run == Run::backward && tensor_core_backward_applies(p);
  if (fast) {  // what the tensor-core path never materialises
    require_argument(p.scores == nullptr, "scores", "must be null for the tensor-core backward (bf16): P stays in registers");
    require_argument(p.output == nullptr, "output",
                     "must be null for the tensor-core backward (bf16): it recomputes no output (backward_forward does)");
    require_argument(reinterpret_cast<std::uintptr_t>(p.wy_inverse) % 16 == 0, "wy_inverse",
                     "must be 16-byte aligned for the tensor-core backward (bf16): its chunk kernel reads T in 16-byte vectors");
  }
  std::size_t bytes = 0;
  if (fast) bytes = tensor_core_backward_workspace_bytes(p);
  else resolve(p, &bytes);
  require_argument(bytes == 0 || p.workspace != nullptr, "workspace",
                   "must not be null: " + std::to_string(bytes) + " bytes are needed (workspace_bytes)");
  const auto tensors = tensors_of(p, run);
  require_tensor_arguments(p.batch, p.heads, tensors,
                           {packed_extent("workspace", p.workspace, bytes, true), packed_extent("saved", p.saved, saved, false)});
  require_device_tensors(tensors);
  if (bytes != 0) require_tensor(p.workspace, workspace_alignment, "workspace");
  if (saved != 0) require_tensor(p.saved, workspace_alignment, "saved");
}

void launch(const LaunchShape& shape, const BackwardStageParams& p, const Buffers& b, cudaStream_t stream) {
  const std::string name = std::string(shape.name) + "<" + name_of(p.dtype) + ", C=" + std::to_string(p.chunk_size) + ">";
  check(cudaFuncSetAttribute(shape.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shape.shared_bytes)),
        "shared-memory size of " + name);
  shape.kernel<<<shape.grid, kThreads, shape.shared_bytes, stream>>>(p, b);
  check_launch(name);
}

template <class T>
void run_stage_typed(Stage stage, const BackwardStageParams& p, const Buffers& b, cudaStream_t stream) {
  switch (p.chunk_size) {
    case 16: return launch(launch_shape<T, 16>(stage, p), p, b, stream);
    case 32: return launch(launch_shape<T, 32>(stage, p), p, b, stream);
    default: return launch(launch_shape<T, 64>(stage, p), p, b, stream);
  }
}

void run_stages(std::initializer_list<Stage> stages, const BackwardStageParams& p, Run run, cudaStream_t stream) {
  validate_for(p, run);
  const Buffers b = resolve(p, nullptr);
  for (Stage stage : stages) switch (p.dtype) {
      case DType::f32: run_stage_typed<float>(stage, p, b, stream); break;
      case DType::f64: run_stage_typed<double>(stage, p, b, stream); break;
      case DType::bf16: run_stage_typed<__nv_bfloat16>(stage, p, b, stream); break;
      case DType::f16: run_stage_typed<__half>(stage, p, b, stream); break;
    }
}

}  // namespace

void set_contiguous_strides(BackwardParams& p) {
  p.q_strides = p.k_strides = p.dq_strides = p.dk_strides = contiguous(p.heads, p.length, p.key_dim);
  p.v_strides = p.d_output_strides = p.dv_strides = contiguous(p.heads, p.length, p.value_dim);
  p.beta_strides = p.log_gate_strides = p.d_beta_strides = p.d_log_gate_strides = contiguous(p.heads, p.length, 1);
  p.initial_state_strides = p.d_final_state_strides = p.d_initial_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}

std::size_t workspace_bytes(const BackwardParams& p) { return testing::workspace_bytes(BackwardStageParams{p, {}}); }
void validate(const BackwardParams& p) { validate_for(BackwardStageParams{p, {}}, Run::backward); }
void backward(const BackwardParams& p, cudaStream_t stream) { testing::backward(BackwardStageParams{p, {}}, stream); }

namespace testing {

std::size_t workspace_bytes(const BackwardStageParams& p) {
  require_shape(p);
  if (tensor_core_backward_applies(p)) return tensor_core_backward_workspace_bytes(p);
  std::size_t bytes = 0;
  resolve(p, &bytes);
  return bytes;
}

void validate(const BackwardStageParams& p) { validate_for(p, Run::backward); }

void backward(const BackwardStageParams& p, cudaStream_t stream) {
  if (tensor_core_backward_applies(p)) {
    validate_for(p, Run::backward);
    return tensor_core_backward(p, TensorCoreStage::prepare, TensorCoreStage::chunk_gradients, stream);
  }
  run_stages({Stage::prepare, Stage::state_scan, Stage::gradient_scan, Stage::chunk_gradients}, p, Run::backward, stream);
}
void backward_tensor_core_stage(const BackwardStageParams& p, TensorCoreStage stage, cudaStream_t stream) {
  require_argument(tensor_core_backward_applies(p), "dtype", "the tensor-core backward takes bf16 with DK, DV <= 128 (multiples of 8) only");
  validate_for(p, Run::backward);
  tensor_core_backward(p, stage, stage, stream);
}
void backward_prepare(const BackwardStageParams& p, cudaStream_t stream) { run_stages({Stage::prepare}, p, Run::backward, stream); }
void backward_state_scan(const BackwardStageParams& p, cudaStream_t stream) {
  run_stages({Stage::state_scan}, p, Run::backward, stream);
}
void backward_gradient_scan(const BackwardStageParams& p, cudaStream_t stream) {
  run_stages({Stage::gradient_scan}, p, Run::backward, stream);
}
void backward_chunk_gradients(const BackwardStageParams& p, cudaStream_t stream) {
  run_stages({Stage::chunk_gradients}, p, Run::backward, stream);
}
void backward_forward(const BackwardStageParams& p, cudaStream_t stream) {
  run_stages({Stage::prepare, Stage::state_scan}, p, Run::forward, stream);
}

}  // namespace testing

}  // namespace deltaproof::cuda::delta_rule
