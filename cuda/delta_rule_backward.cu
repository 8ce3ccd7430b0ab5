// DeltaNet and Gated DeltaNet: backward of the chunkwise WY form, four kernels (delta_rule.h has the
// API and the stage list; cuda/NOTES_delta.md the design, the precision plan and what has been run).
//
// v1 is written to be checked first: each loop is one line of reference/gated_delta_rule.hpp's
// chunk_backward, in the accumulation type A (fp32, or fp64 for fp64 inputs), by plain FMA. Two
// loop shapes carry every product, and their rounding depths are what verify/
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
#include "cuda/check.hpp"
#include "cuda/delta_rule.h"
#include "cuda/delta_rule_backward_fast.h"
#include "cuda/delta_rule_backward_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

namespace deltaproof::cuda {
namespace {

using namespace backward_kernels;

constexpr std::size_t kWorkspaceAlignment = 256;

std::size_t accumulator_size(DType dtype) { return dtype == DType::f64 ? 8 : 4; }

std::size_t aligned(std::size_t bytes) { return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

// Carves the intermediates the caller left null out of the workspace, in a fixed order; `bytes`
// receives the workspace size those need.
Buffers resolve(const DeltaRuleBackwardParams& p, std::size_t* bytes) {
  const std::size_t heads = std::size_t(p.batch) * p.heads, L = p.length, C = p.chunk_size;
  const std::size_t N = (L + C - 1) / C, DK = p.key_dim, DV = p.value_dim, es = accumulator_size(p.dtype);
  char* base = static_cast<char*>(p.workspace);
  std::size_t offset = 0;
  auto take = [&](void* given, std::size_t count) -> void* {
    if (given != nullptr) return given;
    void* at = base != nullptr ? base + offset : nullptr;
    offset += aligned(heads * count * es);
    return at;
  };
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
  if (bytes != nullptr) *bytes = offset;
  return b;
}

// ---------------------------------------------------------------------------------------
// Host side.

void require_sizes(const DeltaRuleBackwardParams& p) {
  require_argument(p.dtype == DType::f32 || p.dtype == DType::f64 || p.dtype == DType::bf16 || p.dtype == DType::f16,
                   "dtype", "must be fp32, fp64, bf16 or fp16, got " + name_of(p.dtype));
  require_argument(p.batch >= 1, "batch", "must be >= 1, got " + std::to_string(p.batch));
  require_argument(p.heads >= 1, "heads", "must be >= 1, got " + std::to_string(p.heads));
  require_argument(static_cast<long long>(p.batch) * p.heads <= 65535, "batch*heads",
                   "must be <= 65535, got " + std::to_string(static_cast<long long>(p.batch) * p.heads));
  require_argument(p.length >= 1, "length", "must be >= 1, got " + std::to_string(p.length));
  require_argument(p.key_dim >= 1 && p.key_dim <= kMaxHeadDim, "key_dim", "must be in 1..256, got " + std::to_string(p.key_dim));
  require_argument(p.value_dim >= 1 && p.value_dim <= kMaxHeadDim, "value_dim",
                   "must be in 1..256, got " + std::to_string(p.value_dim));
  require_argument(p.chunk_size == 16 || p.chunk_size == 32 || p.chunk_size == 64, "chunk_size",
                   "must be 16, 32 or 64, got " + std::to_string(p.chunk_size));
}

enum class Run { backward, forward };

void validate_for(const DeltaRuleBackwardParams& p, Run run) {
  // 1. Without any CUDA call: sizes, then every required pointer present.
  require_sizes(p);
  const auto present = [](const void* pointer, const std::string& name) { require_argument(pointer != nullptr, name, "must not be null"); };
  present(p.q, "q");
  present(p.k, "k");
  present(p.v, "v");
  present(p.beta, "beta");
  if (run == Run::backward) {
    present(p.d_output, "d_output");
    present(p.dq, "dq");
    present(p.dk, "dk");
    present(p.dv, "dv");
    present(p.d_beta, "d_beta");
    require_argument(p.log_gate == nullptr || p.d_log_gate != nullptr, "d_log_gate", "must be given with log_gate (Gated DeltaNet)");
    require_argument(p.log_gate != nullptr || p.d_log_gate == nullptr, "d_log_gate", "must be null without log_gate (DeltaNet)");
  } else {
    present(p.output, "output");
    present(p.final_state, "final_state");
  }
  const bool fast = run == Run::backward && delta_rule_backward_uses_tensor_cores(p);
  if (fast) {  // what the tensor-core path never materialises
    require_argument(p.scores == nullptr, "scores", "must be null for the tensor-core backward (bf16): P stays in registers");
    require_argument(p.output == nullptr, "output",
                     "must be null for the tensor-core backward (bf16): it recomputes no output (delta_rule_backward_forward does)");
  }
  std::size_t bytes = 0;
  if (fast) bytes = delta_rule_backward_fast_workspace_bytes(p);
  else resolve(p, &bytes);
  require_argument(bytes == 0 || p.workspace != nullptr, "workspace",
                   "must not be null: " + std::to_string(bytes) + " bytes are needed (delta_rule_backward_workspace_bytes)");
  // 2. Device pointers and alignment.
  const std::size_t es = size_of(p.dtype), acc = accumulator_size(p.dtype);
  const auto tensor = [](const void* pointer, std::size_t alignment, const std::string& name) {
    require_device_pointer(pointer, name);
    require_aligned(pointer, alignment, name);
  };
  const auto optional = [&](const void* pointer, std::size_t alignment, const std::string& name) {
    if (pointer != nullptr) tensor(pointer, alignment, name);
  };
  tensor(p.q, es, "q");
  tensor(p.k, es, "k");
  tensor(p.v, es, "v");
  tensor(p.beta, es, "beta");
  optional(p.log_gate, acc, "log_gate");
  optional(p.initial_state, acc, "initial_state");
  if (run == Run::backward) {
    tensor(p.d_output, es, "d_output");
    optional(p.d_final_state, acc, "d_final_state");
    tensor(p.dq, es, "dq");
    tensor(p.dk, es, "dk");
    tensor(p.dv, es, "dv");
    tensor(p.d_beta, es, "d_beta");
    optional(p.d_log_gate, acc, "d_log_gate");
    optional(p.d_initial_state, acc, "d_initial_state");
  }
  if (bytes != 0) tensor(p.workspace, kWorkspaceAlignment, "workspace");
  for (auto [pointer, name] : {std::pair<const void*, const char*>{p.gate_sums, "gate_sums"}, {p.wy_inverse, "wy_inverse"},
                               {p.w, "w"}, {p.u, "u"}, {p.scores, "scores"}, {p.boundary_states, "boundary_states"},
                               {p.v_new, "v_new"}, {p.d_v_new, "d_v_new"}, {p.state_gradients, "state_gradients"},
                               {p.d_w, "d_w"}, {p.wy_system, "wy_system"}, {p.wy_system_adjoint, "wy_system_adjoint"},
                               {p.gate_sum_gradients, "gate_sum_gradients"}, {p.final_state, "final_state"}})
    optional(pointer, acc, name);
  optional(p.output, es, "output");
}

void launch(const LaunchShape& shape, const DeltaRuleBackwardParams& p, const Buffers& b) {
  const std::string name = std::string(shape.name) + "<" + name_of(p.dtype) + ", C=" + std::to_string(p.chunk_size) + ">";
  check(cudaFuncSetAttribute(shape.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shape.shared_bytes)),
        "shared-memory size of " + name);
  shape.kernel<<<shape.grid, kThreads, shape.shared_bytes, p.stream>>>(p, b);
  check_launch(name);
}

template <class T>
void run_stage_typed(Stage stage, const DeltaRuleBackwardParams& p, const Buffers& b) {
  switch (p.chunk_size) {
    case 16: return launch(launch_shape<T, 16>(stage, p), p, b);
    case 32: return launch(launch_shape<T, 32>(stage, p), p, b);
    default: return launch(launch_shape<T, 64>(stage, p), p, b);
  }
}

void run_stages(std::initializer_list<Stage> stages, const DeltaRuleBackwardParams& p, Run run) {
  validate_for(p, run);
  const Buffers b = resolve(p, nullptr);
  for (Stage stage : stages) switch (p.dtype) {
      case DType::f32: run_stage_typed<float>(stage, p, b); break;
      case DType::f64: run_stage_typed<double>(stage, p, b); break;
      case DType::bf16: run_stage_typed<__nv_bfloat16>(stage, p, b); break;
      case DType::f16: run_stage_typed<__half>(stage, p, b); break;
    }
}

}  // namespace

std::size_t delta_rule_backward_workspace_bytes(const DeltaRuleBackwardParams& params) {
  require_sizes(params);
  if (delta_rule_backward_uses_tensor_cores(params)) return delta_rule_backward_fast_workspace_bytes(params);
  std::size_t bytes = 0;
  resolve(params, &bytes);
  return bytes;
}

void validate(const DeltaRuleBackwardParams& params) { validate_for(params, Run::backward); }

void delta_rule_backward(const DeltaRuleBackwardParams& params) {
  if (delta_rule_backward_uses_tensor_cores(params)) {
    validate_for(params, Run::backward);
    return delta_rule_backward_fast(params);
  }
  run_stages({Stage::prepare, Stage::state_scan, Stage::gradient_scan, Stage::chunk_gradients}, params, Run::backward);
}
void delta_rule_backward_prepare(const DeltaRuleBackwardParams& params) { run_stages({Stage::prepare}, params, Run::backward); }
void delta_rule_backward_state_scan(const DeltaRuleBackwardParams& params) { run_stages({Stage::state_scan}, params, Run::backward); }
void delta_rule_backward_gradient_scan(const DeltaRuleBackwardParams& params) {
  run_stages({Stage::gradient_scan}, params, Run::backward);
}
void delta_rule_backward_chunk_gradients(const DeltaRuleBackwardParams& params) {
  run_stages({Stage::chunk_gradients}, params, Run::backward);
}
void delta_rule_backward_forward(const DeltaRuleBackwardParams& params) {
  run_stages({Stage::prepare, Stage::state_scan}, params, Run::forward);
}

}  // namespace deltaproof::cuda
