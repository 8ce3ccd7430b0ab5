// Linear attention: the three forward forms and the three backward paths are equal over ℚ.
#include "property_tests/batch_properties.hpp"
#include "property_tests/linear_attention_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

RC_GTEST_PROP(LinearAttentionForms, ForwardFormsEqualOverRationals, ()) {
  check_forward_forms_agree(*gen_linear_attention_case());
}

RC_GTEST_PROP(LinearAttentionForms, BackwardPathsEqualOverRationals, ()) {
  check_backward_paths_agree(*gen_linear_attention_case());
}

// Any two chunk sizes give the same output and final state (C = 1 is the recurrence, C >= L
// the parallel form).
RC_GTEST_PROP(LinearAttentionForms, ChunkSizeDoesNotMatter, ()) {
  const auto c = *gen_linear_attention_case({.max_length = 120, .max_dim = 24});
  const Index other = *rc::gen::inRange<Index>(1, c.shape.length + 2);
  const auto a = la::chunkwise(c.inputs, c.shape.chunk_size);
  const auto b = la::chunkwise(c.inputs, other);
  require_equal("output, C vs C'", a.output, b.output);
  require_equal("final state, C vs C'", a.final_state, b.final_state);
}

// A batched call is the per-head call on each head of a [B, H, L, D] tensor.
RC_GTEST_PROP(LinearAttentionForms, BatchedEqualsPerHead, ()) {
  check_batched_equals_per_head<la::BatchInputs<Exact>>(gen_batch_shape(2, 3, {.max_length = 40, .max_dim = 12}));
}

TEST(LinearAttentionForms, RejectsMismatchedShapes) {
  la::Inputs<double> in{Matrix<double>::Ones(4, 3), Matrix<double>::Ones(5, 3), Matrix<double>::Ones(4, 2), std::nullopt};
  EXPECT_THROW(la::chunkwise(in, 2), std::invalid_argument);
  in.k = Matrix<double>::Ones(4, 3);
  EXPECT_THROW(la::chunkwise(in, 0), std::invalid_argument);
  in.initial_state = Matrix<double>::Ones(3, 2);  // (DK, DV): transposed
  EXPECT_THROW(la::parallel_masked(in), std::invalid_argument);
}

}  // namespace
}  // namespace deltaproof::testing
