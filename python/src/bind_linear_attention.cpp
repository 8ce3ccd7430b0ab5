// deltaproof._core: linear attention's forms (reference/linear_attention.hpp), one head at a time.
#include "python/src/convert.hpp"
#include "reference/linear_attention.hpp"

#include <chrono>
#ifdef __GLIBC__
#include <malloc.h>
#endif

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

  // Wall-clock seconds of each of `repeats` evaluations of one forward form in double, timed here in C++
  // (no conversion to or from numpy inside the timed region). Freed memory stays with the process (as in
  // verify::judge): otherwise every large temporary is a fresh mapping and page faults, not arithmetic,
  // dominate the time; the first run after a change of shape still pays them (callers warm up).
  m.def(
      "la_time_forward",
      [](const std::string& form, py::object q, py::object k, py::object v, py::object h0, Index chunk_size,
         int repeats) {
        if (repeats < 1) throw std::invalid_argument("repeats: must be >= 1 (got " + std::to_string(repeats) + ")");
        const la::Form f = form_of(form);
        const la::Inputs<double> in = inputs<double>(q, k, v, h0);
#ifdef __GLIBC__
        static const bool keeps_freed_memory = mallopt(M_MMAP_THRESHOLD, 256 << 20) && mallopt(M_TRIM_THRESHOLD, 512 << 20);
        (void)keeps_freed_memory;
#endif
        std::vector<double> seconds;
        volatile double sink = 0;  // keeps every evaluation observable
        for (int r = 0; r < repeats; ++r) {
          const auto start = std::chrono::steady_clock::now();
          const auto out = la::forward(f, in, chunk_size);
          sink = sink + out.final_state(0, 0);
          seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        return seconds;
      },
      py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("h0"), py::arg("chunk_size"),
      py::arg("repeats"));

  // ∇L·u for L = <dO, O> + <dS_L, S_L> along u = (u_q, u_k, u_v[, u_S0]), on exact inputs, three ways:
  // "dual" (dual numbers through the form, exact), "backward" (<the form's backward path, u>, exact) and
  // "central_difference" ((L(x + h u) − L(x − h u)) / 2h in High). Every result is returned as an
  // exact rational — the High one converted without loss — so that its error can be taken over ℚ.
  m.def(
      "la_directional_derivative",
      [](const std::string& method, const std::string& form, py::object q, py::object k, py::object v, py::object h0,
         py::object d_o, py::object dht, py::list direction, Index chunk_size, const std::string& step) {
        const la::Form f = form_of(form);
        const la::Inputs<Exact> in = inputs<Exact>(q, k, v, h0);
        const la::Cotangents<Exact> cot{to_matrix<Exact>(d_o, "do"), to_optional_matrix<Exact>(dht, "dht")};
        const ref::Params<Exact> x = la::params_of(in);
        if (direction.size() != x.size())
          throw std::invalid_argument("direction: expected one array per input (q, k, v, and h0 when given), got " +
                                      std::to_string(direction.size()));
        ref::Params<Exact> u;
        for (size_t i = 0; i < x.size(); ++i) {
          u.push_back({x[i].name, to_matrix<Exact>(direction[i], "direction")});
          if (u[i].value.rows() != x[i].value.rows() || u[i].value.cols() != x[i].value.cols())
            throw std::invalid_argument("direction: entry " + std::to_string(i) + " must have the shape of " + x[i].name);
        }
        Exact value;
        if (method == "dual") {
          value = ref::exact_directional_derivative(la::loss_of(f, chunk_size, cot), x, u);
        } else if (method == "backward") {
          value = ref::inner(la::params_of(la::backward(f, in, cot, chunk_size), in.initial_state.has_value()), u);
        } else if (method == "central_difference") {
          const High h = High(Exact(step));
          if (!(h > 0)) throw std::invalid_argument("step: must be positive (got " + step + ")");
          value = Exact(ref::central_difference(la::loss_of(f, chunk_size, cot), ref::params_cast<High>(x),
                                                ref::params_cast<High>(u), h));
        } else {
          throw std::invalid_argument("method: expected dual, backward or central_difference (got '" + method + "')");
        }
        return from_values<Exact>({}, &value);
      },
      py::arg("method"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("h0"), py::arg("do"),
      py::arg("dht"), py::arg("direction"), py::arg("chunk_size"), py::arg("step"));
}

}  // namespace deltaproof::python
