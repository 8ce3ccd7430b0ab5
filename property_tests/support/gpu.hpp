// GPU tests run only where a CUDA device exists; elsewhere GoogleTest reports them skipped.
#pragma once

#include "cuda/check.hpp"

#include <gtest/gtest.h>

#define DELTAPROOF_REQUIRE_GPU()                                                       \
  do {                                                                                 \
    if (!::deltaproof::cuda::gpu_available()) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)
