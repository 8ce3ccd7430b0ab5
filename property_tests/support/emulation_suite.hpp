// The names every CPU-emulation suite uses unqualified: the emulated machine's tensors and thread
// orders, the kernels' DType, the oracle's exact tensors. The suites are written inside this
// namespace (namespace deltaproof::emulation_suite { namespace { ... } }), so that these names are
// declared once, and still hide what a suite's own using-directives bring in (cuda::DType, not
// verify::DType). Nothing here reaches the kernel source a suite includes.
#pragma once

#include "property_tests/support/cuda_emulation.hpp"

namespace deltaproof::emulation_suite {

using cuda::DType;
using emulation::read;
using emulation::Tensor;
using emulation::ThreadOrder;
using emulation::write;
using ref::Exact;
using ref::Index;
using ref::Tensor4;

}  // namespace deltaproof::emulation_suite
