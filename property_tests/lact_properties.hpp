// LaCT cases and properties, as functions of a case templated on a Policy, so that the
// planted-bug tests run the same checks on broken schedules.
#pragma once

#include "property_tests/support/assertions.hpp"
#include "property_tests/support/generators.hpp"
#include "reference/lact.hpp"

#include <ostream>

namespace deltaproof::testing {

namespace lact = ref::lact;
using ref::High;
using ref::Vector;

struct LactCase {
  Shape shape;
  Index hidden_dim = 1, window = 0;
  lact::Schedule schedule = lact::Schedule::UpdateThenApply;
  Exact momentum{0};
  Matrix<Exact> q, k, v;
  Vector<Exact> learning_rate;
  Matrix<Exact> linear_weight;  // (DV, DK)
  Matrix<Exact> w0, w1, w2;     // SwiGLU: (DH, DK), (DV, DH), (DH, DK)

  lact::Options<Exact> options() const { return {schedule, shape.chunk_size, window, momentum, false, false}; }
  lact::Inputs<Exact> linear_inputs() const { return {q, k, v, learning_rate, {linear_weight}}; }
  lact::Inputs<High> swiglu_inputs() const {
    using ref::matrix_cast;
    return {matrix_cast<High>(q), matrix_cast<High>(k), matrix_cast<High>(v), matrix_cast<High>(Matrix<Exact>(learning_rate)),
            {matrix_cast<High>(w0), matrix_cast<High>(w1), matrix_cast<High>(w2)}};
  }
  lact::Inputs<High> linear_inputs_high() const {
    using ref::matrix_cast;
    return {matrix_cast<High>(q), matrix_cast<High>(k), matrix_cast<High>(v), matrix_cast<High>(Matrix<Exact>(learning_rate)),
            {matrix_cast<High>(linear_weight)}};
  }
};

inline std::ostream& operator<<(std::ostream& os, const LactCase& c) {
  return os << "LaCT case " << c.shape << ", DH=" << c.hidden_dim << ", schedule=" << lact::to_string(c.schedule)
            << ", window=" << c.window << ", momentum=" << c.momentum << "\nq =\n" << c.q << "\nk =\n" << c.k << "\nv =\n"
            << c.v << "\neta = " << c.learning_rate.transpose() << "\nW =\n" << c.linear_weight << "\nW0 =\n" << c.w0
            << "\nW1 =\n" << c.w1 << "\nW2 =\n" << c.w2;
}

// Entries p/4 with p ∈ 1..8: positive, so that no derivative vanishes by accident at the point
// where a dependency mask is measured (a zero there would be a coincidence, not structure).
inline rc::Gen<Matrix<Exact>> gen_positive_matrix(Index rows, Index cols) {
  return rc::gen::map(rc::gen::container<std::vector<int>>(static_cast<size_t>(rows * cols), rc::gen::inRange(1, 9)),
                      [rows, cols](const std::vector<int>& p) {
                        Matrix<Exact> m(rows, cols);
                        for (Index i = 0; i < rows; ++i)
                          for (Index j = 0; j < cols; ++j) m(i, j) = Exact(p[static_cast<size_t>(i * cols + j)]) / 4;
                        return m;
                      });
}

struct LactLimits {
  ShapeLimits shape{.max_length = 24, .max_dim = 4, .max_chunk = 8};
  bool positive = false;
};

inline rc::Gen<LactCase> gen_lact_case(LactLimits limits = {}) {
  return rc::gen::mapcat(gen_shape(limits.shape), [positive = limits.positive](const Shape& s) {
    const auto entries = [positive](Index r, Index c) { return positive ? gen_positive_matrix(r, c) : gen_matrix(r, c); };
    return rc::gen::mapcat(rc::gen::inRange<Index>(1, 5), [=](Index hidden) {
      return rc::gen::apply(
          [s, hidden](lact::Schedule schedule, Index window, int momentum, Matrix<Exact> q, Matrix<Exact> k, Matrix<Exact> v,
                      Matrix<Exact> eta, Matrix<Exact> w, Matrix<Exact> w0, Matrix<Exact> w1, Matrix<Exact> w2) {
            LactCase c;
            c.shape = s;
            c.hidden_dim = hidden;
            c.schedule = schedule;
            c.window = window;
            c.momentum = Exact(momentum) / 4;
            c.q = std::move(q), c.k = std::move(k), c.v = std::move(v);
            c.learning_rate = eta.col(0);
            c.linear_weight = std::move(w), c.w0 = std::move(w0), c.w1 = std::move(w1), c.w2 = std::move(w2);
            return c;
          },
          rc::gen::element(lact::Schedule::UpdateThenApply, lact::Schedule::ApplyThenUpdate, lact::Schedule::SingleChunk),
          rc::gen::inRange<Index>(0, s.length + 2), rc::gen::inRange(0, 5), entries(s.length, s.key_dim),
          entries(s.length, s.key_dim), entries(s.length, s.value_dim), gen_positive_matrix(s.length, 1),
          entries(s.value_dim, s.key_dim), entries(hidden, s.key_dim), entries(s.value_dim, hidden),
          entries(hidden, s.key_dim));
    });
  });
}

// Linear fast weight, additive update: LaCT == linear attention with the schedule's block mask
// (weighted by momentum), values η v and S_0 = W_0, exactly.
template <class Policy = lact::Faithful>
void check_linear_lact_is_masked_linear_attention(const LactCase& c) {
  auto opt = c.options();
  opt.window = 0;
  const auto fwd = lact::forward<Exact, lact::LinearFastWeight, Policy>(c.linear_inputs(), opt);
  const Matrix<Exact> mask = lact::block_mask<Exact>(c.schedule, c.shape.length, c.shape.chunk_size, c.momentum);
  const Matrix<Exact> la = lact::masked_linear_attention<Exact>(c.q, c.k, c.learning_rate.asDiagonal() * c.v,
                                                                c.linear_weight, mask);
  require_equal("LaCT(linear, " + lact::to_string(c.schedule) + ") vs masked linear attention", fwd.output, la);
}

// Measured dependency structure (exact Jacobian blocks, linear fast weight) == prediction.
template <class Policy = lact::Faithful>
void check_exact_mask(const LactCase& c) {
  auto opt = c.options();
  opt.window = 0;
  const auto predicted = lact::predicted_dependencies(c.schedule, c.shape.length, c.shape.chunk_size, 0);
  const auto measured = lact::measure_dependencies_exact<Policy>(c.linear_inputs(), opt);
  if (predicted != measured)
    RC_FAIL("dependency mask (" + lact::to_string(c.schedule) + ", C=" + std::to_string(c.shape.chunk_size) +
            ") measured over Q differs from the prediction at " +
            lact::describe_pairs(lact::mask_differences(predicted, measured)) + "\npredicted\n" +
            lact::mask_grid(predicted) + "measured\n" + lact::mask_grid(measured) + "difference (- predicted only, + measured only)\n" +
            lact::mask_difference_grid(predicted, measured));
}

// Measured by perturbation in High (SwiGLU fast weight, every option, window branch) == prediction.
template <class Policy = lact::Faithful>
void check_perturbation_mask(const LactCase& c, const lact::Options<High>& opt) {
  const auto predicted = lact::predicted_dependencies(opt.schedule, c.shape.length, opt.chunk_size, opt.window);
  const auto measured = lact::measure_dependencies_by_perturbation<lact::SwiGluFastWeight, Policy>(c.swiglu_inputs(), opt);
  if (predicted != measured)
    RC_FAIL("dependency mask (" + lact::to_string(opt.schedule) + ", C=" + std::to_string(opt.chunk_size) +
            ", window=" + std::to_string(opt.window) + ") measured by perturbation differs from the prediction at " +
            lact::describe_pairs(lact::mask_differences(predicted, measured)) + "\npredicted\n" +
            lact::mask_grid(predicted) + "measured\n" + lact::mask_grid(measured) + "difference (- predicted only, + measured only)\n" +
            lact::mask_difference_grid(predicted, measured));
}

}  // namespace deltaproof::testing
