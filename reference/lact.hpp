// Large-Chunk Test-Time Training (LaCT): a fast-weight network updated once per chunk, its
// schedules, and the dependency structure each schedule implies.
//
// Fast weight f_W (SwiGLU: f(x) = W1 (silu(W0 x) ⊙ (W2 x)), or linear: f(x) = W x). Chunk c with
// tokens i ∈ c and starting weights W_[c] is absorbed by one update from the summed gradients of
//   ℓ_c(W) = −Σ_{i∈c} η_i ⟨f_W(k_i), v_i⟩,   all taken at W_[c]:
//   g_c = ∇ℓ_c(W_[c]),  Δ_c = μ Δ_{c−1} + g_c,  U_c = NS(Δ_c) or Δ_c,  W_[c+1] = norm(W_[c] − U_c).
// Schedules: update→apply (chunk c reads W_[c+1]: bidirectional inside the chunk), apply→update
// (shifted: chunk c reads W_[c], the last chunk updates nothing), single chunk (C = L, update→apply).
// An optional causal sliding-window softmax attention (window W) is added to the output.
// Shapes for one sequence: q, k (L, DK); v, o (L, DV); η (L); W0, W2 (DH, DK); W1 (DV, DH).
#pragma once

#include "reference/chunking.hpp"
#include "reference/dual.hpp"
#include "reference/scalar.hpp"
#include "reference/sequence_inputs.hpp"

#include <cmath>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace deltaproof::ref::lact {

// Steps with exp or sqrt (SiLU, softmax, norms) need a scalar that has them: High or a float.
template <class T>
inline constexpr bool has_transcendentals_v = std::is_floating_point_v<T> || is_high_v<T>;

enum class Schedule { UpdateThenApply, ApplyThenUpdate, SingleChunk };

inline std::string to_string(Schedule s) {
  switch (s) {
    case Schedule::UpdateThenApply: return "update-apply";
    case Schedule::ApplyThenUpdate: return "apply-update";
    case Schedule::SingleChunk: return "single";
  }
  return "?";
}
inline std::optional<Schedule> parse_schedule(const std::string& s) {
  for (Schedule x : {Schedule::UpdateThenApply, Schedule::ApplyThenUpdate, Schedule::SingleChunk})
    if (s == to_string(x)) return x;
  return std::nullopt;
}

template <class Scalar>
using Weights = std::vector<Matrix<Scalar>>;

template <class Scalar>
struct Options {
  Schedule schedule = Schedule::UpdateThenApply;
  Index chunk_size = 1;            // C (ignored by SingleChunk, which uses C = L)
  Index window = 0;                // sliding-window attention branch: the W most recent tokens; 0 = none
  Scalar momentum = Scalar(0);     // μ in Δ_c = μ Δ_{c−1} + g_c; 0 = no momentum
  bool weight_norm = false;        // restore each row's initial norm (over the input dim) after an update
  bool orthogonalize = false;      // Newton–Schulz on the update

  void validate() const {
    require(chunk_size >= 1, "chunk_size must be >= 1, got " + std::to_string(chunk_size));
    require(window >= 0, "window must be >= 0, got " + std::to_string(window));
  }
};

template <class To, class From>
Options<To> options_cast(const Options<From>& o, To momentum) {
  return {o.schedule, o.chunk_size, o.window, std::move(momentum), o.weight_norm, o.orthogonalize};
}

// ---------------------------------------------------------------------------------------
// Fast weights: f applied to the rows of a (n, DK) matrix, and ∇ℓ_c in closed form.

// f(x) = W x, weights {W (DV, DK)}.  ∇_W ℓ_c = −Vᵀ diag(η) K
struct LinearFastWeight {
  static constexpr const char* name = "linear";
  template <class T>
  static void validate(const Weights<T>& w, Index key_dim, Index value_dim) {
    require(w.size() == 1 && w[0].rows() == value_dim && w[0].cols() == key_dim,
            "initial_weights of the linear fast weight must be {W (DV, DK)}");
  }
  template <class T>
  static Matrix<T> apply(const Weights<T>& w, const Matrix<T>& x) { return x * w[0].transpose(); }  // (n, DV)
  template <class T>
  static Weights<T> chunk_gradient(const Weights<T>& /*w*/, const Matrix<T>& k, const Matrix<T>& v, const Vector<T>& eta) {
    return {Matrix<T>(-(v.transpose() * eta.asDiagonal() * k))};  // (DV, DK)
  }
};

template <class T>
T silu(const T& x) {
  using std::exp;
  return x / (T(1) + exp(-x));
}
template <class T>
T silu_derivative(const T& x) {  // s (1 + x (1 − s)), s = sigmoid(x)
  using std::exp;
  const T s = T(1) / (T(1) + exp(-x));
  return s * (T(1) + x * (T(1) - s));
}
// Forward-mode SiLU, so that tests can differentiate the inner loss without the hand-derived gradient.
template <class T>
Dual<T> silu(const Dual<T>& x) {
  return Dual<T>(silu(x.value), x.tangent * silu_derivative(x.value));
}

// f(x) = W1 (silu(W0 x) ⊙ (W2 x)), weights {W0 (DH, DK), W1 (DV, DH), W2 (DH, DK)}. With
// A = K W0ᵀ, B = K W2ᵀ, H = silu(A) ⊙ B and dF = −diag(η) V:
//   ∇W1 = dFᵀ H,  dH = dF W1,  ∇W0 = (dH ⊙ B ⊙ silu'(A))ᵀ K,  ∇W2 = (dH ⊙ silu(A))ᵀ K
struct SwiGluFastWeight {
  static constexpr const char* name = "swiglu";
  template <class T>
  static void validate(const Weights<T>& w, Index key_dim, Index value_dim) {
    require(w.size() == 3, "initial_weights of the SwiGLU fast weight must be {W0, W1, W2}");
    const Index hidden = w[0].rows();
    require(w[0].cols() == key_dim, "W0 must be (DH, DK)");
    require(w[1].rows() == value_dim && w[1].cols() == hidden, "W1 must be (DV, DH)");
    require(w[2].rows() == hidden && w[2].cols() == key_dim, "W2 must be (DH, DK)");
  }
  template <class T>
  static Matrix<T> apply(const Weights<T>& w, const Matrix<T>& x) {
    const Matrix<T> gate = (x * w[0].transpose()).unaryExpr([](const T& a) { return silu(a); });  // (n, DH)
    const Matrix<T> hidden = gate.cwiseProduct(x * w[2].transpose());                              // (n, DH)
    return hidden * w[1].transpose();                                                              // (n, DV)
  }
  template <class T>
  static Weights<T> chunk_gradient(const Weights<T>& w, const Matrix<T>& k, const Matrix<T>& v, const Vector<T>& eta) {
    const Matrix<T> a = k * w[0].transpose();                                       // (n, DH)
    const Matrix<T> b = k * w[2].transpose();                                       // (n, DH)
    const Matrix<T> gate = a.unaryExpr([](const T& x) { return silu(x); });         // (n, DH)
    const Matrix<T> hidden = gate.cwiseProduct(b);                                  // (n, DH)
    const Matrix<T> d_out = -(eta.asDiagonal() * v);                                // (n, DV)
    const Matrix<T> d_hidden = d_out * w[1];                                        // (n, DH)
    const Matrix<T> d_a = d_hidden.cwiseProduct(b).cwiseProduct(a.unaryExpr([](const T& x) { return silu_derivative(x); }));
    const Matrix<T> d_b = d_hidden.cwiseProduct(gate);
    return {Matrix<T>(d_a.transpose() * k), Matrix<T>(d_out.transpose() * hidden), Matrix<T>(d_b.transpose() * k)};
  }
};

// ℓ_c(W) = −Σ_i η_i ⟨f_W(k_i), v_i⟩, generic (tests differentiate it with dual numbers).
template <class FastWeight, class T>
T inner_loss(const Weights<T>& w, const Matrix<T>& k, const Matrix<T>& v, const Vector<T>& eta) {
  const Matrix<T> f = FastWeight::apply(w, k);  // (n, DV)
  T sum(0);
  for (Index i = 0; i < f.rows(); ++i)
    for (Index j = 0; j < f.cols(); ++j) sum -= eta(i) * f(i, j) * v(i, j);
  return sum;
}

// ∇ℓ_c by forward-mode differentiation of inner_loss, one weight at a time: the independent check
// of the closed-form chunk_gradient (and of the schedule loop that uses it).
template <class FastWeight, class Scalar>
Weights<Scalar> inner_loss_gradient_by_dual(const Weights<Scalar>& w, const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                            const Vector<Scalar>& eta) {
  using D = Dual<Scalar>;
  const auto up = [](const Scalar& x) { return D(x); };
  Weights<D> wd;
  for (const auto& m : w) wd.push_back(m.unaryExpr(up));
  const Matrix<D> kd = k.unaryExpr(up), vd = v.unaryExpr(up);
  const Vector<D> etad = eta.unaryExpr(up);
  Weights<Scalar> g;
  for (size_t p = 0; p < w.size(); ++p) {
    g.push_back(Matrix<Scalar>(w[p].rows(), w[p].cols()));
    for (Index r = 0; r < w[p].rows(); ++r)
      for (Index c = 0; c < w[p].cols(); ++c) {
        wd[p](r, c).tangent = Scalar(1);
        g[p](r, c) = inner_loss<FastWeight>(wd, kd, vd, etad).tangent;
        wd[p](r, c).tangent = Scalar(0);
      }
  }
  return g;
}

// ---------------------------------------------------------------------------------------
// Update options.

// Muon's quintic Newton–Schulz: X_0 = G/‖G‖_F, X ← a X + (b A + c A²) X with A = X Xᵀ, 5 steps,
// (a, b, c) = (3.4445, −4.7750, 2.0315). Tall inputs are handled transposed (A is the smaller Gram).
template <class Scalar>
Matrix<Scalar> newton_schulz(const Matrix<Scalar>& g) {
  if (g.rows() > g.cols()) return newton_schulz<Scalar>(g.transpose()).transpose();
  using std::sqrt;
  const Scalar norm = sqrt(g.cwiseProduct(g).sum());
  if (norm == Scalar(0)) return g;
  const Scalar a = Scalar(34445) / Scalar(10000), b = Scalar(-47750) / Scalar(10000), c = Scalar(20315) / Scalar(10000);
  Matrix<Scalar> x = g / norm;  // (r, n), r <= n
  for (int step = 0; step < 5; ++step) {
    const Matrix<Scalar> gram = x * x.transpose();  // (r, r)
    x = a * x + (b * gram + c * gram * gram) * x;
  }
  return x;
}

// Rows rescaled to the given norms (norms over the input dimension, i.e. over each row).
template <class Scalar>
Matrix<Scalar> with_row_norms(const Matrix<Scalar>& w, const Vector<Scalar>& norms) {
  using std::sqrt;
  Matrix<Scalar> out = w;
  for (Index r = 0; r < w.rows(); ++r) {
    const Scalar n = sqrt(w.row(r).squaredNorm());
    if (n != Scalar(0)) out.row(r) *= norms(r) / n;
  }
  return out;
}

template <class Scalar>
Vector<Scalar> row_norms(const Matrix<Scalar>& w) {
  using std::sqrt;
  Vector<Scalar> n(w.rows());
  for (Index r = 0; r < w.rows(); ++r) n(r) = sqrt(w.row(r).squaredNorm());
  return n;
}

// ---------------------------------------------------------------------------------------

// q, k, v (sequence_inputs.hpp), η and the fast weights' W_[0] (in place of a state S_0).
template <class Scalar>
struct Inputs : SequenceInputs<Scalar, Inputs<Scalar>> {
  Vector<Scalar> learning_rate;     // (L): η_i
  Weights<Scalar> initial_weights;  // W_[0]

  std::vector<PerToken> per_token() const { return {{"learning_rate", learning_rate.size()}}; }
  template <class FastWeight>
  void validate() const {
    this->validate_tokens();
    FastWeight::validate(initial_weights, this->key_dim(), this->value_dim());
  }
};

template <class Scalar>
struct Forward {
  Matrix<Scalar> output;                   // (L, DV): fast-weight branch + window branch
  Matrix<Scalar> fast_weight_output;       // (L, DV): f_W(q_i) with the weights the schedule gives i
  Matrix<Scalar> window_output;            // (L, DV): the window branch (0 without a window)
  Weights<Scalar> final_weights;           // after the last update
  std::vector<Weights<Scalar>> boundary_weights;  // W_[c], the weights before chunk c
};

// Seams for planted-bug tests; the default is faithful.
struct Faithful {
  static constexpr bool gradient_at_chunk_start = true;
  static bool reads_before_update(Schedule s) { return s == Schedule::ApplyThenUpdate; }
  static bool in_window(Index i, Index j, Index window) { return j <= i && i - j < window; }
};
// Bug: each token's gradient taken at weights already moved by the chunk's earlier tokens.
struct GradientAtRunningWeights : Faithful {
  static constexpr bool gradient_at_chunk_start = false;
};
// Bug: the shifted schedule reads after updating (wrong schedule mask).
struct ShiftedReadsUpdatedWeights : Faithful {
  static bool reads_before_update(Schedule) { return false; }
};
// Bug: the window holds W + 1 tokens.
struct WindowOneTooWide : Faithful {
  static bool in_window(Index i, Index j, Index window) { return window > 0 && j <= i && i - j <= window; }
};

template <class Scalar, class FastWeight, class Policy>
Weights<Scalar> chunk_gradient(const Weights<Scalar>& w, const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                               const Vector<Scalar>& eta) {
  if constexpr (Policy::gradient_at_chunk_start) {
    return FastWeight::chunk_gradient(w, k, v, eta);
  } else {
    Weights<Scalar> sum;
    for (const auto& m : w) sum.push_back(Matrix<Scalar>::Zero(m.rows(), m.cols()));
    Weights<Scalar> running = w;
    for (Index i = 0; i < k.rows(); ++i) {
      const Weights<Scalar> g = FastWeight::chunk_gradient(running, Matrix<Scalar>(k.row(i)), Matrix<Scalar>(v.row(i)),
                                                           Vector<Scalar>(eta.segment(i, 1)));
      for (size_t p = 0; p < w.size(); ++p) {
        sum[p] += g[p];
        running[p] = w[p] - sum[p];
      }
    }
    return sum;
  }
}

// o_i = Σ_{j in window(i)} softmax_j(q_i·k_j) v_j, window(i) = {j : i − W < j <= i}.
template <class Scalar, class Policy = Faithful>
Matrix<Scalar> sliding_window_attention(const Matrix<Scalar>& q, const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                        Index window) {
  Matrix<Scalar> out = Matrix<Scalar>::Zero(q.rows(), v.cols());  // (L, DV)
  if constexpr (has_transcendentals_v<Scalar>) {
    using std::exp;
    for (Index i = 0; i < q.rows(); ++i) {
      std::vector<Index> seen;
      for (Index j = 0; j < q.rows(); ++j)
        if (Policy::in_window(i, j, window)) seen.push_back(j);
      if (seen.empty()) continue;
      Scalar top = q.row(i).dot(k.row(seen[0]));
      for (Index j : seen) top = std::max<Scalar>(top, q.row(i).dot(k.row(j)));  // max-subtracted for stability
      Scalar total(0);
      for (Index j : seen) {
        const Scalar weight = exp(q.row(i).dot(k.row(j)) - top);
        total += weight;
        out.row(i) += weight * v.row(j);
      }
      out.row(i) /= total;
    }
  } else {
    require(window == 0, "window > 0 needs exp: use High or double, not exact rationals");
  }
  return out;
}

// W_[c+1] from W_[c]: g_c at W_[c], Δ_c = μ Δ_{c−1} + g_c, U_c = NS(Δ_c) or Δ_c, W − U_c, then norms.
template <class Scalar, class FastWeight, class Policy>
void absorb_chunk(Weights<Scalar>& w, Weights<Scalar>& momentum_buffer, const Weights<Scalar>& initial,
                  const Matrix<Scalar>& k, const Matrix<Scalar>& v, const Vector<Scalar>& eta,
                  const Options<Scalar>& opt) {
  const Weights<Scalar> g = chunk_gradient<Scalar, FastWeight, Policy>(w, k, v, eta);
  for (size_t p = 0; p < w.size(); ++p) {
    momentum_buffer[p] = opt.momentum * momentum_buffer[p] + g[p];
    if constexpr (has_transcendentals_v<Scalar>) {
      w[p] -= opt.orthogonalize ? newton_schulz(momentum_buffer[p]) : momentum_buffer[p];
      if (opt.weight_norm) w[p] = with_row_norms(w[p], row_norms(initial[p]));
    } else {
      require(!opt.orthogonalize && !opt.weight_norm,
              "orthogonalize and weight_norm need sqrt: use High or double, not exact rationals");
      w[p] -= momentum_buffer[p];
    }
  }
}

template <class Scalar, class FastWeight, class Policy = Faithful>
Forward<Scalar> forward(const Inputs<Scalar>& in, const Options<Scalar>& opt) {
  in.template validate<FastWeight>();
  opt.validate();
  const Index L = in.length();
  const Index chunk = opt.schedule == Schedule::SingleChunk ? std::max<Index>(L, 1) : opt.chunk_size;
  const bool reads_before = Policy::reads_before_update(opt.schedule);
  Weights<Scalar> w = in.initial_weights;
  Weights<Scalar> buffer;
  for (const auto& m : w) buffer.push_back(Matrix<Scalar>::Zero(m.rows(), m.cols()));
  Forward<Scalar> out;
  out.output = Matrix<Scalar>::Zero(L, in.v.cols());
  const std::vector<Chunk> chunks = chunks_of(L, chunk);
  for (const Chunk& c : chunks) {
    const Matrix<Scalar> q = in.q.middleRows(c.begin, c.size);  // (C, DK)
    out.boundary_weights.push_back(w);
    if (reads_before) out.output.middleRows(c.begin, c.size) = FastWeight::apply(w, q);
    const bool last = c.index + 1 == static_cast<Index>(chunks.size());
    if (!(reads_before && last))  // the shifted schedule's last update would be read by no one
      absorb_chunk<Scalar, FastWeight, Policy>(w, buffer, in.initial_weights, in.k.middleRows(c.begin, c.size),
                                               in.v.middleRows(c.begin, c.size),
                                               in.learning_rate.segment(c.begin, c.size), opt);
    if (!reads_before) out.output.middleRows(c.begin, c.size) = FastWeight::apply(w, q);
  }
  out.final_weights = w;
  out.window_output = opt.window > 0 ? sliding_window_attention<Scalar, Policy>(in.q, in.k, in.v, opt.window)
                                     : Matrix<Scalar>::Zero(L, in.v.cols());
  out.fast_weight_output = out.output;
  out.output += out.window_output;
  return out;
}

// ---------------------------------------------------------------------------------------
// Linear fast weight with additive update, as masked linear attention.
//
// W_[c+1] = W_[c] + Σ_{j∈c} η_j v_j k_jᵀ (plus momentum) makes o_i = W_0 q_i + Σ_j M_ij (q_i·k_j) η_j v_j with
//   M_ij = Σ_{c = chunk(j)..r(i)} μ^{c − chunk(j)},   r(i) = the last chunk that output i's weights absorbed
// (chunk(i) for update→apply and single chunk, chunk(i) − 1 for apply→update); μ = 0 gives the 0/1 block mask.

inline Index last_absorbed_chunk(Schedule s, Index i, Index chunk_size) {
  if (s == Schedule::SingleChunk) return 0;
  return s == Schedule::ApplyThenUpdate ? i / chunk_size - 1 : i / chunk_size;
}

inline Index chunk_of(Schedule s, Index j, Index chunk_size) { return s == Schedule::SingleChunk ? 0 : j / chunk_size; }

template <class Scalar>
Matrix<Scalar> block_mask(Schedule s, Index length, Index chunk_size, const Scalar& momentum = Scalar(0)) {
  require(chunk_size >= 1, "chunk_size must be >= 1, got " + std::to_string(chunk_size));
  Matrix<Scalar> m = Matrix<Scalar>::Zero(length, length);  // (L, L)
  for (Index i = 0; i < length; ++i)
    for (Index j = 0; j < length; ++j) {
      Scalar term(1), sum(0);
      for (Index c = chunk_of(s, j, chunk_size); c <= last_absorbed_chunk(s, i, chunk_size); ++c) {
        sum += term;
        term *= momentum;
      }
      m(i, j) = sum;
    }
  return m;
}

// O = Q S_0ᵀ + (Q Kᵀ ⊙ M) V for any mask M (L, L).
template <class Scalar>
Matrix<Scalar> masked_linear_attention(const Matrix<Scalar>& q, const Matrix<Scalar>& k, const Matrix<Scalar>& v,
                                       const Matrix<Scalar>& initial_state, const Matrix<Scalar>& mask) {
  require(mask.rows() == q.rows() && mask.cols() == k.rows(), "mask must be (L, L)");
  return q * initial_state.transpose() + (q * k.transpose()).cwiseProduct(mask) * v;  // (L, DV)
}

// ---------------------------------------------------------------------------------------
// Dependency masks: D(i, j) = true when input token j (its q, k, v, η) may influence output i.

using DependencyMask = Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic>;

// Predicted from the schedule: the read (j = i), the chunks output i's weights absorbed
// (chunk(j) <= r(i)), and the window (i − W < j <= i).
inline DependencyMask predicted_dependencies(Schedule s, Index length, Index chunk_size, Index window) {
  require(chunk_size >= 1, "chunk_size must be >= 1, got " + std::to_string(chunk_size));
  require(window >= 0, "window must be >= 0, got " + std::to_string(window));
  DependencyMask d = DependencyMask::Constant(length, length, false);
  for (Index i = 0; i < length; ++i)
    for (Index j = 0; j < length; ++j)
      d(i, j) = j == i || chunk_of(s, j, chunk_size) <= last_absorbed_chunk(s, i, chunk_size) ||
                (j <= i && i - j < window);
  return d;
}

template <class Scalar>
Inputs<Dual<Scalar>> lift(const Inputs<Scalar>& in) {
  const auto up = [](const Scalar& x) { return Dual<Scalar>(x); };
  Inputs<Dual<Scalar>> out{in.q.unaryExpr(up), in.k.unaryExpr(up), in.v.unaryExpr(up), in.learning_rate.unaryExpr(up), {}};
  for (const auto& m : in.initial_weights) out.initial_weights.push_back(m.unaryExpr(up));
  return out;
}

// Measured over ℚ for the linear fast weight: D(i, j) = some ∂o_i/∂x is nonzero, x ranging over
// every scalar of token j, each derivative exact (dual numbers). A zero block is structure only at
// a generic point: use inputs without accidental zeros (e.g. positive entries).
template <class Policy = Faithful>
DependencyMask measure_dependencies_exact(const Inputs<Exact>& in, const Options<Exact>& opt) {
  using D = Dual<Exact>;
  Inputs<D> x = lift(in);
  const Options<D> o = options_cast(opt, D(opt.momentum));
  const Index L = in.length();
  DependencyMask d = DependencyMask::Constant(L, L, false);
  const auto record = [&](D& entry, Index j) {
    entry.tangent = Exact(1);
    const Matrix<D> out = forward<D, LinearFastWeight, Policy>(x, o).output;
    entry.tangent = Exact(0);
    for (Index i = 0; i < L; ++i)
      for (Index c = 0; c < out.cols(); ++c)
        if (out(i, c).tangent != Exact(0)) d(i, j) = true;
  };
  for (Index j = 0; j < L; ++j) {
    for (Index c = 0; c < x.q.cols(); ++c) record(x.q(j, c), j), record(x.k(j, c), j);
    for (Index c = 0; c < x.v.cols(); ++c) record(x.v(j, c), j);
    record(x.learning_rate(j), j);
  }
  return d;
}

// Measured in High for any fast weight: D(i, j) = output row i is not bitwise unchanged when every
// scalar of token j is perturbed (by distinct amounts, so that no two perturbations cancel). The
// two branches are compared separately: summed, a large fast-weight output could absorb a change
// of the window branch in rounding, and the measurement would report a gap that is not there.
template <class FastWeight, class Policy = Faithful>
DependencyMask measure_dependencies_by_perturbation(const Inputs<High>& in, const Options<High>& opt) {
  const Index L = in.length();
  const Forward<High> base = forward<High, FastWeight, Policy>(in, opt);
  DependencyMask d = DependencyMask::Constant(L, L, false);
  for (Index j = 0; j < L; ++j) {
    Inputs<High> moved = in;
    for (Index c = 0; c < in.q.cols(); ++c) {
      moved.q(j, c) += High(1) / High(3 + c);
      moved.k(j, c) += High(1) / High(5 + c);
    }
    for (Index c = 0; c < in.v.cols(); ++c) moved.v(j, c) += High(1) / High(7 + c);
    moved.learning_rate(j) += High(1) / High(11);
    const Forward<High> out = forward<High, FastWeight, Policy>(moved, opt);
    for (Index i = 0; i < L; ++i)
      d(i, j) = out.fast_weight_output.row(i) != base.fast_weight_output.row(i) ||
                out.window_output.row(i) != base.window_output.row(i);
  }
  return d;
}

// Rows are outputs i, columns inputs j: '#' dependence, '.' none.
inline std::string mask_grid(const DependencyMask& d) {
  std::string s;
  for (Index i = 0; i < d.rows(); ++i) {
    for (Index j = 0; j < d.cols(); ++j) s += d(i, j) ? '#' : '.';
    s += '\n';
  }
  return s;
}

// '#' in both, '.' in neither, '-' predicted but not measured, '+' measured but not predicted.
inline std::string mask_difference_grid(const DependencyMask& predicted, const DependencyMask& measured) {
  std::string s;
  for (Index i = 0; i < predicted.rows(); ++i) {
    for (Index j = 0; j < predicted.cols(); ++j)
      s += predicted(i, j) == measured(i, j) ? (predicted(i, j) ? '#' : '.') : (predicted(i, j) ? '-' : '+');
    s += '\n';
  }
  return s;
}

// (output i, input j) pairs where the masks differ.
inline std::vector<std::pair<Index, Index>> mask_differences(const DependencyMask& a, const DependencyMask& b) {
  std::vector<std::pair<Index, Index>> out;
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < a.cols(); ++j)
      if (a(i, j) != b(i, j)) out.push_back({i, j});
  return out;
}

// Causal pairs (j <= i) that output i cannot see: the gap a schedule leaves.
inline std::vector<std::pair<Index, Index>> causal_gaps(const DependencyMask& d) {
  std::vector<std::pair<Index, Index>> out;
  for (Index i = 0; i < d.rows(); ++i)
    for (Index j = 0; j <= i; ++j)
      if (!d(i, j)) out.push_back({i, j});
  return out;
}

inline std::string describe_pairs(const std::vector<std::pair<Index, Index>>& pairs) {
  std::string s;
  for (const auto& [i, j] : pairs) s += (s.empty() ? "" : " ") + ("(" + std::to_string(i) + "," + std::to_string(j) + ")");
  return s.empty() ? "none" : s;
}

}  // namespace deltaproof::ref::lact
