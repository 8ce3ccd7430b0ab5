// deltaproof._core: the compiled half of the Python package. The public API is the pure-Python
// package around it (deltaproof/__init__.py); names here are its building blocks.
#include "python/src/convert.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "deltaproof's oracle forms (double, High, Exact) and verify::judge, for the deltaproof package";
  deltaproof::python::bind_linear_attention(m);
  deltaproof::python::bind_delta_rule(m);
  deltaproof::python::bind_gated_delta_rule(m);
  deltaproof::python::bind_ttt(m);
  deltaproof::python::bind_lact(m);
  deltaproof::python::bind_judge(m);
}
