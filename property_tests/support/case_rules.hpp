// The shapes and regimes every case generator must reach (lengths at the chunk boundary, awkward head
// dims; the design page's numerical policy lists them), as plain data: the rapidcheck generators in
// property_tests/support/ and the GPU suites draw from these lists.
// Order matters: rapidcheck's element pickers index into these lists, so a list's order is part of
// the cases a seed produces.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace deltaproof::testing {

using Index = std::int64_t;  // as in verify/comparison.hpp

// Chunk sizes the CUDA kernels take (their launchers reject any other).
inline std::vector<Index> kernel_chunk_sizes() { return {16, 32, 64}; }

// L at the chunk boundary: 1, 2, C − 1, C, C + 1 (C − 1 held at 1 when C = 1).
inline std::vector<Index> boundary_lengths(Index chunk) { return {1, 2, std::max<Index>(1, chunk - 1), chunk, chunk + 1}; }

// The boundary lengths and one more: two full chunks and a partial third (2C + 3).
inline std::vector<Index> boundary_and_partial_lengths(Index chunk) {
  std::vector<Index> lengths = boundary_lengths(chunk);
  lengths.push_back(2 * chunk + 3);
  return lengths;
}

// Head dims that break kernels: 1, odd (15), one tensor-core tile (16), and 60 (fla's awkward D).
inline std::vector<Index> awkward_head_dims() { return {1, 15, 16, 60}; }

// The same with two tiles (32) as well, and 60 held to a suite's cap on head dims.
inline std::vector<Index> awkward_head_dims(Index max_dim) { return {1, 15, 16, 32, std::min<Index>(60, max_dim)}; }

// The largest head dim the kernels take (fixed-shape tests reach it; generators stay smaller).
inline constexpr Index max_kernel_head_dim = 256;

// β and α regimes: p/8 with p in 1..8, exactly 1, and tiny p/8192.
inline constexpr int gate_numerator_max = 8;
inline constexpr int generic_gate_denominator = 8;
inline constexpr int tiny_gate_denominator = 8192;

}  // namespace deltaproof::testing
