// What the files of verify::judge share (not part of verify's interface): one (sequence, head) unit's
// inputs, the oracle's truth and the bounds, and the functions of each family.
//   judge.cpp         units, layouts, threads, the High oracle (reference/), the comparisons
//   judge_linear.cpp  linear attention: the double oracle (chunkwise, 64-token products) and its
//                     elementwise bounds
//   judge_delta.cpp   DeltaNet / Gated DeltaNet: the double oracle (token recurrence and reverse sweep,
//                     with the bounds' covariances in the same passes) and the row-wise bounds
//   judge_wy.cpp      the same bounds for the WY chunkwise algorithm, per candidate chunk size, and the
//                     premises every delta-family bound rests on
// The model behind every bound: kernel_model.hpp; the derivations: proofs/kernel_error_bounds.md.
#pragma once

#include "reference/scalar.hpp"
#include "verify/judge.hpp"
#include "verify/kernel_model.hpp"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace deltaproof::verify::judging {

using MatrixD = ref::Matrix<double>;
using VectorD = ref::Vector<double>;

// fla's l2norm: x / sqrt(‖x‖² + 1e-6), the normalisation its kernels apply when asked to.
constexpr double l2norm_eps = 1e-6;

// One independent sequence of one head: tokens begin .. begin+length−1 of batch row `batch`.
struct Unit {
  Index sequence, head, batch, begin, length;
};

// The inputs of one unit as the oracle sees them, and what the kernel applied to q and k.
struct UnitInputs {
  MatrixD q_raw, k_raw;  // as given (L, DK)
  MatrixD q, k, v;       // used: scale·n(q), n(k), v
  VectorD beta, alpha, log_gate;
  std::optional<MatrixD> s0;  // (DV, DK)
  std::optional<MatrixD> d_o, d_st;
};

// What a unit's oracle yields; dq, dk with respect to the raw q, k.
struct Truth {
  MatrixD o, ht, dq, dk, dv, dh0;
  VectorD dbeta, dg;
};

// Bounds: same shape as the truth (elementwise) or one entry per row (rowwise: rows × 1), or 1 × 1
// for a whole state matrix in Frobenius norm.
struct Bounds {
  MatrixD o, ht, dq, dk, dv, dh0, dbeta, dg;
};

// Unit roundoff of each output's storage dtype.
struct OutputRoundoffs {
  double o = 0, ht = 0, dq = 0, dk = 0, dv = 0, dh0 = 0, dbeta = 0, dg = 0;
  double eta = 0;  // the largest absolute rounding below an output dtype's normal range (fp16: 2⁻²⁵)
};

// Half the spacing of a dtype's subnormal numbers: a rounding there is off by up to this, whatever
// the value (fp16 2⁻²⁵, bf16 2⁻¹³⁴, fp32 2⁻¹⁵⁰, fp64 2⁻¹⁰⁷⁵).
double subnormal_eta(DType d);

// A premise of a bound that a unit's inputs break: what was measured against what the model covers.
struct PremiseFailure {
  std::string reason;    // e.g. "u32·‖|T||I + A|‖ over a chunk of 64 tokens from token 3 ≥ 1/2"
  double measured = 0;   // the quantity measured
  double limit = 0;      // what the premise allows
};

// f(i) for i in [0, n) on `threads` workers (0: reference/parallel.hpp's count), each a worker of
// reference/parallel.hpp (so nested products run serially inside it); exceptions rethrown here.
void for_each_unit(size_t n, unsigned threads, const std::function<void(size_t)>& f);

// Row-wise n(x) = x / sqrt(‖x‖² + eps).
MatrixD normalise_rows(const MatrixD& x);
// dx from dy through y = s·n(x) (or y = s·x).
MatrixD pull_back(const MatrixD& x, const MatrixD& dy, double scale, bool normalised);
// The same through |J| on magnitudes (elementwise bounds).
MatrixD pull_back_magnitude(const MatrixD& x, const MatrixD& m, double scale, bool normalised);

// ---- linear attention (judge_linear.cpp)

struct LinearOracle {
  Truth value, magnitude;  // dq, dk with respect to the q, k used (before scale and normalisation)
};
LinearOracle linear_chunkwise(const UnitInputs& in, bool gradients, bool magnitudes);

// The forward's model (kernel_model.hpp; proofs/kernel_error_bounds.md §6): the chunks it covers and
// the running state's dtype.
struct LinearForwardModel {
  long chunk_size = 0;    // the kernel's (chunks from the sequence's start); 0: any chunking of ≤ 64 tokens
  double u_state = 0;     // a declared 16-bit running state, rounded at every chunk boundary (0: fp32)
  double eta_state = 0;   // its absolute rounding below the normal range
  double eps_chunk = 0;   // one chunk's update of that state: ε with a chain of 64 + 8 additions
  bool normalised = false;
};

// Per token, what the forward's bound multiplies besides M (all elementwise, (L, DV) unless said):
struct LinearStateTerms {
  MatrixD local;        // A_t = |q_t|(|S_w| + Σ_{s=w..t} |v_s||k_s|ᵀ)ᵀ: what the operand roundings act on
  MatrixD eta_weight;   // what a 16-bit operand's absolute rounding η_op multiplies
  MatrixD state_error;  // |q_t| E_tᵀ: a declared 16-bit state's rounding errors as o reads them (empty: fp32)
  MatrixD final_state_error;  // (DV, DK) E_L (empty: fp32)
  MatrixD final_eta_weight;   // (DV, DK) what η_op multiplies in the final state (keys normalised in the kernel)
  double sensitivity = 0;     // how much E moves per unit of error in the |S| it is computed from, over M
};
LinearStateTerms linear_state_terms(const UnitInputs& in, const LinearForwardModel& model);

// The coefficients of linear attention's bounds: ε_o on A, ε_S on M, the gradients' ε on their M; the
// double oracle's own γ; η_op and the accumulation's absolute η_acc·depth.
struct LinearEps {
  double local = 0, state = 0, gradients = 0, oracle = 0, eta_op = 0, eta_acc = 0;
  long depth = 0;
};
Bounds linear_bounds(const UnitInputs& in, const Truth& t, const Truth& m, const LinearStateTerms& terms,
                     bool gradients, const LinearEps& eps, const OutputRoundoffs& u, double scale, bool normalised);

// ---- DeltaNet / Gated DeltaNet (judge_delta.cpp, judge_wy.cpp)

struct DeltaModel {
  double eps_acc = 0, eps_op = 0, u_op = 0, lambda = 8;
  bool gated = false;
  double u_state = 0;      // the running state rounded to this at every chunk boundary (0: kept in fp32)
  double u_acc32 = 0x1p-23;  // fp32 accumulation (the WY form's triangular solve and state update)
  double operand_max = 0;  // the largest finite number of the operand dtype
  double eta_op = 0;       // subnormal_eta of the operand dtype
  // The WY chunk sizes the bounds cover (chunks from each sequence's start), besides the token
  // recurrence (chunks of one token), which delta_oracle's own sweep covers.
  std::vector<long> chunk_sizes;
  long chunk_stride = 16;  // every chunk size is a multiple of it: delta_oracle keeps the states there
};

// Every per-token quantity of the bounds, from the sweeps of delta_oracle.
struct DeltaSweep {
  // Forward: n_state(i), tr_c(i) after i tokens (0: S_0); per token t: ‖u_t‖, |β_t|‖u_t‖‖k_t‖,
  // k_tᵀ C_{t−1} k_t, q_tᵀ C_t q_t, ‖S_t‖‖q_t‖, Σ_i do_ti² v_ti.
  VectorD n_state, tr_c, n_u, n_write, kck_before, qcq, n_sq, do_w;
  MatrixD value_before;  // (DV, L): v_{t−1}, the value side of E_{t−1}
  // Backward, per token t: ‖G_t‖, tr D_t, k_tᵀ D_t k_t, ‖G_t k_t‖, ‖|G_t||k_t|‖, Σ_i u_ti² w_ti,
  // Σ_i (G_t k_t)_i² v_{t−1,i}; and the trace of the covariance of dS_0.
  VectorD n_g, tr_d, kdk, n_gk, n_abs_gk, u_v, gk_v;
  double tr_d_initial = 0;
  // States S_{t−1} at every t ≡ 0 (mod chunk_stride) and S_L, for the WY bounds (judge_wy.cpp).
  std::vector<MatrixD> chunk_starts;
  MatrixD final_state;
};

Truth delta_oracle(const UnitInputs& in, bool gradients, bool gated, const DeltaModel* model, DeltaSweep& sweep);
struct WyMoments;
Bounds delta_bounds(const UnitInputs& in, const Truth& truth, const DeltaSweep& sw, const WyMoments& wy, bool gradients,
                    const DeltaModel& m, const OutputRoundoffs& u, double scale, bool normalised);

// The WY chunkwise algorithm's share of the forward bounds (judge_wy.cpp): per token t, the
// second moment q_tᵀ C_t q_t of the output's propagated error and, at the end, tr C_L, each the
// largest over the candidate chunk sizes; and the premises the inputs break, if any.
struct WyMoments {
  VectorD qcq;          // (L)
  VectorD tr_state;     // (L) tr C_t: the state error after token t
  double tr_final = 0;  // tr C_L
  VectorD v_bar;        // (L) largest ‖magnitude of V̄_t as the WY products compute it‖ over chunk sizes
  std::vector<PremiseFailure> premises;
};
WyMoments wy_moments(const UnitInputs& in, const DeltaSweep& sw, const DeltaModel& m);

}  // namespace deltaproof::verify::judging
