// DeltaNet / Gated DeltaNet over segments on one GPU (docs/context_parallel.md): a sequence cut into segments that
// are walked at once. Token t maps the state by S ↦ S M_t + X_t (M_t = α_t (I − β_t k_t k_tᵀ)), so a segment
// maps it by S ↦ S P + X with its transition P = M_first ⋯ M_last and its state summary X (the state it leaves
// from S = 0). Per sequence, after one prepare (W, U, scores) of the segments walked together (below):
//   1. the summaries: the register scan's state chain alone (Summary::state from 0: X; Summary::transition from
//      I with U ≡ 0: P), every segment at once;
//   2. segment_scan_kernel: the state entering segment r, S_in(0) = S_0, S_in(r + 1) = S_in(r) P_r + X_r, in fp32
//      FMA (each entry X_r's entry plus DK products in key order: |error| ≤ γ_DK(2⁻²⁴)·(|S_in(r)| |P_r| + |X_r|));
//   3. the one-walk register scan of every segment from its S_in, all in one launch when they are of one length (the
//      last one's final state copied out), else the last one, of its own length, in a launch of its own.
// Segments are ceil(L / R) tokens (the launcher's Segmentation), the last one the remainder; a segment is any
// number of tokens, not a multiple of C. Each step is the one walk's arithmetic on its own inputs, so the kernels'
// stage checks judge each of them (kernel_checks/delta_rule_segments.hpp). Both the launcher (delta_rule.cu) and the
// CPU emulation (property_tests/delta_rule_forward_cpu_emulation_test.cpp) run `run_segments` below, each with its
// own launches.
#pragma once

#include "cuda/delta_rule_forward_kernels.cuh"
#include "cuda/segments.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS {

// Tokens [first, first + count·length) of sequence b as `count` sequences of `length` tokens (the user's tensors,
// offset; each segment `length` rows after the previous one); states, intermediates and workspace left to the caller.
inline ForwardStageParams segment_view(const ForwardStageParams& p, int b, int first, int count, int length) {
  ForwardStageParams v = p;
  static_cast<delta_rule::ForwardIntermediates&>(v) = {};
  v.batch = count, v.length = length;
  v.initial_state = nullptr, v.final_state = nullptr, v.saved = nullptr, v.workspace = nullptr;
  v.initial_state_strides = v.final_state_strides = {};
  const std::int64_t es = std::int64_t(size_of(p.dtype));
  const auto offset = [&](const Strides& s) { return std::int64_t(b) * s.batch + std::int64_t(first) * s.row; };
  const auto per_segment = [&](Strides s) { s.batch = std::int64_t(length) * s.row; return s; };
  const auto at = [&](const void* base, const Strides& s) { return static_cast<const char*>(base) + offset(s) * es; };
  v.q = at(p.q, p.q_strides), v.k = at(p.k, p.k_strides), v.v = at(p.v, p.v_strides), v.beta = at(p.beta, p.beta_strides);
  v.output = static_cast<char*>(p.output) + offset(p.output_strides) * es;
  if (p.log_gate != nullptr) v.log_gate = p.log_gate + offset(p.log_gate_strides);
  v.q_strides = per_segment(p.q_strides), v.k_strides = per_segment(p.k_strides), v.v_strides = per_segment(p.v_strides);
  v.beta_strides = per_segment(p.beta_strides), v.log_gate_strides = per_segment(p.log_gate_strides);
  v.output_strides = per_segment(p.output_strides);
  return v;
}

// Step 2's inputs and output for one sequence (b), packed fp32: [segment, head, rows, DK].
struct SegmentScan {
  const float* x = nullptr;           // [n, H, DV, DK]: X_r
  const float* transition = nullptr;  // [n, H, DK, DK]: P_r
  const float* s0 = nullptr;          // the user's S_0 (null: 0), sequence b's
  Strides s0_strides;
  float* incoming = nullptr;  // [n + 1, H, DV, DK]: S_in(r)
  int b = 0, segments = 0, heads = 0, value_dim = 0, key_dim = 0;  // segments: n
};

// Floats of ForwardIntermediates::segment_states, segment_transitions and segment_incoming (packed
// [B, segment, H, rows, DK], n = layout.folded segments summarised).
struct SegmentFloats {
  std::size_t states, transitions, incoming;
};
inline SegmentFloats segment_floats(const ForwardStageParams& p, const SegmentLayout& layout) {
  const std::size_t heads = std::size_t(p.batch) * p.heads, DK = p.key_dim, DV = p.value_dim, n = layout.folded;
  return {heads * n * DV * DK, heads * n * DK * DK, heads * (n + 1) * DV * DK};
}

constexpr int kSegmentScanThreads = 256, kSegmentScanRows = 16;  // a block: 16 state rows, one thread per key column and 8 rows
inline std::size_t segment_scan_shared_bytes(int key_dim) { return sizeof(float) * kSegmentScanRows * key_dim; }

struct InOrder {  // the segments' summaries composed first to last (a test plants the reverse)
  static constexpr bool reversed = false;
};

// grid (ceil(DV / 16), H), kSegmentScanThreads threads, segment_scan_shared_bytes(DK); DK ≤ kTcKeys.
template <class Order = InOrder>
__global__ void __launch_bounds__(kSegmentScanThreads) segment_scan_kernel(SegmentScan s) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* rows = reinterpret_cast<float*>(smem);  // [16][DK]: S_in(r)'s rows row0..row0 + 15
  const int h = blockIdx.y, row0 = blockIdx.x * kSegmentScanRows, DK = s.key_dim, DV = s.value_dim, H = s.heads;
  const int col = threadIdx.x % kTcKeys, first = (threadIdx.x / kTcKeys) * 8;  // this thread's rows first..first + 7
  const std::size_t state = std::size_t(DV) * DK;
  for (int e = threadIdx.x; e < kSegmentScanRows * DK; e += kSegmentScanThreads) {
    const int i = e / DK, c = e % DK, row = row0 + i;
    rows[e] = (s.s0 != nullptr && row < DV) ? s.s0[s.s0_strides.head_offset(s.b, h) + row * s.s0_strides.row + c] : 0.0f;
  }
  __syncthreads();
  for (int r = 0;; ++r) {
    float* in = s.incoming + (std::size_t(r) * H + h) * state;
    for (int i = 0; i < 8; ++i)
      if (row0 + first + i < DV && col < DK) in[(row0 + first + i) * DK + col] = rows[(first + i) * DK + col];
    if (r == s.segments) break;
    const int from = Order::reversed ? s.segments - 1 - r : r;
    const float* P = s.transition + (std::size_t(from) * H + h) * DK * DK;
    const float* X = s.x + (std::size_t(from) * H + h) * state;
    float acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = (row0 + first + i < DV && col < DK) ? X[(row0 + first + i) * DK + col] : 0.0f;
    if (col < DK)
      for (int k = 0; k < DK; ++k) {
        const float pk = P[k * DK + col];
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(rows[(first + i) * DK + k], pk, acc[i]);
      }
    __syncthreads();  // every thread has read S_in(r)
    if (col < DK)
      for (int i = 0; i < 8; ++i) rows[(first + i) * DK + col] = acc[i];
    __syncthreads();
  }
}

// Runs walked by the one launch of step 3: every run when all are of one length (the last one's final state then
// copied out), else all but the last, which takes a launch of its own.
inline int runs_walked_together(const SegmentLayout& layout) { return layout.tail == layout.length ? layout.folded + 1 : layout.folded; }

// Sequence b's final state, [H, DV, DK] packed, to the caller's strided final_state: one thread per entry.
struct StateCopy {
  const float* from = nullptr;
  float* to = nullptr;
  Strides to_strides;
  int b = 0, heads = 0, rows = 0, cols = 0;
};
constexpr int kStateCopyThreads = 256;
__global__ void __launch_bounds__(kStateCopyThreads) copy_state_kernel(StateCopy c) {
  const std::int64_t e = std::int64_t(blockIdx.x) * kStateCopyThreads + threadIdx.x, per = std::int64_t(c.rows) * c.cols;
  if (e >= c.heads * per) return;
  const int h = int(e / per), r = int(e % per / c.cols), col = int(e % c.cols);
  c.to[c.to_strides.head_offset(c.b, h) + r * c.to_strides.row + col] = c.from[e];
}

// The launches of one segmented forward, given by the caller (the GPU launcher or the CPU emulation):
//   resolve(p)                 p with W, U and the scores carved from p.workspace (delta_rule.cu's resolve)
//   prepare(p)                 stage 1
//   scan(p, Summary)           the register scan, one walk or a summary
//   segment_scan(SegmentScan)  step 2
//   copy_state(StateCopy)      copy_state_kernel
// p: validated, taking the register scan, `layout.folded` ≥ 1, its segment_* scratch given (segment_floats);
// `workspace` holds the resolved view of the runs walked together (run_workspace_view); `finals` H·(n + 1)·DV·DK
// floats, the final states of the runs walked together.
template <class Launches>
void run_segments(const ForwardStageParams& p, const SegmentLayout& layout, void* workspace, float* finals, Launches& launch) {
  const int H = p.heads, DK = p.key_dim, DV = p.value_dim, n = layout.folded, together = runs_walked_together(layout);
  const std::size_t state = std::size_t(DV) * DK, transition = std::size_t(DK) * DK;
  for (int b = 0; b < p.batch; ++b) {
    float* x = p.segment_states + std::size_t(b) * n * H * state;
    float* t = p.segment_transitions + std::size_t(b) * n * H * transition;
    float* incoming = p.segment_incoming + std::size_t(b) * (n + 1) * H * state;
    ForwardStageParams runs = segment_view(p, b, 0, together, layout.length);
    runs.workspace = workspace;
    runs = launch.resolve(runs);
    launch.prepare(runs);

    ForwardStageParams summary = runs;  // X_r over runs 0..n−1 (a prefix of the prepared runs): from 0, U read
    summary.batch = n;
    summary.final_state = x, summary.final_state_strides = contiguous(H, DV, DK);
    launch.scan(summary, Summary::state);
    summary.value_dim = DK;  // P_r: from I, U ≡ 0, DK state rows
    summary.final_state = t, summary.final_state_strides = contiguous(H, DK, DK);
    launch.scan(summary, Summary::transition);

    launch.segment_scan(SegmentScan{x, t, p.initial_state, p.initial_state_strides, incoming, b, n, H, DV, DK});

    runs.initial_state = incoming, runs.initial_state_strides = contiguous(H, DV, DK);
    runs.final_state = finals, runs.final_state_strides = contiguous(H, DV, DK);
    launch.scan(runs, Summary::none);
    if (together == n + 1) {
      launch.copy_state(StateCopy{finals + std::size_t(n) * H * state, p.final_state, p.final_state_strides, b, H, DV, DK});
      continue;
    }
    ForwardStageParams last = segment_view(p, b, n * layout.length, 1, layout.tail);
    last.initial_state = incoming + std::size_t(n) * H * state, last.initial_state_strides = contiguous(H, DV, DK);
    last.final_state = p.final_state + p.final_state_strides.head_offset(b, 0), last.final_state_strides = p.final_state_strides;
    last.workspace = workspace;
    last = launch.resolve(last);
    launch.prepare(last);
    launch.scan(last, Summary::none);
  }
}

}  // namespace deltaproof::cuda::DELTAPROOF_FORWARD_KERNELS
