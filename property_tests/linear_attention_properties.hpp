// The linear-attention properties, as functions of a case, so that the planted-bug suite can
// run each of them against a broken form (a Policy other than Faithful).
#pragma once

#include "property_tests/support/assertions.hpp"
#include "property_tests/support/linear_attention_cases.hpp"

namespace deltaproof::testing {

// parallel masked == token recurrence == chunkwise, outputs and final state, exactly.
template <class Policy = la::Faithful>
void check_forward_forms_agree(const LinearAttentionCase& c) {
  const auto parallel = la::parallel_masked(c.inputs);
  const auto recurrent = la::token_recurrence(c.inputs);
  const auto chunked = la::chunkwise<Exact, Policy>(c.inputs, c.shape.chunk_size);
  require_equal("recurrent output vs parallel", recurrent.output, parallel.output);
  require_equal("recurrent final state vs parallel", recurrent.final_state, parallel.final_state);
  require_equal("chunkwise output vs parallel", chunked.output, parallel.output);
  require_equal("chunkwise final state vs parallel", chunked.final_state, parallel.final_state);
  // S_[c] is the recurrence's state after the tokens before chunk c.
  for (size_t c_index = 0; c_index < chunked.boundary_states.size(); ++c_index) {
    const Index before = static_cast<Index>(c_index) * c.shape.chunk_size;
    la::Inputs<Exact> prefix{c.inputs.q.topRows(before), c.inputs.k.topRows(before), c.inputs.v.topRows(before),
                             c.inputs.initial_state};
    require_equal("boundary state S_[" + std::to_string(c_index) + "]", chunked.boundary_states[c_index],
                  la::token_recurrence(prefix).final_state);
  }
}

// The three backward paths, each derived on its own, agree exactly.
template <class Policy = la::Faithful>
void check_backward_paths_agree(const LinearAttentionCase& c) {
  const auto parallel = la::parallel_masked_backward(c.inputs, c.cotangents);
  const auto recurrent = la::token_recurrence_backward(c.inputs, c.cotangents);
  const auto chunked = la::chunkwise_backward<Exact, Policy>(c.inputs, c.cotangents, c.shape.chunk_size);
  for (const auto& [name, g] : {std::pair{"recurrent", &recurrent}, std::pair{"chunkwise", &chunked}}) {
    const std::string n = name;
    require_equal(n + " dq vs parallel", g->dq, parallel.dq);
    require_equal(n + " dk vs parallel", g->dk, parallel.dk);
    require_equal(n + " dv vs parallel", g->dv, parallel.dv);
    require_equal(n + " dS_0 vs parallel", g->d_initial_state, parallel.d_initial_state);
  }
}

}  // namespace deltaproof::testing
