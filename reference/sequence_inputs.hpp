// What the inputs of every family share: one (batch, head) sequence of queries, keys and values,
// the dimensions read off them, the optional initial state, and the checks that name a bad shape.
//
//   q, k (L, DK);  v (L, DV);  per-token coefficients β, α, g = ln α, η (L);  S_0 (DV, DK)
//
// A family's Inputs derives from SequenceInputs<Scalar, Inputs> and adds its per-token
// coefficients (listed by per_token() for the length check) and its initial state. The base holds
// q, k, v, so aggregate initialization stays flat: Inputs{q, k, v, beta, initial_state}.
#pragma once

#include "reference/chunking.hpp"
#include "reference/scalar.hpp"

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace deltaproof::ref {

// A per-token coefficient as the length check sees it.
struct PerToken {
  std::string name;
  Index size;
};

template <class Scalar, class Derived>
struct SequenceInputs {
  Matrix<Scalar> q, k, v;  // (L, DK), (L, DK), (L, DV)

  Index length() const { return q.rows(); }
  Index key_dim() const { return q.cols(); }
  Index value_dim() const { return v.cols(); }

  // q, k, v of one chunk's tokens [begin, begin + size): views (C, DK), (C, DK), (C, DV).
  auto rows(const Chunk& c) const {
    return std::tuple{q.middleRows(c.begin, c.size), k.middleRows(c.begin, c.size), v.middleRows(c.begin, c.size)};
  }

  // The per-token coefficients to check (Derived lists its own).
  std::vector<PerToken> per_token() const { return {}; }

  // S_0, or the zero state when it is absent: (DV, DK), or (DV, state_cols) where the state is
  // not key-by-value (TTT's weights on DF features).
  Matrix<Scalar> initial_state_or_zero(Index state_cols) const {
    const auto& s0 = derived().initial_state;
    return s0 ? *s0 : Matrix<Scalar>::Zero(value_dim(), state_cols);
  }
  Matrix<Scalar> initial_state_or_zero() const { return initial_state_or_zero(key_dim()); }

  // q, k, v of one length L, q and k of one key dim DK, and every per-token coefficient of length L.
  void validate_tokens() const {
    require(k.rows() == q.rows() && v.rows() == q.rows(), "q, k, v must have the same length L");
    require(k.cols() == q.cols(), "q and k must have the same key dim DK");
    for (const PerToken& c : derived().per_token())
      require(c.size == length(), c.name + " must have one entry per token (length L)");
  }
  // The tokens, and S_0 absent or (DV, state_cols); `state_shape` names the expected shape.
  void validate(Index state_cols, const std::string& state_shape) const {
    validate_tokens();
    const auto& s0 = derived().initial_state;
    require(!s0 || (s0->rows() == value_dim() && s0->cols() == state_cols), "initial_state must be " + state_shape);
  }
  void validate() const { validate(key_dim(), "(DV, DK)"); }

 private:
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
};

}  // namespace deltaproof::ref
