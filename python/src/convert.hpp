// numpy ⇄ oracle matrices for the three scalars the Python module exposes.
//
//   double, High: float64 numpy arrays in; float64 numpy arrays out (High rounded to nearest).
//   Exact:        ("exact", shape, [str …]) in, each string a rational "p/q" (Python builds it from
//                 fractions.Fraction or exactly from a float); the same tuple out. The Python layer
//                 turns it into an object array of Fraction, so nothing here touches Fraction.
#pragma once

#include "reference/scalar.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

namespace deltaproof::python {

namespace py = pybind11;
using ref::Exact;
using ref::High;
using ref::Index;
template <class S>
using Matrix = ref::Matrix<S>;
template <class S>
using Vector = ref::Vector<S>;

// Row-major values and shape of an input, whatever the scalar.
template <class S>
std::vector<S> values_of(const py::handle& x, std::vector<Index>& shape) {
  std::vector<S> out;
  if constexpr (ref::is_exact_v<S>) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(x);
    if (t.size() != 3 || t[0].cast<std::string>() != "exact")
      throw std::invalid_argument("exact scalar: expected an ('exact', shape, strings) tuple");
    shape = t[1].cast<std::vector<Index>>();
    for (const auto& s : t[2].cast<py::list>()) out.emplace_back(Exact(s.cast<std::string>()));
  } else {
    auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(x);
    if (!a) throw std::invalid_argument("expected a float64 numpy array");
    shape.assign(a.shape(), a.shape() + a.ndim());
    const double* p = a.data();
    out.reserve(static_cast<size_t>(a.size()));
    for (py::ssize_t i = 0; i < a.size(); ++i) out.emplace_back(S(p[i]));
  }
  return out;
}

template <class S>
Matrix<S> to_matrix(const py::handle& x, const char* name) {
  std::vector<Index> shape;
  std::vector<S> v = values_of<S>(x, shape);
  if (shape.size() != 2) throw std::invalid_argument(std::string(name) + ": expected a 2-D array");
  Matrix<S> m(shape[0], shape[1]);
  for (Index i = 0; i < shape[0]; ++i)
    for (Index j = 0; j < shape[1]; ++j) m(i, j) = v[static_cast<size_t>(i * shape[1] + j)];
  return m;
}

template <class S>
Vector<S> to_vector(const py::handle& x, const char* name) {
  std::vector<Index> shape;
  std::vector<S> v = values_of<S>(x, shape);
  if (shape.size() != 1) throw std::invalid_argument(std::string(name) + ": expected a 1-D array");
  Vector<S> out(shape[0]);
  for (Index i = 0; i < shape[0]; ++i) out(i) = v[static_cast<size_t>(i)];
  return out;
}

template <class S>
std::optional<Matrix<S>> to_optional_matrix(const py::handle& x, const char* name) {
  if (x.is_none()) return std::nullopt;
  return to_matrix<S>(x, name);
}

template <class S>
py::object from_values(const std::vector<Index>& shape, const S* data) {
  Index n = 1;
  for (Index d : shape) n *= d;
  if constexpr (ref::is_exact_v<S>) {
    py::list strings;
    for (Index i = 0; i < n; ++i) strings.append(py::str(data[i].str()));
    return py::make_tuple("exact", py::cast(shape), strings);
  } else {
    py::array_t<double> a(std::vector<py::ssize_t>(shape.begin(), shape.end()));
    double* p = a.mutable_data();
    for (Index i = 0; i < n; ++i) p[i] = ref::scalar_cast<double>(data[i]);
    return a;
  }
}

template <class S>
py::object from_matrix(const Matrix<S>& m) {
  std::vector<S> rowmajor;
  rowmajor.reserve(static_cast<size_t>(m.size()));
  for (Index i = 0; i < m.rows(); ++i)
    for (Index j = 0; j < m.cols(); ++j) rowmajor.push_back(m(i, j));
  return from_values<S>({m.rows(), m.cols()}, rowmajor.data());
}

template <class S>
py::object from_vector(const Vector<S>& v) {
  std::vector<S> values(v.data(), v.data() + v.size());
  return from_values<S>({v.size()}, values.data());
}

template <class S>
py::list from_matrices(const std::vector<Matrix<S>>& ms) {
  py::list out;
  for (const auto& m : ms) out.append(from_matrix<S>(m));
  return out;
}

// Calls f.template operator()<S>() for the scalar named "double", "high" or "exact" ("exact" only
// where WithExact: forms that take exp of log-gates have no exact evaluation).
template <bool WithExact = true, class F>
py::object dispatch_scalar(const std::string& scalar, F&& f) {
  if (scalar == "double") return f.template operator()<double>();
  if (scalar == "high") return f.template operator()<High>();
  if constexpr (WithExact) {
    if (scalar == "exact") return f.template operator()<Exact>();
  } else {
    if (scalar == "exact") throw std::invalid_argument("scalar: 'exact' is not available for the log-gate path (it takes exp)");
  }
  throw std::invalid_argument("scalar: expected 'double', 'high' or 'exact' (got '" + scalar + "')");
}

void bind_linear_attention(py::module_& m);
void bind_delta_rule(py::module_& m);
void bind_gated_delta_rule(py::module_& m);
void bind_ttt(py::module_& m);
void bind_lact(py::module_& m);
void bind_judge(py::module_& m);

}  // namespace deltaproof::python
