// Bugs planted in the DeltaNet / Gated DeltaNet backward's results: each mutant is what the kernel would
// have written with the named bug, and the stage check named with it must reject it. Shared by the
// device-free checker test (delta_rule_backward_checks_test: on the oracle) and the GPU suite
// (delta_rule_backward_gpu_test: on the kernel's own result), so that both plant the same bugs.
#pragma once

#include "kernel_checks/delta_rule_backward_stages.hpp"
#include "property_tests/support/delta_rule_gpu_suite.hpp"
#include "reference/delta_rule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace deltaproof::delta_rule_gpu_suite {

inline bool any_row_fails(const std::vector<Comparison>& rows, const std::string& tensor) {
  return std::any_of(rows.begin(), rows.end(), [&](const Comparison& c) { return c.tensor == tensor && !c.agrees(); });
}

// dg_j = Σ_{r > j} dG_r: the in-chunk reverse sum of the gate-sum gradients starts one token late.
inline void plant_gate_sum_off_by_one(const DeltaCase& c, BackwardResult& r) {
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    const Matrix<Exact> dgs = r.d_gate_sums.head(b, h);
    Matrix<Exact> dg = Matrix<Exact>::Zero(c.length, 1);
    for (const ref::Chunk& ch : ref::chunks_of(c.length, c.chunk)) {
      Exact running(0);
      for (Index t = ch.begin + ch.size - 1; t >= ch.begin; --t) {
        dg(t, 0) = running;  // the bug: token t's own dG_t is added after it is written
        running += dgs(t, 0);
      }
    }
    r.d_log_gate.set_head(b, h, dg);
  });
}

// dβ without its T-adjoint term Σ_j (E ⊙ D)_ij k_i·k_j (only the W and U terms), stored in the dtype.
inline void plant_d_beta_without_adjoint(const DeltaCase& c, const HostInputs& in, BackwardResult& r) {
  ref::for_each_head(c.batch, c.heads, [&](Index b, Index h) {
    const Matrix<High> k = ref::matrix_cast<High>(in.k.head(b, h)), e = ref::matrix_cast<High>(r.e.head(b, h));
    const Matrix<High> gsum = ref::matrix_cast<High>(r.gate_sums.head(b, h));
    Matrix<Exact> db = r.d_beta.head(b, h);
    for (const ref::Chunk& ch : ref::chunks_of(c.length, c.chunk))
      for (Index i = 0; i < ch.size; ++i) {
        High adjoint(0);
        for (Index j = 0; j < i; ++j) {
          const High decay = c.gated ? High(exp(gsum(ch.begin + i, 0) - gsum(ch.begin + j, 0))) : High(1);
          adjoint += e(ch.index * c.chunk + i, j) * decay * k.row(ch.begin + i).dot(k.row(ch.begin + j));
        }
        db(ch.begin + i, 0) = dt::round_to(Exact(db(ch.begin + i, 0) - ref::scalar_cast<Exact>(adjoint)), c.dtype);
      }
    r.d_beta.set_head(b, h, db);
  });
}

inline void expect_planted_bugs_caught(const DeltaCase& c, const HostInputs& in, const Cotangents& cot, const BackwardResult& good,
                                       const BackwardResult& without_final_gradient) {
  auto expect_caught = [&](const std::string& bug, const std::string& stage, const BackwardResult& bad) {
    const auto rep = check_backward_stages(c, in, cot, bad);
    EXPECT_TRUE(any_row_fails(rep, stage)) << "planted bug not caught by " << stage << ": " << bug << "\n" << describe(c);
    for (const Comparison& row : rep)
      if (!row.agrees()) {
        std::cout << "caught " << bug << ": " << describe(row) << "\n";
        break;
      }
  };
  // What the kernel writes when it starts the reverse scan from 0 instead of dS_L.
  expect_caught("dropped dS_L", "dS_L", without_final_gradient);
  {
    BackwardResult bad = good;
    plant_d_beta_without_adjoint(c, in, bad);
    expect_caught("dbeta missing the T-adjoint term", "dbeta", bad);
  }
  if (c.gated) {
    BackwardResult bad = good;
    plant_gate_sum_off_by_one(c, bad);
    expect_caught("gate-sum gradient off by one token", "dg", bad);
  }
  {
    BackwardResult bad = good;  // dW = +dV̄ S
    for (Exact& x : bad.d_w.data) x = -x;
    expect_caught("dW with the wrong sign", "dW", bad);
  }
  {
    BackwardResult bad = good;  // S_[0] = 0: the state scan ignores S_0
    for (Index i = 0; i < c.value_dim * c.key_dim; ++i) bad.boundary.data[size_t(i)] = 0;
    expect_caught("lost S_0", "S_0", bad);
  }
}

// A case that reaches two chunks (the second partial), S_0 and dS_L.
inline DeltaCase planted_bug_case(bool gated) {
  DeltaCase c;
  c.gated = gated, c.length = 40, c.chunk = 32, c.key_dim = 16, c.value_dim = 12, c.with_initial_state = true, c.seed = 1000;
  return c;
}

}  // namespace deltaproof::delta_rule_gpu_suite
