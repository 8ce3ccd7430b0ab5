// deltaproof._core: DeltaNet's forms (reference/delta_rule.hpp), one head at a time.
#include "python/src/convert.hpp"
#include "reference/delta_conditioning.hpp"
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

  // The derivation's GPU schedule with its levels: the base×base diagonal block inverses and every merge.
  m.def(
      "invert_unit_lower_blocked",
      [](const std::string& scalar, py::object a, Index base_block) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const auto r = dr::invert_unit_lower_blocked<S>(to_matrix<S>(a, "a"), base_block);
          py::dict out;
          out["T"] = from_matrix<S>(r.t);
          out["diagonal_block_inverses"] = from_matrices<S>(r.diagonal_block_inverses);
          py::list levels;
          for (const auto& level : r.merged_levels) levels.append(from_matrices<S>(level));
          out["merged_levels"] = levels;
          return out;
        });
      },
      py::arg("scalar"), py::arg("a"), py::arg("base_block"));

  // One chunk's prefix maps S ↦ S P_r + H_r three ways: dense products in token order, the tree scan,
  // and rebuilt from Equation 7's WY factors.
  m.def(
      "delta_prefix_products",
      [](const std::string& scalar, const std::string& method, py::object k, py::object v, py::object beta) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const Matrix<S> kk = to_matrix<S>(k, "k"), vv = to_matrix<S>(v, "v");
          const Vector<S> b = to_vector<S>(beta, "beta");
          std::vector<dr::AffineMap<S>> prefix;
          if (method == "sequential") prefix = dr::sequential_prefix_scan(dr::affine_maps<S>(kk, vv, b));
          else if (method == "tree") prefix = dr::tree_prefix_scan(dr::affine_maps<S>(kk, vv, b));
          else if (method == "wy") prefix = dr::wy_prefix_products<S>(dr::wy_recurrence<S>(kk, vv, b), kk);
          else throw std::invalid_argument("method: expected sequential, tree or wy (got '" + method + "')");
          py::list out;
          for (const auto& p : prefix) {
            py::dict d;
            d["P"] = from_matrix<S>(p.transition);
            d["H"] = from_matrix<S>(p.write);
            out.append(d);
          }
          return py::object(out);
        });
      },
      py::arg("scalar"), py::arg("method"), py::arg("k"), py::arg("v"), py::arg("beta"));

  // reference/delta_conditioning.hpp on exact inputs: per chunk size, max|T|, max|W|, max|U| (exact) and
  // the error of the chunkwise form and of the token recurrence evaluated in float or double.
  m.def(
      "delta_conditioning",
      [](const std::string& float_type, py::object q, py::object k, py::object v, py::object beta, py::object h0,
         std::vector<Index> chunk_sizes) {
        const dr::Inputs<Exact> in = inputs<Exact>(q, k, v, beta, h0);
        std::vector<ref::ConditioningRow> rows;
        if (float_type == "float") rows = ref::conditioning<float>(in, chunk_sizes);
        else if (float_type == "double") rows = ref::conditioning<double>(in, chunk_sizes);
        else throw std::invalid_argument("float_type: expected float or double (got '" + float_type + "')");
        py::list out;
        for (const auto& r : rows) {
          py::dict d;
          d["chunk_size"] = r.chunk_size;
          d["max_abs_t"] = r.max_abs_t;
          d["max_abs_w"] = r.max_abs_w;
          d["max_abs_u"] = r.max_abs_u;
          d["chunkwise_relative_l2"] = r.chunkwise_relative_l2;
          d["chunkwise_max_abs"] = r.chunkwise_max_abs;
          d["chunkwise_worst_row"] = r.chunkwise_worst_row;
          d["recurrence_relative_l2"] = r.recurrence_relative_l2;
          d["recurrence_worst_row"] = r.recurrence_worst_row;
          d["chunkwise_finite"] = r.chunkwise_finite;
          d["recurrence_finite"] = r.recurrence_finite;
          d["max_abs_output"] = r.max_abs_output;
          out.append(d);
        }
        return out;
      },
      py::arg("float_type"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("h0"),
      py::arg("chunk_sizes"));
}

}  // namespace deltaproof::python
