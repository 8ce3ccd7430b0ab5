// Additive linear attention: argument validation and the public entry points. The kernels are in
// linear_attention_passes.cuh, their launchers in linear_attention_kernels.cuh; this library instantiates them
// faithful only.
#include "cuda/linear_attention.h"

#include "cuda/arguments.hpp"
#include "cuda/context_parallel.h"
#include "cuda/linear_attention_kernels.cuh"

#include <stdexcept>
#include <string>
#include <vector>

namespace deltaproof::cuda::linear_attention {
namespace {

void require_shape(DType dtype, int batch, int heads, int length, const char* length_name, int key_dim, int value_dim) {
  require_dtype(dtype, {DType::f32, DType::f64, DType::bf16, DType::f16});
  require_sizes(batch, heads, length, length_name, key_dim, value_dim);
}

void require_segments(int batch, int heads, int segments) {
  const std::string name = "segments: " + std::to_string(segments);
  if (segments < 0) throw std::invalid_argument(name + " is negative (0 chooses, 1 walks each sequence once)");
  if (long(batch) * heads * segments > kMaxGridRows)
    throw std::invalid_argument(name + ": batch · heads · segments exceeds " + std::to_string(kMaxGridRows));
}

}  // namespace

bool uses_tensor_cores(DType dtype, int key_dim, int value_dim) { return tensor_core_pass(dtype, key_dim, value_dim); }

void set_contiguous_strides(ForwardParams& p) {
  p.q_strides = p.k_strides = contiguous(p.heads, p.length, p.key_dim);
  p.v_strides = p.output_strides = contiguous(p.heads, p.length, p.value_dim);
  p.initial_state_strides = p.final_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}
void set_contiguous_strides(BackwardParams& p) {
  p.q_strides = p.k_strides = p.dq_strides = p.dk_strides = contiguous(p.heads, p.length, p.key_dim);
  p.v_strides = p.d_output_strides = p.dv_strides = contiguous(p.heads, p.length, p.value_dim);
  p.initial_state_strides = p.d_final_state_strides = p.d_initial_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}
void set_contiguous_strides(DecodeParams& p) {
  p.q_strides = p.k_strides = contiguous(p.heads, p.tokens, p.key_dim);
  p.v_strides = p.output_strides = contiguous(p.heads, p.tokens, p.value_dim);
  p.initial_state_strides = p.final_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}

namespace {

std::vector<TensorArgument> tensors_of(const ForwardParams& p) {
  const std::size_t es = size_of(p.dtype), ss = size_of(state_dtype(p.dtype));
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, N = cuda::chunk_count(L, p.chunk_size);
  return {{"q", p.q, p.q_strides, L, DK, es},
          {"k", p.k, p.k_strides, L, DK, es},
          {"v", p.v, p.v_strides, L, DV, es},
          {"initial_state", p.initial_state, p.initial_state_strides, DV, DK, ss, false, false},
          {"output", p.output, p.output_strides, L, DV, es, true},
          {"final_state", p.final_state, p.final_state_strides, DV, DK, ss, true, false},
          {"boundary_states", p.boundary_states, contiguous(p.heads, N, DV * DK), N, DV * DK, ss, true, false}};
}

std::vector<TensorArgument> tensors_of(const BackwardParams& p) {
  const std::size_t es = size_of(p.dtype), ss = size_of(state_dtype(p.dtype));
  const int L = p.length, DK = p.key_dim, DV = p.value_dim;
  return {{"q", p.q, p.q_strides, L, DK, es},
          {"k", p.k, p.k_strides, L, DK, es},
          {"v", p.v, p.v_strides, L, DV, es},
          {"d_output", p.d_output, p.d_output_strides, L, DV, es},
          {"initial_state", p.initial_state, p.initial_state_strides, DV, DK, ss, false, false},
          {"d_final_state", p.d_final_state, p.d_final_state_strides, DV, DK, ss, false, false},
          {"dq", p.dq, p.dq_strides, L, DK, es, true},
          {"dk", p.dk, p.dk_strides, L, DK, es, true},
          {"dv", p.dv, p.dv_strides, L, DV, es, true},
          {"d_initial_state", p.d_initial_state, p.d_initial_state_strides, DV, DK, ss, true, false}};
}

// In place (initial_state == final_state) the state is left out of the aliasing check: each entry is
// read, then written, by one thread.
std::vector<TensorArgument> tensors_of(const DecodeParams& p) {
  const std::size_t es = size_of(p.dtype), ss = size_of(state_dtype(p.dtype));
  const int T = p.tokens, DK = p.key_dim, DV = p.value_dim;
  const bool in_place = decode_state_in_place(p.initial_state, p.initial_state_strides, p.final_state, p.final_state_strides);
  return {{"q", p.q, p.q_strides, T, DK, es},
          {"k", p.k, p.k_strides, T, DK, es},
          {"v", p.v, p.v_strides, T, DV, es},
          {"initial_state", in_place ? nullptr : p.initial_state, p.initial_state_strides, DV, DK, ss, false, false},
          {"output", p.output, p.output_strides, T, DV, es, true},
          {"final_state", p.final_state, p.final_state_strides, DV, DK, ss, true}};
}

}  // namespace

// Order: everything that needs no CUDA call first (dtype, sizes, chunk size, strides, null pointers,
// aliasing), then device-pointer and alignment checks.
void validate(const ForwardParams& p) {
  require_shape(p.dtype, p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_chunk_size(p.chunk_size);
  require_segments(p.batch, p.heads, p.segments);
  if (p.segments > 1 && p.boundary_states)
    throw std::invalid_argument("segments: " + std::to_string(p.segments) +
                                " with boundary_states: the boundary states are one walk's (0 or 1)");
  const auto tensors = tensors_of(p);
  require_tensor_arguments(p.batch, p.heads, tensors);
  require_device_tensors(tensors);
}

void validate(const BackwardParams& p) {
  require_shape(p.dtype, p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_chunk_size(p.chunk_size);
  require_segments(p.batch, p.heads, p.segments);
  const auto tensors = tensors_of(p);
  require_tensor_arguments(p.batch, p.heads, tensors);
  require_device_tensors(tensors);
}

void validate(const DecodeParams& p) {
  require_shape(p.dtype, p.batch, p.heads, p.tokens, "tokens", p.key_dim, p.value_dim);
  const auto tensors = tensors_of(p);
  require_tensor_arguments(p.batch, p.heads, tensors);
  require_device_tensors(tensors);
}

void forward(const ForwardParams& p, cudaStream_t stream) {
  validate(p);
  launch_forward<Faithful>(p, stream);
}

void backward(const BackwardParams& p, cudaStream_t stream) {
  validate(p);
  launch_backward<Faithful>(p, stream);
}

void decode(const DecodeParams& p, cudaStream_t stream) {
  validate(p);
  launch_decode<Faithful>(p, stream);
}

}  // namespace deltaproof::cuda::linear_attention

namespace deltaproof::cuda::context_parallel {

// Here, beside the kernels it launches (cuda/context_parallel.h).
void linear_attention_forward(const linear_attention::ForwardParams& local, Exchange& exchange, cudaStream_t stream) {
  namespace la = linear_attention;
  la::validate(local);
  if (local.boundary_states)
    throw std::invalid_argument("boundary_states: not written by a context-parallel forward (must be null)");
  const int rank = exchange.rank(), ranks = exchange.size();
  const std::size_t state_bytes = size_of(la::state_dtype(local.dtype));
  const std::size_t bytes = state_bytes * std::size_t(local.batch) * local.heads * local.value_dim * local.key_dim;
  const StreamMemory memory(bytes * (ranks + 2), stream, "the summaries");  // summary, gathered, incoming state
  char* base = static_cast<char*>(memory.data);
  void *summary = base, *gathered = base + bytes, *incoming = base + bytes * (ranks + 1);

  const la::ForwardPass sum = la::rank_summary_pass(local, rank, summary);
  la::run_pass<la::Faithful>(sum.pass, local.dtype, sum.vec, stream);
  exchange.all_gather(summary, gathered, bytes, stream);
  la::ForwardParams run = local;
  if (rank > 0) {
    const la::RankPrefix prefix = la::rank_prefix(local, rank, gathered, incoming);
    if (local.dtype == DType::f64) la::rank_prefix_kernel<double><<<la::prefix_blocks(prefix), la::kScanThreads, 0, stream>>>(prefix);
    else la::rank_prefix_kernel<float><<<la::prefix_blocks(prefix), la::kScanThreads, 0, stream>>>(prefix);
    check_launch("linear_attention rank_prefix_kernel");
    run.initial_state = incoming;
    run.initial_state_strides = contiguous(local.heads, local.value_dim, local.key_dim);
  }
  la::launch_forward<la::Faithful>(run, stream);
}

}  // namespace deltaproof::cuda::context_parallel
