// DeltaNet / Gated DeltaNet over segments (cuda::delta_rule::ForwardParams::segments, cuda/delta_rule_segments.cuh)
// against the one walk, step by step. Each step of the segmented forward is the one walk's arithmetic on its own
// inputs, or one fp32 product, so each is held to what is already derived:
//   * the summaries: run r's state summary X_r bit for bit the one walk's final state on run r from S = 0, and its
//     transition P_r the one walk's final state on run r with v = 0 (DK value rows) from S = I;
//   * the incoming states: S_in(0) = S_0 bit for bit; S_in(r + 1) against S_in(r) P_r + X_r on the kernel's own
//     values within γ_DK(2⁻²⁴)·(|S_in(r)| |P_r| + |X_r|) entrywise (fp32 FMA from X_r, DK products in key order);
//     and every S_in(r) against the oracle's tree_prefix_scan of the kernel's summaries applied to S_0 (High),
//     within that rounding carried through the chain (the composition order is the oracle's);
//   * the runs: every run's output, and the last run's final state, bit for bit the one walk's on that run from
//     its S_in;
// and every one walk named above is judged stage by stage (check_stages) against the oracle.
#pragma once

#include "kernel_checks/delta_rule_stages.hpp"

#include <functional>
#include <vector>

namespace deltaproof::verify::delta_rule {

// What a forward over segments writes, read back exactly: the output and final state, and the segment_*
// intermediates ([B, n·H, rows, DK]: run-major, then head, in each sequence; n summarised runs).
struct SegmentedResult {
  Tensor4<Exact> output, final_state, states, transitions, incoming;
};

// The one-walk forward with every intermediate (run_forward on a GPU; the CPU emulation's own run).
using OneWalk = std::function<ForwardResult(const DeltaCase&, const HostInputs&)>;

// One row per check above: "X", "P", "S_in", "S_in tree", "output", "final_state" (bit-for-bit rows: bound 0), then the stage
// rows of every one walk, the stage named after its walk ("X S_next", "P T", "run O", …), batch the sequence's.
std::vector<Comparison> check_segments(const DeltaCase& c, const HostInputs& in, int segments, const SegmentedResult& r,
                                       const OneWalk& one_walk);

// On the GPU: testing::forward with `segments` and the segment_* intermediates given (16-bit c, DK ≤ 128, DK and
// DV multiples of 8).
SegmentedResult run_segmented_forward(const DeltaCase& c, const HostInputs& in, int segments);

}  // namespace deltaproof::verify::delta_rule
