// Certificate for proofs/ttt_lact.md: for each listed shape, the TTT and LaCT equivalences of
// reference/ttt.hpp and reference/lact.hpp hold for ALL inputs of that shape (q, k, v, learning
// rates, initial weights, momentum), by Schwartz–Zippel identity testing
// (proofs/identity_testing.hpp). The TTT loop takes its inner gradients by dual numbers, so the
// loop side of each identity uses no hand-derived formula.
//
// Built three times: faithful; with DELTAPROOF_PLANTED_ttt (mini-batch gradients at the running
// weights instead of the batch start); with DELTAPROOF_PLANTED_lact (the shifted schedule reads
// the updated weights). ctest expects both planted builds to fail (WILL_FAIL).
#include "proofs/identity_testing.hpp"
#include "reference/delta_rule.hpp"
#include "reference/lact.hpp"
#include "reference/linear_attention.hpp"
#include "reference/ttt.hpp"

#include <optional>
#include <string>

namespace {

using namespace deltaproof::proofs;
namespace ttt = deltaproof::ref::ttt;
namespace lact = deltaproof::ref::lact;
namespace la = deltaproof::ref::linear_attention;
namespace dr = deltaproof::ref::delta_rule;
namespace ref = deltaproof::ref;

#ifdef DELTAPROOF_PLANTED_ttt
using TttPolicy = ttt::GradientAtRunningWeights;
#else
using TttPolicy = ttt::Faithful;
#endif
#ifdef DELTAPROOF_PLANTED_lact
using LactPolicy = lact::ShiftedReadsUpdatedWeights;
#else
using LactPolicy = lact::Faithful;
#endif

struct TttShape {
  Index L, DK, DV, b;
  bool initial_state;
  bool nonquadratic;  // also the quartic loss and the frozen quadratic features (degrees grow fast: small L only)
  std::string name() const {
    return "TTT L=" + std::to_string(L) + " DK=" + std::to_string(DK) + " DV=" + std::to_string(DV) + " b=" + std::to_string(b) +
           (initial_state ? " W_0 given" : " W_0 = 0");
  }
};

template <class S>
void equal_forward(Claim<S>& claim, const ttt::Forward<S>& a, const ttt::Forward<S>& b) {
  claim.equal(a.output, b.output).equal(a.final_state, b.final_state);
}

// The general statement for one loss and feature map: the loop = its linear-attention writes,
// replayed through linear attention's recurrence and parallel form.
template <class Loss, class Features, class S>
void general_statement(Claims<S>& out, const ttt::Inputs<S>& in, const std::string& what) {
  const auto loop = ttt::gradient_descent<S, Loss, Features>(in);
  const auto writes = ttt::as_linear_attention<S, Loss, Features>(in);
  const auto replay = la::token_recurrence(writes.writes);
  const auto parallel = la::parallel_masked(writes.writes);
  out.add("tokenwise TTT, " + what + ": gradient step = write vhat_t k_t^T; loop = writes replayed by linear attention"
          " (recurrence, parallel): O, W_L  [gradient_descent, as_linear_attention]")
      .equal(loop.output, writes.forward.output)
      .equal(loop.final_state, writes.forward.final_state)
      .equal(loop.output, replay.output)
      .equal(loop.final_state, replay.final_state)
      .equal(loop.output, parallel.output);
}

template <class Source>
auto ttt_claims(const TttShape& sh, Source& src) {
  using S = std::decay_t<decltype(src.matrix(1, 1)(0, 0))>;
  ttt::Inputs<S> in{src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DV), src.vector(sh.L), std::nullopt};
  if (sh.initial_state) in.initial_state = src.matrix(sh.DV, sh.DK);
  const Vector<S> momentum = src.vector(sh.L);
  Claims<S> out;
  const dr::Inputs<S> delta{in.q, in.k, in.v, in.learning_rate, in.initial_state};
  const auto deltanet = dr::token_recurrence(delta);

  equal_forward(out.add("tokenwise TTT, squared loss 1/2|W k - v|^2 = DeltaNet (beta = eta): O, W_L"
                        "  [gradient_descent<SquaredBinding> = delta_rule::token_recurrence]"),
                ttt::gradient_descent<S, ttt::SquaredBinding>(in), ttt::Forward<S>{deltanet.output, deltanet.final_state});
  const la::Inputs<S> additive{in.q, in.k, in.learning_rate.asDiagonal() * in.v, in.initial_state};
  const auto linear = la::parallel_masked(additive);
  equal_forward(out.add("tokenwise TTT, linear objective -v.(W k) = linear attention with values eta v: O, W_L"
                        "  [gradient_descent<NegativeDot> = parallel_masked]"),
                ttt::gradient_descent<S, ttt::NegativeDot>(in), ttt::Forward<S>{linear.output, linear.final_state});
  general_statement<ttt::SquaredBinding, ttt::IdentityFeatures>(out, in, "squared loss");
  general_statement<ttt::NegativeDot, ttt::IdentityFeatures>(out, in, "linear objective");

  equal_forward(out.add("mini-batch TTT (b=" + std::to_string(sh.b) + "), squared loss: primal loop = dual form: O, W_L"
                        "  [gradient_descent{b} = minibatch_dual]"),
                ttt::gradient_descent<S, ttt::SquaredBinding, ttt::IdentityFeatures, TttPolicy>(in, {sh.b, std::nullopt}),
                ttt::minibatch_dual<S, ttt::SquaredBinding>(in, sh.b));
  equal_forward(out.add("mini-batch TTT (b=" + std::to_string(sh.b) + "), linear objective: primal = dual = linear attention"
                        "  [gradient_descent{b} = minibatch_dual = parallel_masked]"),
                ttt::gradient_descent<S, ttt::NegativeDot, ttt::IdentityFeatures, TttPolicy>(in, {sh.b, std::nullopt}),
                ttt::minibatch_dual<S, ttt::NegativeDot>(in, sh.b));
  out.list.back().equal(ttt::minibatch_dual<S, ttt::NegativeDot>(in, sh.b).output, linear.output);
  equal_forward(out.add("mini-batch dual at b = 1 = DeltaNet: O, W_L  [minibatch_dual(1) = delta_rule::token_recurrence]"),
                ttt::minibatch_dual<S, ttt::SquaredBinding>(in, 1), ttt::Forward<S>{deltanet.output, deltanet.final_state});
  equal_forward(out.add("TTT with momentum M_t = a_t M_{t-1} + eta_t grad_t = linear attention with mask A_ti: O, W_L"
                        "  [gradient_descent{1, a} = momentum_linear_attention]"),
                ttt::gradient_descent<S, ttt::SquaredBinding>(in, {1, momentum}),
                ttt::momentum_linear_attention<S, ttt::SquaredBinding>(in, momentum));

  if (sh.nonquadratic) {
    general_statement<ttt::QuarticBinding, ttt::IdentityFeatures>(out, in, "quartic loss 1/4 sum (f - v)^4");
    ttt::Inputs<S> featured{in.q, in.k, in.v, in.learning_rate, std::nullopt};
    if (sh.initial_state) featured.initial_state = src.matrix(sh.DV, 2 * sh.DK);
    general_statement<ttt::SquaredBinding, ttt::QuadraticFeatures>(out, featured, "squared loss on frozen features [x, x*x]");
    equal_forward(out.add("mini-batch TTT (b=" + std::to_string(sh.b) + "), squared loss on features [x, x*x]: primal = dual"
                          "  [gradient_descent{b} = minibatch_dual]"),
                  ttt::gradient_descent<S, ttt::SquaredBinding, ttt::QuadraticFeatures, TttPolicy>(featured, {sh.b, std::nullopt}),
                  ttt::minibatch_dual<S, ttt::SquaredBinding, ttt::QuadraticFeatures>(featured, sh.b));
    equal_forward(out.add("TTT with momentum, quartic loss = linear attention with mask A_ti  [momentum_linear_attention]"),
                  ttt::gradient_descent<S, ttt::QuarticBinding>(in, {1, momentum}),
                  ttt::momentum_linear_attention<S, ttt::QuarticBinding>(in, momentum));
  }
  return out;
}

struct LactShape {
  Index L, C, DK, DV;
  std::string name() const {
    return "LaCT L=" + std::to_string(L) + " C=" + std::to_string(C) + " DK=" + std::to_string(DK) + " DV=" + std::to_string(DV) +
           ", linear fast weight, momentum mu symbolic";
  }
};

template <class Source>
auto lact_claims(const LactShape& sh, Source& src) {
  using S = std::decay_t<decltype(src.matrix(1, 1)(0, 0))>;
  const lact::Inputs<S> in{src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DK), src.matrix(sh.L, sh.DV), src.vector(sh.L),
                           {src.matrix(sh.DV, sh.DK)}};
  const S mu = src.vector(1)(0);
  Claims<S> out;
  const Matrix<S> values = in.learning_rate.asDiagonal() * in.v;  // (L, DV): η_j v_j
  for (const auto schedule : {lact::Schedule::UpdateThenApply, lact::Schedule::ApplyThenUpdate, lact::Schedule::SingleChunk}) {
    const lact::Options<S> opt{schedule, sh.C, 0, mu, false, false};
    const auto fwd = lact::forward<S, lact::LinearFastWeight, LactPolicy>(in, opt);
    const Matrix<S> mask = lact::block_mask<S>(schedule, sh.L, sh.C, mu);
    out.add("LaCT " + lact::to_string(schedule) + " (C=" + std::to_string(sh.C) +
            "), linear fast weight, momentum mu = masked linear attention, M_ij = sum_{c=chunk(j)..r(i)} mu^(c-chunk(j))"
            "  [lact::forward = masked_linear_attention(block_mask)]")
        .equal(fwd.output, lact::masked_linear_attention<S>(in.q, in.k, values, in.initial_weights[0], mask));
  }
  {
    const lact::Options<S> opt{lact::Schedule::UpdateThenApply, 1, 0, S(0), false, false};
    const auto fwd = lact::forward<S, lact::LinearFastWeight, LactPolicy>(in, opt);
    out.add("LaCT update-apply at C = 1, no momentum = causal linear attention  [lact::forward = linear_attention::token_recurrence]")
        .equal(fwd.output, la::token_recurrence(la::Inputs<S>{in.q, in.k, values, in.initial_weights[0]}).output);
  }
  auto& gradient = out.add("closed-form chunk gradient -V^T diag(eta) K = dual-number gradient of l_c = -sum eta_i <W k_i, v_i>"
                           ", every chunk  [LinearFastWeight::chunk_gradient = inner_loss_gradient_by_dual]");
  for (const auto& ch : ref::chunks_of(sh.L, sh.C)) {
    const Matrix<S> k = in.k.middleRows(ch.begin, ch.size), v = in.v.middleRows(ch.begin, ch.size);
    const Vector<S> eta = in.learning_rate.segment(ch.begin, ch.size);
    gradient.equal(lact::LinearFastWeight::chunk_gradient(in.initial_weights, k, v, eta)[0],
                   lact::inner_loss_gradient_by_dual<lact::LinearFastWeight>(in.initial_weights, k, v, eta)[0]);
  }
  auto& masks = out.add("block masks at mu = 0 are the schedules' definitions [chunk(j) <= chunk(i)], [chunk(j) < chunk(i)], all"
                        "  [block_mask]");
  Matrix<S> bidirectional(sh.L, sh.L), shifted(sh.L, sh.L);
  for (Index i = 0; i < sh.L; ++i)
    for (Index j = 0; j < sh.L; ++j) {
      bidirectional(i, j) = S(j / sh.C <= i / sh.C ? 1 : 0);
      shifted(i, j) = S(j / sh.C < i / sh.C ? 1 : 0);
    }
  masks.equal(lact::block_mask<S>(lact::Schedule::UpdateThenApply, sh.L, sh.C, S(0)), bidirectional)
      .equal(lact::block_mask<S>(lact::Schedule::ApplyThenUpdate, sh.L, sh.C, S(0)), shifted)
      .equal(lact::block_mask<S>(lact::Schedule::SingleChunk, sh.L, sh.C, S(0)), Matrix<S>::Constant(sh.L, sh.L, S(1)));
  return out;
}

}  // namespace

int main() {
  Certificate cert("TTT / LaCT certificate (proofs/ttt_lact.md): tokenwise TTT = DeltaNet / linear attention (general"
                   " statement for any loss), mini-batch primal = dual, momentum = masked linear attention; LaCT schedules"
                   " with a linear fast weight = masked linear attention"
#ifdef DELTAPROOF_PLANTED_ttt
                   "\nPLANTED BUG: mini-batch gradients taken at the running weights (this run must fail)"
#endif
#ifdef DELTAPROOF_PLANTED_lact
                   "\nPLANTED BUG: the shifted schedule reads the updated weights (this run must fail)"
#endif
  );
  const TttShape ttt_shapes[] = {
      {1, 1, 1, 1, true, true}, {4, 2, 1, 2, true, true}, {5, 1, 2, 3, false, true}, {7, 3, 1, 3, true, false},
      {9, 2, 3, 4, true, false}, {16, 2, 2, 5, true, false}, {33, 3, 2, 8, true, false},
  };
  for (const TttShape& sh : ttt_shapes) cert.shape(sh.name(), [&](auto& source) { return ttt_claims(sh, source); });
  const LactShape lact_shapes[] = {{1, 2, 1, 1}, {7, 3, 2, 2}, {8, 4, 1, 3}, {10, 4, 3, 2}, {12, 5, 2, 1}, {40, 16, 3, 2}};
  for (const LactShape& sh : lact_shapes) cert.shape(sh.name(), [&](auto& source) { return lact_claims(sh, source); });
  return cert.finish();
}
