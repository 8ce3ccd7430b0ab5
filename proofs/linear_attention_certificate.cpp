// Certificate for proofs/linear_attention.md: over every small shape, the three forward forms
// are equal *as polynomials* in the inputs (so for all real inputs of that shape, not only
// sampled ones), and each backward path equals the formal gradient of
// L = <dO, O> + <dS_L, S_L>. Prints one line per shape group; exit 0 iff every identity holds.
// The method is symbolic (polynomials compared term by term), so the failure probability is 0.
// Built twice: faithful, and with DELTAPROOF_PLANTED (the partial last chunk dropped from the
// chunkwise forward and backward), which ctest expects to fail.
#include "reference/linear_attention.hpp"
#include "reference/polynomial.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

namespace la = deltaproof::ref::linear_attention;
using deltaproof::ref::Index;
using deltaproof::ref::Matrix;
using deltaproof::ref::Polynomial;

#ifdef DELTAPROOF_PLANTED
// Planted bug: a partial last chunk (L % C != 0) is skipped, a classic tail-handling slip.
struct Policy : la::Faithful {
  static bool keeps_chunk(const deltaproof::ref::Chunk& c, Index chunk_size) { return c.size == chunk_size; }
};
#else
using Policy = la::Faithful;
#endif

// Fresh variables x_0, x_1, ... for the entries of each input matrix.
struct Variables {
  int count = 0;
  Matrix<Polynomial> matrix(Index rows, Index cols, std::vector<int>* ids = nullptr) {
    Matrix<Polynomial> m(rows, cols);
    for (Index i = 0; i < rows; ++i)
      for (Index j = 0; j < cols; ++j) {
        if (ids) ids->push_back(count);
        m(i, j) = Polynomial::variable(count++);
      }
    return m;
  }
};

// Entry (i, j) of a gradient matrix must be ∂L/∂(variable of the matching input entry).
bool is_formal_gradient(const Matrix<Polynomial>& gradient, const Polynomial& loss, const std::vector<int>& ids) {
  for (Index i = 0; i < gradient.rows(); ++i)
    for (Index j = 0; j < gradient.cols(); ++j)
      if (gradient(i, j) != loss.derivative(ids[static_cast<size_t>(i * gradient.cols() + j)])) return false;
  return true;
}

bool certify(Index L, Index C, Index DK, Index DV) {
  Variables vars;
  std::vector<int> q_ids, k_ids, v_ids, s0_ids;
  la::Inputs<Polynomial> in{vars.matrix(L, DK, &q_ids), vars.matrix(L, DK, &k_ids), vars.matrix(L, DV, &v_ids),
                            vars.matrix(DV, DK, &s0_ids)};
  const la::Cotangents<Polynomial> cot{vars.matrix(L, DV), vars.matrix(DV, DK)};

  const auto parallel = la::parallel_masked(in);
  const auto recurrent = la::token_recurrence(in);
  const auto chunked = la::chunkwise<Polynomial, Policy>(in, C);
  bool ok = recurrent.output == parallel.output && chunked.output == parallel.output &&
            recurrent.final_state == parallel.final_state && chunked.final_state == parallel.final_state;

  const Polynomial loss = la::pairing(parallel, cot);
  for (const auto& g : {la::parallel_masked_backward(in, cot), la::token_recurrence_backward(in, cot),
                        la::chunkwise_backward<Polynomial, Policy>(in, cot, C)})
    ok = ok && is_formal_gradient(g.dq, loss, q_ids) && is_formal_gradient(g.dk, loss, k_ids) &&
         is_formal_gradient(g.dv, loss, v_ids) && is_formal_gradient(g.d_initial_state, loss, s0_ids);
  return ok;
}

}  // namespace

int main() {
  int shapes = 0, failures = 0;
  std::printf("linear attention certificate (proofs/linear_attention.md): parallel = recurrent = chunkwise forms,\n"
              "each backward path = formal gradient; method: symbolic (equal as polynomials over Q, every\n"
              "input entry a variable), failure probability 0\n");
#ifdef DELTAPROOF_PLANTED
  std::printf("PLANTED BUG: partial last chunk dropped from the chunkwise forms (this run must fail)\n");
#endif
  for (Index L = 1; L <= 6; ++L) {
    int group = 0, group_failures = 0;
    for (Index C = 1; C <= L + 1; ++C)
      for (Index DK = 1; DK <= 3; ++DK)
        for (Index DV = 1; DV <= 2; ++DV) {
          const bool ok = certify(L, C, DK, DV);
          ++group, ++shapes;
          if (!ok) {
            ++group_failures, ++failures;
            std::printf("  FAILED: L=%ld C=%ld DK=%ld DV=%ld\n", long(L), long(C), long(DK), long(DV));
          }
        }
    std::printf("  L=%ld: C=1..%ld, DK=1..3, DV=1..2, S_0 and dS_L symbolic: %d shapes, %s\n", long(L), long(L + 1),
                group, group_failures ? "FAILED" : "all identities hold");
  }
  std::printf("%d shapes, %d failed\n", shapes, failures);
  return failures ? 1 : 0;
}
