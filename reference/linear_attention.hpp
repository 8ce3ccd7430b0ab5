// Additive linear attention: every form of the derivation, forward and backward.
//
//   S_t = S_{t-1} + v_t k_tᵀ,   o_t = S_t q_t,   S ∈ R^{DV×DK} (value-by-key)
//
// Shapes for one (batch, head) sequence: q, k (L, DK); v, o (L, DV); states (DV, DK).
// Three forward forms (parallel masked, token recurrence, chunkwise) and three backward paths,
// each derived on its own, so that they can be checked equal over ℚ.
#pragma once

#include "reference/batch.hpp"
#include "reference/chunking.hpp"
#include "reference/exact_recurrence.hpp"
#include "reference/gradcheck.hpp"
#include "reference/scalar.hpp"
#include "reference/sequence_inputs.hpp"

#include <optional>
#include <vector>

namespace deltaproof::ref::linear_attention {

// q, k, v (sequence_inputs.hpp) and S_0.
template <class Scalar>
struct Inputs : SequenceInputs<Scalar, Inputs<Scalar>> {
  std::optional<Matrix<Scalar>> initial_state;  // (DV, DK); absent means S_0 = 0
};

template <class Scalar>
struct Forward {
  Matrix<Scalar> output;       // (L, DV)
  Matrix<Scalar> final_state;  // (DV, DK)
};

template <class Scalar>
struct ChunkwiseForward : Forward<Scalar> {
  std::vector<Matrix<Scalar>> boundary_states;  // S_[c], the state before chunk c, each (DV, DK)
};

// Incoming gradients: on the output and (optionally) on the final state.
template <class Scalar>
struct Cotangents {
  Matrix<Scalar> d_output;                        // (L, DV)
  std::optional<Matrix<Scalar>> d_final_state;    // (DV, DK); absent means 0
};

template <class Scalar>
struct Gradients {
  Matrix<Scalar> dq, dk, dv;      // (L, DK), (L, DK), (L, DV)
  Matrix<Scalar> d_initial_state;  // (DV, DK): dS_0, also when S_0 was absent (then at S_0 = 0)
};

// Seams through which planted-bug tests run a broken chunkwise form; the default is faithful.
struct Faithful {
  static bool in_causal_mask(Index i, Index j) { return j <= i; }
  static bool keeps_chunk(const Chunk&, Index /*chunk_size*/) { return true; }
  static constexpr bool reads_initial_state = true;
};

template <class Scalar, class Policy = Faithful>
Matrix<Scalar> chunk_mask(Index n) {
  Matrix<Scalar> m = Matrix<Scalar>::Zero(n, n);
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < n; ++j)
      if (Policy::in_causal_mask(i, j)) m(i, j) = Scalar(1);
  return m;
}

// ---------------------------------------------------------------------------------------
// Forward forms

// O = Q S_0ᵀ + (Q Kᵀ ⊙ M) V,   S_L = S_0 + Vᵀ K
template <class Scalar>
Forward<Scalar> parallel_masked(const Inputs<Scalar>& in) {
  in.validate();
  const Matrix<Scalar> s0 = in.initial_state_or_zero();                                // (DV, DK)
  const Matrix<Scalar> scores = (in.q * in.k.transpose()).cwiseProduct(causal_mask<Scalar>(in.length()));  // (L, L)
  Forward<Scalar> out;
  out.output = in.q * s0.transpose() + scores * in.v;  // (L, DV)
  out.final_state = s0 + in.v.transpose() * in.k;      // (DV, DK)
  return out;
}

// S_t = S_{t-1} + v_t k_tᵀ,   o_t = S_t q_t   (over ℚ by default on integers, exact_recurrence.hpp)
template <class Scalar, class Evaluation = OnIntegers>
Forward<Scalar> token_recurrence(const Inputs<Scalar>& in) {
  in.validate();
  if constexpr (is_exact_v<Scalar> && Evaluation::on_integers) {
    Forward<Scalar> out;
    exact::run({in.q, in.k, in.v, nullptr, nullptr, false, in.initial_state}, out.output, out.final_state);
    return out;
  }
  Matrix<Scalar> state = in.initial_state_or_zero();  // (DV, DK)
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t) {
    state += in.v.row(t).transpose() * in.k.row(t);                  // (DV, DK)
    out.output.row(t) = (state * in.q.row(t).transpose()).transpose();  // (1, DV)
  }
  out.final_state = state;
  return out;
}

// Equation 4 of the derivation: scan S_[c+1] = S_[c] + V_[c]ᵀ K_[c], then per chunk
// O_[c] = Q_[c] S_[c]ᵀ + (Q_[c] K_[c]ᵀ ⊙ M_C) V_[c].
template <class Scalar, class Policy = Faithful>
ChunkwiseForward<Scalar> chunkwise(const Inputs<Scalar>& in, Index chunk_size) {
  in.validate();
  ChunkwiseForward<Scalar> out;
  out.output = Matrix<Scalar>::Zero(in.length(), in.value_dim());
  Matrix<Scalar> state = Policy::reads_initial_state ? in.initial_state_or_zero()
                                                     : Matrix<Scalar>::Zero(in.value_dim(), in.key_dim());
  for (const Chunk& c : chunks_of(in.length(), chunk_size)) {
    if (!Policy::keeps_chunk(c, chunk_size)) continue;
    const auto [q, k, v] = in.rows(c);  // (C, DK), (C, DK), (C, DV)
    out.boundary_states.push_back(state);
    const Matrix<Scalar> scores = (q * k.transpose()).cwiseProduct(chunk_mask<Scalar, Policy>(c.size));  // (C, C)
    out.output.middleRows(c.begin, c.size) = q * state.transpose() + scores * v;                      // (C, DV)
    state += v.transpose() * k;                                                                          // (DV, DK)
  }
  out.final_state = state;
  return out;
}

// ---------------------------------------------------------------------------------------
// Backward paths. Each returns dL for L = <dO, O> + <dS_L, S_L>.

// From O = Q S_0ᵀ + P V with P = Q Kᵀ ⊙ M and S_L = S_0 + Vᵀ K:
//   dQ = dO S_0 + (dO Vᵀ ⊙ M) K,  dK = (dO Vᵀ ⊙ M)ᵀ Q + V dS_L,
//   dV = Pᵀ dO + K dS_Lᵀ,          dS_0 = dOᵀ Q + dS_L
template <class Scalar>
Gradients<Scalar> parallel_masked_backward(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot) {
  in.validate();
  const Matrix<Scalar> s0 = in.initial_state_or_zero();  // (DV, DK)
  const Matrix<Scalar> d_final = cot.d_final_state ? *cot.d_final_state
                                                   : Matrix<Scalar>::Zero(in.value_dim(), in.key_dim());
  const Matrix<Scalar> mask = causal_mask<Scalar>(in.length());             // (L, L)
  const Matrix<Scalar> scores = (in.q * in.k.transpose()).cwiseProduct(mask);  // (L, L)
  const Matrix<Scalar> d_scores = (cot.d_output * in.v.transpose()).cwiseProduct(mask);  // (L, L)
  Gradients<Scalar> g;
  g.dq = cot.d_output * s0 + d_scores * in.k;                      // (L, DK)
  g.dk = d_scores.transpose() * in.q + in.v * d_final;             // (L, DK)
  g.dv = scores.transpose() * cot.d_output + in.k * d_final.transpose();  // (L, DV)
  g.d_initial_state = cot.d_output.transpose() * in.q + d_final;  // (DV, DK)
  return g;
}

// Reverse sweep of the recurrence with G = dL/dS_t:
//   G ← G + do_t q_tᵀ,  dq_t = S_tᵀ do_t,  dv_t = G k_t,  dk_t = Gᵀ v_t,  and dS_0 = G at the end.
template <class Scalar>
Gradients<Scalar> token_recurrence_backward(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot) {
  in.validate();
  const Index L = in.length();
  std::vector<Matrix<Scalar>> states;  // S_1 .. S_L, each (DV, DK)
  Matrix<Scalar> state = in.initial_state_or_zero();
  for (Index t = 0; t < L; ++t) {
    state += in.v.row(t).transpose() * in.k.row(t);
    states.push_back(state);
  }
  Matrix<Scalar> grad = cot.d_final_state ? *cot.d_final_state
                                          : Matrix<Scalar>::Zero(in.value_dim(), in.key_dim());  // (DV, DK)
  Gradients<Scalar> g;
  g.dq.resize(L, in.key_dim());
  g.dk.resize(L, in.key_dim());
  g.dv.resize(L, in.value_dim());
  for (Index t = L - 1; t >= 0; --t) {
    const auto d_out = cot.d_output.row(t).transpose();  // (DV, 1)
    grad += d_out * in.q.row(t);                         // (DV, DK)
    g.dq.row(t) = (states[t].transpose() * d_out).transpose();
    g.dv.row(t) = (grad * in.k.row(t).transpose()).transpose();
    g.dk.row(t) = (grad.transpose() * in.v.row(t).transpose()).transpose();
  }
  g.d_initial_state = grad;
  return g;
}

// Reverse scan of boundary-state gradients G_[c] = G_[c+1] + dO_[c]ᵀ Q_[c] (G_[N] = dS_L), then
// per chunk with E = dO Vᵀ ⊙ M_C:
//   dQ = dO S_[c] + E K,  dK = Eᵀ Q + V G_[c+1],  dV = (Q Kᵀ ⊙ M_C)ᵀ dO + K G_[c+1]ᵀ,  dS_0 = G_[0]
template <class Scalar, class Policy = Faithful>
Gradients<Scalar> chunkwise_backward(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot, Index chunk_size) {
  const ChunkwiseForward<Scalar> fwd = chunkwise<Scalar, Policy>(in, chunk_size);
  std::vector<Chunk> chunks;
  for (const Chunk& c : chunks_of(in.length(), chunk_size))
    if (Policy::keeps_chunk(c, chunk_size)) chunks.push_back(c);
  const Index n = static_cast<Index>(chunks.size());

  std::vector<Matrix<Scalar>> after(n + 1);  // after[c] = G_[c+1], the gradient on the state after chunk c
  Matrix<Scalar> grad = cot.d_final_state ? *cot.d_final_state
                                          : Matrix<Scalar>::Zero(in.value_dim(), in.key_dim());  // (DV, DK)
  for (Index c = n - 1; c >= 0; --c) {
    after[c] = grad;
    grad += cot.d_output.middleRows(chunks[c].begin, chunks[c].size).transpose() *
            in.q.middleRows(chunks[c].begin, chunks[c].size);
  }

  Gradients<Scalar> g;
  g.dq = Matrix<Scalar>::Zero(in.length(), in.key_dim());
  g.dk = Matrix<Scalar>::Zero(in.length(), in.key_dim());
  g.dv = Matrix<Scalar>::Zero(in.length(), in.value_dim());
  for (Index c = 0; c < n; ++c) {
    const Chunk& ch = chunks[c];
    const auto [q, k, v] = in.rows(ch);                              // (C, DK), (C, DK), (C, DV)
    const auto d_out = cot.d_output.middleRows(ch.begin, ch.size);   // (C, DV)
    const Matrix<Scalar> mask = chunk_mask<Scalar, Policy>(ch.size);  // (C, C)
    const Matrix<Scalar> d_scores = (d_out * v.transpose()).cwiseProduct(mask);  // E, (C, C)
    const Matrix<Scalar> scores = (q * k.transpose()).cwiseProduct(mask);        // (C, C)
    g.dq.middleRows(ch.begin, ch.size) = d_out * fwd.boundary_states[c] + d_scores * k;
    g.dk.middleRows(ch.begin, ch.size) = d_scores.transpose() * q + v * after[c];
    g.dv.middleRows(ch.begin, ch.size) = scores.transpose() * d_out + k * after[c].transpose();
  }
  g.d_initial_state = Policy::reads_initial_state ? grad : Matrix<Scalar>::Zero(in.value_dim(), in.key_dim());
  return g;
}

// ---------------------------------------------------------------------------------------
// Dispatch by form, conversions, and the pairing that the backward paths differentiate.

enum class Form { parallel, recurrent, chunkwise };

template <class Scalar>
Forward<Scalar> forward(Form form, const Inputs<Scalar>& in, Index chunk_size) {
  if (form == Form::parallel) return parallel_masked(in);
  if (form == Form::recurrent) return token_recurrence(in);
  return chunkwise(in, chunk_size);
}

template <class Scalar>
Gradients<Scalar> backward(Form form, const Inputs<Scalar>& in, const Cotangents<Scalar>& cot, Index chunk_size) {
  if (form == Form::parallel) return parallel_masked_backward(in, cot);
  if (form == Form::recurrent) return token_recurrence_backward(in, cot);
  return chunkwise_backward(in, cot, chunk_size);
}

template <class To, class From>
Inputs<To> cast(const Inputs<From>& in) {
  Inputs<To> out{matrix_cast<To>(in.q), matrix_cast<To>(in.k), matrix_cast<To>(in.v), std::nullopt};
  if (in.initial_state) out.initial_state = matrix_cast<To>(*in.initial_state);
  return out;
}

template <class To, class From>
Cotangents<To> cast(const Cotangents<From>& cot) {
  Cotangents<To> out{matrix_cast<To>(cot.d_output), std::nullopt};
  if (cot.d_final_state) out.d_final_state = matrix_cast<To>(*cot.d_final_state);
  return out;
}

// L = <dO, O> + <dS_L, S_L>: the scalar whose gradient every backward path returns.
template <class Scalar>
Scalar pairing(const Forward<Scalar>& out, const Cotangents<Scalar>& cot) {
  Scalar value = frobenius_inner(cot.d_output, out.output);
  if (cot.d_final_state) value += frobenius_inner(*cot.d_final_state, out.final_state);
  return value;
}

// The differentiable inputs as a named list (q, k, v, and S_0 when given), and back.
template <class Scalar>
Params<Scalar> params_of(const Inputs<Scalar>& in) {
  Params<Scalar> p{{"q", in.q}, {"k", in.k}, {"v", in.v}};
  if (in.initial_state) p.push_back({"S_0", *in.initial_state});
  return p;
}

template <class Scalar>
Inputs<Scalar> inputs_of(const Params<Scalar>& p) {
  Inputs<Scalar> in{p.at(0).value, p.at(1).value, p.at(2).value, std::nullopt};
  if (p.size() > 3) in.initial_state = p[3].value;
  return in;
}

template <class Scalar>
Params<Scalar> params_of(const Gradients<Scalar>& g, bool with_initial_state) {
  Params<Scalar> p{{"q", g.dq}, {"k", g.dk}, {"v", g.dv}};
  if (with_initial_state) p.push_back({"S_0", g.d_initial_state});
  return p;
}

// The loss t ↦ L(x) of one form as a callable generic in the scalar (for gradcheck.hpp): the
// cotangents are held exactly and converted to the scalar of each call.
template <class Exactly>
auto loss_of(Form form, Index chunk_size, const Cotangents<Exactly>& cot) {
  return [form, chunk_size, cot](const auto& params) {
    using T = typename std::decay_t<decltype(params[0].value)>::Scalar;
    return pairing(forward(form, inputs_of(params), chunk_size), cast<T>(cot));
  };
}

// ---------------------------------------------------------------------------------------
// Rounding-error bounds (the design page's numerical policy).
//
// Every entry of o, S_L and of each gradient is a sum of products of inputs with coefficient +1,
// so Σ|terms| is the same form evaluated on |inputs|. Any of the forms above, in a floating
// type with unit roundoff u, accumulates at most m = L + DK + DV + 4 roundings on each term
// (one per product, one per addition along the longest chain: a DK- or DV-long dot product,
// an L-long sum over tokens, and the few adds that join partial results). Hence, elementwise,
//   |computed − exact| <= γ_m · form(|inputs|),   γ_m = m·u / (1 − m·u)   (Higham, Thm 3.1).

inline Index rounding_depth(Index length, Index key_dim, Index value_dim) { return length + key_dim + value_dim + 4; }

template <class Scalar>
Inputs<Scalar> absolute(const Inputs<Scalar>& in) {
  Inputs<Scalar> a{in.q.cwiseAbs(), in.k.cwiseAbs(), in.v.cwiseAbs(), std::nullopt};
  if (in.initial_state) a.initial_state = in.initial_state->cwiseAbs();
  return a;
}

template <class Scalar>
Cotangents<Scalar> absolute(const Cotangents<Scalar>& cot) {
  Cotangents<Scalar> a{cot.d_output.cwiseAbs(), std::nullopt};
  if (cot.d_final_state) a.d_final_state = cot.d_final_state->cwiseAbs();
  return a;
}

// Σ|terms| of each output entry: (|Q| |S_0|ᵀ + (|Q||K|ᵀ ⊙ M)|V|, |S_0| + |V|ᵀ|K|).
template <class Scalar>
Forward<Scalar> forward_magnitude(const Inputs<Scalar>& in) {
  return parallel_masked(absolute(in));
}

// Σ|terms| of each gradient entry.
template <class Scalar>
Gradients<Scalar> backward_magnitude(const Inputs<Scalar>& in, const Cotangents<Scalar>& cot) {
  return parallel_masked_backward(absolute(in), absolute(cot));
}

// ---------------------------------------------------------------------------------------
// [B, H, L, D] batches: each head is an independent sequence. The batched forms serve DeltaNet
// and Gated DeltaNet too: their BatchInputs give their heads' Inputs, their BatchGradients add β, α.

template <class Scalar>
struct BatchInputs : BatchSequenceInputs<Scalar, BatchInputs<Scalar>> {
  std::optional<Tensor4<Scalar>> initial_state;  // [B, H, DV, DK]

  Inputs<Scalar> head(Index b, Index h) const { return this->template head_inputs<Inputs<Scalar>>(b, h); }
};

template <class Scalar>
struct BatchForward {
  Tensor4<Scalar> output;       // [B, H, L, DV]
  Tensor4<Scalar> final_state;  // [B, H, DV, DK]

  void set_head(Index b, Index h, const Forward<Scalar>& f) {
    output.set_head(b, h, f.output);
    final_state.set_head(b, h, f.final_state);
  }
};

// Applies a single-sequence forward form (parallel_masked, token_recurrence, or chunkwise with
// its chunk size bound) to every head of a batch of any family.
template <class Scalar, template <class> class BatchIn, class Form>
BatchForward<Scalar> batched(const BatchIn<Scalar>& in, Form&& form) {
  in.validate();
  const Index B = in.q.batch, H = in.q.heads, L = in.q.rows, DK = in.q.cols, DV = in.v.cols;
  BatchForward<Scalar> zero{Tensor4<Scalar>(B, H, L, DV), Tensor4<Scalar>(B, H, DV, DK)};
  return for_every_head(std::move(zero), in, [&](Index b, Index h) { return form(in.head(b, h)); });
}

template <class Scalar>
struct BatchCotangents {
  Tensor4<Scalar> d_output;                      // [B, H, L, DV]
  std::optional<Tensor4<Scalar>> d_final_state;  // [B, H, DV, DK]

  // dO shaped like the batch's output, dS_L like its final state.
  template <class BatchIn>
  void validate(const BatchIn& in) const {
    const Index B = in.q.batch, H = in.q.heads, L = in.q.rows, DK = in.q.cols, DV = in.v.cols;
    require(has_shape(d_output, B, H, L, DV), "d_output must be [B, H, L, DV]");
    require(!d_final_state || has_shape(*d_final_state, B, H, DV, DK), "d_final_state must be [B, H, DV, DK]");
  }
  Cotangents<Scalar> head(Index b, Index h) const {
    Cotangents<Scalar> cot{d_output.head(b, h), std::nullopt};
    if (d_final_state) cot.d_final_state = d_final_state->head(b, h);
    return cot;
  }
};

template <class Scalar>
struct BatchGradients {
  Tensor4<Scalar> dq, dk, dv;       // [B, H, L, DK], [B, H, L, DK], [B, H, L, DV]
  Tensor4<Scalar> d_initial_state;  // [B, H, DV, DK]

  // Zeros shaped like the batch's q, k, v and state (dS_0 also when S_0 is absent).
  template <class BatchIn>
  static BatchGradients zeros_like(const BatchIn& in) {
    const Index B = in.q.batch, H = in.q.heads, L = in.q.rows, DK = in.q.cols, DV = in.v.cols;
    return {Tensor4<Scalar>(B, H, L, DK), Tensor4<Scalar>(B, H, L, DK), Tensor4<Scalar>(B, H, L, DV),
            Tensor4<Scalar>(B, H, DV, DK)};
  }
  template <class HeadGradients>
  void set_head(Index b, Index h, const HeadGradients& g) {
    dq.set_head(b, h, g.dq);
    dk.set_head(b, h, g.dk);
    dv.set_head(b, h, g.dv);
    d_initial_state.set_head(b, h, g.d_initial_state);
  }
};

// Applies a single-sequence backward path to every head of a batch of any family, into `zero`
// (that family's BatchGradients::zeros_like(in)).
template <class BatchGrads, class BatchIn, class Scalar, class Backward>
BatchGrads backward_every_head(BatchGrads zero, const BatchIn& in, const BatchCotangents<Scalar>& cot, Backward&& backward) {
  in.validate();
  cot.validate(in);
  return for_every_head(std::move(zero), in, [&](Index b, Index h) { return backward(in.head(b, h), cot.head(b, h)); });
}

template <class Scalar, class Backward>
BatchGradients<Scalar> batched_backward(const BatchInputs<Scalar>& in, const BatchCotangents<Scalar>& cot,
                                        Backward&& backward) {
  return backward_every_head(BatchGradients<Scalar>::zeros_like(in), in, cot, backward);
}

}  // namespace deltaproof::ref::linear_attention
