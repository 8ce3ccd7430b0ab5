// What the DeltaNet / Gated DeltaNet kernel suites (delta_rule_gpu_test, delta_rule_backward_gpu_test,
// delta_rule_backward_checks_test) share: the names they use unqualified and the text of their stage
// rows. The suites are written inside this namespace (namespace deltaproof::delta_rule_gpu_suite {
// namespace { ... } }), so that these names are declared once and still hide what the using-directives
// bring in (cuda::DType and ref::Index, not verify's).
#pragma once

#include "kernel_checks/delta_rule_stages.hpp"
#include "property_tests/support/bounded_property.hpp"
#include "property_tests/support/case_rules.hpp"
#include "verify/matrix_comparison.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace deltaproof::delta_rule_gpu_suite {

using cuda::DType;
using ref::Exact;
using ref::High;
using ref::Index;
using ref::Matrix;
using ref::Tensor4;
using ref::Vector;
namespace dt = deltaproof::verify;
using namespace deltaproof::verify;
using namespace deltaproof::verify::delta_rule;
using deltaproof::testing::awkward_head_dims;
using deltaproof::testing::boundary_and_partial_lengths;
using deltaproof::testing::boundary_lengths;
using deltaproof::testing::check_cases;
using deltaproof::testing::kernel_chunk_sizes;

// The case, then every stage outside its bound (from the rows' fields).
inline std::string failures(const DeltaCase& c, const std::vector<Comparison>& rows) {
  return describe(c) + "\n" + describe_failures(rows);
}

// Largest err/bound per stage (the worst batch, head and chunk of each), for the printed calibration.
inline std::string calibration(const std::vector<Comparison>& rows) {
  std::string s;
  for (const Comparison& worst : worst_per_tensor(rows)) s += worst.tensor + " " + number_text(worst.ratio) + "  ";
  return s;
}

// `call` must throw std::invalid_argument naming `argument` first ("argument: ...") and saying `message`.
template <class Call>
void expect_named(const std::string& argument, const std::string& message, Call call) {
  try {
    call();
    ADD_FAILURE() << "no exception for a bad " << argument;
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(argument + ":", 0), 0u) << what;
    EXPECT_NE(what.find(message), std::string::npos) << what;
  }
}

}  // namespace deltaproof::delta_rule_gpu_suite
