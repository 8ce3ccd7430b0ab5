// `deltaproof verify --op lact` (the LaCT equivalences on one seeded case) and `deltaproof masks`
// (predicted vs measured dependency masks of a schedule, as character grids).
#include "reference/high_agreement.hpp"
#include "reference/lact.hpp"
#include "reference/random_inputs.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"
#include "tools/report.hpp"

#include <iostream>

namespace deltaproof::tools {
namespace {

namespace lact = ref::lact;
using ref::Exact;
using ref::High;
using ref::Index;
using ref::Matrix;
using ref::Vector;

constexpr Index swiglu_hidden_dim = 4;

// Entries p/4 with p ∈ 1..8 when positive (no derivative vanishes by accident where a mask is
// measured), else n/4 with |n| <= 8.
Matrix<Exact> entries(ref::RandomDyadic& random, Index rows, Index cols, bool positive) {
  if (!positive) return random.matrix<Exact>(rows, cols);
  Matrix<Exact> m(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) m(i, j) = random.unit_interval<Exact>(8) * 2;
  return m;
}

struct Case {
  lact::Inputs<Exact> linear;  // {W (DV, DK)}
  lact::Inputs<Exact> swiglu;  // {W0 (DH, DK), W1 (DV, DH), W2 (DH, DK)}
};

Case make_case(const CaseOptions& o, bool positive) {
  ref::RandomDyadic random(o.seed);
  Case c;
  c.linear.q = entries(random, o.length, o.key_dim, positive);
  c.linear.k = entries(random, o.length, o.key_dim, positive);
  c.linear.v = entries(random, o.length, o.value_dim, positive);
  c.linear.learning_rate.resize(o.length);
  for (Index i = 0; i < o.length; ++i) c.linear.learning_rate(i) = random.unit_interval<Exact>(8);
  c.linear.initial_weights = {entries(random, o.value_dim, o.key_dim, positive)};
  c.swiglu = c.linear;
  // η/(DK C) for SwiGLU: the unbounded inner loss −η⟨f(k), v⟩ would otherwise grow the weights fast.
  c.swiglu.learning_rate /= Exact(o.key_dim * o.chunk_size);
  c.swiglu.initial_weights = {entries(random, swiglu_hidden_dim, o.key_dim, positive),
                              entries(random, o.value_dim, swiglu_hidden_dim, positive),
                              entries(random, swiglu_hidden_dim, o.key_dim, positive)};
  return c;
}

lact::Inputs<High> to_high(const lact::Inputs<Exact>& in) {
  lact::Inputs<High> out{ref::matrix_cast<High>(in.q), ref::matrix_cast<High>(in.k), ref::matrix_cast<High>(in.v),
                         ref::matrix_cast<High>(Matrix<Exact>(in.learning_rate)), {}};
  for (const auto& w : in.initial_weights) out.initial_weights.push_back(ref::matrix_cast<High>(w));
  return out;
}

void add_high(ComparisonTable& t, const std::string& quantity, const std::string& left, const std::string& right,
              const Matrix<High>& a, const Matrix<High>& b) {
  const auto s = ref::compare<Exact>(quantity, ref::matrix_cast<Exact>(a), ref::matrix_cast<Exact>(b),
                                     ref::high_agreement_bound(b));
  t.add(quantity, left, right, s, s.within_bound);
}

// Stacks per-chunk matrices vertically, so that one row of the table covers every chunk.
Matrix<High> stack(const std::vector<Matrix<High>>& parts) {
  Index rows = 0;
  for (const auto& p : parts) rows += p.rows();
  Matrix<High> out(rows, parts.empty() ? 0 : parts[0].cols());
  Index at = 0;
  for (const auto& p : parts) out.middleRows(at, p.rows()) = p, at += p.rows();
  return out;
}

}  // namespace

int verify_lact(const CaseOptions& o) {
  if (o.scalar != "exact") {
    std::cerr << "deltaproof: --scalar: --op lact verifies over exact rationals (High for SwiGLU); only exact is allowed\n";
    return 2;
  }
  const Index L = o.length, C = o.chunk_size;
  std::cout << "deltaproof verify: LaCT, L=" << L << " C=" << C << " DK=" << o.key_dim << " DV=" << o.value_dim
            << " DH=" << swiglu_hidden_dim << " seed=" << o.seed
            << "\ninputs: q, k, v, weights with entries n/4, |n| <= 8; eta = p/8 in (0, 1]\n\n";
  Progress progress("deltaproof verify --op lact", 2);
  progress.step("linear fast weight");
  const Case c = make_case(o, false);
  const lact::Schedule schedules[] = {lact::Schedule::UpdateThenApply, lact::Schedule::ApplyThenUpdate,
                                      lact::Schedule::SingleChunk};

  ComparisonTable linear("linear fast weight, additive update = masked linear attention (exact over Q)");
  for (lact::Schedule s : schedules)
    for (const Exact& mu : {Exact(0), Exact(1) / 2}) {
      const lact::Options<Exact> opt{s, C, 0, mu, false, false};
      const auto fwd = lact::forward<Exact, lact::LinearFastWeight>(c.linear, opt);
      const Matrix<Exact> expected = lact::masked_linear_attention<Exact>(
          c.linear.q, c.linear.k, c.linear.learning_rate.asDiagonal() * c.linear.v, c.linear.initial_weights[0],
          lact::block_mask<Exact>(s, L, C, mu));
      const auto summary = ref::compare<Exact>("output", fwd.output, expected);
      linear.add("output", "LaCT " + lact::to_string(s) + " mu=" + mu.str(), "masked LA", summary, summary.exact_zero());
    }

  progress.step("SwiGLU fast weight");
  ComparisonTable swiglu("SwiGLU fast weight, eta/(DK C) (High)");
  const lact::Inputs<High> high = to_high(c.swiglu);
  {
    // W_[c+1] = W_[c] − Δ_c, Δ_c = μ Δ_{c−1} + ∇ℓ_c(W_[c]) with ∇ by dual numbers on the inner loss.
    const lact::Options<High> opt{lact::Schedule::UpdateThenApply, C, 0, High(1) / 2, false, false};
    const auto fwd = lact::forward<High, lact::SwiGluFastWeight>(high, opt);
    const auto chunks = ref::chunks_of(L, C);
    std::vector<std::vector<Matrix<High>>> got(3), want(3);
    lact::Weights<High> delta;
    for (const auto& m : high.initial_weights) delta.push_back(Matrix<High>::Zero(m.rows(), m.cols()));
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const auto& ch = chunks[ci];
      const auto& before = fwd.boundary_weights[ci];
      const auto& after = ci + 1 < chunks.size() ? fwd.boundary_weights[ci + 1] : fwd.final_weights;
      const auto g = lact::inner_loss_gradient_by_dual<lact::SwiGluFastWeight, High>(
          before, high.k.middleRows(ch.begin, ch.size), high.v.middleRows(ch.begin, ch.size),
          high.learning_rate.segment(ch.begin, ch.size));
      for (size_t p = 0; p < 3; ++p) {
        delta[p] = opt.momentum * delta[p] + g[p];
        got[p].push_back(after[p]);
        want[p].push_back(before[p] - delta[p]);
      }
    }
    for (size_t p = 0; p < 3; ++p)
      add_high(swiglu, "W" + std::to_string(p) + " per chunk", "update (mu=1/2)", "W - sum grad at start", stack(got[p]),
               stack(want[p]));
  }
  {
    const lact::Options<High> single{lact::Schedule::SingleChunk, C, 0, High(0), true, true};
    const lact::Options<High> whole{lact::Schedule::UpdateThenApply, L, 0, High(0), true, true};
    const auto a = lact::forward<High, lact::SwiGluFastWeight>(high, single);
    const auto b = lact::forward<High, lact::SwiGluFastWeight>(high, whole);
    const auto summary = ref::compare<Exact>("output", ref::matrix_cast<Exact>(a.output), ref::matrix_cast<Exact>(b.output));
    swiglu.add("output", "single chunk +norm+NS", "update-apply C=L", summary, summary.exact_zero());
  }
  {
    const lact::Options<High> opt{lact::Schedule::UpdateThenApply, C, 0, High(0), true, true};
    const auto fwd = lact::forward<High, lact::SwiGluFastWeight>(high, opt);
    for (size_t p = 0; p < 3; ++p) {
      std::vector<Matrix<High>> got, want;
      for (const auto& w : fwd.boundary_weights) got.push_back(Matrix<High>(lact::row_norms(w[p])));
      got.push_back(Matrix<High>(lact::row_norms(fwd.final_weights[p])));
      for (size_t i = 0; i < got.size(); ++i) want.push_back(Matrix<High>(lact::row_norms(high.initial_weights[p])));
      add_high(swiglu, "W" + std::to_string(p) + " row norms", "weight norm + NS", "initial norms", stack(got), stack(want));
    }
  }
  {
    // Linear fast weight with Newton–Schulz: W_[c+1] = W_[c] − NS(−Vᵀ diag(η) K).
    const lact::Inputs<High> lin = to_high(c.linear);
    const lact::Options<High> opt{lact::Schedule::UpdateThenApply, C, 0, High(0), false, true};
    const auto fwd = lact::forward<High, lact::LinearFastWeight>(lin, opt);
    const auto chunks = ref::chunks_of(L, C);
    std::vector<Matrix<High>> got, want;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const auto& ch = chunks[ci];
      const Matrix<High> g = -(lin.v.middleRows(ch.begin, ch.size).transpose() *
                               lin.learning_rate.segment(ch.begin, ch.size).asDiagonal() * lin.k.middleRows(ch.begin, ch.size));
      got.push_back(ci + 1 < chunks.size() ? fwd.boundary_weights[ci + 1][0] : fwd.final_weights[0]);
      want.push_back(fwd.boundary_weights[ci][0] - lact::newton_schulz(g));
    }
    add_high(swiglu, "W per chunk", "linear, NS update", "W - NS(grad)", stack(got), stack(want));
  }

  linear.print(std::cout);
  std::cout << "\n";
  swiglu.print(std::cout);
  std::cout << "\nHigh bound: |a - b| <= 1e-60 (1 + max|b|) (reference/high_agreement.hpp)\n"
            << "dependency masks: deltaproof masks --schedule update-apply|apply-update|single --L --C --window\n";
  const bool pass = linear.all_pass() && swiglu.all_pass();
  std::cout << "\n" << (pass ? "all LaCT equivalences hold" : "LaCT EQUIVALENCES FAIL") << "\n";
  return pass ? 0 : 1;
}

int masks_lact(const CaseOptions& o) {
  const auto schedule = lact::parse_schedule(o.schedule);
  if (!schedule) {
    std::cerr << "deltaproof: --schedule must be update-apply, apply-update or single, got " << o.schedule << "\n";
    return 2;
  }
  Progress progress("deltaproof masks", 1);
  progress.step("measured mask");
  const lact::DependencyMask predicted = lact::predicted_dependencies(*schedule, o.length, o.chunk_size, o.window);
  const Case c = make_case(o, true);
  const bool exact = o.fast_weight == "linear" && o.window == 0;
  lact::DependencyMask measured;
  if (exact) {
    measured = lact::measure_dependencies_exact(c.linear, lact::Options<Exact>{*schedule, o.chunk_size, 0, Exact(0), false, false});
  } else {
    const lact::Options<High> opt{*schedule, o.chunk_size, o.window, High(0), false, false};
    measured = o.fast_weight == "linear"
                   ? lact::measure_dependencies_by_perturbation<lact::LinearFastWeight>(to_high(c.linear), opt)
                   : lact::measure_dependencies_by_perturbation<lact::SwiGluFastWeight>(to_high(c.swiglu), opt);
  }
  std::cout << "deltaproof masks: LaCT " << lact::to_string(*schedule) << ", L=" << o.length << " C=" << o.chunk_size
            << " window=" << o.window << ", " << o.fast_weight << " fast weight, DK=" << o.key_dim << " DV=" << o.value_dim
            << " seed=" << o.seed << "\nrows: output i, columns: input token j (q_j, k_j, v_j, eta_j); '#' may influence\n"
            << "measured: "
            << (exact ? "exactly nonzero Jacobian blocks over Q (dual numbers)"
                      : "output row not bitwise unchanged when token j is perturbed (High)")
            << "\n\npredicted\n" << lact::mask_grid(predicted) << "\nmeasured\n" << lact::mask_grid(measured)
            << "\ndifference ('#' both, '.' neither, '-' predicted only, '+' measured only)\n"
            << lact::mask_difference_grid(predicted, measured) << "\n";
  const auto differences = lact::mask_differences(predicted, measured);
  std::cout << "differences: " << lact::describe_pairs(differences) << "\n"
            << "causal gaps (j <= i not influencing i): " << lact::describe_pairs(lact::causal_gaps(measured)) << "\n"
            << (differences.empty() ? "measured mask equals the prediction" : "MEASURED MASK DIFFERS FROM THE PREDICTION")
            << "\n";
  return differences.empty() ? 0 : 1;
}

}  // namespace deltaproof::tools
