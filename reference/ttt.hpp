// Test-Time Training (TTT): a fast-weight model trained by gradient descent on each token, and
// the theorems that tie it to linear attention.
//
// Inner model f(x) = W φ(x): a linear last layer W (DV, DF) on a frozen feature map φ: R^DK → R^DF
// (φ = identity gives f(x) = S x). Token t writes with one gradient step on ℓ(f(k_t), v_t) and
// reads o_t = W_t φ(q_t):
//
//   W_t = W_{t−1} − η_t ∇_W ℓ(W φ(k_t), v_t)|_{W_{t−1}} = W_{t−1} + v̂_t k̂_tᵀ,
//   k̂_t = φ(k_t),  v̂_t = −η_t ∂ℓ/∂f (W_{t−1} φ(k_t), v_t)                      (the general statement)
//
// so ½‖f − v‖² gives DeltaNet (v̂ = β(v − S k)) and −vᵀf gives additive linear attention (v̂ = β v).
// Shapes for one sequence: q, k (L, DK); v, o (L, DV); η (L); W (DV, DF).
#pragma once

#include "reference/chunking.hpp"
#include "reference/dual.hpp"
#include "reference/high_agreement.hpp"
#include "reference/linear_attention.hpp"
#include "reference/scalar.hpp"
#include "reference/sequence_inputs.hpp"

#include <boost/math/constants/constants.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace deltaproof::ref::ttt {

// ---------------------------------------------------------------------------------------
// Inner losses ℓ(f, v) on the model's output f for target v: the value (generic, so that a plain
// gradient-descent loop can differentiate it with dual numbers) and ∂ℓ/∂f (closed form, the
// derivation's v̂ = −η ∂ℓ/∂f).

// ℓ = ½‖f − v‖²  →  DeltaNet
struct SquaredBinding {
  static constexpr const char* name = "squared binding 1/2|f - v|^2";
  template <class T>
  static T value(const Vector<T>& f, const Vector<T>& v) {
    T sum(0);
    for (Index i = 0; i < f.size(); ++i) sum += (f(i) - v(i)) * (f(i) - v(i));
    return sum / T(2);
  }
  template <class T>
  static Vector<T> output_gradient(const Vector<T>& f, const Vector<T>& v) { return f - v; }
};

// ℓ = −vᵀ f  →  additive linear attention
struct NegativeDot {
  static constexpr const char* name = "linear objective -v.f";
  template <class T>
  static T value(const Vector<T>& f, const Vector<T>& v) {
    T sum(0);
    for (Index i = 0; i < f.size(); ++i) sum -= v(i) * f(i);
    return sum;
  }
  template <class T>
  static Vector<T> output_gradient(const Vector<T>& /*f*/, const Vector<T>& v) { return -v; }
};

// ℓ = ¼ Σ (f_i − v_i)⁴: a non-quadratic loss, so that the general statement is checked beyond the
// two cases with a named recurrence.
struct QuarticBinding {
  static constexpr const char* name = "quartic binding 1/4 sum (f - v)^4";
  template <class T>
  static T value(const Vector<T>& f, const Vector<T>& v) {
    T sum(0);
    for (Index i = 0; i < f.size(); ++i) {
      const T d = f(i) - v(i);
      sum += d * d * d * d;
    }
    return sum / T(4);
  }
  template <class T>
  static Vector<T> output_gradient(const Vector<T>& f, const Vector<T>& v) {
    Vector<T> g(f.size());
    for (Index i = 0; i < f.size(); ++i) {
      const T d = f(i) - v(i);
      g(i) = d * d * d;
    }
    return g;
  }
};

// ---------------------------------------------------------------------------------------
// Frozen feature maps φ, applied to each row of a (n, DK) matrix.

// φ(x) = x
struct IdentityFeatures {
  static constexpr const char* name = "identity";
  static Index feature_dim(Index key_dim) { return key_dim; }
  template <class T>
  static Matrix<T> apply(const Matrix<T>& x) { return x; }
};

// φ(x) = [x, x ⊙ x]: a nonlinear (but rational) frozen map, e.g. a fixed first layer.
struct QuadraticFeatures {
  static constexpr const char* name = "[x, x*x]";
  static Index feature_dim(Index key_dim) { return 2 * key_dim; }
  template <class T>
  static Matrix<T> apply(const Matrix<T>& x) {
    Matrix<T> out(x.rows(), 2 * x.cols());  // (n, 2 DK)
    out.leftCols(x.cols()) = x;
    out.rightCols(x.cols()) = x.cwiseProduct(x);
    return out;
  }
};

// ---------------------------------------------------------------------------------------

// q, k, v (sequence_inputs.hpp), η and W_0; the state is (DV, DF), so initial_state_or_zero and
// validate take the feature dim DF.
template <class Scalar>
struct Inputs : SequenceInputs<Scalar, Inputs<Scalar>> {
  Vector<Scalar> learning_rate;                 // (L): η_t, DeltaNet's β_t
  std::optional<Matrix<Scalar>> initial_state;  // (DV, DF): W_0; absent means 0

  std::vector<PerToken> per_token() const { return {{"learning_rate", learning_rate.size()}}; }
  Matrix<Scalar> initial_state_or_zero(Index feature_dim) const {
    return SequenceInputs<Scalar, Inputs>::initial_state_or_zero(feature_dim);
  }
  void validate(Index feature_dim) const {
    SequenceInputs<Scalar, Inputs>::validate(feature_dim, "(DV, DF) with DF the feature dim");
  }
};

template <class Scalar>
struct Forward {
  Matrix<Scalar> output;       // (L, DV)
  Matrix<Scalar> final_state;  // (DV, DF)
};

// Optimizer of the plain loop: mini-batches of size b (all gradients of a batch at the weights
// from its start) and optional momentum a_t (M_t = a_t M_{t−1} + η_t ∇ℓ_t, W_t = W_{t−1} − M_t).
template <class Scalar>
struct Optimizer {
  Index batch_size = 1;
  std::optional<Vector<Scalar>> momentum;  // (L): a_t
};

// Seams for planted-bug tests; the default is faithful.
struct Faithful {
  static constexpr bool gradient_at_batch_start = true;
};
// Bug: each gradient of a mini-batch taken at the weights already updated by earlier tokens.
struct GradientAtRunningWeights {
  static constexpr bool gradient_at_batch_start = false;
};

// ∇_W ℓ(W φ, v) by forward-mode differentiation, one weight at a time: no hand-derived formula.
// Seeding W_rc moves only row r of W φ, so that row alone is evaluated on dual numbers; the other
// rows enter the loss as constants (zero tangent), as they would in the full dual product.
template <class Scalar, class Loss>
Matrix<Scalar> loss_gradient_by_dual(const Matrix<Scalar>& weights, const Vector<Scalar>& features,
                                     const Vector<Scalar>& target) {
  using D = Dual<Scalar>;
  const auto lift = [](const Scalar& x) { return D(x); };
  const Vector<Scalar> f = weights * features;              // (DV)
  Vector<D> f_dual = f.unaryExpr(lift);                     // (DV)
  const Vector<D> phi = features.unaryExpr(lift);           // (DF)
  const Vector<D> v = target.unaryExpr(lift);               // (DV)
  Matrix<Scalar> grad(weights.rows(), weights.cols());      // (DV, DF)
  for (Index r = 0; r < weights.rows(); ++r) {
    Vector<D> w = weights.row(r).transpose().unaryExpr(lift);  // (DF): row r of W
    for (Index c = 0; c < w.size(); ++c) {
      w(c).tangent = Scalar(1);
      D row(0);
      for (Index j = 0; j < w.size(); ++j) row += w(j) * phi(j);  // (W φ)_r on dual numbers
      f_dual(r) = row;
      grad(r, c) = Loss::value(f_dual, v).tangent;
      w(c).tangent = Scalar(0);
    }
    f_dual(r) = D(f(r));
  }
  return grad;
}

// The plain gradient-descent loop. Per mini-batch B with starting weights W_s, for t ∈ B in order:
//   G_t = ∇_W ℓ(W φ(k_t), v_t)|_{W_s},  W ← W − η_t G_t  (or with momentum M ← a_t M + η_t G_t, W ← W − M),
//   o_t = W φ(q_t).
// b = 1 is tokenwise TTT.
template <class Scalar, class Loss, class Features = IdentityFeatures, class Policy = Faithful>
Forward<Scalar> gradient_descent(const Inputs<Scalar>& in, const Optimizer<Scalar>& opt = {}) {
  const Index F = Features::feature_dim(in.key_dim());
  in.validate(F);
  require(opt.batch_size >= 1, "batch_size (b) must be >= 1, got " + std::to_string(opt.batch_size));
  require(!opt.momentum || opt.momentum->size() == in.length(), "momentum must have one entry per token (L)");
  const Matrix<Scalar> phi_q = Features::apply(in.q);  // (L, DF)
  const Matrix<Scalar> phi_k = Features::apply(in.k);  // (L, DF)
  Matrix<Scalar> w = in.initial_state_or_zero(F);      // (DV, DF)
  Matrix<Scalar> buffer = Matrix<Scalar>::Zero(w.rows(), w.cols());
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (const Chunk& batch : chunks_of(in.length(), opt.batch_size)) {
    const Matrix<Scalar> start = w;
    for (Index t = batch.begin; t < batch.begin + batch.size; ++t) {
      const Matrix<Scalar>& at = Policy::gradient_at_batch_start ? start : w;
      const Matrix<Scalar> grad = loss_gradient_by_dual<Scalar, Loss>(at, phi_k.row(t).transpose(), in.v.row(t).transpose());
      if (opt.momentum) {
        buffer = (*opt.momentum)(t) * buffer + in.learning_rate(t) * grad;
        w -= buffer;
      } else {
        w -= in.learning_rate(t) * grad;
      }
      out.output.row(t) = (w * phi_q.row(t).transpose()).transpose();
    }
  }
  out.final_state = w;
  return out;
}

// ---------------------------------------------------------------------------------------
// The general statement as a construction: the same run, written as linear-attention writes.

template <class Scalar>
struct LinearAttentionWrites {
  linear_attention::Inputs<Scalar> writes;  // q̂ = φ(q), k̂ = φ(k), v̂_t = −η_t ∂ℓ/∂f, S_0 = W_0
  Forward<Scalar> forward;                  // o_t = S_t q̂_t along the way
};

// S_t = S_{t−1} + v̂_t k̂_tᵀ with k̂_t = φ(k_t), v̂_t = −η_t ∂ℓ/∂f(S_{t−1} k̂_t, v_t);  o_t = S_t φ(q_t)
template <class Scalar, class Loss, class Features = IdentityFeatures>
LinearAttentionWrites<Scalar> as_linear_attention(const Inputs<Scalar>& in) {
  const Index F = Features::feature_dim(in.key_dim());
  in.validate(F);
  LinearAttentionWrites<Scalar> r;
  r.writes.q = Features::apply(in.q);  // (L, DF)
  r.writes.k = Features::apply(in.k);  // (L, DF)
  r.writes.v.resize(in.length(), in.value_dim());
  r.writes.initial_state = in.initial_state_or_zero(F);
  Matrix<Scalar> state = *r.writes.initial_state;  // (DV, DF)
  r.forward.output.resize(in.length(), in.value_dim());
  for (Index t = 0; t < in.length(); ++t) {
    const Vector<Scalar> key = r.writes.k.row(t).transpose();
    const Vector<Scalar> f = state * key;  // (DV)
    const Vector<Scalar> v_hat = -in.learning_rate(t) * Loss::output_gradient(f, Vector<Scalar>(in.v.row(t).transpose()));
    r.writes.v.row(t) = v_hat.transpose();
    state += v_hat * key.transpose();
    r.forward.output.row(t) = (state * r.writes.q.row(t).transpose()).transpose();
  }
  r.forward.final_state = state;
  return r;
}

// ---------------------------------------------------------------------------------------
// Momentum. With M_t = a_t M_{t−1} + η_t ∇ℓ_t and W_t = W_{t−1} − M_t, unrolling gives, at step t,
//   W_t = W_0 + Σ_{i≤t} A_ti g_i φ(k_i)ᵀ,   g_i = −η_i ∂ℓ/∂f (W_{i−1} φ(k_i), v_i),
//   A_ti = Σ_{j=i..t} Π_{s=i+1..j} a_s   (i ≤ t; 0 above the diagonal),
// i.e. linear attention whose write v̂_i is reweighted per reader t: v̂_i(t) = A_ti g_i.

template <class Scalar>
Matrix<Scalar> momentum_mask(const Vector<Scalar>& a) {
  const Index L = a.size();
  Matrix<Scalar> mask = Matrix<Scalar>::Zero(L, L);  // (L, L)
  for (Index i = 0; i < L; ++i) {
    Scalar product(1);  // Π_{s=i+1..j} a_s
    Scalar sum(0);
    for (Index j = i; j < L; ++j) {
      if (j > i) product *= a(j);
      sum += product;
      mask(j, i) = sum;  // A_ji: reader j, writer i
    }
  }
  return mask;
}

// o_t = W_0 φ(q_t) + Σ_{i≤t} A_ti (φ(k_i)·φ(q_t)) g_i, with g_i computed from W_{i−1} in the same form.
template <class Scalar, class Loss, class Features = IdentityFeatures>
Forward<Scalar> momentum_linear_attention(const Inputs<Scalar>& in, const Vector<Scalar>& momentum) {
  const Index F = Features::feature_dim(in.key_dim());
  in.validate(F);
  require(momentum.size() == in.length(), "momentum must have one entry per token (L)");
  const Index L = in.length();
  const Matrix<Scalar> phi_q = Features::apply(in.q);  // (L, DF)
  const Matrix<Scalar> phi_k = Features::apply(in.k);  // (L, DF)
  const Matrix<Scalar> w0 = in.initial_state_or_zero(F);
  const Matrix<Scalar> mask = momentum_mask(momentum);  // (L, L)
  Matrix<Scalar> g = Matrix<Scalar>::Zero(L, in.value_dim());  // rows g_i, (L, DV)
  // W_t = W_0 + Gᵀ diag(A_t·) Φ(K) restricted to i <= t
  const auto weights_after = [&](Index t) {
    Matrix<Scalar> w = w0;
    for (Index i = 0; i <= t; ++i) w += mask(t, i) * g.row(i).transpose() * phi_k.row(i);
    return w;
  };
  for (Index t = 0; t < L; ++t) {
    const Matrix<Scalar> w_before = t == 0 ? w0 : weights_after(t - 1);
    const Vector<Scalar> f = w_before * phi_k.row(t).transpose();
    g.row(t) = (-in.learning_rate(t) * Loss::output_gradient(f, Vector<Scalar>(in.v.row(t).transpose()))).transpose();
  }
  const Matrix<Scalar> scores = (phi_q * phi_k.transpose()).cwiseProduct(mask);  // (L, L)
  Forward<Scalar> out;
  out.output = phi_q * w0.transpose() + scores * g;  // (L, DV)
  out.final_state = L == 0 ? w0 : weights_after(L - 1);
  return out;
}

// ---------------------------------------------------------------------------------------
// Mini-batch TTT, dual form (TTT-Linear): per batch with starting weights W_s,
//   G = ∂ℓ/∂f (Φ(K) W_sᵀ, V) row by row,   H = diag(η) G,
//   O = Φ(Q) W_sᵀ − (Φ(Q) Φ(K)ᵀ ⊙ M) H,   W ← W_s − Hᵀ Φ(K),   M the causal mask of the batch.
template <class Scalar, class Loss, class Features = IdentityFeatures>
Forward<Scalar> minibatch_dual(const Inputs<Scalar>& in, Index batch_size) {
  const Index F = Features::feature_dim(in.key_dim());
  in.validate(F);
  require(batch_size >= 1, "batch_size (b) must be >= 1, got " + std::to_string(batch_size));
  Matrix<Scalar> w = in.initial_state_or_zero(F);  // (DV, DF)
  Forward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (const Chunk& batch : chunks_of(in.length(), batch_size)) {
    const Matrix<Scalar> phi_q = Features::apply(Matrix<Scalar>(in.q.middleRows(batch.begin, batch.size)));  // (b, DF)
    const Matrix<Scalar> phi_k = Features::apply(Matrix<Scalar>(in.k.middleRows(batch.begin, batch.size)));  // (b, DF)
    const Matrix<Scalar> f = phi_k * w.transpose();  // (b, DV)
    Matrix<Scalar> h(batch.size, in.value_dim());    // (b, DV)
    for (Index i = 0; i < batch.size; ++i)
      h.row(i) = in.learning_rate(batch.begin + i) *
                 Loss::output_gradient(Vector<Scalar>(f.row(i).transpose()),
                                       Vector<Scalar>(in.v.row(batch.begin + i).transpose())).transpose();
    const Matrix<Scalar> scores = (phi_q * phi_k.transpose()).cwiseProduct(causal_mask<Scalar>(batch.size));  // (b, b)
    out.output.middleRows(batch.begin, batch.size) = phi_q * w.transpose() - scores * h;
    w -= h.transpose() * phi_k;
  }
  out.final_state = w;
  return out;
}

// ---------------------------------------------------------------------------------------
// TTT-MLP: f(x) = W2 σ(W1 x) with σ = GELU (x Φ(x)), squared binding loss, mini-batches of size b.
// Needs erf and exp: High or double.

template <class Scalar>
struct MlpWeights {
  Matrix<Scalar> w1;  // (DH, DK)
  Matrix<Scalar> w2;  // (DV, DH)
};

template <class Scalar>
struct MlpForward {
  Matrix<Scalar> output;  // (L, DV)
  MlpWeights<Scalar> final_weights;
};

template <class Scalar>
Scalar gelu(const Scalar& x) {
  using std::erf, std::sqrt;
  return x * (Scalar(1) + erf(x / sqrt(Scalar(2)))) / Scalar(2);
}
// σ'(x) = Φ(x) + x φ(x)
template <class Scalar>
Scalar gelu_derivative(const Scalar& x) {
  using std::erf, std::exp, std::sqrt;
  const Scalar pi = boost::math::constants::pi<Scalar>();
  return (Scalar(1) + erf(x / sqrt(Scalar(2)))) / Scalar(2) + x * exp(-x * x / Scalar(2)) / sqrt(Scalar(2) * pi);
}
// Forward-mode GELU for dual numbers, so that the primal loop needs no hand-derived backward.
template <class Scalar>
Dual<Scalar> gelu(const Dual<Scalar>& x) {
  return Dual<Scalar>(gelu(x.value), x.tangent * gelu_derivative(x.value));
}

template <class T>
Vector<T> mlp_apply(const Matrix<T>& w1, const Matrix<T>& w2, const Vector<T>& x) {
  const Vector<T> z = w1 * x;  // (DH)
  return w2 * z.unaryExpr([](const T& s) { return gelu(s); });
}

template <class Scalar>
void validate_mlp(const Inputs<Scalar>& in, const MlpWeights<Scalar>& w0, Index batch_size) {
  in.validate(in.key_dim());
  require(w0.w1.cols() == in.key_dim(), "w1 must be (DH, DK)");
  require(w0.w2.rows() == in.value_dim() && w0.w2.cols() == w0.w1.rows(), "w2 must be (DV, DH)");
  require(batch_size >= 1, "batch_size (b) must be >= 1, got " + std::to_string(batch_size));
}

// Primal: an explicit loop. Per batch with start weights θ_s, for t in order:
//   θ ← θ − η_t ∇_θ ½‖f_θ(k_t) − v_t‖² |_{θ_s}  (gradient by dual numbers, weight by weight),  o_t = f_θ(q_t).
// Seeding W1_rc moves only hidden unit r, seeding W2_rc only output r: those are evaluated on dual
// numbers, the rest of the network enters as constants (zero tangent), as in a full dual pass.
template <class Scalar, class Policy = Faithful>
MlpForward<Scalar> mlp_minibatch_primal(const Inputs<Scalar>& in, const MlpWeights<Scalar>& w0, Index batch_size) {
  validate_mlp(in, w0, batch_size);
  using D = Dual<Scalar>;
  const auto lift = [](const Scalar& x) { return D(x); };
  const auto dual_dot = [](const Vector<D>& a, const Vector<D>& b) {
    D sum(0);
    for (Index j = 0; j < a.size(); ++j) sum += a(j) * b(j);
    return sum;
  };
  MlpWeights<Scalar> w = w0;
  MlpForward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (const Chunk& batch : chunks_of(in.length(), batch_size)) {
    const MlpWeights<Scalar> start = w;
    for (Index t = batch.begin; t < batch.begin + batch.size; ++t) {
      const MlpWeights<Scalar>& at = Policy::gradient_at_batch_start ? start : w;
      const Matrix<D> w1 = at.w1.unaryExpr(lift), w2 = at.w2.unaryExpr(lift);  // (DH, DK), (DV, DH)
      const Vector<D> key = in.k.row(t).transpose().unaryExpr(lift);           // (DK)
      const Vector<D> target = in.v.row(t).transpose().unaryExpr(lift);        // (DV)
      const Vector<D> z = w1 * key;                                            // (DH), constants
      const Vector<D> hidden = z.unaryExpr([](const D& s) { return gelu(s); });
      const Vector<D> f = w2 * hidden;                                         // (DV), constants
      Matrix<Scalar> g1(w1.rows(), w1.cols()), g2(w2.rows(), w2.cols());
      for (Index r = 0; r < w1.rows(); ++r) {
        Vector<D> row = w1.row(r).transpose();  // (DK)
        for (Index c = 0; c < w1.cols(); ++c) {
          row(c).tangent = Scalar(1);
          Vector<D> h = hidden;
          h(r) = gelu(dual_dot(row, key));  // hidden unit r on dual numbers
          g1(r, c) = SquaredBinding::value(Vector<D>(w2 * h), target).tangent;
          row(c).tangent = Scalar(0);
        }
      }
      for (Index r = 0; r < w2.rows(); ++r) {
        Vector<D> row = w2.row(r).transpose();  // (DH)
        for (Index c = 0; c < w2.cols(); ++c) {
          row(c).tangent = Scalar(1);
          Vector<D> output = f;
          output(r) = dual_dot(row, hidden);  // output r on dual numbers
          g2(r, c) = SquaredBinding::value(output, target).tangent;
          row(c).tangent = Scalar(0);
        }
      }
      w.w1 -= in.learning_rate(t) * g1;
      w.w2 -= in.learning_rate(t) * g2;
      out.output.row(t) = mlp_apply(w.w1, w.w2, Vector<Scalar>(in.q.row(t).transpose())).transpose();
    }
  }
  out.final_weights = w;
  return out;
}

// Dual: per batch with start weights (W1, W2), Z1 = K W1ᵀ, X2 = σ(Z1), G2 = X2 W2ᵀ − V,
// G1 = (G2 W2) ⊙ σ'(Z1); then with the causal mask M and E = diag(η):
//   Z1q = Q W1ᵀ − (Q Kᵀ ⊙ M) E G1,   X2q = σ(Z1q),   O = X2q W2ᵀ − (X2q X2ᵀ ⊙ M) E G2,
//   W1 ← W1 − G1ᵀ E K,   W2 ← W2 − G2ᵀ E X2.
template <class Scalar>
MlpForward<Scalar> mlp_minibatch_dual(const Inputs<Scalar>& in, const MlpWeights<Scalar>& w0, Index batch_size) {
  validate_mlp(in, w0, batch_size);
  const auto act = [](const Scalar& x) { return gelu(x); };
  const auto act_prime = [](const Scalar& x) { return gelu_derivative(x); };
  MlpWeights<Scalar> w = w0;
  MlpForward<Scalar> out;
  out.output.resize(in.length(), in.value_dim());
  for (const Chunk& batch : chunks_of(in.length(), batch_size)) {
    const auto [q, k, v] = in.rows(batch);  // (b, DK), (b, DK), (b, DV)
    const Matrix<Scalar> eta = in.learning_rate.segment(batch.begin, batch.size).asDiagonal();  // (b, b)
    const Matrix<Scalar> mask = causal_mask<Scalar>(batch.size);                                 // (b, b)
    const Matrix<Scalar> z1 = k * w.w1.transpose();                                              // (b, DH)
    const Matrix<Scalar> x2 = z1.unaryExpr(act);                                                 // (b, DH)
    const Matrix<Scalar> g2 = x2 * w.w2.transpose() - v;                                         // (b, DV)
    const Matrix<Scalar> g1 = (g2 * w.w2).cwiseProduct(z1.unaryExpr(act_prime));                  // (b, DH)
    const Matrix<Scalar> z1q = q * w.w1.transpose() - (q * k.transpose()).cwiseProduct(mask) * eta * g1;  // (b, DH)
    const Matrix<Scalar> x2q = z1q.unaryExpr(act);                                                        // (b, DH)
    out.output.middleRows(batch.begin, batch.size) =
        x2q * w.w2.transpose() - (x2q * x2.transpose()).cwiseProduct(mask) * eta * g2;  // (b, DV)
    w.w1 -= g1.transpose() * eta * k;
    w.w2 -= g2.transpose() * eta * x2;
  }
  out.final_weights = w;
  return out;
}

using ref::high_agreement_bound;

}  // namespace deltaproof::ref::ttt
