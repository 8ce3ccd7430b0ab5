// libdeltaproof_judge.so: verify::judge behind a plain C interface, for Pythons the pybind11 module
// was not built for (deltaproof/_backend.py loads it with ctypes). No Python headers inside.
//
//   request: JSON {"op", "layout", "scale", "cu_seqlens": [..], "qk_l2norm", "tf32", "threads",
//                  optional "state_dtype" ("bf16", "fp16", "fp32", "fp64"), optional "chunk_size",
//                  "inputs": {name: {"shape": [..], "dtype": "bf16", "index": i}}, "outputs": {...}}
//   arrays[i]: the float64 row-major values of the tensor with that index.
//   returns: malloc'd JSON {"verdict": {...}, "table": "..."} or {"error": "..."}; free with deltaproof_free.
#include "verify/judge.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

namespace vf = deltaproof::verify;
using nlohmann::json;

std::optional<vf::HostTensor> tensor(const json& group, const char* name, const double* const* arrays, long n) {
  if (!group.contains(name)) return std::nullopt;
  const json& t = group.at(name);
  vf::HostTensor h;
  h.shape = t.at("shape").get<std::vector<vf::Index>>();
  h.dtype = vf::parse_dtype(t.at("dtype").get<std::string>());
  const long index = t.at("index").get<long>();
  if (index < 0 || index >= n) throw std::invalid_argument(std::string(name) + ": array index out of range");
  h.values.assign(arrays[index], arrays[index] + h.size());
  return h;
}

char* copy_out(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace

extern "C" {

char* deltaproof_judge(const char* request, const double* const* arrays, long n_arrays) {
  try {
    const json r = json::parse(request);
    const json& in = r.at("inputs");
    const json& out = r.at("outputs");
    for (const auto& [key, _] : in.items())
      if (key != "q" && key != "k" && key != "v" && key != "beta" && key != "g" && key != "h0" && key != "do" &&
          key != "dht")
        throw std::invalid_argument(key + ": not an input name (q, k, v, beta, g, h0, do, dht)");
    vf::KernelCase c;
    c.op = vf::parse_op(r.at("op").get<std::string>());
    c.layout = vf::parse_layout(r.at("layout").get<std::string>());
    for (const char* name : {"q", "k", "v"})
      if (!in.contains(name)) throw std::invalid_argument(std::string(name) + ": missing from the inputs");
    c.q = *tensor(in, "q", arrays, n_arrays);
    c.k = *tensor(in, "k", arrays, n_arrays);
    c.v = *tensor(in, "v", arrays, n_arrays);
    c.beta = tensor(in, "beta", arrays, n_arrays);
    c.g = tensor(in, "g", arrays, n_arrays);
    c.h0 = tensor(in, "h0", arrays, n_arrays);
    c.d_o = tensor(in, "do", arrays, n_arrays);
    c.d_ht = tensor(in, "dht", arrays, n_arrays);
    c.cu_seqlens = r.at("cu_seqlens").get<std::vector<vf::Index>>();
    c.scale = r.at("scale").get<double>();
    c.l2_normalize_qk = r.at("qk_l2norm").get<bool>();
    c.validate();
    vf::KernelResult k;
    for (const auto& [key, _] : out.items())
      if (key != "o" && key != "ht" && key != "dq" && key != "dk" && key != "dv" && key != "dbeta" && key != "dg" &&
          key != "dh0")
        throw std::invalid_argument(key + ": not an output name (o, ht, dq, dk, dv, dbeta, dg, dh0)");
    k.o = tensor(out, "o", arrays, n_arrays);
    k.ht = tensor(out, "ht", arrays, n_arrays);
    k.dq = tensor(out, "dq", arrays, n_arrays);
    k.dk = tensor(out, "dk", arrays, n_arrays);
    k.dv = tensor(out, "dv", arrays, n_arrays);
    k.dbeta = tensor(out, "dbeta", arrays, n_arrays);
    k.dg = tensor(out, "dg", arrays, n_arrays);
    k.dh0 = tensor(out, "dh0", arrays, n_arrays);
    vf::validate_result(c, k);
    vf::JudgeOptions options;
    options.tf32_operands = r.at("tf32").get<bool>();
    options.threads = r.at("threads").get<unsigned>();
    if (r.contains("state_dtype") && !r.at("state_dtype").is_null())
      options.state_dtype = vf::parse_dtype(r.at("state_dtype").get<std::string>());
    if (r.contains("chunk_size") && !r.at("chunk_size").is_null()) options.chunk_size = r.at("chunk_size").get<long>();
    const vf::Verdict v = vf::judge(c, k, options);
    return copy_out(json{{"verdict", vf::to_json(v)}, {"table", vf::format_table(v)}}.dump());
  } catch (const std::exception& e) {
    return copy_out(json{{"error", e.what()}}.dump());
  }
}

void deltaproof_free(char* p) { std::free(p); }

}  // extern "C"
