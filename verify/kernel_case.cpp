#include "verify/kernel_case.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>

namespace deltaproof::verify {

std::string name_of(Op op) {
  switch (op) {
    case Op::linear: return "linear";
    case Op::delta: return "delta";
    default: return "gated-delta";
  }
}

std::string name_of(Layout layout) { return layout == Layout::bhld ? "bhld" : "blhd"; }

Op parse_op(const std::string& s) {
  if (s == "linear") return Op::linear;
  if (s == "delta") return Op::delta;
  if (s == "gated-delta" || s == "gated_delta") return Op::gated_delta;
  throw std::invalid_argument("--op: expected linear, delta or gated-delta (got '" + s + "')");
}

Layout parse_layout(const std::string& s) {
  if (s == "bhld") return Layout::bhld;
  if (s == "blhd") return Layout::blhd;
  throw std::invalid_argument("--layout: expected bhld or blhd (got '" + s + "')");
}

DType parse_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "fp32" || s == "f32" || s == "float32" || s == "float") return DType::f32;
  if (s == "fp64" || s == "f64" || s == "float64" || s == "double") return DType::f64;
  throw std::invalid_argument("dtype: expected bf16, fp16, fp32 or fp64 (got '" + s + "')");
}

std::string name_of(DType dtype) {
  switch (dtype) {
    case DType::f64: return "fp64";
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    default: return "fp16";
  }
}

double unit_roundoff(DType d) {
  switch (d) {
    case DType::bf16: return 0x1p-8;
    case DType::f16: return 0x1p-11;
    case DType::f32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

Index HostTensor::size() const {
  Index n = 1;
  for (Index d : shape) n *= d;
  return n;
}

static std::string shape_string_of(const std::vector<Index>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string HostTensor::shape_string() const { return shape_string_of(shape); }

static void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

Index KernelCase::batch() const { return q.shape.empty() ? 0 : q.shape[0]; }
Index KernelCase::sequences() const { return cu_seqlens.empty() ? batch() : Index(cu_seqlens.size()) - 1; }
Index KernelCase::heads() const { return q.shape.size() == 4 ? q.shape[layout == Layout::bhld ? 1 : 2] : 0; }
Index KernelCase::key_dim() const { return q.shape.size() == 4 ? q.shape[3] : 0; }
Index KernelCase::value_dim() const { return v.shape.size() == 4 ? v.shape[3] : 0; }
Index KernelCase::total_length() const { return q.shape.size() == 4 ? q.shape[layout == Layout::bhld ? 2 : 1] : 0; }

std::vector<Index> KernelCase::token_shape(Index dim) const {
  if (layout == Layout::bhld) return {batch(), heads(), total_length(), dim};
  return {batch(), total_length(), heads(), dim};
}

std::vector<Index> KernelCase::gate_shape() const {
  if (layout == Layout::bhld) return {batch(), heads(), total_length()};
  return {batch(), total_length(), heads()};
}

std::vector<Index> KernelCase::state_shape() const {
  if (layout == Layout::bhld) return {sequences(), heads(), value_dim(), key_dim()};
  return {sequences(), heads(), key_dim(), value_dim()};
}

// The element count of a shape, or nullopt for a negative extent or a product past 2⁶³ − 1 (a
// shape no tensor in memory can have: HostTensor::size() would overflow).
static std::optional<Index> checked_size(const std::vector<Index>& shape) {
  Index n = 1;
  for (Index d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

static void require_shape(const HostTensor& t, const std::vector<Index>& expected, const std::string& name) {
  require(t.shape == expected, name + ": shape " + t.shape_string() + ", expected " + shape_string_of(expected));
  const auto count = checked_size(t.shape);
  require(count.has_value(), name + ": shape " + t.shape_string() + " has a negative extent or too many elements");
  require(t.values.size() == size_t(*count), name + ": holds " + std::to_string(t.values.size()) +
                                                 " values for shape " + t.shape_string());
}

static void require_finite(const HostTensor& t, const std::string& name) {
  for (size_t i = 0; i < t.values.size(); ++i)  // the message is built only for a bad entry
    if (!std::isfinite(t.values[i])) require(false, name + ": entry " + std::to_string(i) + " is not finite");
}

void KernelCase::validate() const {
  require(q.shape.size() == 4, "q: expected 4 dimensions, got shape " + q.shape_string());
  require(v.shape.size() == 4, "v: expected 4 dimensions, got shape " + v.shape_string());
  require(key_dim() >= 1 && value_dim() >= 1 && heads() >= 1, "q, v: head count and head dims must be at least 1");
  require_shape(q, token_shape(key_dim()), "q");
  require_shape(k, token_shape(key_dim()), "k");
  require_shape(v, token_shape(value_dim()), "v");
  // With L = 0 the inputs hold nothing, yet the states [N, H, DV, DK] are still allocated and written.
  require(checked_size(state_shape()).has_value(), "q, v: the states' shape " + shape_string_of(state_shape()) +
                                                       " has more than 2^63 - 1 elements");
  require(std::isfinite(scale), "scale: must be finite");
  if (!cu_seqlens.empty()) {
    require(batch() == 1, "cu_seqlens: varlen inputs are packed with batch 1 (got B = " + std::to_string(batch()) + ")");
    require(cu_seqlens.front() == 0, "cu_seqlens: must start at 0");
    for (size_t i = 1; i < cu_seqlens.size(); ++i)
      require(cu_seqlens[i] >= cu_seqlens[i - 1], "cu_seqlens: not non-decreasing at position " + std::to_string(i));
    require(cu_seqlens.back() == total_length(), "cu_seqlens: must end at the packed length T = " +
                                                     std::to_string(total_length()) + " (ends at " +
                                                     std::to_string(cu_seqlens.back()) + ")");
    require(cu_seqlens.size() >= 2, "cu_seqlens: needs at least two entries");
  }
  for (auto* t : {&q, &k, &v}) require_finite(*t, t == &q ? "q" : t == &k ? "k" : "v");
  const bool needs_beta = op != Op::linear;
  require(beta.has_value() == needs_beta, needs_beta ? "beta: required for --op " + name_of(op)
                                                     : "beta: given, but --op linear takes none");
  require(g.has_value() == (op == Op::gated_delta), op == Op::gated_delta ? "g: required for --op gated-delta"
                                                                           : "g: given, but only --op gated-delta takes gates");
  if (beta) {
    require_shape(*beta, gate_shape(), "beta");
    require_finite(*beta, "beta");
  }
  if (g) {
    require_shape(*g, gate_shape(), "g");
    require_finite(*g, "g");
  }
  if (h0) {
    require_shape(*h0, state_shape(), "h0");
    require_finite(*h0, "h0");
  }
  if (d_o) {
    require_shape(*d_o, token_shape(value_dim()), "do");
    require_finite(*d_o, "do");
  }
  if (d_ht) {
    require(d_o.has_value(), "dht: given without do");
    require_shape(*d_ht, state_shape(), "dht");
    require_finite(*d_ht, "dht");
  }
}

void validate_result(const KernelCase& c, const KernelResult& r) {
  if (r.o) require_shape(*r.o, c.token_shape(c.value_dim()), "o");
  if (r.ht) require_shape(*r.ht, c.state_shape(), "ht");
  const bool grads = r.dq || r.dk || r.dv || r.dbeta || r.dg || r.dh0;
  require(!grads || c.d_o.has_value(), "gradients: given, but the inputs hold no cotangent do");
  if (r.dq) require_shape(*r.dq, c.token_shape(c.key_dim()), "dq");
  if (r.dk) require_shape(*r.dk, c.token_shape(c.key_dim()), "dk");
  if (r.dv) require_shape(*r.dv, c.token_shape(c.value_dim()), "dv");
  if (r.dbeta) {
    require(c.op != Op::linear, "dbeta: given, but --op linear has no beta");
    require_shape(*r.dbeta, c.gate_shape(), "dbeta");
  }
  if (r.dg) {
    require(c.op == Op::gated_delta, "dg: given, but only --op gated-delta has gates");
    require_shape(*r.dg, c.gate_shape(), "dg");
  }
  if (r.dh0) require_shape(*r.dh0, c.state_shape(), "dh0");
}

std::string describe(const KernelCase& c) {
  std::string s = "op " + name_of(c.op) + ", layout " + name_of(c.layout) + ", q " + c.q.shape_string() + ", v " +
                  c.v.shape_string() + ", scale " + std::to_string(c.scale) + (c.l2_normalize_qk ? ", qk-l2norm" : "");
  if (c.h0) s += ", h0";
  if (c.d_o) s += ", do";
  if (c.d_ht) s += ", dht";
  if (!c.cu_seqlens.empty()) {
    s += ", cu_seqlens [";
    for (size_t i = 0; i < c.cu_seqlens.size(); ++i) s += (i ? ", " : "") + std::to_string(c.cu_seqlens[i]);
    s += "]";
  }
  return s;
}

}  // namespace deltaproof::verify
