// Walking one sequence as several segments at once (docs/context_parallel.md), host side, shared by the
// linear-attention and delta-rule launchers: how many segments, and the scratch memory their states take.
#pragma once

#include "cuda/check.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

namespace deltaproof::cuda {

inline constexpr long kMaxGridRows = 65535;  // gridDim.y: B·H·R block rows

struct Segmentation {
  int segments = 1, length = 0;  // `segments` runs of `length` tokens (the last ones shorter or empty)
};

// `requested` segments of ceil(L / requested) tokens; 0: chosen for a GPU with `slots` blocks resident at
// once, each sequence taking `blocks_per_sequence`: one segment while the sequences fill half the GPU,
// else enough to fill it, each at least 8 chunks long and a whole number of chunks.
inline Segmentation choose_segments(int requested, int sequences, int length, int chunk, int blocks_per_sequence, int slots) {
  if (requested > 0) return {requested, requested == 1 ? length : (length + requested - 1) / requested};
  const long busy = long(sequences) * blocks_per_sequence;
  const long by_width = busy > 0 ? slots / busy : 1, by_length = length / (8L * chunk);
  const long by_grid = sequences > 0 ? kMaxGridRows / sequences : 1;
  const long segments = std::min({by_width, by_length, by_grid});
  if (2 * busy > slots || segments < 2) return {1, length};
  const long per = (length + segments - 1) / segments, rounded = (per + chunk - 1) / chunk * chunk;
  return {int((length + rounded - 1) / rounded), int(rounded)};
}

// For kernels that walk runs of one length in one launch and a shorter last run in a launch of its own (the delta
// family's): `seg` with as many runs as divide L's whole chunks evenly, when that keeps at least half of them.
inline Segmentation even_segments(Segmentation seg, int length, int chunk) {
  if (seg.segments < 2 || length % chunk != 0) return seg;
  const int chunks = length / chunk;
  for (int r = seg.segments; 2 * r >= seg.segments && r >= 2; --r)
    if (chunks % r == 0) return {r, length / r};
  return seg;
}

// A sequence of L tokens as Segmentation's runs, none empty: runs 0..folded−1 of `length` tokens each, then the
// last run of `tail` tokens (1..length). folded = 0: one run.
struct SegmentLayout {
  int folded = 0, length = 0, tail = 0;
};
inline SegmentLayout segment_layout(int L, Segmentation seg) {
  const int length = std::max(1, std::min(seg.length, L)), count = (L + length - 1) / length;
  return {count - 1, length, L - (count - 1) * length};
}

// The current device's SM count.
inline int multiprocessor_count() {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

// Scratch memory from the stream's pool, given back in stream order, also when a launch throws.
struct StreamMemory {
  void* data = nullptr;
  cudaStream_t stream;
  StreamMemory(std::size_t bytes, cudaStream_t s, const std::string& what) : stream(s) {
    check(cudaMallocAsync(&data, bytes, stream), "cudaMallocAsync for " + what);
  }
  ~StreamMemory() { cudaFreeAsync(data, stream); }
  StreamMemory(const StreamMemory&) = delete;
  StreamMemory& operator=(const StreamMemory&) = delete;
};

}  // namespace deltaproof::cuda
