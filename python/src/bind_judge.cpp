// deltaproof._core: verify::judge and verify::oracle on numpy arrays. Each tensor comes from Python
// as (float64 array holding the exact values the kernel saw, dtype name it was stored in).
#include "python/src/convert.hpp"
#include "verify/host_memory.hpp"
#include "verify/judge.hpp"

#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include <utility>

namespace deltaproof::python {

namespace vf = deltaproof::verify;

static vf::HostTensor host_tensor(const py::handle& entry, const std::string& name) {
  const py::tuple t = py::reinterpret_borrow<py::tuple>(entry);
  if (t.size() != 2) throw std::invalid_argument(name + ": expected (array, dtype)");
  auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(t[0]);
  if (!a) throw std::invalid_argument(name + ": expected a numeric array");
  vf::HostTensor h;
  h.shape.assign(a.shape(), a.shape() + a.ndim());
  vf::reserve_in_huge_pages(h.values, size_t(a.size()));
  h.values.assign(a.data(), a.data() + a.size());
  h.dtype = vf::parse_dtype(t[1].cast<std::string>());
  return h;
}

static std::optional<vf::HostTensor> optional_tensor(const py::dict& d, const char* name) {
  if (!d.contains(name) || d[name].is_none()) return std::nullopt;
  return host_tensor(d[name], name);
}

static vf::HostTensor required_tensor(const py::dict& d, const char* name) {
  auto t = optional_tensor(d, name);
  if (!t) throw std::invalid_argument(std::string(name) + ": missing from the inputs");
  return std::move(*t);
}

static vf::KernelCase kernel_case(const std::string& op, const std::string& layout, const py::dict& inputs, double scale,
                                  const std::vector<vf::Index>& cu_seqlens, bool qk_l2norm) {
  static const char* known[] = {"q", "k", "v", "beta", "g", "h0", "do", "dht"};
  for (const auto& item : inputs) {
    const std::string key = item.first.cast<std::string>();
    if (std::find_if(std::begin(known), std::end(known), [&](const char* n) { return key == n; }) == std::end(known))
      throw std::invalid_argument(key + ": not an input name (q, k, v, beta, g, h0, do, dht)");
  }
  vf::KernelCase c;
  c.op = vf::parse_op(op);
  c.layout = vf::parse_layout(layout);
  c.q = required_tensor(inputs, "q");
  c.k = required_tensor(inputs, "k");
  c.v = required_tensor(inputs, "v");
  c.beta = optional_tensor(inputs, "beta");
  c.g = optional_tensor(inputs, "g");
  c.h0 = optional_tensor(inputs, "h0");
  c.d_o = optional_tensor(inputs, "do");
  c.d_ht = optional_tensor(inputs, "dht");
  c.cu_seqlens = cu_seqlens;
  c.scale = scale;
  c.l2_normalize_qk = qk_l2norm;
  c.validate();
  return c;
}

static py::object array_of(const std::optional<vf::HostTensor>& t) {
  if (!t) return py::none();
  return from_values<double>(t->shape, t->values.data());
}

void bind_judge(py::module_& m) {
  m.def(
      "judge",
      [](const std::string& op, const std::string& layout, const py::dict& inputs, const py::dict& outputs, double scale,
         const std::vector<vf::Index>& cu_seqlens, bool qk_l2norm, bool tf32, unsigned threads,
         const std::optional<std::string>& state_dtype, long chunk_size) {
        const vf::KernelCase c = kernel_case(op, layout, inputs, scale, cu_seqlens, qk_l2norm);
        static const char* known[] = {"o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0"};
        for (const auto& item : outputs) {
          const std::string key = item.first.cast<std::string>();
          if (std::find_if(std::begin(known), std::end(known), [&](const char* n) { return key == n; }) == std::end(known))
            throw std::invalid_argument(key + ": not an output name (o, ht, dq, dk, dv, dbeta, dg, dh0)");
        }
        vf::KernelResult r;
        r.o = optional_tensor(outputs, "o");
        r.ht = optional_tensor(outputs, "ht");
        r.dq = optional_tensor(outputs, "dq");
        r.dk = optional_tensor(outputs, "dk");
        r.dv = optional_tensor(outputs, "dv");
        r.dbeta = optional_tensor(outputs, "dbeta");
        r.dg = optional_tensor(outputs, "dg");
        r.dh0 = optional_tensor(outputs, "dh0");
        vf::validate_result(c, r);
        vf::Verdict v;
        {
          py::gil_scoped_release release;
          vf::JudgeOptions options;
          options.tf32_operands = tf32, options.threads = threads, options.chunk_size = chunk_size;
          if (state_dtype) options.state_dtype = vf::parse_dtype(*state_dtype);
          v = vf::judge(c, r, options);
        }
        return py::make_tuple(vf::to_json(v).dump(), vf::format_table(v));
      },
      py::arg("op"), py::arg("layout"), py::arg("inputs"), py::arg("outputs"), py::arg("scale"), py::arg("cu_seqlens"),
      py::arg("qk_l2norm"), py::arg("tf32"), py::arg("threads"), py::arg("state_dtype") = py::none(),
      py::arg("chunk_size") = 0);

  m.def(
      "oracle",
      [](const std::string& op, const std::string& layout, const py::dict& inputs, double scale,
         const std::vector<vf::Index>& cu_seqlens, bool qk_l2norm, unsigned threads) {
        const vf::KernelCase c = kernel_case(op, layout, inputs, scale, cu_seqlens, qk_l2norm);
        vf::KernelResult r;
        {
          py::gil_scoped_release release;
          r = vf::oracle(c, threads);
        }
        py::dict out;
        const std::pair<const char*, const std::optional<vf::HostTensor>*> fields[] = {
            {"o", &r.o},   {"ht", &r.ht},       {"dq", &r.dq}, {"dk", &r.dk},
            {"dv", &r.dv}, {"dbeta", &r.dbeta}, {"dg", &r.dg}, {"dh0", &r.dh0}};
        for (const auto& [name, t] : fields)
          if (*t) out[name] = array_of(*t);
        return out;
      },
      py::arg("op"), py::arg("layout"), py::arg("inputs"), py::arg("scale"), py::arg("cu_seqlens"), py::arg("qk_l2norm"),
      py::arg("threads"));
}

}  // namespace deltaproof::python
