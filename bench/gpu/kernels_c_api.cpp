// deltaproof's CUDA kernels behind a plain C interface, for ctypes (bench/gpu/side_by_side.py).
//
// The kernels run on device pointers the caller owns (PyTorch tensors) and on the caller's stream,
// so that deltaproof's, fla's and the derivation's Triton kernels are timed on the very same tensors in one
// process. The CUDA runtime is linked statically; it shares the device's primary context, and so
// every pointer and stream, with the caller's runtime.
//
// Every function returns 0 on success, 1 for an invalid argument (nothing launched, no output
// touched) and 2 for a CUDA error; deltaproof_kernels_last_error() then says which argument, or
// which kernel failed. Layouts and dtypes are those of cuda/linear_attention.h and
// cuda/delta_rule.h: tensors [B, H, L, D] contiguous, states [B, H, DV, DK] fp32.
#include <cstddef>
#include "cuda/delta_rule.h"
#include "cuda/linear_attention.h"

#include <cuda_runtime.h>

#include <exception>
#include <stdexcept>
#include <string>

namespace {

namespace kc = deltaproof::cuda;
namespace kla = deltaproof::cuda::linear_attention;
namespace kdr = deltaproof::cuda::delta_rule;

thread_local std::string last_error;

kc::DType parse_dtype(const char* name) {
  const std::string s = name ? name : "";
  if (s == "bf16") return kc::DType::bf16;
  if (s == "fp16") return kc::DType::f16;
  if (s == "fp32") return kc::DType::f32;
  if (s == "fp64") return kc::DType::f64;
  throw std::invalid_argument("dtype: must be bf16, fp16, fp32 or fp64, got '" + s + "'");
}

// Runs `body`, turning exceptions into a return code and a message.
template <class Body>
int guarded(Body&& body) {
  try {
    body();
    last_error.clear();
    return 0;
  } catch (const std::invalid_argument& e) {
    last_error = e.what();
    return 1;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 2;
  }
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

kdr::ForwardParams delta_rule_forward_shape(const char* dtype, int batch, int heads, int length, int key_dim, int value_dim,
                                            int chunk_size) {
  kdr::ForwardParams p;
  p.dtype = parse_dtype(dtype), p.batch = batch, p.heads = heads, p.length = length, p.key_dim = key_dim;
  p.value_dim = value_dim, p.chunk_size = chunk_size;
  kdr::set_contiguous_strides(p);
  return p;
}

kdr::BackwardParams delta_rule_backward_shape(const char* dtype, int batch, int heads, int length, int key_dim,
                                              int value_dim, int chunk_size) {
  kdr::BackwardParams p;
  p.dtype = parse_dtype(dtype), p.batch = batch, p.heads = heads, p.length = length, p.key_dim = key_dim;
  p.value_dim = value_dim, p.chunk_size = chunk_size;
  kdr::set_contiguous_strides(p);
  return p;
}

}  // namespace

extern "C" {

const char* deltaproof_kernels_last_error(void) { return last_error.c_str(); }

// Chunkwise forward (cuda/linear_attention.h, forward): o = chunkwise(q, k, v) from S_0
// (null: zero); the final state is written where final_state is not null.
int deltaproof_linear_attention_forward(const char* dtype, int batch, int heads, int length, int key_dim,
                                        int value_dim, int chunk_size, const void* q, const void* k, const void* v,
                                        void* output, const void* initial_state, void* final_state, void* stream) {
  return guarded([&] {
    kla::ForwardParams p;
    p.dtype = parse_dtype(dtype), p.batch = batch, p.heads = heads, p.length = length, p.key_dim = key_dim;
    p.value_dim = value_dim, p.chunk_size = chunk_size, p.q = q, p.k = k, p.v = v, p.output = output;
    p.initial_state = initial_state, p.final_state = final_state;
    kla::set_contiguous_strides(p);
    kla::forward(p, as_stream(stream));
  });
}

// Backward (cuda/linear_attention.h, backward): dq, dk, dv (and dS_0 where d_initial_state is not
// null) from dO and an optional dS_L.
int deltaproof_linear_attention_backward(const char* dtype, int batch, int heads, int length, int key_dim,
                                         int value_dim, int chunk_size, const void* q, const void* k, const void* v,
                                         const void* d_output, void* dq, void* dk, void* dv, const void* initial_state,
                                         const void* d_final_state, void* d_initial_state, void* stream) {
  return guarded([&] {
    kla::BackwardParams p;
    p.dtype = parse_dtype(dtype), p.batch = batch, p.heads = heads, p.length = length, p.key_dim = key_dim;
    p.value_dim = value_dim, p.chunk_size = chunk_size, p.q = q, p.k = k, p.v = v, p.d_output = d_output;
    p.dq = dq, p.dk = dk, p.dv = dv, p.initial_state = initial_state, p.d_final_state = d_final_state;
    p.d_initial_state = d_initial_state;
    kla::set_contiguous_strides(p);
    kla::backward(p, as_stream(stream));
  });
}

// Decode of `tokens` new tokens (cuda/linear_attention.h, decode); initial_state may equal
// final_state (in place).
int deltaproof_linear_attention_decode(const char* dtype, int batch, int heads, int tokens, int key_dim,
                                       int value_dim, const void* q, const void* k, const void* v, void* output,
                                       const void* initial_state, void* final_state, void* stream) {
  return guarded([&] {
    kla::DecodeParams p;
    p.dtype = parse_dtype(dtype), p.batch = batch, p.heads = heads, p.tokens = tokens, p.key_dim = key_dim;
    p.value_dim = value_dim, p.q = q, p.k = k, p.v = v, p.output = output;
    p.initial_state = initial_state, p.final_state = final_state;
    kla::set_contiguous_strides(p);
    kla::decode(p, as_stream(stream));
  });
}

// Bytes of the workspace deltaproof_delta_rule_forward needs for these sizes (into *bytes).
int deltaproof_delta_rule_forward_workspace_bytes(const char* dtype, int batch, int heads, int length, int key_dim,
                                                  int value_dim, int chunk_size, std::size_t* bytes) {
  return guarded([&] { *bytes = kdr::workspace_bytes(delta_rule_forward_shape(dtype, batch, heads, length, key_dim, value_dim, chunk_size)); });
}

// Bytes of what a training forward keeps for the backward (into *bytes; 0: nothing for these inputs).
int deltaproof_delta_rule_saved_bytes(const char* dtype, int batch, int heads, int length, int key_dim, int value_dim,
                                      int chunk_size, std::size_t* bytes) {
  return guarded([&] { *bytes = kdr::saved_bytes(delta_rule_forward_shape(dtype, batch, heads, length, key_dim, value_dim, chunk_size)); });
}

// DeltaNet (log_gate null) or Gated DeltaNet chunkwise forward (cuda/delta_rule.h, delta_rule::forward);
// workspace: the bytes deltaproof_delta_rule_forward_workspace_bytes gives, 256-byte aligned; saved (may be
// null): deltaproof_delta_rule_saved_bytes' bytes, 256-byte aligned, kept for the backward (a training step).
int deltaproof_delta_rule_forward(const char* dtype, int batch, int heads, int length, int key_dim, int value_dim,
                                  int chunk_size, const void* q, const void* k, const void* v, const void* beta,
                                  const float* log_gate, const float* initial_state, void* output, float* final_state,
                                  void* workspace, void* saved, void* stream) {
  return guarded([&] {
    kdr::ForwardParams p = delta_rule_forward_shape(dtype, batch, heads, length, key_dim, value_dim, chunk_size);
    p.q = q, p.k = k, p.v = v, p.beta = beta, p.log_gate = log_gate, p.initial_state = initial_state;
    p.output = output, p.final_state = final_state, p.workspace = workspace, p.saved = saved;
    kdr::forward(p, as_stream(stream));
  });
}

// Bytes of the workspace deltaproof_delta_rule_backward needs for these sizes (into *bytes).
int deltaproof_delta_rule_backward_workspace_bytes(const char* dtype, int batch, int heads, int length, int key_dim,
                                                   int value_dim, int chunk_size, std::size_t* bytes) {
  return guarded([&] { *bytes = kdr::workspace_bytes(delta_rule_backward_shape(dtype, batch, heads, length, key_dim, value_dim, chunk_size)); });
}

// DeltaNet (log_gate null) or Gated DeltaNet backward (cuda/delta_rule.h, delta_rule::backward): dq, dk,
// dv, dβ and, with log_gate, dg (fp32) from dO, an optional dS_L and S_0 (dS_0 where d_initial_state is
// not null); workspace: deltaproof_delta_rule_backward_workspace_bytes' bytes, 256-byte aligned; saved (may be
// null): a training forward's saved buffer on the same inputs.
int deltaproof_delta_rule_backward(const char* dtype, int batch, int heads, int length, int key_dim, int value_dim,
                                   int chunk_size, const void* q, const void* k, const void* v, const void* beta,
                                   const float* log_gate, const void* d_output, void* dq, void* dk, void* dv,
                                   void* d_beta, float* d_log_gate, const float* initial_state,
                                   const float* d_final_state, float* d_initial_state, void* workspace,
                                   const void* saved, void* stream) {
  return guarded([&] {
    kdr::BackwardParams p = delta_rule_backward_shape(dtype, batch, heads, length, key_dim, value_dim, chunk_size);
    p.q = q, p.k = k, p.v = v, p.beta = beta, p.log_gate = log_gate, p.d_output = d_output;
    p.dq = dq, p.dk = dk, p.dv = dv, p.d_beta = d_beta, p.d_log_gate = d_log_gate;
    p.initial_state = initial_state, p.d_final_state = d_final_state, p.d_initial_state = d_initial_state;
    p.workspace = workspace, p.saved = saved;
    kdr::backward(p, as_stream(stream));
  });
}

// DeltaNet or Gated DeltaNet decode (cuda/delta_rule.h, delta_rule::decode); initial_state may
// equal final_state (in place).
int deltaproof_delta_rule_decode(const char* dtype, int batch, int heads, int tokens, int key_dim, int value_dim,
                                 const void* q, const void* k, const void* v, const void* beta, const float* log_gate,
                                 const float* initial_state, void* output, float* final_state, void* stream) {
  return guarded([&] {
    kdr::DecodeParams p;
    p.dtype = parse_dtype(dtype), p.batch = batch, p.heads = heads, p.tokens = tokens, p.key_dim = key_dim;
    p.value_dim = value_dim, p.q = q, p.k = k, p.v = v, p.beta = beta, p.log_gate = log_gate;
    p.initial_state = initial_state, p.output = output, p.final_state = final_state;
    kdr::set_contiguous_strides(p);
    kdr::decode(p, as_stream(stream));
  });
}

}  // extern "C"
