// Gated DeltaNet: every forward form equals its neighbours over ℚ; α = 1 is DeltaNet; the
// additive scalar-gate case; the log-gate path the kernels use, in High.
#include "property_tests/delta_properties.hpp"
#include "reference/linear_attention.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

constexpr ShapeLimits kForms{.max_length = 96, .max_dim = 24, .max_chunk = 64};
// The erase–write view and the affine scan multiply dense (DK, DK) matrices per token.
constexpr ShapeLimits kDense{.max_length = 64, .max_dim = 16, .max_chunk = 64};
constexpr ShapeLimits kStages{.max_length = 40, .max_dim = 10, .max_chunk = 40};

DELTAPROOF_DELTA_FORM_PROPERTIES(GatedDeltaRuleForms, gen_gated_delta_case, kDense, kStages, kForms)

RC_GTEST_PROP(GatedDeltaRuleForms, TriangularSolvesAgreeOnGatedSystems, ()) {
  const Index n = *rc::gen::oneOf(rc::gen::element<Index>(1, 2, 16, 17, 32), rc::gen::inRange<Index>(1, 40));
  const auto regime = *gen_delta_regime();
  const Matrix<Exact> k = *gen_keys(n, *rc::gen::inRange<Index>(1, 5), regime.keys);
  const Matrix<Exact> decay = gd::decay_from_gates(*gen_gates(n, regime.alpha));
  check_triangular_solves_agree(gd::wy_system<Exact>(k, *gen_gates(n, regime.beta), decay), *gen_base_block(),
                                *gen_base_block());
}

// With every α_t = 1 the gated forms are DeltaNet's, intermediates included.
RC_GTEST_PROP(GatedDeltaRuleForms, AlphaOneIsDeltaNet, ()) {
  const auto d = *gen_delta_case(kForms);
  const gd::Inputs<Exact> in{d.inputs.q, d.inputs.k, d.inputs.v, d.inputs.beta, Vector<Exact>::Ones(d.shape.length),
                             d.inputs.initial_state};
  const auto gated = gd::chunkwise(in, d.shape.chunk_size);
  const auto plain = dr::chunkwise(d.inputs, d.shape.chunk_size);
  require_equal("output", gated.output, plain.output);
  require_equal("final state", gated.final_state, plain.final_state);
  for (size_t c = 0; c < plain.chunks.size(); ++c) {
    require_equal(at_chunk("A", c), gated.chunks[c].a, plain.chunks[c].a);
    require_equal(at_chunk("T", c), gated.chunks[c].t, plain.chunks[c].t);
    require_equal(at_chunk("W", c), gated.chunks[c].w, plain.chunks[c].w);
    require_equal(at_chunk("U", c), gated.chunks[c].u, plain.chunks[c].u);
    require_equal(at_chunk("V_new", c), gated.chunks[c].v_new, plain.chunks[c].v_new);
  }
}

// S_t = α_t S_{t-1} + v_t k_tᵀ: chunkwise == recurrence, and α = 1 is linear attention.
RC_GTEST_PROP(GatedDeltaRuleForms, AdditiveScalarGateChunkwiseMatchesRecurrence, ()) {
  const auto c = *gen_gated_delta_case({.max_length = 120, .max_dim = 24, .max_chunk = 64});
  const gd::ScalarGateInputs<Exact> in{c.inputs.q, c.inputs.k, c.inputs.v, c.inputs.alpha, c.inputs.initial_state};
  const auto recurrent = gd::additive_token_recurrence(in);
  const auto chunked = gd::additive_chunkwise(in, c.shape.chunk_size);
  require_equal("additive output", chunked.output, recurrent.output);
  require_equal("additive final state", chunked.final_state, recurrent.final_state);
  const gd::ScalarGateInputs<Exact> ungated{in.q, in.k, in.v, Vector<Exact>::Ones(c.shape.length), in.initial_state};
  const auto linear = ref::linear_attention::token_recurrence(
      ref::linear_attention::Inputs<Exact>{in.q, in.k, in.v, in.initial_state});
  require_equal("alpha = 1 output vs linear attention", gd::additive_chunkwise(ungated, c.shape.chunk_size).output, linear.output);
}

// The kernels' log-gate path (Γ = exp(G_e − G_s), causal side only), in High with g = ln α:
// the decays match the exact products to within High's rounding (entries in (0, 1], each the
// exp of a sum of at most C rounded logs: relative error <= (2C + 4)·u·(1 + Σ|g|)), and the
// chunkwise output matches the exact oracle to 1e-50 relative to its largest entry, i.e.
// at most 49 of High's 99 digits lost to the conditioning of T (max|T| stays far below 1e49 at
// these shapes; the conditioning suite measures it).
RC_GTEST_PROP(GatedDeltaRuleForms, LogGatePathInHighMatchesExactOracle, ()) {
  const auto c = *gen_gated_delta_case({.max_length = 24, .max_dim = 8, .max_chunk = 24});
  gd::LogGateInputs<High> in{ref::matrix_cast<High>(c.inputs.q), ref::matrix_cast<High>(c.inputs.k),
                             ref::matrix_cast<High>(c.inputs.v), ref::matrix_cast<High>(Matrix<Exact>(c.inputs.beta)).col(0),
                             Vector<High>(c.shape.length), std::nullopt};
  if (c.inputs.initial_state) in.initial_state = ref::matrix_cast<High>(*c.inputs.initial_state);
  for (Index t = 0; t < c.shape.length; ++t) in.log_gate(t) = log(High(c.inputs.alpha(t)));
  const double u = ref::unit_roundoff<High>();
  for (const auto& ch : ref::chunks_of(c.shape.length, c.shape.chunk_size)) {
    const Matrix<High> from_logs = gd::decay_from_log_gates<High>(in.log_gate.segment(ch.begin, ch.size));
    const Matrix<High> exact = ref::matrix_cast<High>(gd::decay_from_gates<Exact>(c.inputs.alpha.segment(ch.begin, ch.size)));
    const High sum_abs_log = in.log_gate.segment(ch.begin, ch.size).cwiseAbs().sum();
    const High bound = High((2 * ch.size + 4) * u) * (1 + sum_abs_log);
    for (Index e = 0; e <= ch.size; ++e)
      for (Index s = 0; s <= e; ++s)
        if (!(abs(from_logs(e, s) - exact(e, s)) <= bound * exact(e, s)))
          RC_FAIL("decay Γ(" + std::to_string(e) + ", " + std::to_string(s) + ") from log gates off by more than " + bound.str(5));
  }
  const auto oracle = gd::token_recurrence(c.inputs);
  const auto logs = gd::chunkwise_log_gate(in, c.shape.chunk_size);
  const Matrix<High> reference = ref::matrix_cast<High>(oracle.output);
  const High scale = std::max(High(1), High(reference.cwiseAbs().maxCoeff()));
  const High err = (logs.output - reference).cwiseAbs().maxCoeff() / scale;
  if (!(err < High("1e-50"))) RC_FAIL("log-gate chunkwise output: relative error " + err.str(5));
}

TEST(GatedDeltaRuleForms, RejectsBadShapes) {
  gd::Inputs<double> in{Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 3), Matrix<double>::Ones(4, 2),
                        Vector<double>::Ones(4), Vector<double>::Ones(5), std::nullopt};
  EXPECT_THROW(gd::chunkwise(in, 2), std::invalid_argument);  // alpha has 5 entries, L = 4
  in.alpha = Vector<double>::Ones(4);
  EXPECT_NO_THROW(gd::chunkwise(in, 2));
  gd::LogGateInputs<double> logs{in.q, in.k, in.v, in.beta, Vector<double>::Zero(3), std::nullopt};
  EXPECT_THROW(gd::chunkwise_log_gate(logs, 2), std::invalid_argument);
}

}  // namespace
}  // namespace deltaproof::testing
