// Random DeltaNet and Gated DeltaNet problems over ℚ: inputs and cotangents of a generated
// shape, in the regimes that matter for the delta rule (the design page's numerical policy): β = 1, tiny β, α = 1,
// tiny α, and unnormalized keys (ill-conditioned WY systems).
#pragma once

#include "property_tests/support/generators.hpp"
#include "reference/gated_delta_rule.hpp"
#include "reference/gradcheck.hpp"

#include <ostream>
#include <string>
#include <type_traits>

namespace deltaproof::testing {

namespace dr = ref::delta_rule;
namespace gd = ref::gated_delta_rule;
using ref::Vector;

// β_t or α_t: p/8 with p in 1..8, exactly 1, or tiny (p/8192); "mixed" draws any of them per token.
enum class GateRegime { generic, one, tiny, mixed };
// Keys with entries n/16 (|n| <= 4, ‖k‖ about 1 for small DK) or n/4 (|n| <= 8, ‖k‖ up to 2√DK).
enum class KeyRegime { small, unnormalized };
const char* name(GateRegime r);
const char* name(KeyRegime r);

struct DeltaRegime {
  GateRegime beta = GateRegime::generic;
  GateRegime alpha = GateRegime::generic;  // gated cases only
  KeyRegime keys = KeyRegime::unnormalized;
};
std::ostream& operator<<(std::ostream& os, const DeltaRegime& r);

rc::Gen<DeltaRegime> gen_delta_regime();
rc::Gen<Vector<Exact>> gen_gates(Index length, GateRegime regime);
rc::Gen<Matrix<Exact>> gen_keys(Index rows, Index cols, KeyRegime regime);

struct DeltaCase {
  Shape shape;
  DeltaRegime regime;
  dr::Inputs<Exact> inputs;
  dr::Cotangents<Exact> cotangents;  // d_output always; d_final_state when S_0 is given
};
std::ostream& operator<<(std::ostream& os, const DeltaCase& c);

struct GatedDeltaCase {
  Shape shape;
  DeltaRegime regime;
  gd::Inputs<Exact> inputs;
  dr::Cotangents<Exact> cotangents;
};
std::ostream& operator<<(std::ostream& os, const GatedDeltaCase& c);

rc::Gen<DeltaCase> gen_delta_case(ShapeLimits limits);
rc::Gen<GatedDeltaCase> gen_gated_delta_case(ShapeLimits limits);

// Named parameter lists come from the reference (params_of / inputs_of in both namespaces).
template <class Scalar>
Scalar from_exact(const Exact& x) {
  if constexpr (std::is_same_v<Scalar, ref::Dual<Exact>>) return Scalar(x);
  else return ref::scalar_cast<Scalar>(x);
}

// L = <dO, O> + <dS_L, S_L>, in any scalar (Dual<Exact> for exact directional derivatives).
template <class Scalar>
Scalar loss_with_exact_cotangents(const dr::Cotangents<Exact>& cot, const dr::Forward<Scalar>& f) {
  Scalar sum(0);
  for (Index i = 0; i < f.output.rows(); ++i)
    for (Index j = 0; j < f.output.cols(); ++j) sum += from_exact<Scalar>(cot.d_output(i, j)) * f.output(i, j);
  if (cot.d_final_state)
    for (Index i = 0; i < f.final_state.rows(); ++i)
      for (Index j = 0; j < f.final_state.cols(); ++j)
        sum += from_exact<Scalar>((*cot.d_final_state)(i, j)) * f.final_state(i, j);
  return sum;
}

// A random direction with the same names and shapes as p (entries n/4).
rc::Gen<ref::Params<Exact>> gen_direction(const ref::Params<Exact>& p);

}  // namespace deltaproof::testing
