// deltaproof._core: DeltaNet's forms (reference/delta_rule.hpp), one head at a time.
#include "python/src/convert.hpp"
#include "reference/delta_rule.hpp"

namespace deltaproof::python {

namespace dr = ref::delta_rule;

dr::TriangularSolve solve_of(const std::string& s) {
  if (s == "forward_substitution" || s == "forward-substitution") return dr::TriangularSolve::forward_substitution;
  if (s == "blocked") return dr::TriangularSolve::blocked;
  if (s == "recursive") return dr::TriangularSolve::recursive;
  throw std::invalid_argument("solve: expected forward_substitution, blocked or recursive (got '" + s + "')");
}

template <class S>
static dr::Inputs<S> inputs(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& beta,
                            const py::handle& h0) {
  return {to_matrix<S>(q, "q"), to_matrix<S>(k, "k"), to_matrix<S>(v, "v"), to_vector<S>(beta, "beta"),
          to_optional_matrix<S>(h0, "h0")};
}

template <class S>
static py::dict chunk_dict(const dr::ChunkIntermediates<S>& x) {
  py::dict d;
  d["A"] = from_matrix<S>(x.a);
  d["T"] = from_matrix<S>(x.t);
  d["W"] = from_matrix<S>(x.w);
  d["U"] = from_matrix<S>(x.u);
  d["v_new"] = from_matrix<S>(x.v_new);
  return d;
}

void bind_delta_rule(py::module_& m) {
  m.def(
      "delta_forward",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object beta,
         py::object h0, Index chunk_size, const std::string& solve, Index base_block) {
        const dr::ChunkOptions options{solve_of(solve), base_block};
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const dr::Inputs<S> in = inputs<S>(q, k, v, beta, h0);
          py::dict out;
          if (form == "chunkwise" || form == "parallel") {
            const auto r = form == "chunkwise" ? dr::chunkwise(in, chunk_size, options) : dr::parallel_wy(in, options);
            out["o"] = from_matrix<S>(r.output);
            out["ht"] = from_matrix<S>(r.final_state);
            out["boundary_states"] = from_matrices<S>(r.boundary_states);
            py::list chunks;
            for (const auto& x : r.chunks) chunks.append(chunk_dict<S>(x));
            out["chunks"] = chunks;
            return out;
          }
          dr::Forward<S> r;
          if (form == "recurrent") r = dr::token_recurrence(in);
          else if (form == "recurrent_read_correct_write") r = dr::token_recurrence_read_correct_write(in);
          else if (form == "affine_scan") r = dr::affine_scan(in);
          else throw std::invalid_argument("form: expected recurrent, recurrent_read_correct_write, affine_scan, chunkwise or parallel (got '" + form + "')");
          out["o"] = from_matrix<S>(r.output);
          out["ht"] = from_matrix<S>(r.final_state);
          return out;
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("h0"),
      py::arg("chunk_size"), py::arg("solve"), py::arg("base_block"));

  m.def(
      "delta_backward",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object beta,
         py::object h0, py::object d_o, py::object dht, Index chunk_size, const std::string& solve, Index base_block) {
        const dr::ChunkOptions options{solve_of(solve), base_block};
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const dr::Inputs<S> in = inputs<S>(q, k, v, beta, h0);
          const dr::Cotangents<S> cot{to_matrix<S>(d_o, "do"), to_optional_matrix<S>(dht, "dht")};
          dr::Gradients<S> g;
          if (form == "recurrent") g = dr::token_recurrence_backward(in, cot);
          else if (form == "chunkwise") g = dr::chunkwise_backward(in, cot, chunk_size, options);
          else if (form == "parallel") g = dr::chunkwise_backward(in, cot, std::max<Index>(1, in.length()), options);
          else throw std::invalid_argument("form: expected recurrent, chunkwise or parallel (got '" + form + "')");
          py::dict out;
          out["dq"] = from_matrix<S>(g.dq);
          out["dk"] = from_matrix<S>(g.dk);
          out["dv"] = from_matrix<S>(g.dv);
          out["dbeta"] = from_vector<S>(g.d_beta);
          out["dh0"] = from_matrix<S>(g.d_initial_state);
          return out;
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("h0"),
      py::arg("do"), py::arg("dht"), py::arg("chunk_size"), py::arg("solve"), py::arg("base_block"));

  // One chunk's WY factors: by Equation 7's recurrence, or through A and T = A⁻¹ by a named solve.
  m.def(
      "delta_wy",
      [](const std::string& scalar, const std::string& method, py::object k, py::object v, py::object beta,
         const std::string& solve, Index base_block) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const Matrix<S> kk = to_matrix<S>(k, "k"), vv = to_matrix<S>(v, "v");
          const Vector<S> b = to_vector<S>(beta, "beta");
          py::dict out;
          const Matrix<S> a = dr::wy_system<S>(kk, b);
          out["A"] = from_matrix<S>(a);
          if (method == "recurrence") {
            const auto f = dr::wy_recurrence<S>(kk, vv, b);
            out["W"] = from_matrix<S>(f.w);
            out["U"] = from_matrix<S>(f.u);
          } else if (method == "solve") {
            const Matrix<S> t = dr::invert_unit_lower<S>(a, solve_of(solve), base_block);
            const auto f = dr::wy_factors<S>(t, kk, vv, b);
            out["T"] = from_matrix<S>(t);
            out["W"] = from_matrix<S>(f.w);
            out["U"] = from_matrix<S>(f.u);
          } else {
            throw std::invalid_argument("method: expected recurrence or solve (got '" + method + "')");
          }
          return out;
        });
      },
      py::arg("scalar"), py::arg("method"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("solve"),
      py::arg("base_block"));

  m.def(
      "invert_unit_lower",
      [](const std::string& scalar, py::object a, const std::string& solve, Index base_block) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          return from_matrix<S>(dr::invert_unit_lower<S>(to_matrix<S>(a, "a"), solve_of(solve), base_block));
        });
      },
      py::arg("scalar"), py::arg("a"), py::arg("solve"), py::arg("base_block"));
}

}  // namespace deltaproof::python
