// deltaproof._core: Gated DeltaNet's forms (reference/gated_delta_rule.hpp), one head at a time:
// the α-form (exact over ℚ), the kernels' log-gate path (double, High) and the additive scalar gate.
#include "python/src/convert.hpp"
#include "reference/gated_delta_rule.hpp"

namespace deltaproof::python {

namespace gd = ref::gated_delta_rule;
ref::delta_rule::TriangularSolve solve_of(const std::string& s);  // bind_delta_rule.cpp

template <class S>
static gd::Inputs<S> inputs(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& beta,
                            const py::handle& alpha, const py::handle& h0) {
  return {to_matrix<S>(q, "q"),         to_matrix<S>(k, "k"),           to_matrix<S>(v, "v"),
          to_vector<S>(beta, "beta"), to_vector<S>(alpha, "alpha"), to_optional_matrix<S>(h0, "h0")};
}

template <class S>
static gd::LogGateInputs<S> log_gate_inputs(const py::handle& q, const py::handle& k, const py::handle& v,
                                            const py::handle& beta, const py::handle& g, const py::handle& h0) {
  return {to_matrix<S>(q, "q"),         to_matrix<S>(k, "k"),   to_matrix<S>(v, "v"),
          to_vector<S>(beta, "beta"), to_vector<S>(g, "g"), to_optional_matrix<S>(h0, "h0")};
}

template <class S>
static py::dict chunkwise_dict(const gd::ChunkwiseForward<S>& r) {
  py::dict out;
  out["o"] = from_matrix<S>(r.output);
  out["ht"] = from_matrix<S>(r.final_state);
  out["boundary_states"] = from_matrices<S>(r.boundary_states);
  py::list chunks;
  for (const auto& x : r.chunks) {
    py::dict d;
    d["A"] = from_matrix<S>(x.a);
    d["T"] = from_matrix<S>(x.t);
    d["W"] = from_matrix<S>(x.w);
    d["U"] = from_matrix<S>(x.u);
    d["v_new"] = from_matrix<S>(x.v_new);
    d["decay"] = from_matrix<S>(x.decay);
    chunks.append(d);
  }
  out["chunks"] = chunks;
  return out;
}

template <class S>
static py::dict gradients_dict(const gd::Gradients<S>& g, const char* gate_name) {
  py::dict out;
  out["dq"] = from_matrix<S>(g.dq);
  out["dk"] = from_matrix<S>(g.dk);
  out["dv"] = from_matrix<S>(g.dv);
  out["dbeta"] = from_vector<S>(g.d_beta);
  out[gate_name] = from_vector<S>(g.d_alpha);
  out["dh0"] = from_matrix<S>(g.d_initial_state);
  return out;
}

void bind_gated_delta_rule(py::module_& m) {
  m.def(
      "gated_forward",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object beta,
         py::object alpha, py::object h0, Index chunk_size, const std::string& solve, Index base_block) {
        const gd::ChunkOptions options{solve_of(solve), base_block};
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const gd::Inputs<S> in = inputs<S>(q, k, v, beta, alpha, h0);
          if (form == "chunkwise") return chunkwise_dict<S>(gd::chunkwise(in, chunk_size, options));
          if (form == "parallel") return chunkwise_dict<S>(gd::parallel_wy(in, options));
          gd::Forward<S> r;
          if (form == "recurrent") r = gd::token_recurrence(in);
          else if (form == "recurrent_read_correct_write") r = gd::token_recurrence_read_correct_write(in);
          else if (form == "affine_scan") r = gd::affine_scan(in);
          else throw std::invalid_argument("form: expected recurrent, recurrent_read_correct_write, affine_scan, chunkwise or parallel (got '" + form + "')");
          py::dict out;
          out["o"] = from_matrix<S>(r.output);
          out["ht"] = from_matrix<S>(r.final_state);
          return out;
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("alpha"),
      py::arg("h0"), py::arg("chunk_size"), py::arg("solve"), py::arg("base_block"));

  m.def(
      "gated_backward",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object beta,
         py::object alpha, py::object h0, py::object d_o, py::object dht, Index chunk_size, const std::string& solve,
         Index base_block) {
        const gd::ChunkOptions options{solve_of(solve), base_block};
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const gd::Inputs<S> in = inputs<S>(q, k, v, beta, alpha, h0);
          const gd::Cotangents<S> cot{to_matrix<S>(d_o, "do"), to_optional_matrix<S>(dht, "dht")};
          if (form == "recurrent") return gradients_dict<S>(gd::token_recurrence_backward(in, cot), "dalpha");
          if (form == "chunkwise") return gradients_dict<S>(gd::chunkwise_backward(in, cot, chunk_size, options), "dalpha");
          if (form == "parallel")
            return gradients_dict<S>(gd::chunkwise_backward(in, cot, std::max<Index>(1, in.length()), options), "dalpha");
          throw std::invalid_argument("form: expected recurrent, chunkwise or parallel (got '" + form + "')");
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("alpha"),
      py::arg("h0"), py::arg("do"), py::arg("dht"), py::arg("chunk_size"), py::arg("solve"), py::arg("base_block"));

  // The kernels' parametrisation: log-gates g = ln α, decays exp(G_e − G_s) (double, High).
  m.def(
      "gated_log_gate_forward",
      [](const std::string& scalar, py::object q, py::object k, py::object v, py::object beta, py::object g,
         py::object h0, Index chunk_size, const std::string& solve, Index base_block) {
        const gd::ChunkOptions options{solve_of(solve), base_block};
        return dispatch_scalar<false>(scalar, [&]<class S>() -> py::object {
          return chunkwise_dict<S>(gd::chunkwise_log_gate(log_gate_inputs<S>(q, k, v, beta, g, h0), chunk_size, options));
        });
      },
      py::arg("scalar"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("g"), py::arg("h0"),
      py::arg("chunk_size"), py::arg("solve"), py::arg("base_block"));

  m.def(
      "gated_log_gate_backward",
      [](const std::string& scalar, py::object q, py::object k, py::object v, py::object beta, py::object g,
         py::object h0, py::object d_o, py::object dht, Index chunk_size, const std::string& solve, Index base_block) {
        const gd::ChunkOptions options{solve_of(solve), base_block};
        return dispatch_scalar<false>(scalar, [&]<class S>() -> py::object {
          const gd::Cotangents<S> cot{to_matrix<S>(d_o, "do"), to_optional_matrix<S>(dht, "dht")};
          return gradients_dict<S>(
              gd::chunkwise_log_gate_backward(log_gate_inputs<S>(q, k, v, beta, g, h0), cot, chunk_size, options), "dg");
        });
      },
      py::arg("scalar"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("g"), py::arg("h0"),
      py::arg("do"), py::arg("dht"), py::arg("chunk_size"), py::arg("solve"), py::arg("base_block"));

  // One chunk's gate-decayed WY factors by the gated Equation 7, with Γ and A.
  m.def(
      "gated_wy",
      [](const std::string& scalar, py::object k, py::object v, py::object beta, py::object alpha) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const Matrix<S> kk = to_matrix<S>(k, "k"), vv = to_matrix<S>(v, "v");
          const Vector<S> b = to_vector<S>(beta, "beta");
          const Matrix<S> decay = gd::decay_from_gates<S>(to_vector<S>(alpha, "alpha"));
          const auto f = gd::wy_recurrence<S>(kk, vv, b, decay);
          py::dict out;
          out["decay"] = from_matrix<S>(decay);
          out["A"] = from_matrix<S>(gd::wy_system<S>(kk, b, decay));
          out["W"] = from_matrix<S>(f.w);
          out["U"] = from_matrix<S>(f.u);
          return out;
        });
      },
      py::arg("scalar"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("alpha"));

  // One chunk's decays Γ(e, s), (C+1, C+1): exact products of the gates α ("exact", "double", "high"), or
  // the kernels' exp(G_e − G_s) of the log-gates g on the causal side only ("float", "double", "high";
  // "float" evaluates in float32, with g rounded to float32 on the way in).
  m.def(
      "gated_decay",
      [](const std::string& scalar, const std::string& method, py::object gates) -> py::object {
        if (method == "gates")
          return dispatch_scalar(scalar, [&]<class S>() -> py::object {
            return from_matrix<S>(gd::decay_from_gates<S>(to_vector<S>(gates, "alpha")));
          });
        if (method != "log_gates")
          throw std::invalid_argument("method: expected gates or log_gates (got '" + method + "')");
        if (scalar == "float") return from_matrix<float>(gd::decay_from_log_gates<float>(to_vector<float>(gates, "g")));
        return dispatch_scalar<false>(scalar, [&]<class S>() -> py::object {
          return from_matrix<S>(gd::decay_from_log_gates<S>(to_vector<S>(gates, "g")));
        });
      },
      py::arg("scalar"), py::arg("method"), py::arg("gates"));

  // S_t = α_t S_{t-1} + v_t k_tᵀ: the additive case with a scalar gate.
  m.def(
      "gated_additive_forward",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object alpha,
         py::object h0, Index chunk_size) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const gd::ScalarGateInputs<S> in{to_matrix<S>(q, "q"), to_matrix<S>(k, "k"), to_matrix<S>(v, "v"),
                                           to_vector<S>(alpha, "alpha"), to_optional_matrix<S>(h0, "h0")};
          py::dict out;
          if (form == "recurrent") {
            const auto r = gd::additive_token_recurrence(in);
            out["o"] = from_matrix<S>(r.output);
            out["ht"] = from_matrix<S>(r.final_state);
          } else if (form == "chunkwise") {
            const auto r = gd::additive_chunkwise(in, chunk_size);
            out["o"] = from_matrix<S>(r.output);
            out["ht"] = from_matrix<S>(r.final_state);
            out["boundary_states"] = from_matrices<S>(r.boundary_states);
          } else {
            throw std::invalid_argument("form: expected recurrent or chunkwise (got '" + form + "')");
          }
          return out;
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("alpha"), py::arg("h0"),
      py::arg("chunk_size"));
}

}  // namespace deltaproof::python
