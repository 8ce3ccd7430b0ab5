// The seeded linear-attention case every `deltaproof --op linear` command evaluates.
#pragma once

#include "reference/linear_attention.hpp"
#include "reference/random_inputs.hpp"
#include "tools/commands.hpp"

namespace deltaproof::tools {

struct LinearAttentionCase {
  ref::linear_attention::Inputs<ref::Exact> inputs;
  ref::linear_attention::Cotangents<ref::Exact> cotangents;
};

// Entries n/2^22 with |n| < 2^22: exact in float, double and ℚ, so all reference forms see the
// same inputs, and wide enough that float and double forms really round (bf16/fp16 kernels round
// them; the oracle then runs on the rounded values). S_0 and dS_L are always given.
inline LinearAttentionCase make_linear_attention_case(const CaseOptions& o) {
  ref::RandomDyadic random(o.seed);
  constexpr int scale = 1 << 22;
  auto draw = [&](ref::Index rows, ref::Index cols) { return random.matrix<ref::Exact>(rows, cols, scale - 1, scale); };
  LinearAttentionCase c;
  c.inputs.q = draw(o.length, o.key_dim);
  c.inputs.k = draw(o.length, o.key_dim);
  c.inputs.v = draw(o.length, o.value_dim);
  c.inputs.initial_state = draw(o.value_dim, o.key_dim);
  c.cotangents.d_output = draw(o.length, o.value_dim);
  c.cotangents.d_final_state = draw(o.value_dim, o.key_dim);
  return c;
}

}  // namespace deltaproof::tools
