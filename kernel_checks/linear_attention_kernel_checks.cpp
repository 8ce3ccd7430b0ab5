#include "kernel_checks/linear_attention_kernel_checks.hpp"

#include "reference/gradcheck.hpp"
#include "verify/matrix_comparison.hpp"

#include <cmath>
#include <random>
#include <sstream>

namespace deltaproof::verify::linear_attention {

namespace la = ref::linear_attention;
namespace kla = cuda::linear_attention;

std::ostream& operator<<(std::ostream& os, const CudaShape& s) {
  return os << "{B=" << s.batch << ", H=" << s.heads << ", L=" << s.length << ", DK=" << s.key_dim
            << ", DV=" << s.value_dim << ", C=" << s.chunk_size << ", S_0=" << (s.with_initial_state ? "given" : "absent")
            << ", dtype=" << cuda::name_of(s.dtype)
            << (kla::uses_tensor_cores(s.dtype, int(s.key_dim), int(s.value_dim)) ? " (tensor cores)" : "") << "}";
}

std::string describe(const CudaShape& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const CudaCase& c) { return os << "GPU case " << c.shape; }

namespace {

Exact entry_of(int n) { return Exact(n) / 64; }

Tensor4<Exact> random_tensor(std::mt19937_64& rng, Index b, Index h, Index r, Index c) {
  std::uniform_int_distribution<int> pick(-512, 512);
  Tensor4<Exact> t(b, h, r, c);
  for (Exact& x : t.data) x = entry_of(pick(rng));
  return t;
}

DType state_dtype(const CudaShape& s) { return kla::state_dtype(s.dtype); }

Tensor4<Exact> rows_of(const Tensor4<Exact>& t, Index begin, Index count) {
  Tensor4<Exact> out(t.batch, t.heads, count, t.cols);
  ref::for_each_head(t.batch, t.heads, [&](Index b, Index h) { out.set_head(b, h, t.head(b, h).middleRows(begin, count)); });
  return out;
}

Comparison row(const std::string& tensor, Index b, Index h, const Matrix<Exact>& candidate, const Matrix<Exact>& exact,
               const Matrix<Exact>& bound, Index chunk = -1) {
  return compare_within<Exact>(tensor, candidate, exact, bound, {b, h, chunk});
}

}  // namespace

CudaCase make_case(const CudaShape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  CudaCase c;
  c.shape = s;
  c.inputs.q = random_tensor(rng, s.batch, s.heads, s.length, s.key_dim);
  c.inputs.k = random_tensor(rng, s.batch, s.heads, s.length, s.key_dim);
  c.inputs.v = random_tensor(rng, s.batch, s.heads, s.length, s.value_dim);
  c.cotangents.d_output = random_tensor(rng, s.batch, s.heads, s.length, s.value_dim);
  if (s.with_initial_state) {
    c.inputs.initial_state = random_tensor(rng, s.batch, s.heads, s.value_dim, s.key_dim);
    c.cotangents.d_final_state = random_tensor(rng, s.batch, s.heads, s.value_dim, s.key_dim);
  }
  return c;
}

DeviceInputs upload_case(const CudaCase& c) {
  const DType d = c.shape.dtype;
  DeviceInputs in{upload(c.inputs.q, d), upload(c.inputs.k, d), upload(c.inputs.v, d), upload(c.cotangents.d_output, d),
                  std::nullopt, std::nullopt, {}, {}};
  if (c.inputs.initial_state) in.initial_state = upload(*c.inputs.initial_state, state_dtype(c.shape));
  if (c.cotangents.d_final_state) in.d_final_state = upload(*c.cotangents.d_final_state, state_dtype(c.shape));
  in.exact = {in.q.exact, in.k.exact, in.v.exact, std::nullopt};
  if (in.initial_state) in.exact.initial_state = in.initial_state->exact;
  in.exact_cot = {in.d_output.exact, std::nullopt};
  if (in.d_final_state) in.exact_cot.d_final_state = in.d_final_state->exact;
  return in;
}

KernelForward run_forward(const CudaShape& s, const DeviceInputs& in, Index chunk_size, bool with_boundary, const Kernels& kernels) {
  const Index N = (s.length + chunk_size - 1) / chunk_size;
  DeviceTensor out = allocate(s.dtype, s.batch, s.heads, s.length, s.value_dim);
  DeviceTensor final_state = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
  DeviceTensor boundary = allocate(state_dtype(s), s.batch, s.heads, N * s.value_dim, s.key_dim);
  kla::ForwardParams p;
  p.dtype = s.dtype;
  p.batch = int(s.batch), p.heads = int(s.heads), p.length = int(s.length), p.key_dim = int(s.key_dim),
  p.value_dim = int(s.value_dim), p.chunk_size = int(chunk_size);
  p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.output = out.data();
  p.initial_state = in.initial_state ? in.initial_state->device.data() : nullptr;
  p.final_state = final_state.data();
  p.boundary_states = with_boundary ? boundary.data() : nullptr;
  kla::set_contiguous_strides(p);
  kernels.forward(p);
  KernelForward r{download(out), download(final_state), {}};
  if (with_boundary) r.boundary_states = download(boundary);
  return r;
}

la::BatchGradients<Exact> run_backward(const CudaShape& s, const DeviceInputs& in, const Kernels& kernels) {
  DeviceTensor dq = allocate(s.dtype, s.batch, s.heads, s.length, s.key_dim);
  DeviceTensor dk = allocate(s.dtype, s.batch, s.heads, s.length, s.key_dim);
  DeviceTensor dv = allocate(s.dtype, s.batch, s.heads, s.length, s.value_dim);
  DeviceTensor ds0 = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
  kla::BackwardParams p;
  p.dtype = s.dtype;
  p.batch = int(s.batch), p.heads = int(s.heads), p.length = int(s.length), p.key_dim = int(s.key_dim),
  p.value_dim = int(s.value_dim), p.chunk_size = int(s.chunk_size);
  p.q = in.q.device.data(), p.k = in.k.device.data(), p.v = in.v.device.data(), p.d_output = in.d_output.device.data();
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.initial_state = in.initial_state ? in.initial_state->device.data() : nullptr;
  p.d_final_state = in.d_final_state ? in.d_final_state->device.data() : nullptr;
  p.d_initial_state = ds0.data();
  kla::set_contiguous_strides(p);
  kernels.backward(p);
  return {download(dq), download(dk), download(dv), download(ds0)};
}

Tensor4<Exact> run_decode(DType dtype, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                          const void* initial_state, DeviceTensor& state, const Kernels& kernels) {
  DeviceTensor out = allocate(dtype, q.batch, q.heads, q.rows, v.cols);
  kla::DecodeParams p;
  p.dtype = dtype;
  p.batch = int(q.batch), p.heads = int(q.heads), p.tokens = int(q.rows), p.key_dim = int(q.cols), p.value_dim = int(v.cols);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.output = out.data();
  p.initial_state = initial_state;
  p.final_state = state.data();
  kla::set_contiguous_strides(p);
  kernels.decode(p);
  return download(out);
}

KernelPrecision precision_of(const CudaShape& s, bool is_state, Index depth_length, Index depth_chunk) {
  const Index L = depth_length > 0 ? depth_length : s.length, C = depth_chunk > 0 ? depth_chunk : s.chunk_size;
  const double u_out = is_state ? 0 : s.dtype == DType::bf16 ? std::ldexp(1.0, -8) : s.dtype == DType::f16 ? std::ldexp(1.0, -11) : 0;
  return kernel_precision(kernel_rounding_depth(L, C, s.key_dim, s.value_dim), s.dtype == DType::f64,
                          kla::uses_tensor_cores(s.dtype, int(s.key_dim), int(s.value_dim)), u_out);
}

Matrix<Exact> bound_of(const Matrix<Exact>& magnitude, const Matrix<Exact>& exact, const KernelPrecision& p, int copies) {
  return kernel_bound(magnitude, exact, p) * Exact(copies);
}

std::vector<Comparison> check_forward(const CudaCase& c, bool with_boundary, const Kernels& kernels) {
  const DeviceInputs in = upload_case(c);
  return judge_forward(c.shape, in.exact, run_forward(c.shape, in, c.shape.chunk_size, with_boundary, kernels), with_boundary);
}

std::vector<Comparison> judge_forward(const CudaShape& s, const la::BatchInputs<Exact>& exact_inputs, const KernelForward& k,
                                      bool with_boundary) {
  const KernelPrecision out_p = precision_of(s, false), state_p = precision_of(s, true);
  std::vector<Comparison> rows;
  ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
    const auto head = exact_inputs.head(b, h);
    const auto exact = la::chunkwise(head, s.chunk_size);
    const auto mag = la::forward_magnitude(head);
    rows.push_back(row("output", b, h, k.output.head(b, h), exact.output, bound_of(mag.output, exact.output, out_p)));
    rows.push_back(row("final state", b, h, k.final_state.head(b, h), exact.final_state,
                       bound_of(mag.final_state, exact.final_state, state_p)));
    if (!with_boundary) return;
    // S_[c]'s terms are a subset of S_L's: the final-state magnitude bounds them all.
    const Matrix<Exact> boundary = k.boundary_states.head(b, h);
    for (size_t n = 0; n < exact.boundary_states.size(); ++n)
      rows.push_back(row("boundary state", b, h, boundary.middleRows(Index(n) * s.value_dim, s.value_dim),
                         exact.boundary_states[n], bound_of(mag.final_state, exact.boundary_states[n], state_p), Index(n)));
  });
  return rows;
}

std::vector<Comparison> check_backward(const CudaCase& c, const Kernels& kernels) {
  const DeviceInputs in = upload_case(c);
  return judge_backward(c.shape, in.exact, in.exact_cot, run_backward(c.shape, in, kernels));
}

std::vector<Comparison> judge_backward(const CudaShape& s, const la::BatchInputs<Exact>& exact_inputs,
                                       const la::BatchCotangents<Exact>& exact_cotangents, const la::BatchGradients<Exact>& g) {
  const KernelPrecision p = precision_of(s, false), state_p = precision_of(s, true);
  std::vector<Comparison> rows;
  ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
    const auto head = exact_inputs.head(b, h);
    const auto cot = exact_cotangents.head(b, h);
    const auto exact = la::chunkwise_backward(head, cot, s.chunk_size);
    const auto mag = la::backward_magnitude(head, cot);
    rows.push_back(row("dq", b, h, g.dq.head(b, h), exact.dq, bound_of(mag.dq, exact.dq, p)));
    rows.push_back(row("dk", b, h, g.dk.head(b, h), exact.dk, bound_of(mag.dk, exact.dk, p)));
    rows.push_back(row("dv", b, h, g.dv.head(b, h), exact.dv, bound_of(mag.dv, exact.dv, p)));
    rows.push_back(row("dS_0", b, h, g.d_initial_state.head(b, h), exact.d_initial_state,
                       bound_of(mag.d_initial_state, exact.d_initial_state, state_p)));
  });
  return rows;
}

std::vector<Comparison> check_chunk_sizes_agree(const CudaCase& c) {
  const DeviceInputs in = upload_case(c);
  std::vector<CudaShape> shapes;
  std::vector<KernelForward> runs;
  for (int C : kla::supported_chunk_sizes) {
    CudaShape s = c.shape;
    s.chunk_size = C;
    shapes.push_back(s);
    runs.push_back(run_forward(s, in, C, false));
  }
  std::vector<Comparison> rows;
  ref::for_each_head(c.shape.batch, c.shape.heads, [&](Index b, Index h) {
    const auto head = in.exact.head(b, h);
    const auto exact = la::parallel_masked(head);
    const auto mag = la::forward_magnitude(head);
    for (size_t x = 0; x < runs.size(); ++x)
      for (size_t y = x + 1; y < runs.size(); ++y) {
        const Matrix<Exact> out_bound = bound_of(mag.output, exact.output, precision_of(shapes[x], false)) +
                                        bound_of(mag.output, exact.output, precision_of(shapes[y], false));
        const Matrix<Exact> state_bound = bound_of(mag.final_state, exact.final_state, precision_of(shapes[x], true)) +
                                          bound_of(mag.final_state, exact.final_state, precision_of(shapes[y], true));
        const std::string pair = "C=" + std::to_string(shapes[x].chunk_size) + " vs C=" + std::to_string(shapes[y].chunk_size);
        rows.push_back(row("output " + pair, b, h, runs[x].output.head(b, h), runs[y].output.head(b, h), out_bound));
        rows.push_back(
            row("final state " + pair, b, h, runs[x].final_state.head(b, h), runs[y].final_state.head(b, h), state_bound));
      }
  });
  return rows;
}

std::vector<Comparison> check_decode(const CudaCase& c, const Kernels& kernels) {
  const CudaShape& s = c.shape;
  const DeviceInputs in = upload_case(c);
  DeviceTensor state = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
  const auto out = run_decode(s.dtype, in.q.device, in.k.device, in.v.device,
                              in.initial_state ? in.initial_state->device.data() : nullptr, state, kernels);
  return judge_decode(s, in.exact, out, download(state));
}

std::vector<Comparison> judge_decode(const CudaShape& s, const la::BatchInputs<Exact>& exact_inputs, const Tensor4<Exact>& output,
                                     const Tensor4<Exact>& final_state) {
  const KernelPrecision out_p = precision_of(s, false, s.length, 1), state_p = precision_of(s, true, s.length, 1);
  std::vector<Comparison> rows;
  ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
    const auto head = exact_inputs.head(b, h);
    const auto exact = la::token_recurrence(head);
    const auto mag = la::forward_magnitude(head);
    rows.push_back(row("decode output", b, h, output.head(b, h), exact.output, bound_of(mag.output, exact.output, out_p)));
    rows.push_back(row("decode final state", b, h, final_state.head(b, h), exact.final_state,
                       bound_of(mag.final_state, exact.final_state, state_p)));
  });
  return rows;
}

std::vector<Comparison> check_decode_after_prefill(const CudaCase& c, Index prefill) {
  const CudaShape& s = c.shape;
  const Index rest = s.length - prefill;
  const DeviceInputs whole = upload_case(c);
  const KernelForward one_pass = run_forward(s, whole, s.chunk_size, false);

  CudaCase head_case = c;
  head_case.shape.length = prefill;
  head_case.inputs.q = rows_of(c.inputs.q, 0, prefill);
  head_case.inputs.k = rows_of(c.inputs.k, 0, prefill);
  head_case.inputs.v = rows_of(c.inputs.v, 0, prefill);
  head_case.cotangents.d_output = rows_of(c.cotangents.d_output, 0, prefill);
  const DeviceInputs head_in = upload_case(head_case);
  DeviceTensor state = allocate(state_dtype(s), s.batch, s.heads, s.value_dim, s.key_dim);
  {
    DeviceTensor out = allocate(s.dtype, s.batch, s.heads, prefill, s.value_dim);
    kla::ForwardParams p;
    p.dtype = s.dtype;
    p.batch = int(s.batch), p.heads = int(s.heads), p.length = int(prefill), p.key_dim = int(s.key_dim),
    p.value_dim = int(s.value_dim), p.chunk_size = int(s.chunk_size);
    p.q = head_in.q.device.data(), p.k = head_in.k.device.data(), p.v = head_in.v.device.data(), p.output = out.data();
    p.initial_state = head_in.initial_state ? head_in.initial_state->device.data() : nullptr;
    p.final_state = state.data();
    kla::set_contiguous_strides(p);
    kla::forward(p);
  }
  const auto tail = [&](const Tensor4<Exact>& t) { return upload(rows_of(t, prefill, rest), s.dtype); };
  const Uploaded q = tail(c.inputs.q), k = tail(c.inputs.k), v = tail(c.inputs.v);
  const auto decoded = run_decode(s.dtype, q.device, k.device, v.device, state.data(), state);
  const auto decoded_state = download(state);

  const KernelPrecision out_p = precision_of(s, false), state_p = precision_of(s, true);
  std::vector<Comparison> rows;
  ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
    const auto head = whole.exact.head(b, h);
    const auto exact = la::token_recurrence(head);
    const auto mag = la::forward_magnitude(head);
    const Matrix<Exact> out_bound = bound_of(mag.output, exact.output, out_p, 2).bottomRows(rest);
    rows.push_back(row("decode after prefill, output", b, h, decoded.head(b, h),
                       Matrix<Exact>(one_pass.output.head(b, h).bottomRows(rest)), out_bound));
    rows.push_back(row("decode after prefill, final state", b, h, decoded_state.head(b, h), one_pass.final_state.head(b, h),
                       bound_of(mag.final_state, exact.final_state, state_p, 2)));
  });
  return rows;
}

DirectionalCheck check_directional_derivative(const CudaCase& c, const la::BatchInputs<Exact>& direction, const std::string& name,
                                              const Kernels& kernels) {
  CudaShape s = c.shape;
  s.dtype = DType::f64;
  const Exact step = Exact(1) / 64;
  const auto shifted = [&](const Exact& t) {
    CudaCase x = c;
    x.shape = s;
    for (size_t i = 0; i < x.inputs.q.data.size(); ++i) x.inputs.q.data[i] += t * direction.q.data[i];
    for (size_t i = 0; i < x.inputs.k.data.size(); ++i) x.inputs.k.data[i] += t * direction.k.data[i];
    for (size_t i = 0; i < x.inputs.v.data.size(); ++i) x.inputs.v.data[i] += t * direction.v.data[i];
    if (x.inputs.initial_state && direction.initial_state)
      for (size_t i = 0; i < x.inputs.initial_state->data.size(); ++i)
        x.inputs.initial_state->data[i] += t * direction.initial_state->data[i];
    return x;
  };
  const KernelPrecision out_p = precision_of(s, false), state_p = precision_of(s, true);
  // Kernel pairing at a point, its exact value, and its bound: Σ|cot|·bound.
  const auto pairing = [&](const CudaCase& x, Exact& kernel_value, Exact& exact_value, Exact& error_bound) {
    const DeviceInputs in = upload_case(x);  // fp64 holds every entry: no rounding
    const KernelForward k = run_forward(s, in, s.chunk_size, false, kernels);
    kernel_value = exact_value = error_bound = 0;
    ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
      const auto head = in.exact.head(b, h);
      const auto cot = in.exact_cot.head(b, h);
      const auto exact = la::parallel_masked(head);
      const auto mag = la::forward_magnitude(head);
      kernel_value += ref::frobenius_inner(cot.d_output, Matrix<Exact>(k.output.head(b, h)));
      exact_value += ref::frobenius_inner(cot.d_output, exact.output);
      error_bound += ref::frobenius_inner(Matrix<Exact>(cot.d_output.cwiseAbs()), bound_of(mag.output, exact.output, out_p));
      if (cot.d_final_state) {
        kernel_value += ref::frobenius_inner(*cot.d_final_state, Matrix<Exact>(k.final_state.head(b, h)));
        exact_value += ref::frobenius_inner(*cot.d_final_state, exact.final_state);
        error_bound += ref::frobenius_inner(Matrix<Exact>(cot.d_final_state->cwiseAbs()),
                                            bound_of(mag.final_state, exact.final_state, state_p));
      }
    });
  };
  Exact k_plus, e_plus, b_plus, k_minus, e_minus, b_minus;
  pairing(shifted(step), k_plus, e_plus, b_plus);
  pairing(shifted(-step), k_minus, e_minus, b_minus);
  const Exact kernel_difference = (k_plus - k_minus) / (2 * step);
  const Exact exact_difference = (e_plus - e_minus) / (2 * step);

  CudaCase at = c;
  at.shape = s;
  const DeviceInputs in = upload_case(at);
  const auto g = run_backward(s, in, kernels);
  Exact kernel_derivative = 0, exact_derivative = 0, gradient_bound = 0;
  ref::for_each_head(s.batch, s.heads, [&](Index b, Index h) {
    const auto head = in.exact.head(b, h);
    const auto cot = in.exact_cot.head(b, h);
    const auto exact = la::parallel_masked_backward(head, cot);
    const auto mag = la::backward_magnitude(head, cot);
    const auto pair = [&](const Matrix<Exact>& u, const Matrix<Exact>& kernel, const Matrix<Exact>& ex, const Matrix<Exact>& m,
                          const KernelPrecision& p) {
      kernel_derivative += ref::frobenius_inner(u, kernel);
      exact_derivative += ref::frobenius_inner(u, ex);
      gradient_bound += ref::frobenius_inner(Matrix<Exact>(u.cwiseAbs()), bound_of(m, ex, p));
    };
    pair(direction.q.head(b, h), g.dq.head(b, h), exact.dq, mag.dq, out_p);
    pair(direction.k.head(b, h), g.dk.head(b, h), exact.dk, mag.dk, out_p);
    pair(direction.v.head(b, h), g.dv.head(b, h), exact.dv, mag.dv, out_p);
    if (head.initial_state && direction.initial_state)
      pair(direction.initial_state->head(b, h), g.d_initial_state.head(b, h), exact.d_initial_state, mag.d_initial_state,
           state_p);
  });
  const Exact truncation = abs(exact_difference - exact_derivative);
  const Exact allowed = truncation + (b_plus + b_minus) / (2 * step) + gradient_bound;
  const Exact gap = abs(kernel_difference - kernel_derivative);

  DirectionalCheck d;
  d.central_difference = ref::to_double(kernel_difference);
  d.backward = ref::to_double(kernel_derivative);
  d.truncation = ref::to_double(truncation);
  d.row.tensor = name;
  d.row.count = 1;
  d.row.error = d.row.max_abs = d.row.rms = ref::to_double(gap);
  d.row.bound = ref::to_double(allowed);
  d.row.reference = d.backward;
  d.row.ratio = ratio_with_verdict(d.row.bound > 0 ? d.row.error / d.row.bound : (d.row.error > 0 ? INFINITY : 0.0),
                                   gap <= allowed);
  return d;
}

}  // namespace deltaproof::verify::linear_attention
