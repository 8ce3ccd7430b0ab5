// Additive linear attention: argument validation and the public entry points. The kernels and
// their launchers are in linear_attention_kernels.cuh; this library instantiates them faithful only.
#include "cuda/linear_attention.h"
#include "cuda/linear_attention_kernels.cuh"

#include <cstdint>
#include <string>
#include <utility>

namespace deltaproof::cuda::linear_attention {
namespace {

bool is_supported_chunk(int c) {
  for (int s : supported_chunk_sizes)
    if (c == s) return true;
  return false;
}

void require_dtype(DType d) {
  require_argument(d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16, "dtype",
                   "must be fp32, fp64, bf16 or fp16");
}

void require_sizes(int batch, int heads, int length, const char* length_name, int key_dim, int value_dim) {
  require_argument(batch >= 1, "batch", "must be >= 1");
  require_argument(heads >= 1, "heads", "must be >= 1");
  require_argument(std::int64_t{batch} * heads <= 65535, "batch*heads", "must be <= 65535 (one grid row per head)");
  require_sequence_length(length, length_name);
  require_argument(key_dim >= 1 && key_dim <= max_head_dim, "key_dim", "must be in 1..256");
  require_argument(value_dim >= 1 && value_dim <= max_head_dim, "value_dim", "must be in 1..256");
}

// Strides that keep every (b, h, i, j) apart (rows inside heads inside batches), and whose largest
// offset, (B-1)*batch + (H-1)*head + (rows-1)*row + cols - 1, fits the kernels' int64 offsets.
// Computed in 128 bits, so that no stride, however large, wraps a check.
void require_strides(const Strides& s, int batch, int heads, int rows, int cols, const std::string& name) {
  using Wide = __int128;
  const Wide row_span = Wide(rows - 1) * s.row + cols, head_span = Wide(heads - 1) * s.head + row_span;
  require_argument(s.row >= cols, name + "_strides.row", "must be >= the column count " + std::to_string(cols));
  require_argument(s.head >= row_span, name + "_strides.head", "must be >= (rows-1)*row + cols");
  require_argument(s.batch >= head_span, name + "_strides.batch", "must be >= (heads-1)*head + (rows-1)*row + cols");
  require_argument(Wide(batch - 1) * s.batch + head_span <= Wide(INT64_MAX), name + "_strides",
                   "the largest offset (B-1)*batch + (H-1)*head + (rows-1)*row + cols must fit in 64 bits");
}

void require_tensor(const void* pointer, DType dtype, const std::string& name) {
  require_device_pointer(pointer, name);
  require_aligned(pointer, size_of(dtype), name);
}
void require_optional_tensor(const void* pointer, DType dtype, const std::string& name) {
  if (pointer) require_tensor(pointer, dtype, name);
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

// Order: everything that needs no CUDA call first (dtype, sizes, chunk size, strides, null
// pointers), then device-pointer and alignment checks.
void validate(const ForwardParams& p) {
  require_dtype(p.dtype);
  require_sizes(p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_argument(is_supported_chunk(p.chunk_size), "chunk_size", "must be 16, 32 or 64");
  require_strides(p.q_strides, p.batch, p.heads, p.length, p.key_dim, "q");
  require_strides(p.k_strides, p.batch, p.heads, p.length, p.key_dim, "k");
  require_strides(p.v_strides, p.batch, p.heads, p.length, p.value_dim, "v");
  require_strides(p.output_strides, p.batch, p.heads, p.length, p.value_dim, "output");
  if (p.initial_state) require_strides(p.initial_state_strides, p.batch, p.heads, p.value_dim, p.key_dim, "initial_state");
  if (p.final_state) require_strides(p.final_state_strides, p.batch, p.heads, p.value_dim, p.key_dim, "final_state");
  for (auto [ptr, name] : {std::pair{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {static_cast<const void*>(p.output), "output"}})
    require_argument(ptr != nullptr, name, "must not be null");
  require_tensor(p.q, p.dtype, "q");
  require_tensor(p.k, p.dtype, "k");
  require_tensor(p.v, p.dtype, "v");
  require_tensor(p.output, p.dtype, "output");
  require_optional_tensor(p.initial_state, state_dtype(p.dtype), "initial_state");
  require_optional_tensor(p.final_state, state_dtype(p.dtype), "final_state");
  require_optional_tensor(p.boundary_states, state_dtype(p.dtype), "boundary_states");
}

void validate(const BackwardParams& p) {
  require_dtype(p.dtype);
  require_sizes(p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_argument(is_supported_chunk(p.chunk_size), "chunk_size", "must be 16, 32 or 64");
  require_strides(p.q_strides, p.batch, p.heads, p.length, p.key_dim, "q");
  require_strides(p.k_strides, p.batch, p.heads, p.length, p.key_dim, "k");
  require_strides(p.v_strides, p.batch, p.heads, p.length, p.value_dim, "v");
  require_strides(p.d_output_strides, p.batch, p.heads, p.length, p.value_dim, "d_output");
  require_strides(p.dq_strides, p.batch, p.heads, p.length, p.key_dim, "dq");
  require_strides(p.dk_strides, p.batch, p.heads, p.length, p.key_dim, "dk");
  require_strides(p.dv_strides, p.batch, p.heads, p.length, p.value_dim, "dv");
  if (p.initial_state) require_strides(p.initial_state_strides, p.batch, p.heads, p.value_dim, p.key_dim, "initial_state");
  if (p.d_final_state) require_strides(p.d_final_state_strides, p.batch, p.heads, p.value_dim, p.key_dim, "d_final_state");
  if (p.d_initial_state) require_strides(p.d_initial_state_strides, p.batch, p.heads, p.value_dim, p.key_dim, "d_initial_state");
  for (auto [ptr, name] : {std::pair{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.d_output, "d_output"},
                           {static_cast<const void*>(p.dq), "dq"}, {static_cast<const void*>(p.dk), "dk"},
                           {static_cast<const void*>(p.dv), "dv"}})
    require_argument(ptr != nullptr, name, "must not be null");
  require_tensor(p.q, p.dtype, "q");
  require_tensor(p.k, p.dtype, "k");
  require_tensor(p.v, p.dtype, "v");
  require_tensor(p.d_output, p.dtype, "d_output");
  require_tensor(p.dq, p.dtype, "dq");
  require_tensor(p.dk, p.dtype, "dk");
  require_tensor(p.dv, p.dtype, "dv");
  require_optional_tensor(p.initial_state, state_dtype(p.dtype), "initial_state");
  require_optional_tensor(p.d_final_state, state_dtype(p.dtype), "d_final_state");
  require_optional_tensor(p.d_initial_state, state_dtype(p.dtype), "d_initial_state");
}

void validate(const DecodeParams& p) {
  require_dtype(p.dtype);
  require_sizes(p.batch, p.heads, p.tokens, "tokens", p.key_dim, p.value_dim);
  require_strides(p.q_strides, p.batch, p.heads, p.tokens, p.key_dim, "q");
  require_strides(p.k_strides, p.batch, p.heads, p.tokens, p.key_dim, "k");
  require_strides(p.v_strides, p.batch, p.heads, p.tokens, p.value_dim, "v");
  require_strides(p.output_strides, p.batch, p.heads, p.tokens, p.value_dim, "output");
  require_strides(p.final_state_strides, p.batch, p.heads, p.value_dim, p.key_dim, "final_state");
  if (p.initial_state) require_strides(p.initial_state_strides, p.batch, p.heads, p.value_dim, p.key_dim, "initial_state");
  if (p.initial_state == p.final_state)  // in place: each entry is read, then written, by one thread
    require_argument(p.initial_state_strides.batch == p.final_state_strides.batch &&
                         p.initial_state_strides.head == p.final_state_strides.head &&
                         p.initial_state_strides.row == p.final_state_strides.row,
                     "initial_state_strides", "must equal final_state_strides when the state is updated in place");
  for (auto [ptr, name] : {std::pair{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {static_cast<const void*>(p.output), "output"},
                           {static_cast<const void*>(p.final_state), "final_state"}})
    require_argument(ptr != nullptr, name, "must not be null");
  require_tensor(p.q, p.dtype, "q");
  require_tensor(p.k, p.dtype, "k");
  require_tensor(p.v, p.dtype, "v");
  require_tensor(p.output, p.dtype, "output");
  require_tensor(p.final_state, state_dtype(p.dtype), "final_state");
  require_optional_tensor(p.initial_state, state_dtype(p.dtype), "initial_state");
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
