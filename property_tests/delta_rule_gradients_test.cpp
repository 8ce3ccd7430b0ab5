// DeltaNet backward: the chunkwise backward through the WY form, the token-recurrence backward,
// exact directional derivatives (dual numbers over ℚ) and central differences in High agree.
#include "property_tests/batch_properties.hpp"
#include "property_tests/delta_properties.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace deltaproof::testing {
namespace {

constexpr ShapeLimits kBackward{.max_length = 80, .max_dim = 20, .max_chunk = 64};
constexpr ShapeLimits kDual{.max_length = 40, .max_dim = 12, .max_chunk = 40};
constexpr ShapeLimits kHigh{.max_length = 24, .max_dim = 8, .max_chunk = 24};

DELTAPROOF_DELTA_GRADIENT_PROPERTIES(DeltaRuleGradients, gen_delta_case, kBackward, kDual, kHigh)

RC_GTEST_PROP(DeltaRuleGradients, BatchedBackwardEqualsPerHead, ()) {
  check_batched_backward_equals_per_head<dr::BatchInputs<Exact>>(gen_batch_shape(2, 2, {.max_length = 12, .max_dim = 6}));
}

}  // namespace
}  // namespace deltaproof::testing
