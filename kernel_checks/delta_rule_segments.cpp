#include "kernel_checks/delta_rule_segments.hpp"

#include "cuda/segments.hpp"
#include "kernel_checks/device_tensors.hpp"
#include "reference/delta_rule.hpp"
#include "reference/scalar.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace deltaproof::verify::delta_rule {
namespace {

namespace dt = deltaproof::verify;

cuda::SegmentLayout layout_of(const DeltaCase& c, int segments) {
  const int sequences = int(c.batch * c.heads), L = int(c.length);
  return cuda::segment_layout(L, cuda::choose_segments(segments, sequences, L, int(c.chunk), 1, 1));
}

// Rows first..first + count − 1 of sequence b, as a one-sequence tensor.
Tensor4<Exact> rows_of(const Tensor4<Exact>& t, Index b, Index first, Index count) {
  Tensor4<Exact> out(1, t.heads, count, t.cols);
  for (Index h = 0; h < t.heads; ++h)
    for (Index i = 0; i < count; ++i)
      for (Index j = 0; j < t.cols; ++j)
        out.data[std::size_t((h * count + i) * t.cols + j)] = t.data[t.offset(b, h) + std::size_t((first + i) * t.cols + j)];
  return out;
}

// Heads block·H..block·H + H − 1 of sequence b in a [B, n·H, rows, cols] tensor (run `block`'s states).
Tensor4<Exact> run_block(const Tensor4<Exact>& t, Index b, Index block, Index heads) {
  Tensor4<Exact> out(1, heads, t.rows, t.cols);
  const std::size_t per = std::size_t(heads * t.rows * t.cols);
  std::copy_n(t.data.begin() + std::ptrdiff_t(t.offset(b, block * heads)), per, out.data.begin());
  return out;
}

Tensor4<Exact> identity(Index heads, Index dim) {
  Tensor4<Exact> out(1, heads, dim, dim);
  for (Index h = 0; h < heads; ++h)
    for (Index i = 0; i < dim; ++i) out.data[out.offset(0, h) + std::size_t(i * dim + i)] = Exact(1);
  return out;
}

// Equal bits: error the largest difference, bound 0.
Comparison bitwise(const std::string& tensor, Index b, const Tensor4<Exact>& got, const Tensor4<Exact>& want) {
  Comparison row;
  row.tensor = tensor, row.batch = b, row.formula = "equal bits";
  if (!has_shape(got, want.batch, want.heads, want.rows, want.cols)) {
    row.error = row.ratio = std::numeric_limits<double>::infinity();
    return row;
  }
  for (std::size_t e = 0; e < want.data.size(); ++e) {
    const double diff = std::abs(ref::to_double(Exact(got.data[e] - want.data[e])));
    const double value = std::abs(ref::to_double(want.data[e]));
    row.max_abs = std::max(row.max_abs, value);
    if (diff > row.error || (e == 0 && diff == 0)) {
      row.error = diff, row.reference = value;
      const Index per_head = want.rows * want.cols, at = Index(e) % per_head;
      row.head = Index(e) / per_head, row.index = {at / want.cols, at % want.cols};
    }
  }
  row.count = Index(want.data.size());
  row.ratio = row.error == 0 ? 0 : std::numeric_limits<double>::infinity();
  return row;
}

// S_in(r + 1) against S_in(r) P_r + X_r, entrywise. The reference sum runs in double: each product of two fp32
// values is exact there, the sum's own error ≤ γ_{DK+1}(2⁻⁵³)·M, allowed on top of the kernel's γ_DK(2⁻²⁴)·M, with
// DK·2⁻¹⁴⁹ for fp32 results among the subnormals.
Comparison scan_row(Index b, Index run, const Tensor4<Exact>& s, const Tensor4<Exact>& p, const Tensor4<Exact>& x,
                    const Tensor4<Exact>& next) {
  Comparison row;
  row.tensor = "S_in", row.batch = b, row.chunk = run + 1, row.norm = Norm::elementwise;
  row.formula = "γ_DK(2⁻²⁴)·(|S_in| |P| + |X|) + γ_{DK+1}(2⁻⁵³)·M + DK·2⁻¹⁴⁹";
  const Index DV = s.rows, DK = s.cols;
  const double unit = ref::gamma(long(DK), 0x1p-24) + 2 * ref::gamma(long(DK) + 1, 0x1p-53);
  for (Index h = 0; h < s.heads; ++h)
    for (Index i = 0; i < DV; ++i)
      for (Index j = 0; j < DK; ++j) {
        const auto at = [&](const Tensor4<Exact>& t, Index r, Index col) { return ref::to_double(t.data[t.offset(0, h) + std::size_t(r * t.cols + col)]); };
        double sum = at(x, i, j), magnitude = std::abs(sum);
        for (Index k = 0; k < DK; ++k) {
          const double term = at(s, i, k) * at(p, k, j);
          sum += term, magnitude += std::abs(term);
        }
        const double error = std::abs(at(next, i, j) - sum), bound = unit * magnitude * (1 + 1e-12) + double(DK) * 0x1p-149;
        const double ratio = error / bound;
        ++row.count;
        row.max_abs = std::max(row.max_abs, std::abs(at(next, i, j)));
        if (ratio > row.ratio || row.count == 1) {
          row.ratio = ratio, row.error = error, row.bound = bound, row.reference = sum, row.head = h, row.index = {i, j};
        }
      }
  return row;
}

// Every S_in(r), r ≥ 1, against the oracle's tree_prefix_scan (reference/delta_rule.hpp) of the kernel's own
// summaries applied to S_0, in High: the order of composition checked against the oracle's. The kernel's rounding
// carried through the chain: Ŝ(r + 1) = Ŝ(r) P_r + X_r + δ_r with |δ_r| ≤ γ_DK(2⁻²⁴)(|Ŝ(r)||P_r| + |X_r|) + DK·2⁻¹⁴⁹,
// so |Ŝ(r) − S(r)| ≤ B(r), B(0) = 0, B(r + 1) = B(r)|P_r| + that (in double, with a relative 1e-12 of room).
Comparison tree_row(Index b, const Tensor4<Exact>& s0, const Tensor4<Exact>& states, const Tensor4<Exact>& transitions,
                    const Tensor4<Exact>& incoming, Index n) {
  using ref::High;
  Comparison row;
  row.tensor = "S_in tree", row.batch = b, row.norm = Norm::elementwise;
  row.formula = "B(r+1) = B(r)|P_r| + γ_DK(2⁻²⁴)(|S_in(r)||P_r| + |X_r|) + DK·2⁻¹⁴⁹ against tree_prefix_scan";
  const Index H = s0.heads, DV = s0.rows, DK = s0.cols;
  const double unit = ref::gamma(long(DK), 0x1p-24);
  for (Index h = 0; h < H; ++h) {
    std::vector<ref::delta_rule::AffineMap<High>> maps;
    std::vector<Matrix<double>> p_abs, x_abs;
    for (Index r = 0; r < n; ++r) {
      const Matrix<Exact> p = run_block(transitions, b, r, H).head(0, h), x = run_block(states, b, r, H).head(0, h);
      maps.push_back({ref::matrix_cast<High>(p), ref::matrix_cast<High>(x)});
      p_abs.push_back(ref::matrix_cast<double>(p).cwiseAbs()), x_abs.push_back(ref::matrix_cast<double>(x).cwiseAbs());
    }
    const auto prefix = ref::delta_rule::tree_prefix_scan(maps);
    const Matrix<High> start = ref::matrix_cast<High>(s0.head(0, h));
    Matrix<double> bound = Matrix<double>::Zero(DV, DK);
    for (Index r = 0; r < n; ++r) {
      const Matrix<double> before = ref::matrix_cast<double>(run_block(incoming, b, r, H).head(0, h)).cwiseAbs();
      bound = (bound * p_abs[size_t(r)] + unit * (before * p_abs[size_t(r)] + x_abs[size_t(r)])) * (1 + 1e-12);
      bound.array() += double(DK) * 0x1p-149;
      const Matrix<High> exact = start * prefix[size_t(r)].transition + prefix[size_t(r)].write;
      const Matrix<Exact> got = run_block(incoming, b, r + 1, H).head(0, h);
      for (Index i = 0; i < DV; ++i)
        for (Index j = 0; j < DK; ++j) {
          const double error = ref::to_double(High(High(got(i, j)) - exact(i, j)));
          const double ratio = std::abs(error) / bound(i, j);
          ++row.count;
          row.max_abs = std::max(row.max_abs, std::abs(ref::to_double(got(i, j))));
          if (ratio > row.ratio || row.count == 1) {
            row.ratio = ratio, row.error = std::abs(error), row.bound = bound(i, j), row.reference = ref::to_double(exact(i, j));
            row.head = h, row.chunk = r + 1, row.index = {i, j};
          }
        }
    }
  }
  return row;
}

}  // namespace

std::vector<Comparison> check_segments(const DeltaCase& c, const HostInputs& in, int segments, const SegmentedResult& r,
                                       const OneWalk& one_walk) {
  const cuda::SegmentLayout layout = layout_of(c, segments);
  const Index H = c.heads, DK = c.key_dim, DV = c.value_dim, n = layout.folded;
  std::vector<Comparison> rows;
  const auto stages = [&](const std::string& walk, Index b, const DeltaCase& wc, const HostInputs& win, const ForwardResult& w) {
    for (Comparison row : check_stages(wc, win, w)) {
      row.tensor = walk + " " + row.tensor, row.batch = b;
      rows.push_back(row);
    }
  };
  for (Index b = 0; b < c.batch; ++b) {
    const Tensor4<Exact> s0 = c.with_initial_state ? rows_of(in.initial_state, b, 0, DV) : Tensor4<Exact>(1, H, DV, DK);
    rows.push_back(bitwise("S_in", b, n > 0 ? run_block(r.incoming, b, 0, H) : s0, s0));
    for (Index run = 0; run <= n; ++run) {
      const Index first = run * layout.length, length = run < n ? layout.length : layout.tail;
      DeltaCase wc = c;
      wc.batch = 1, wc.length = length, wc.with_initial_state = true;
      HostInputs win;
      win.q = rows_of(in.q, b, first, length), win.k = rows_of(in.k, b, first, length), win.v = rows_of(in.v, b, first, length);
      win.beta = rows_of(in.beta, b, first, length), win.log_gate = rows_of(in.log_gate, b, first, length);
      win.initial_state = n > 0 ? run_block(r.incoming, b, run, H) : s0;
      const ForwardResult walk = one_walk(wc, win);
      rows.push_back(bitwise("output", b, rows_of(r.output, b, first, length), walk.output));
      stages("run", b, wc, win, walk);
      if (run == n) {
        rows.push_back(bitwise("final_state", b, rows_of(r.final_state, b, 0, DV), walk.final_state));
        break;
      }
      DeltaCase xc = wc;  // X_r: the run from 0
      xc.with_initial_state = false;
      HostInputs xin = win;
      xin.initial_state = {};
      const ForwardResult x = one_walk(xc, xin);
      rows.push_back(bitwise("X", b, run_block(r.states, b, run, H), x.final_state));
      stages("X", b, xc, xin, x);
      DeltaCase pc = wc;  // P_r: v = 0 with DK value rows, from I
      pc.value_dim = DK;
      HostInputs pin = win;
      pin.v = Tensor4<Exact>(1, H, length, DK), pin.initial_state = identity(H, DK);
      const ForwardResult p = one_walk(pc, pin);
      rows.push_back(bitwise("P", b, run_block(r.transitions, b, run, H), p.final_state));
      stages("P", b, pc, pin, p);
      rows.push_back(scan_row(b, run, win.initial_state, run_block(r.transitions, b, run, H), run_block(r.states, b, run, H),
                              run_block(r.incoming, b, run + 1, H)));
    }
    if (n > 0) rows.push_back(tree_row(b, s0, r.states, r.transitions, r.incoming, n));
  }
  return rows;
}

SegmentedResult run_segmented_forward(const DeltaCase& c, const HostInputs& in, int segments) {
  const Index B = c.batch, H = c.heads, L = c.length, DK = c.key_dim, DV = c.value_dim, n = layout_of(c, segments).folded;
  const DeviceInputs d = upload_inputs(c, in);
  const dt::DeviceTensor output = dt::allocate(c.dtype, B, H, L, DV), final_state = dt::allocate(DType::f32, B, H, DV, DK);
  dt::DeviceTensor states, transitions, incoming, workspace;
  cuda::delta_rule::ForwardStageParams p;
  p.dtype = c.dtype, p.batch = int(B), p.heads = int(H), p.length = int(L), p.key_dim = int(DK), p.value_dim = int(DV);
  p.chunk_size = int(c.chunk), p.segments = segments;
  p.q = d.q.device.data(), p.k = d.k.device.data(), p.v = d.v.device.data(), p.beta = d.beta.device.data();
  p.log_gate = c.gated ? static_cast<const float*>(d.log_gate.device.data()) : nullptr;
  p.initial_state = c.with_initial_state ? static_cast<const float*>(d.initial_state.device.data()) : nullptr;
  p.output = output.data(), p.final_state = static_cast<float*>(final_state.data());
  cuda::delta_rule::set_contiguous_strides(p);
  if (n > 0) {
    states = dt::allocate(DType::f32, B, n * H, DV, DK), transitions = dt::allocate(DType::f32, B, n * H, DK, DK);
    incoming = dt::allocate(DType::f32, B, (n + 1) * H, DV, DK);
    p.segment_states = static_cast<float*>(states.data()), p.segment_transitions = static_cast<float*>(transitions.data());
    p.segment_incoming = static_cast<float*>(incoming.data());
  }
  if (const std::size_t bytes = cuda::delta_rule::testing::workspace_bytes(p); bytes > 0) {
    workspace = dt::allocate(DType::f32, 1, 1, 1, Index((bytes + 3) / 4));
    p.workspace = workspace.data();
  }
  cuda::delta_rule::testing::forward(p);
  SegmentedResult r;
  r.output = dt::download(output), r.final_state = dt::download(final_state);
  if (n > 0) r.states = dt::download(states), r.transitions = dt::download(transitions), r.incoming = dt::download(incoming);
  return r;
}

}  // namespace deltaproof::verify::delta_rule
