// DeltaNet / Gated DeltaNet entry points (cuda/delta_rule.h: forward, backward, decode) on tensors
// laid out with strides: fla's token-major [B, T, H, D] viewed as [B, H, T, D], rows padded, a
// misaligned base. Every result must be bit for bit that of the same entries packed: the kernels
// read and write through the strides and compute nothing differently. Where the strides deny the
// register scan its 16-byte rows (odd padding), both sides run the fallback scan: the packed copy
// is then placed one element off 16 bytes, which sends it to the fallback too.
#include "cuda/delta_rule.h"
#include "property_tests/support/gpu.hpp"
#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "kernel_checks/delta_rule_stages.hpp"
#include "kernel_checks/device_tensors.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace {

using namespace deltaproof;
using namespace deltaproof::testing;
using namespace deltaproof::verify::delta_rule;
using cuda::DType;
using cuda::Strides;
using ref::Index;
namespace dt = deltaproof::verify;
namespace kdr = deltaproof::cuda::delta_rule;

enum class Layout { token_major, padded_rows, odd_padding };

const char* name_of(Layout l) {
  return l == Layout::token_major ? "token-major [B, T, H, D]" : l == Layout::padded_rows ? "rows padded by 8" : "rows padded by 1";
}

// The strides of a [B, H, rows, cols] user tensor in this layout (per-token vectors: cols = 1).
// Token-major applies to per-token tensors; states (rows = DV) get padded rows in every layout.
Strides layout_of(Layout l, Index heads, Index rows, Index cols, bool per_token) {
  if (l == Layout::token_major && per_token) return token_major(heads, rows, cols);
  return padded_rows(heads, rows, cols, l == Layout::odd_padding ? 1 : 8);
}

// A strided copy of a packed tensor, and the packed tensor itself as a run sees it: in place, or (for
// odd padding) copied one element off 16-byte alignment, so that both runs take the same scan.
struct Pair {
  StridedTensor strided, packed;
};
Pair pair_of(const dt::DeviceTensor& t, Layout l, bool per_token) {
  const Index H = t.heads, R = t.rows, C = t.cols;
  return {strided_copy(t, layout_of(l, H, R, C, per_token)),
          strided_copy(t, cuda::contiguous(int(H), int(R), int(C)), l == Layout::odd_padding ? 1 : 0)};
}
Pair empty_pair(DType dtype, Index B, Index H, Index rows, Index cols, Layout l, bool per_token) {
  return {strided(dtype, B, H, rows, cols, layout_of(l, H, rows, cols, per_token)),
          strided(dtype, B, H, rows, cols, cuda::contiguous(int(H), int(rows), int(cols)), l == Layout::odd_padding ? 1 : 0)};
}

// Which of a pair a run reads and writes; bind points a params field and its strides at it.
enum class Side { strided, packed };
template <class Pointer>
void bind(const Pair& t, Side side, Pointer& pointer, Strides& strides) {
  const StridedTensor& x = side == Side::strided ? t.strided : t.packed;
  pointer = static_cast<Pointer>(x.data());
  strides = x.strides;
}

void expect_same_entries(const Pair& p, const std::string& tensor, const std::string& what) {
  EXPECT_TRUE(p.strided.packed_bytes() == p.packed.packed_bytes()) << what << ": " << tensor << " differs";
}

struct Shape {
  DType dtype;
  Index key_dim, value_dim, chunk;
  bool gated;
  Layout layout;
};

// bf16 DK = DV = 64: the register scan on both sides (token-major, and padding by 8); odd padding:
// the fallback on both; fp32 and DK = 60: the fallback wherever.
const Shape kShapes[] = {
    {DType::bf16, 64, 64, 64, true, Layout::token_major},  {DType::bf16, 64, 64, 32, false, Layout::padded_rows},
    {DType::bf16, 64, 64, 16, true, Layout::odd_padding},  {DType::f32, 40, 24, 16, true, Layout::token_major},
    {DType::bf16, 60, 36, 32, true, Layout::odd_padding},  {DType::f16, 32, 48, 64, false, Layout::token_major},
};

DeltaCase case_of(const Shape& s) {
  DeltaCase c;
  c.dtype = s.dtype, c.batch = 2, c.heads = 3, c.length = 77, c.key_dim = s.key_dim, c.value_dim = s.value_dim;
  c.chunk = s.chunk, c.gated = s.gated, c.with_initial_state = true, c.seed = 1400 + s.key_dim + s.chunk;
  return c;
}

std::string describe(const Shape& s, const DeltaCase& c) { return verify::delta_rule::describe(c) + ", " + name_of(s.layout); }

TEST(DeltaRuleStridesGpu, ForwardOnStridedTensorsEqualsPackedBitwise) {
  DELTAPROOF_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    const DeltaCase c = case_of(s);
    const DeviceInputs in = upload_inputs(c, make_inputs(c));
    const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim;
    const Pair q = pair_of(in.q.device, s.layout, true), k = pair_of(in.k.device, s.layout, true);
    const Pair v = pair_of(in.v.device, s.layout, true), beta = pair_of(in.beta.device, s.layout, true);
    const Pair g = pair_of(in.log_gate.device, s.layout, true), s0 = pair_of(in.initial_state.device, s.layout, false);
    const Pair out = empty_pair(c.dtype, B, H, L, DV, s.layout, true), fin = empty_pair(DType::f32, B, H, DV, DK, s.layout, false);
    for (Side side : {Side::strided, Side::packed}) {
      kdr::ForwardParams p;
      p.dtype = c.dtype, p.batch = int(B), p.heads = int(H), p.length = int(L), p.key_dim = int(DK), p.value_dim = int(DV);
      p.chunk_size = int(c.chunk);
      bind(q, side, p.q, p.q_strides), bind(k, side, p.k, p.k_strides), bind(v, side, p.v, p.v_strides);
      bind(beta, side, p.beta, p.beta_strides), bind(s0, side, p.initial_state, p.initial_state_strides);
      if (c.gated) bind(g, side, p.log_gate, p.log_gate_strides);
      bind(out, side, p.output, p.output_strides), bind(fin, side, p.final_state, p.final_state_strides);
      dt::DeviceBuffer workspace(kdr::workspace_bytes(p));
      p.workspace = workspace.get();
      kdr::forward(p);
      cuda::check(cudaDeviceSynchronize(), "forward");
    }
    expect_same_entries(out, "output", describe(s, c));
    expect_same_entries(fin, "final_state", describe(s, c));
  }
}

TEST(DeltaRuleStridesGpu, DecodeOnStridedTensorsEqualsPackedBitwise) {
  DELTAPROOF_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    DeltaCase c = case_of(s);
    c.length = 5;  // decode tokens
    const DeviceInputs in = upload_inputs(c, make_inputs(c));
    const Index B = c.batch, H = c.heads, T = c.length, DK = c.key_dim, DV = c.value_dim;
    const Pair q = pair_of(in.q.device, s.layout, true), k = pair_of(in.k.device, s.layout, true);
    const Pair v = pair_of(in.v.device, s.layout, true), beta = pair_of(in.beta.device, s.layout, true);
    const Pair g = pair_of(in.log_gate.device, s.layout, true);
    const Pair state = pair_of(in.initial_state.device, s.layout, false);  // updated in place
    const Pair out = empty_pair(c.dtype, B, H, T, DV, s.layout, true);
    for (Side side : {Side::strided, Side::packed}) {
      kdr::DecodeParams p;
      p.dtype = c.dtype, p.batch = int(B), p.heads = int(H), p.tokens = int(T), p.key_dim = int(DK), p.value_dim = int(DV);
      bind(q, side, p.q, p.q_strides), bind(k, side, p.k, p.k_strides), bind(v, side, p.v, p.v_strides);
      bind(beta, side, p.beta, p.beta_strides);
      if (c.gated) bind(g, side, p.log_gate, p.log_gate_strides);
      bind(state, side, p.initial_state, p.initial_state_strides), bind(state, side, p.final_state, p.final_state_strides);
      bind(out, side, p.output, p.output_strides);
      kdr::decode(p);
      cuda::check(cudaDeviceSynchronize(), "decode");
    }
    expect_same_entries(out, "output", describe(s, c));
    expect_same_entries(state, "state (in place)", describe(s, c));
  }
}

TEST(DeltaRuleStridesGpu, BackwardOnStridedTensorsEqualsPackedBitwise) {
  DELTAPROOF_REQUIRE_GPU();
  for (const Shape& shape : kShapes) {
    Shape s = shape;
    for (DType dtype : {s.dtype, DType::f64}) {  // and the fp64 backward
      s.dtype = dtype;
      const DeltaCase c = case_of(s);
      const HostInputs host = make_inputs(c);
      const BackwardDeviceInputs in = upload_backward_inputs(c, host, make_cotangents(c));
      const DType acc = accumulator_dtype(c.dtype);
      const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim;
      const Pair q = pair_of(in.q.device, s.layout, true), k = pair_of(in.k.device, s.layout, true);
      const Pair v = pair_of(in.v.device, s.layout, true), beta = pair_of(in.beta.device, s.layout, true);
      const Pair g = pair_of(in.log_gate.device, s.layout, true), s0 = pair_of(in.initial_state.device, s.layout, false);
      const Pair d_out = pair_of(in.d_output.device, s.layout, true);
      const Pair d_final = pair_of(in.d_final_state.device, s.layout, false);
      const Pair dq = empty_pair(c.dtype, B, H, L, DK, s.layout, true), dk = empty_pair(c.dtype, B, H, L, DK, s.layout, true);
      const Pair dv = empty_pair(c.dtype, B, H, L, DV, s.layout, true), d_beta = empty_pair(c.dtype, B, H, L, 1, s.layout, true);
      const Pair dg = empty_pair(acc, B, H, L, 1, s.layout, true), d_s0 = empty_pair(acc, B, H, DV, DK, s.layout, false);
      for (Side side : {Side::strided, Side::packed}) {
        kdr::BackwardParams p;
        p.dtype = c.dtype, p.batch = int(B), p.heads = int(H), p.length = int(L), p.key_dim = int(DK), p.value_dim = int(DV);
        p.chunk_size = int(c.chunk);
        bind(q, side, p.q, p.q_strides), bind(k, side, p.k, p.k_strides), bind(v, side, p.v, p.v_strides);
        bind(beta, side, p.beta, p.beta_strides), bind(s0, side, p.initial_state, p.initial_state_strides);
        bind(d_out, side, p.d_output, p.d_output_strides), bind(d_final, side, p.d_final_state, p.d_final_state_strides);
        bind(dq, side, p.dq, p.dq_strides), bind(dk, side, p.dk, p.dk_strides), bind(dv, side, p.dv, p.dv_strides);
        bind(d_beta, side, p.d_beta, p.d_beta_strides), bind(d_s0, side, p.d_initial_state, p.d_initial_state_strides);
        if (c.gated) bind(g, side, p.log_gate, p.log_gate_strides), bind(dg, side, p.d_log_gate, p.d_log_gate_strides);
        dt::DeviceBuffer workspace(kdr::workspace_bytes(p));
        p.workspace = workspace.get();
        kdr::backward(p);
        cuda::check(cudaDeviceSynchronize(), "backward");
      }
      for (auto [t, name] : {std::pair{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}, {&d_beta, "d_beta"}, {&d_s0, "d_initial_state"}})
        expect_same_entries(*t, name, describe(s, c));
      if (c.gated) expect_same_entries(dg, "d_log_gate", describe(s, c));
    }
  }
}

}  // namespace
