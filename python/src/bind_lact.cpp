// deltaproof._core: Large-Chunk TTT (reference/lact.hpp), one sequence at a time: the schedules,
// the block masks they imply, and the predicted and measured dependency masks.
//
// Fast weights by name: "linear" {W (DV, DK)} or "swiglu" {W0 (DH, DK), W1 (DV, DH), W2 (DH, DK)}.
// SwiGLU, the window, weight norm and Newton–Schulz take exp or sqrt: double or High only. Masks are
// numpy bool arrays (rows: output i, columns: input token j).
#include "python/src/convert.hpp"
#include "reference/lact.hpp"

namespace deltaproof::python {

namespace lact = ref::lact;

namespace {

lact::Schedule schedule_of(const std::string& s) {
  const auto parsed = lact::parse_schedule(s);
  if (!parsed) throw std::invalid_argument("schedule: expected update-apply, apply-update or single (got '" + s + "')");
  return *parsed;
}

template <class S, class F>
py::object dispatch_fast_weight(const std::string& fast_weight, F&& f) {
  if (fast_weight == "linear") return f.template operator()<lact::LinearFastWeight>();
  if (fast_weight == "swiglu") {
    if constexpr (lact::has_transcendentals_v<S>) return f.template operator()<lact::SwiGluFastWeight>();
    else throw std::invalid_argument("fast_weight: swiglu takes SiLU (exp): use 'high' or 'double', not 'exact'");
  }
  throw std::invalid_argument("fast_weight: expected linear or swiglu (got '" + fast_weight + "')");
}

template <class S>
lact::Weights<S> weights_of(const py::list& weights) {
  lact::Weights<S> out;
  for (const auto& w : weights) out.push_back(to_matrix<S>(w, "weights"));
  return out;
}

template <class S>
lact::Inputs<S> inputs(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& eta,
                       const py::list& weights) {
  lact::Inputs<S> in{to_matrix<S>(q, "q"), to_matrix<S>(k, "k"), to_matrix<S>(v, "v"), to_vector<S>(eta, "eta"),
                      weights_of<S>(weights)};
  // The oracle calls η learning_rate; here the argument is eta.
  if (in.learning_rate.size() != in.q.rows())
    throw std::invalid_argument("eta: expected one learning rate per token (L = " + std::to_string(in.q.rows()) +
                                "), got " + std::to_string(in.learning_rate.size()));
  return in;
}

// A scalar argument (μ) arrives as a one-entry vector, so that it converts like every other input.
template <class S>
S scalar_of(const py::handle& x, const char* name) {
  const Vector<S> v = to_vector<S>(x, name);
  if (v.size() != 1) throw std::invalid_argument(std::string(name) + ": expected one number");
  return v(0);
}

template <class S>
lact::Options<S> options(const std::string& schedule, Index chunk_size, Index window, const py::handle& momentum,
                         bool weight_norm, bool orthogonalize) {
  return {schedule_of(schedule), chunk_size, window, scalar_of<S>(momentum, "momentum"), weight_norm, orthogonalize};
}

template <class S>
py::object out_matrix(const Matrix<S>& m, bool high_exact) {
  if constexpr (ref::is_high_v<S>) {
    if (high_exact) return from_matrix<Exact>(ref::matrix_cast<Exact>(m));
  }
  return from_matrix<S>(m);
}

template <class S>
py::list out_weights(const lact::Weights<S>& w, bool high_exact) {
  py::list out;
  for (const auto& m : w) out.append(out_matrix<S>(m, high_exact));
  return out;
}

py::array_t<bool> from_mask(const lact::DependencyMask& d) {
  py::array_t<bool> a({static_cast<py::ssize_t>(d.rows()), static_cast<py::ssize_t>(d.cols())});
  auto view = a.mutable_unchecked<2>();
  for (Index i = 0; i < d.rows(); ++i)
    for (Index j = 0; j < d.cols(); ++j) view(i, j) = d(i, j);
  return a;
}

lact::DependencyMask to_mask(const py::handle& x, const char* name) {
  auto a = py::array_t<bool, py::array::c_style | py::array::forcecast>::ensure(x);
  if (!a || a.ndim() != 2) throw std::invalid_argument(std::string(name) + ": expected a 2-D bool array");
  lact::DependencyMask d(a.shape(0), a.shape(1));
  auto view = a.unchecked<2>();
  for (Index i = 0; i < d.rows(); ++i)
    for (Index j = 0; j < d.cols(); ++j) d(i, j) = view(i, j);
  return d;
}

void require_same_shape(const lact::DependencyMask& a, const lact::DependencyMask& b, const char* names) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    throw std::invalid_argument(std::string(names) + ": the two masks must have the same shape");
}

py::list from_pairs(const std::vector<std::pair<Index, Index>>& pairs) {
  py::list out;
  for (const auto& [i, j] : pairs) out.append(py::make_tuple(i, j));
  return out;
}

}  // namespace

void bind_lact(py::module_& m) {
  m.def(
      "lact_forward",
      [](const std::string& scalar, const std::string& fast_weight, py::object q, py::object k, py::object v,
         py::object eta, py::list weights, const std::string& schedule, Index chunk_size, Index window,
         py::object momentum, bool weight_norm, bool orthogonalize, bool high_exact) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const lact::Inputs<S> in = inputs<S>(q, k, v, eta, weights);
          const lact::Options<S> opt = options<S>(schedule, chunk_size, window, momentum, weight_norm, orthogonalize);
          return dispatch_fast_weight<S>(fast_weight, [&]<class FastWeight>() -> py::object {
            const auto r = lact::forward<S, FastWeight>(in, opt);
            py::dict out;
            out["o"] = out_matrix<S>(r.output, high_exact);
            out["fast_weight_output"] = out_matrix<S>(r.fast_weight_output, high_exact);
            out["window_output"] = out_matrix<S>(r.window_output, high_exact);
            out["final_weights"] = out_weights<S>(r.final_weights, high_exact);
            py::list boundary;
            for (const auto& w : r.boundary_weights) boundary.append(out_weights<S>(w, high_exact));
            out["boundary_weights"] = boundary;
            return out;
          });
        });
      },
      py::arg("scalar"), py::arg("fast_weight"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("eta"),
      py::arg("weights"), py::arg("schedule"), py::arg("chunk_size"), py::arg("window"), py::arg("momentum"),
      py::arg("weight_norm"), py::arg("orthogonalize"), py::arg("high_exact"));

  // ∇ℓ_c at the given weights: the closed form the schedule uses, or dual numbers on inner_loss.
  m.def(
      "lact_chunk_gradient",
      [](const std::string& scalar, const std::string& fast_weight, const std::string& method, py::list weights,
         py::object k, py::object v, py::object eta, bool high_exact) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          const lact::Weights<S> w = weights_of<S>(weights);
          const Matrix<S> kk = to_matrix<S>(k, "k"), vv = to_matrix<S>(v, "v");
          const Vector<S> e = to_vector<S>(eta, "eta");
          return dispatch_fast_weight<S>(fast_weight, [&]<class FastWeight>() -> py::object {
            FastWeight::validate(w, kk.cols(), vv.cols());
            if (method == "closed_form") return out_weights<S>(FastWeight::chunk_gradient(w, kk, vv, e), high_exact);
            if (method == "dual")
              return out_weights<S>(lact::inner_loss_gradient_by_dual<FastWeight, S>(w, kk, vv, e), high_exact);
            throw std::invalid_argument("method: expected closed_form or dual (got '" + method + "')");
          });
        });
      },
      py::arg("scalar"), py::arg("fast_weight"), py::arg("method"), py::arg("weights"), py::arg("k"), py::arg("v"),
      py::arg("eta"), py::arg("high_exact"));

  m.def(
      "lact_block_mask",
      [](const std::string& scalar, const std::string& schedule, Index length, Index chunk_size, py::object momentum) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          return from_matrix<S>(lact::block_mask<S>(schedule_of(schedule), length, chunk_size,
                                                    scalar_of<S>(momentum, "momentum")));
        });
      },
      py::arg("scalar"), py::arg("schedule"), py::arg("length"), py::arg("chunk_size"), py::arg("momentum"));

  m.def(
      "lact_masked_linear_attention",
      [](const std::string& scalar, py::object q, py::object k, py::object v, py::object h0, py::object mask) {
        return dispatch_scalar(scalar, [&]<class S>() -> py::object {
          return from_matrix<S>(lact::masked_linear_attention<S>(to_matrix<S>(q, "q"), to_matrix<S>(k, "k"),
                                                                 to_matrix<S>(v, "v"), to_matrix<S>(h0, "h0"),
                                                                 to_matrix<S>(mask, "mask")));
        });
      },
      py::arg("scalar"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("h0"), py::arg("mask"));

  m.def(
      "lact_predicted_dependencies",
      [](const std::string& schedule, Index length, Index chunk_size, Index window) {
        return from_mask(lact::predicted_dependencies(schedule_of(schedule), length, chunk_size, window));
      },
      py::arg("schedule"), py::arg("length"), py::arg("chunk_size"), py::arg("window"));

  // "exact": every ∂o_i/∂x_j over ℚ by dual numbers (linear fast weight, no window, no norm or NS);
  // "perturbation": output rows not bitwise unchanged in High when token j moves (any fast weight).
  m.def(
      "lact_measure_dependencies",
      [](const std::string& method, const std::string& fast_weight, py::object q, py::object k, py::object v,
         py::object eta, py::list weights, const std::string& schedule, Index chunk_size, Index window,
         py::object momentum, bool weight_norm, bool orthogonalize) -> py::object {
        if (method == "exact") {
          if (fast_weight != "linear")
            throw std::invalid_argument("fast_weight: the exact measurement is for the linear fast weight; use "
                                        "method='perturbation' for swiglu");
          return from_mask(lact::measure_dependencies_exact(
              inputs<Exact>(q, k, v, eta, weights),
              options<Exact>(schedule, chunk_size, window, momentum, weight_norm, orthogonalize)));
        }
        if (method == "perturbation") {
          const lact::Inputs<High> in = inputs<High>(q, k, v, eta, weights);
          const lact::Options<High> opt = options<High>(schedule, chunk_size, window, momentum, weight_norm, orthogonalize);
          return dispatch_fast_weight<High>(fast_weight, [&]<class FastWeight>() -> py::object {
            return from_mask(lact::measure_dependencies_by_perturbation<FastWeight>(in, opt));
          });
        }
        throw std::invalid_argument("method: expected exact or perturbation (got '" + method + "')");
      },
      py::arg("method"), py::arg("fast_weight"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("eta"),
      py::arg("weights"), py::arg("schedule"), py::arg("chunk_size"), py::arg("window"), py::arg("momentum"),
      py::arg("weight_norm"), py::arg("orthogonalize"));

  m.def("lact_mask_grid", [](py::object d) { return lact::mask_grid(to_mask(d, "mask")); }, py::arg("mask"));
  m.def(
      "lact_mask_difference_grid",
      [](py::object predicted, py::object measured) {
        const lact::DependencyMask p = to_mask(predicted, "predicted"), d = to_mask(measured, "measured");
        require_same_shape(p, d, "predicted, measured");
        return lact::mask_difference_grid(p, d);
      },
      py::arg("predicted"), py::arg("measured"));
  m.def(
      "lact_mask_differences",
      [](py::object a, py::object b) {
        const lact::DependencyMask x = to_mask(a, "a"), y = to_mask(b, "b");
        require_same_shape(x, y, "a, b");
        return from_pairs(lact::mask_differences(x, y));
      },
      py::arg("a"), py::arg("b"));
  m.def("lact_causal_gaps", [](py::object d) { return from_pairs(lact::causal_gaps(to_mask(d, "mask"))); },
        py::arg("mask"));
}

}  // namespace deltaproof::python
