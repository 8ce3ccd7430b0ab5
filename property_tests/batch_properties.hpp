// Batched forms against the single-sequence forms, for every family: a generated [B, H, L, D]
// batch, then every head of the batched result equal over ℚ to the form run on that head alone.
#pragma once

#include "property_tests/support/assertions.hpp"
#include "property_tests/support/delta_cases.hpp"
#include "property_tests/support/linear_attention_cases.hpp"
#include "reference/batch.hpp"

#include <rapidcheck.h>

namespace deltaproof::testing {

using ref::Tensor4;

// B heads of H, each one sequence of a generated shape.
struct BatchShape {
  Index batch = 1, heads = 1;
  Shape shape;
};

inline BatchShape gen_batch_shape(Index max_batch, Index max_heads, ShapeLimits limits) {
  BatchShape s;
  s.batch = *rc::gen::inRange<Index>(1, max_batch + 1);
  s.heads = *rc::gen::inRange<Index>(1, max_heads + 1);
  s.shape = *gen_shape(limits);
  return s;
}

// A [B, H, rows, cols] tensor of generated entries.
inline Tensor4<Exact> gen_tensor(Index batch, Index heads, Index rows, Index cols) {
  Tensor4<Exact> t(batch, heads, rows, cols);
  ref::for_each_head(batch, heads, [&](Index b, Index h) { t.set_head(b, h, *gen_matrix(rows, cols)); });
  return t;
}

// [B, H, L, 1] gates in every regime: p/8, 1, p/8192.
inline Tensor4<Exact> gen_gate_tensor(Index batch, Index heads, Index length) {
  Tensor4<Exact> t(batch, heads, length, 1);
  ref::for_each_head(batch, heads, [&](Index b, Index h) { t.set_head(b, h, Matrix<Exact>(*gen_gates(length, GateRegime::mixed))); });
  return t;
}

// A batch of BatchIn's family: q, k, v, its per-token gates (β, α), and S_0 where the shape has one.
template <class BatchIn>
BatchIn gen_batch(const BatchShape& s) {
  const Index B = s.batch, H = s.heads, L = s.shape.length, DK = s.shape.key_dim, DV = s.shape.value_dim;
  BatchIn in;
  in.q = gen_tensor(B, H, L, DK), in.k = gen_tensor(B, H, L, DK), in.v = gen_tensor(B, H, L, DV);
  if constexpr (requires { in.beta; }) in.beta = gen_gate_tensor(B, H, L);
  if constexpr (requires { in.alpha; }) in.alpha = gen_gate_tensor(B, H, L);
  if (s.shape.with_initial_state) in.initial_state = gen_tensor(B, H, DV, DK);
  return in;
}

// dO, and dS_L where the shape has S_0.
inline la::BatchCotangents<Exact> gen_batch_cotangents(const BatchShape& s) {
  const Index B = s.batch, H = s.heads, DK = s.shape.key_dim, DV = s.shape.value_dim;
  la::BatchCotangents<Exact> cot{gen_tensor(B, H, s.shape.length, DV), std::nullopt};
  if (s.shape.with_initial_state) cot.d_final_state = gen_tensor(B, H, DV, DK);
  return cot;
}

// The batched forward of BatchIn's family over its chunkwise form (the shape's C) on a generated
// batch: every head's output and final state equal the token recurrence on that head alone.
// Unqualified calls find the family's forms through its inputs (argument-dependent lookup).
template <class BatchIn>
void check_batched_equals_per_head(const BatchShape& s) {
  const BatchIn in = gen_batch<BatchIn>(s);
  const auto out = batched(in, [&](const auto& x) { return chunkwise(x, s.shape.chunk_size); });
  ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
    const auto single = token_recurrence(in.head(b, h));
    require_equal("batched output head", out.output.head(b, h), single.output);
    require_equal("batched final state head", out.final_state.head(b, h), single.final_state);
  });
}

// The batched backward over the chunkwise backward: every head's gradients (dq, dk, dv, dβ and dα
// where the family has them, dS_0) equal the token-recurrence backward on that head.
template <class BatchIn>
void check_batched_backward_equals_per_head(const BatchShape& s) {
  const BatchIn in = gen_batch<BatchIn>(s);
  const la::BatchCotangents<Exact> cot = gen_batch_cotangents(s);
  const auto out = batched_backward(in, cot, [&](const auto& x, const auto& d) { return chunkwise_backward(x, d, s.shape.chunk_size); });
  ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
    const auto single = token_recurrence_backward(in.head(b, h), cot.head(b, h));
    require_equal("batched dq", out.dq.head(b, h), single.dq);
    require_equal("batched dk", out.dk.head(b, h), single.dk);
    require_equal("batched dv", out.dv.head(b, h), single.dv);
    if constexpr (requires { out.d_beta; }) require_equal("batched dbeta", out.d_beta.head(b, h), Matrix<Exact>(single.d_beta));
    if constexpr (requires { out.d_alpha; }) require_equal("batched dalpha", out.d_alpha.head(b, h), Matrix<Exact>(single.d_alpha));
    require_equal("batched dS_0", out.d_initial_state.head(b, h), single.d_initial_state);
  });
}

}  // namespace deltaproof::testing
