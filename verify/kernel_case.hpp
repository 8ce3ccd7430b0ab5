// A kernel run as data: what a kernel was given (KernelCase) and what it produced (KernelResult),
// in either deltaproof's layout or flash-linear-attention's, fixed-length or varlen. Values are
// doubles holding the exact values the kernel saw (every bf16, fp16 and fp32 number is a double);
// `dtype` says what they were stored as, which sets the rounding of outputs.
//
// Layouts (fla = flash-linear-attention, the most used public library of this family):
//   bhld (deltaproof): q, k [B, H, L, DK]; v, o [B, H, L, DV]; beta, g [B, H, L];
//                      states h0, ht, dh0, dht [B, H, DV, DK] (value-by-key).
//   blhd (fla):        q, k [B, T, H, DK]; v, o [B, T, H, DV]; beta, g [B, T, H];
//                      states [N, H, DK, DV] (key-by-value, the transpose of deltaproof's S).
// Varlen (cu_seqlens, both layouts use B = 1): sequence n is tokens cu[n] .. cu[n+1]−1 of the
// packed axis, states reset at every boundary; N = len(cu_seqlens) − 1 sequences, each may be empty.
#pragma once

#include "verify/comparison.hpp"

#include <optional>
#include <string>
#include <vector>

namespace deltaproof::verify {

// Element types of the tensors a kernel reads and writes (the kernel's own accumulation is its model's:
// kernel_model.hpp).
enum class DType { f32, f64, bf16, f16 };

enum class Op { linear, delta, gated_delta };
enum class Layout { bhld, blhd };

std::string name_of(Op op);          // "linear", "delta", "gated-delta"
std::string name_of(Layout layout);  // "bhld", "blhd"
std::string name_of(DType dtype);    // "fp32", "fp64", "bf16", "fp16"
Op parse_op(const std::string& s);            // throws std::invalid_argument naming --op
Layout parse_layout(const std::string& s);    // throws std::invalid_argument naming --layout
DType parse_dtype(const std::string& s);      // "bf16", "fp16", "fp32", "fp64" (also torch/numpy names)

// The unit roundoff of a storage type: 2⁻⁸ bf16, 2⁻¹¹ fp16, 2⁻²⁴ fp32, 2⁻⁵³ fp64.
double unit_roundoff(DType d);

struct HostTensor {
  std::vector<Index> shape;
  std::vector<double> values;  // row-major
  DType dtype = DType::f32;

  Index size() const;
  std::string shape_string() const;  // "[2, 64, 4, 16]"
};

struct KernelCase {
  Op op = Op::linear;
  Layout layout = Layout::bhld;
  HostTensor q, k, v;
  std::optional<HostTensor> beta;     // delta, gated-delta; any real value
  std::optional<HostTensor> g;        // gated-delta: log-gates g = ln α (≤ 0)
  std::optional<HostTensor> h0;       // initial state; absent = 0
  std::vector<Index> cu_seqlens;      // empty: fixed length
  double scale = 1.0;                 // the kernel uses scale·q (fla's `scale`)
  bool l2_normalize_qk = false;       // the kernel L2-normalises q and k itself (fla's use_qk_l2norm_in_kernel)
  // Cotangents: gradients are judged when d_o is given (d_ht optional, absent = 0).
  std::optional<HostTensor> d_o, d_ht;

  Index batch() const;       // B (1 for varlen)
  Index sequences() const;   // N: B, or len(cu_seqlens) − 1
  Index heads() const;
  Index key_dim() const;
  Index value_dim() const;
  Index total_length() const;  // L (bhld) or T (blhd)
  // Expected shapes in this case's layout.
  std::vector<Index> token_shape(Index dim) const;  // q-like: [B, H, L, dim] or [B, T, H, dim]
  std::vector<Index> gate_shape() const;            // beta/g: [B, H, L] or [B, T, H]
  std::vector<Index> state_shape() const;           // [N, H, DV, DK] or [N, H, DK, DV]
  // Every shape, dtype and cu_seqlens rule; throws std::invalid_argument naming the tensor.
  void validate() const;
};

struct KernelResult {
  std::optional<HostTensor> o, ht;                      // forward
  std::optional<HostTensor> dq, dk, dv, dbeta, dg, dh0;  // backward (for the case's d_o, d_ht)
};

// The case in one line: op, layout, q and v shapes, scale, which optional tensors it has, cu_seqlens.
std::string describe(const KernelCase& c);

// Checks that every present tensor has the shape the case implies and finite-ness is reported
// by the judge, not here; throws std::invalid_argument naming the tensor.
void validate_result(const KernelCase& c, const KernelResult& r);

}  // namespace deltaproof::verify
