// deltaproof._core: linear attention's forms (reference/linear_attention.hpp), one head at a time.
#include "python/src/convert.hpp"
#include "reference/linear_attention.hpp"

namespace deltaproof::python {

namespace la = ref::linear_attention;

static la::Form form_of(const std::string& s) {
  if (s == "parallel") return la::Form::parallel;
  if (s == "recurrent") return la::Form::recurrent;
  if (s == "chunkwise") return la::Form::chunkwise;
  throw std::invalid_argument("form: expected parallel, recurrent or chunkwise (got '" + s + "')");
}

template <class S>
static la::Inputs<S> inputs(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& h0) {
  return {to_matrix<S>(q, "q"), to_matrix<S>(k, "k"), to_matrix<S>(v, "v"), to_optional_matrix<S>(h0, "h0")};
}

void bind_linear_attention(py::module_& m) {
  m.def(
      "la_forward",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object h0,
         Index chunk_size) {
        const la::Form f = form_of(form);
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const la::Inputs<S> in = inputs<S>(q, k, v, h0);
          py::dict out;
          if (f == la::Form::chunkwise) {
            const auto r = la::chunkwise(in, chunk_size);
            out["o"] = from_matrix<S>(r.output);
            out["ht"] = from_matrix<S>(r.final_state);
            out["boundary_states"] = from_matrices<S>(r.boundary_states);
          } else {
            const auto r = la::forward(f, in, chunk_size);
            out["o"] = from_matrix<S>(r.output);
            out["ht"] = from_matrix<S>(r.final_state);
          }
          return out;
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("h0"), py::arg("chunk_size"));

  m.def(
      "la_backward",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object h0,
         py::object d_o, py::object dht, Index chunk_size) {
        const la::Form f = form_of(form);
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const la::Inputs<S> in = inputs<S>(q, k, v, h0);
          const la::Cotangents<S> cot{to_matrix<S>(d_o, "do"), to_optional_matrix<S>(dht, "dht")};
          const auto g = la::backward(f, in, cot, chunk_size);
          py::dict out;
          out["dq"] = from_matrix<S>(g.dq);
          out["dk"] = from_matrix<S>(g.dk);
          out["dv"] = from_matrix<S>(g.dv);
          out["dh0"] = from_matrix<S>(g.d_initial_state);
          return out;
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("h0"), py::arg("do"),
      py::arg("dht"), py::arg("chunk_size"));
}

}  // namespace deltaproof::python
