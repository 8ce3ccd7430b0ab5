// A rapidcheck property over a fixed number of generated cases, for suites whose cases are costly
// (GPU runs, the exact oracle): the count is the test's, the seed still comes from RC_PARAMS, and
// RC_PARAMS's max_success may lower the count (never raise it): the sanitizer runs ask for a few.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <utility>

namespace deltaproof::testing {

template <class Testable>
bool check_cases(const std::string& name, int cases, Testable&& testable) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = std::min(cases, params.maxSuccess);
  rc::detail::TestMetadata metadata;
  metadata.id = metadata.description = name;
  const auto result = rc::detail::checkTestable(std::forward<Testable>(testable), metadata, params);
  rc::detail::printResultMessage(result, std::cerr);
  std::cerr << std::endl;
  return result.template is<rc::detail::SuccessResult>();
}

}  // namespace deltaproof::testing
