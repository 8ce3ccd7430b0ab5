// Linear attention over segments and ranks (docs/context_parallel.md), device side: the scan of the segments' sums
// and a rank's prefix of the gathered summaries, one thread per state entry. Included by linear_attention_kernels.cuh
// (and so compiled by the CPU emulation too), after the passes.
#pragma once

#include "cuda/linear_attention_passes.cuh"

#include <cstdint>

namespace deltaproof::cuda::linear_attention {
namespace {

// Segment sums' exclusive scan in a pass's direction: incoming[r] = S_0 + Σ of the sums of the segments the
// pass walks before r, one thread per state entry, the segments added in the pass's order. (A chain of R
// additions an entry: the entries are the parallelism; a log-depth scan would round the same sums otherwise.)
struct SegmentScan {
  const void* sums;  // [B, H, R, rows, cols] packed
  void* incoming;    // [B, H, R, rows, cols] packed
  const void* s0; std::int64_t s0_b, s0_h, s0_r, s0_c;  // the pass's S_0, or null
  int batch, heads, segments, rows, cols;
  bool reversed;
};
constexpr int kScanThreads = 256;

template <class A, class Policy>
__global__ void __launch_bounds__(kScanThreads) segment_scan_kernel(SegmentScan s) {
  const std::int64_t per = std::int64_t(s.rows) * s.cols;
  const std::int64_t e = std::int64_t(blockIdx.x) * kScanThreads + threadIdx.x;
  if (e >= std::int64_t(s.batch) * s.heads * per) return;
  const std::int64_t bh = e / per, rc = e % per;
  const int b = int(bh / s.heads), h = int(bh % s.heads), row = int(rc / s.cols), col = int(rc % s.cols);
  A acc = s.s0 && Policy::reads_initial_state ? static_cast<const A*>(s.s0)[b * s.s0_b + h * s.s0_h + row * s.s0_r + col * s.s0_c]
                                              : A(0);
  const A* sums = static_cast<const A*>(s.sums) + bh * s.segments * per + rc;
  A* incoming = static_cast<A*>(s.incoming) + bh * s.segments * per + rc;
  for (int i = 0; i < s.segments; ++i) {
    const int r = s.reversed ? s.segments - 1 - i : i;
    if (Policy::exclusive_segment_scan) incoming[r * per] = acc;
    acc += sums[r * per];
    if (!Policy::exclusive_segment_scan) incoming[r * per] = acc;
  }
}

// Context parallelism (cuda/context_parallel.h): rank r's incoming state from every rank's summary, gathered
// [R, B, H, rows, cols] (rank 0's starting from S_0): Σ_{r' < r}, in rank order, one thread per state entry.
struct RankPrefix {
  const void* gathered;
  void* incoming;         // [B, H, rows, cols] packed
  std::int64_t entries;   // B·H·rows·cols
  int rank;
};

template <class A>
__global__ void __launch_bounds__(kScanThreads) rank_prefix_kernel(RankPrefix p) {
  const std::int64_t e = std::int64_t(blockIdx.x) * kScanThreads + threadIdx.x;
  if (e >= p.entries) return;
  A acc = 0;
  for (int r = 0; r < p.rank; ++r) acc += static_cast<const A*>(p.gathered)[r * p.entries + e];
  static_cast<A*>(p.incoming)[e] = acc;
}

}  // namespace
}  // namespace deltaproof::cuda::linear_attention
