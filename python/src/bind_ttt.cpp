// deltaproof._core: Test-Time Training (reference/ttt.hpp), one sequence at a time.
//
// Losses by name: "squared" ½‖f − v‖² (→ DeltaNet), "linear" −vᵀf (→ linear attention), "quartic"
// ¼Σ(f − v)⁴. Features: "identity" φ(x) = x, "quadratic" φ(x) = [x, x ⊙ x]. TTT-MLP takes erf and
// exp, so it runs in double or High only; with high_exact its High results come back as the exact
// rationals they are (MPFR values are dyadic), so that the 10⁻⁶⁰ agreement can be seen in Python.
#include "python/src/convert.hpp"
#include "reference/high_agreement.hpp"
#include "reference/ttt.hpp"

namespace deltaproof::python {

namespace ttt = ref::ttt;

namespace {

template <class F>
py::object dispatch_loss(const std::string& loss, F&& f) {
  if (loss == "squared") return f.template operator()<ttt::SquaredBinding>();
  if (loss == "linear") return f.template operator()<ttt::NegativeDot>();
  if (loss == "quartic") return f.template operator()<ttt::QuarticBinding>();
  throw std::invalid_argument("loss: expected squared, linear or quartic (got '" + loss + "')");
}

template <class F>
py::object dispatch_features(const std::string& features, F&& f) {
  if (features == "identity") return f.template operator()<ttt::IdentityFeatures>();
  if (features == "quadratic") return f.template operator()<ttt::QuadraticFeatures>();
  throw std::invalid_argument("features: expected identity or quadratic (got '" + features + "')");
}

template <class S>
ttt::Inputs<S> inputs(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& eta,
                      const py::handle& h0) {
  ttt::Inputs<S> in{to_matrix<S>(q, "q"), to_matrix<S>(k, "k"), to_matrix<S>(v, "v"), to_vector<S>(eta, "eta"),
                      to_optional_matrix<S>(h0, "h0")};
  // The oracle calls η learning_rate; here the argument is eta.
  if (in.learning_rate.size() != in.q.rows())
    throw std::invalid_argument("eta: expected one learning rate per token (L = " + std::to_string(in.q.rows()) +
                                "), got " + std::to_string(in.learning_rate.size()));
  return in;
}

// High matrices as float64 (default) or as their exact rational values.
template <class S>
py::object out_matrix(const Matrix<S>& m, bool high_exact) {
  if constexpr (ref::is_high_v<S>) {
    if (high_exact) return from_matrix<Exact>(ref::matrix_cast<Exact>(m));
  }
  return from_matrix<S>(m);
}

template <class S>
py::dict forward_dict(const ttt::Forward<S>& r, bool high_exact) {
  py::dict out;
  out["o"] = out_matrix<S>(r.output, high_exact);
  out["ht"] = out_matrix<S>(r.final_state, high_exact);
  return out;
}

}  // namespace

void bind_ttt(py::module_& m) {
  m.def(
      "ttt_forward",
      [](const std::string& scalar, const std::string& form, const std::string& loss, const std::string& features,
         py::object q, py::object k, py::object v, py::object eta, py::object h0, Index batch_size, py::object momentum,
         bool high_exact) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const ttt::Inputs<S> in = inputs<S>(q, k, v, eta, h0);
          const std::optional<Vector<S>> a =
              momentum.is_none() ? std::nullopt : std::optional<Vector<S>>(to_vector<S>(momentum, "momentum"));
          return dispatch_loss(loss, [&]<class Loss>() -> py::object {
            return dispatch_features(features, [&]<class Features>() -> py::object {
              if (form == "gradient_descent")
                return forward_dict<S>(ttt::gradient_descent<S, Loss, Features>(in, {batch_size, a}), high_exact);
              if (form == "minibatch_dual")
                return forward_dict<S>(ttt::minibatch_dual<S, Loss, Features>(in, batch_size), high_exact);
              if (form == "momentum_linear_attention") {
                if (!a) throw std::invalid_argument("momentum: momentum_linear_attention needs one a_t per token");
                return forward_dict<S>(ttt::momentum_linear_attention<S, Loss, Features>(in, *a), high_exact);
              }
              if (form == "as_linear_attention") {
                const auto r = ttt::as_linear_attention<S, Loss, Features>(in);
                py::dict out = forward_dict<S>(r.forward, high_exact);
                py::dict writes;
                writes["q"] = out_matrix<S>(r.writes.q, high_exact);
                writes["k"] = out_matrix<S>(r.writes.k, high_exact);
                writes["v"] = out_matrix<S>(r.writes.v, high_exact);
                writes["h0"] = out_matrix<S>(*r.writes.initial_state, high_exact);
                out["writes"] = writes;
                return out;
              }
              throw std::invalid_argument(
                  "form: expected gradient_descent, minibatch_dual, momentum_linear_attention or as_linear_attention "
                  "(got '" + form + "')");
            });
          });
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("loss"), py::arg("features"), py::arg("q"), py::arg("k"),
      py::arg("v"), py::arg("eta"), py::arg("h0"), py::arg("batch_size"), py::arg("momentum"), py::arg("high_exact"));

  m.def(
      "ttt_momentum_mask",
      [](const std::string& scalar, py::object momentum) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          return from_matrix<S>(ttt::momentum_mask<S>(to_vector<S>(momentum, "momentum")));
        });
      },
      py::arg("scalar"), py::arg("momentum"));

  m.def(
      "ttt_mlp",
      [](const std::string& scalar, const std::string& form, py::object q, py::object k, py::object v, py::object eta,
         py::object w1, py::object w2, Index batch_size, bool high_exact) {
        if (scalar == "exact")
          throw std::invalid_argument("scalar: TTT-MLP takes GELU (erf, exp): use 'high' or 'double', not 'exact'");
        return dispatch_scalar<false>(scalar, [&]<class S>() -> py::object {
          const ttt::Inputs<S> in = inputs<S>(q, k, v, eta, py::none());
          const ttt::MlpWeights<S> w0{to_matrix<S>(w1, "w1"), to_matrix<S>(w2, "w2")};
          ttt::MlpForward<S> r;
          if (form == "primal") r = ttt::mlp_minibatch_primal<S>(in, w0, batch_size);
          else if (form == "dual") r = ttt::mlp_minibatch_dual<S>(in, w0, batch_size);
          else throw std::invalid_argument("form: expected primal or dual (got '" + form + "')");
          py::dict out;
          out["o"] = out_matrix<S>(r.output, high_exact);
          out["w1"] = out_matrix<S>(r.final_weights.w1, high_exact);
          out["w2"] = out_matrix<S>(r.final_weights.w2, high_exact);
          return out;
        });
      },
      py::arg("scalar"), py::arg("form"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("eta"), py::arg("w1"),
      py::arg("w2"), py::arg("batch_size"), py::arg("high_exact"));

  // The bound two High evaluations of one value must agree within: 10⁻⁶⁰ (1 + max|reference|), as "p/q".
  m.def(
      "high_agreement_bound",
      [](py::object reference) {
        const Matrix<Exact> bound = ref::high_agreement_bound(to_matrix<Exact>(reference, "reference"));
        return bound.size() ? bound(0, 0).str() : ref::high_agreement_relative_bound().str();
      },
      py::arg("reference"));
}

}  // namespace deltaproof::python
