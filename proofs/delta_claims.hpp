// Claim builders that the DeltaNet and Gated DeltaNet certificates share (delta_rule_certificate.cpp,
// gated_delta_rule_certificate.cpp): a shape, the token views, the chunkwise forms and backward
// paths under each triangular solve against the recurrence, and the backward as the formal
// gradient of L = <dO, O> + <dS_L, S_L>.
//
// Unqualified calls to the oracle (token_recurrence, chunkwise, params_of, …) find the family
// through the inputs' type by argument-dependent lookup: delta_rule's forms for dr::Inputs,
// gated_delta_rule's for gd::Inputs. `family` prefixes each statement ("" or "gated ").
#pragma once

#include "proofs/identity_testing.hpp"
#include "reference/delta_rule.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

namespace deltaproof::proofs {

namespace dr = ref::delta_rule;
using dr::TriangularSolve;

inline constexpr TriangularSolve kSolves[] = {TriangularSolve::forward_substitution, TriangularSolve::blocked,
                                              TriangularSolve::recursive};

struct DeltaShape {
  Index L, C, DK, DV;
  bool initial_state;
  Index base;  // base block of the blocked and recursive solves
  std::string name() const {
    return "L=" + std::to_string(L) + " C=" + std::to_string(C) + " DK=" + std::to_string(DK) + " DV=" + std::to_string(DV) +
           (initial_state ? " S_0 given" : " S_0 = 0") + ", base block " + std::to_string(base);
  }
};

// Every prefix (transition, write) of a equal to b's; a length mismatch makes the claim fail.
template <class S>
void equal_maps(Claim<S>& claim, const std::vector<dr::AffineMap<S>>& a, const std::vector<dr::AffineMap<S>>& b) {
  if (a.size() != b.size()) claim.equal(Matrix<S>::Zero(1, 1), Matrix<S>::Zero(1, 2));
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    claim.equal(a[i].transition, b[i].transition).equal(a[i].write, b[i].write);
}

// S_0 … S_L of the recurrence: each token's affine map applied in turn (S_t = state after t tokens).
template <class S>
std::vector<Matrix<S>> recurrence_states(const Matrix<S>& initial_state, const std::vector<dr::AffineMap<S>>& maps) {
  std::vector<Matrix<S>> states{initial_state};
  for (const auto& m : maps) states.push_back(m.apply(states.back()));
  return states;
}

// O, S_L and every boundary state S_[c] of a chunkwise run against the recurrence's.
template <class S, class Chunked>
void equal_to_recurrence(Claim<S>& claim, const Chunked& chunked, const dr::Forward<S>& recurrent,
                         const std::vector<Matrix<S>>& states, Index chunk_size) {
  claim.equal(chunked.output, recurrent.output).equal(chunked.final_state, recurrent.final_state);
  for (size_t c = 0; c < chunked.boundary_states.size(); ++c)
    claim.equal(chunked.boundary_states[c], states[c * static_cast<size_t>(chunk_size)]);
}

// dq, dk, dv, dβ, dα (gated), dS_0.
template <class S, class Gradients>
void equal_gradients(Claim<S>& claim, const Gradients& a, const Gradients& b) {
  claim.equal(a.dq, b.dq).equal(a.dk, b.dk).equal(a.dv, b.dv).equal(as_matrix(a.d_beta), as_matrix(b.d_beta));
  if constexpr (requires { a.d_alpha; }) claim.equal(as_matrix(a.d_alpha), as_matrix(b.d_alpha));
  claim.equal(a.d_initial_state, b.d_initial_state);
}

// Read–correct–write and the affine tree scan against erase–write; returns erase–write.
template <class S, class In>
dr::Forward<S> claim_token_views(Claims<S>& out, const std::string& family, const In& in) {
  const auto erase_write = token_recurrence(in);
  const auto rcw = token_recurrence_read_correct_write(in);
  out.add(family + "read-correct-write = erase-write: O, S_L  [token_recurrence_read_correct_write = token_recurrence]")
      .equal(rcw.output, erase_write.output)
      .equal(rcw.final_state, erase_write.final_state);
  const auto affine = affine_scan(in);
  out.add(family + "affine tree scan = erase-write: O, S_L  [affine_scan = token_recurrence]")
      .equal(affine.output, erase_write.output)
      .equal(affine.final_state, erase_write.final_state);
  return erase_write;
}

// The chunkwise form under each triangular solve, and the parallel form (one chunk of C = L,
// blocked), against the recurrence.
template <class Policy, class S, class In>
void claim_chunkwise_forms(Claims<S>& out, const std::string& family, const In& in, const DeltaShape& sh,
                           const dr::Forward<S>& recurrent, const std::vector<Matrix<S>>& states) {
  for (const auto solve : kSolves)
    equal_to_recurrence(out.add(family + "chunkwise (C=" + std::to_string(sh.C) + ", " + dr::to_string(solve) +
                                ") = recurrence: O, S_L, every S_[c]  [chunkwise]"),
                        chunkwise<S, Policy>(in, sh.C, {solve, sh.base}), recurrent, states, sh.C);
  const Index whole = std::max<Index>(1, sh.L);
  equal_to_recurrence(out.add(family + "parallel form (one chunk C=L, blocked) = recurrence: O, S_L  [parallel_wy]"),
                      chunkwise<S, Policy>(in, whole, {TriangularSolve::blocked, sh.base}), recurrent, states, whole);
}

// The backward through WY under each triangular solve against the recurrence backward.
template <class Policy, class S, class In, class Gradients>
void claim_backward_paths(Claims<S>& out, const std::string& family, const In& in, const dr::Cotangents<S>& cot,
                          const DeltaShape& sh, const Gradients& recurrent) {
  const std::string gradients = requires { recurrent.d_alpha; } ? "dq, dk, dv, dbeta, dalpha, dS_0" : "dq, dk, dv, dbeta, dS_0";
  for (const auto solve : kSolves)
    equal_gradients(out.add(family + "backward through WY (C=" + std::to_string(sh.C) + ", " + dr::to_string(solve) +
                            ") = recurrence backward: " + gradients + "  [chunkwise_backward = token_recurrence_backward]"),
                    chunkwise_backward<S, Policy>(in, cot, sh.C, {solve, sh.base}), recurrent);
}

// <backward, u> = d/de L(x + e u) for a direction u drawn from src (symbolic in the degree run):
// the backward is the formal gradient of L = <dO, O> + <dS_L, S_L>, a polynomial identity in x,
// u and the cotangents. dS_0 is taken at S_0 = 0 when S_0 is absent, where u moves it.
// inputs_of: the family's inputs_of (a parameter list alone does not name its family).
template <class S, class In, class Gradients, class Source, class InputsOf>
void claim_formal_gradient(Claims<S>& out, const std::string& family, const In& in, const dr::Cotangents<S>& cot,
                           const Gradients& at, Source& src, InputsOf&& inputs_of) {
  In with_state = in;
  with_state.initial_state = in.initial_state_or_zero();
  const ref::Params<S> x = params_of(with_state);  // q, k, v, β, (α,) S_0
  ref::Params<S> u = x;
  for (auto& p : u) p.value = src.matrix(p.value.rows(), p.value.cols());
  ref::Params<ref::Dual<S>> moved;
  for (size_t p = 0; p < x.size(); ++p) moved.push_back({x[p].name, lift(x[p].value, u[p].value)});
  const dr::Cotangents<ref::Dual<S>> cot_d{lift(cot.d_output), lift(*cot.d_final_state)};
  const S directional = pairing(token_recurrence(inputs_of(moved)), cot_d).tangent;
  const S analytic = ref::inner(params_of(at, true), u);
  out.add("<backward, u> = d/de L(x + e u) through the " + family +
          "recurrence (dual numbers): backward = formal gradient of L")
      .equal(as_matrix(analytic), as_matrix(directional));
}

// A delta certificate's run: builder(shape, source) on every shape, under the title (with the
// planted bug's line in a planted build); the exit status says whether every identity held.
template <class Builder>
int certify_shapes(const std::string& title, const char* planted, std::initializer_list<DeltaShape> shapes, Builder&& builder) {
  Certificate cert(planted ? title + "\nPLANTED BUG: " + planted + " (this run must fail)" : title);
  for (const DeltaShape& sh : shapes) cert.shape(sh.name(), [&](auto& source) { return builder(sh, source); });
  return cert.finish();
}

}  // namespace deltaproof::proofs
