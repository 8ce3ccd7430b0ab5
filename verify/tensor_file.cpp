// The tensor files' entry points (by extension), round_to, and the loaders of `deltaproof check`,
// which turn an inputs file and an outputs file into a KernelCase and a KernelResult. The containers
// and their byte codecs: tensor_file_internal.hpp.
#include "verify/tensor_file.hpp"

#include "verify/tensor_file_internal.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

namespace deltaproof::verify {

using tensor_files::ends_with;
using tensor_files::fail;
using tensor_files::shape_text;

namespace {

// ---------------------------------------------------------------------------------------------
// Loaders.

std::string names_of(const TensorFile& f) {
  std::string s;
  for (const auto& [name, t] : f.floating) s += (s.empty() ? "" : ", ") + name;
  for (const auto& [name, t] : f.integer) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "nothing" : s;
}

void require_known_names(const std::string& path, const TensorFile& f, const std::set<std::string>& known,
                         const std::string& role) {
  std::string list;
  for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
  for (const auto& [name, t] : f.floating)
    if (!known.count(name)) fail(path, name, "not " + role + " (expected " + list + ")");
  for (const auto& [name, t] : f.integer)
    if (!known.count(name)) fail(path, name, "not " + role + " (expected " + list + ")");
}

std::string index_text(const std::vector<Index>& shape, Index flat) {
  std::vector<Index> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::string s = "(";
  for (size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s + ")";
}

void require_finite(const std::string& path, const std::string& name, const HostTensor& t) {
  for (size_t i = 0; i < t.values.size(); ++i)
    if (!std::isfinite(t.values[i]))
      fail(path, name, std::string("entry ") + index_text(t.shape, Index(i)) + " is " + (std::isnan(t.values[i]) ? "NaN" : "Inf"));
}

// A floating tensor of the file: nullopt when absent, an error when stored as integers.
std::optional<HostTensor> take_floating(const std::string& path, const TensorFile& f, const std::string& name) {
  if (auto it = f.integer.find(name); it != f.integer.end())
    fail(path, name, std::string("stored as ") + (it->second.wide ? "int64" : "int32") + ", expected bf16, fp16, fp32 or fp64");
  const auto it = f.floating.find(name);
  if (it == f.floating.end()) return std::nullopt;
  require_finite(path, name, it->second);
  return it->second;
}

HostTensor require_floating(const std::string& path, const TensorFile& f, const std::string& name) {
  auto t = take_floating(path, f, name);
  if (!t) fail(path, name, "missing (the file holds " + names_of(f) + ")");
  return *t;
}

template <class Check>
void prefixed(const std::string& path, Check&& check) {
  try {
    check();
  } catch (const std::invalid_argument& e) {
    fail(path, e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

double round_to(DType dtype, double x) {
  if (!std::isfinite(x) || x == 0 || dtype == DType::f64) return x;
  // Precision p (significand bits), least normal exponent, largest finite value.
  int precision = 24, min_exponent = -126;
  double largest = double(std::numeric_limits<float>::max());
  if (dtype == DType::bf16) precision = 8, largest = 0x1.FEp127;
  if (dtype == DType::f16) precision = 11, min_exponent = -14, largest = 65504.0;
  const int exponent = std::max(std::ilogb(x), min_exponent);  // subnormals share the least exponent's spacing
  const int shift = precision - 1 - exponent;
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(x, shift)), -shift);  // ties to even (default mode)
  return std::fabs(rounded) > largest ? std::copysign(HUGE_VAL, x) : rounded;
}

TensorFile read_tensor_file(const std::string& path) {
  if (ends_with(path, ".safetensors")) return tensor_files::read_safetensors(path);
  if (ends_with(path, ".npz")) return tensor_files::read_npz(path);
  fail(path, "unknown file type (expected .safetensors or .npz)");
}

void write_tensor_file(const std::string& path, const TensorFile& contents) {
  if (ends_with(path, ".safetensors")) return tensor_files::write_safetensors(path, contents);
  if (ends_with(path, ".npz")) return tensor_files::write_npz(path, contents);
  fail(path, "unknown file type (expected .safetensors or .npz)");
}

KernelCase read_kernel_case(const std::string& path, const CaseFlags& flags) {
  const TensorFile f = read_tensor_file(path);
  require_known_names(path, f, {"q", "k", "v", "beta", "g", "h0", "do", "dht", "cu_seqlens"}, "an input of a kernel case");
  KernelCase c;
  c.op = flags.op;
  c.layout = flags.layout;
  c.scale = flags.scale;
  c.l2_normalize_qk = flags.l2_normalize_qk;
  c.q = require_floating(path, f, "q");
  c.k = require_floating(path, f, "k");
  c.v = require_floating(path, f, "v");
  c.beta = take_floating(path, f, "beta");
  c.g = take_floating(path, f, "g");
  c.h0 = take_floating(path, f, "h0");
  c.d_o = take_floating(path, f, "do");
  c.d_ht = take_floating(path, f, "dht");
  if (f.floating.count("cu_seqlens"))
    fail(path, "cu_seqlens", "stored as " + name_of(f.floating.at("cu_seqlens").dtype) + ", expected int32 or int64");
  const auto cu = f.integer.find("cu_seqlens");
  if (flags.varlen) {
    if (cu == f.integer.end()) fail(path, "cu_seqlens", "missing (varlen inputs need it; the file holds " + names_of(f) + ")");
    if (cu->second.shape.size() != 1) fail(path, "cu_seqlens", "shape " + shape_text(cu->second.shape) + ", expected one dimension");
    if (cu->second.values.size() < 2) fail(path, "cu_seqlens", "needs at least two entries (0 and T)");
    c.cu_seqlens.assign(cu->second.values.begin(), cu->second.values.end());
  } else if (cu != f.integer.end()) {
    fail(path, "cu_seqlens", "present, but the case is not varlen (pass --cu-seqlens)");
  }
  prefixed(path, [&] { c.validate(); });
  return c;
}

KernelResult read_kernel_result(const KernelCase& c, const std::string& outputs_path, const std::string& gradients_path) {
  KernelResult forward;
  {
    const TensorFile f = read_tensor_file(outputs_path);
    require_known_names(outputs_path, f, {"o", "ht"}, "an output of a kernel");
    forward.o = require_floating(outputs_path, f, "o");
    forward.ht = take_floating(outputs_path, f, "ht");
    prefixed(outputs_path, [&] { validate_result(c, forward); });
  }
  if (gradients_path.empty()) return forward;
  KernelResult backward;
  const TensorFile f = read_tensor_file(gradients_path);
  require_known_names(gradients_path, f, {"dq", "dk", "dv", "dbeta", "dg", "dh0"}, "a gradient");
  if (f.floating.empty()) fail(gradients_path, "holds no gradient (expected any of dq, dk, dv, dbeta, dg, dh0)");
  backward.dq = take_floating(gradients_path, f, "dq");
  backward.dk = take_floating(gradients_path, f, "dk");
  backward.dv = take_floating(gradients_path, f, "dv");
  backward.dbeta = take_floating(gradients_path, f, "dbeta");
  backward.dg = take_floating(gradients_path, f, "dg");
  backward.dh0 = take_floating(gradients_path, f, "dh0");
  prefixed(gradients_path, [&] { validate_result(c, backward); });
  backward.o = std::move(forward.o);
  backward.ht = std::move(forward.ht);
  return backward;
}

void write_kernel_case(const std::string& path, const KernelCase& c) {
  TensorFile f;
  f.floating["q"] = c.q;
  f.floating["k"] = c.k;
  f.floating["v"] = c.v;
  if (c.beta) f.floating["beta"] = *c.beta;
  if (c.g) f.floating["g"] = *c.g;
  if (c.h0) f.floating["h0"] = *c.h0;
  if (c.d_o) f.floating["do"] = *c.d_o;
  if (c.d_ht) f.floating["dht"] = *c.d_ht;
  if (!c.cu_seqlens.empty())
    f.integer["cu_seqlens"] = IntegerTensor{{Index(c.cu_seqlens.size())}, {c.cu_seqlens.begin(), c.cu_seqlens.end()}, true};
  write_tensor_file(path, f);
}

void write_kernel_outputs(const std::string& path, const KernelResult& r) {
  TensorFile f;
  if (r.o) f.floating["o"] = *r.o;
  if (r.ht) f.floating["ht"] = *r.ht;
  write_tensor_file(path, f);
}

void write_kernel_gradients(const std::string& path, const KernelResult& r) {
  TensorFile f;
  const std::pair<const char*, const std::optional<HostTensor>*> grads[] = {
      {"dq", &r.dq}, {"dk", &r.dk}, {"dv", &r.dv}, {"dbeta", &r.dbeta}, {"dg", &r.dg}, {"dh0", &r.dh0}};
  for (const auto& [name, t] : grads)
    if (*t) f.floating[name] = **t;
  write_tensor_file(path, f);
}

}  // namespace deltaproof::verify
