// DeltaNet and Gated DeltaNet: chunkwise WY forward (two kernels) and recurrent decode, host side:
// validation, workspace, dispatch; the public entry points and the forward's per-stage test seams.
// The kernels are in delta_rule_forward_kernels.cuh and the headers it includes (also compiled by the CPU emulation).
//
// Precision plan (where values are rounded to the input dtype, and why):
//   * Every product runs with fp32 accumulation: tensor cores (WMMA or raw mma.sync, bf16/fp16 operands) for
//     bf16/fp16 inputs, plain fp32 FMA for fp32 inputs.
//   * A = I + strictly_lower(diag(β) Γ ⊙ K Kᵀ) and its inverse T stay in fp32 (the inverse
//     amplifies errors in A when keys are not normalized, so A is never rounded).
//   * W = T diag(βγ) K and U = T diag(β) V: the fp32 factor T diag(βγ) is split into a hi and a
//     lo part in the input dtype (x = hi + lo + O(u²|x|)), so the tensor-core product sees T to
//     about 16 bits instead of 8, at the cost of a second cheap MMA.
//   * W and U are stored in the input dtype: they are tensor-core operands of the scan anyway.
//   * The state S lives in fp32 for the whole scan. The register scan (the fast path) feeds it to W Sᵀ
//     and Q Sᵀ as a hi + lo pair in the input dtype (≈ 16 bits, two MMAs); the fallback scan rounds it
//     once to the input dtype (the one rounding that the best public kernels also make).
//   * V̄ = U − W Sᵀ is accumulated in fp32 and rounded to the input dtype only as an operand of
//     P V̄ and of the state update; the gate decay is applied in fp32 before that rounding.
//   * P = Q Kᵀ ⊙ Γ ⊙ M is formed in fp32 and rounded to the input dtype as an MMA operand (for the register
//     scan by the prepare, which stores it rounded: the scan's sequential chain no longer forms it).
#include "cuda/delta_rule.h"

#include "cuda/arguments.hpp"
#include "cuda/check.hpp"
#include "cuda/decode_kernels.cuh"
#include "cuda/delta_rule_backward_tensor_core.h"
#include "cuda/delta_rule_forward_kernels.cuh"
#include "cuda/delta_rule_segments.cuh"
#include "cuda/segments.hpp"
#include "cuda/testing/delta_rule_stages.h"

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace deltaproof::cuda::delta_rule {
namespace {

using namespace forward_kernels;

bool aligned_to(const void* pointer, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0; }

// Every step between rows a multiple of `elements` (dimensions of one entry never step).
bool strides_multiple_of(const Strides& s, int batch, int heads, int rows, std::int64_t elements) {
  return (batch == 1 || s.batch % elements == 0) && (heads == 1 || s.head % elements == 0) && (rows == 1 || s.row % elements == 0);
}

// The register scan when the inputs allow it: 16-bit, DK ≤ 128, DK and DV multiples of 8, rows of q,
// k, W and U 16-byte aligned (cp.async), output pairs 4-byte aligned. Otherwise the fallback scan runs.
bool register_scan(const ForwardStageParams& p) {
  const int B = p.batch, H = p.heads, L = p.length;
  return p.dtype != DType::f32 && p.key_dim <= kTcKeys && p.key_dim % 8 == 0 && p.value_dim % 8 == 0 &&
         aligned_to(p.q, 16) && strides_multiple_of(p.q_strides, B, H, L, 8) && aligned_to(p.k, 16) &&
         strides_multiple_of(p.k_strides, B, H, L, 8) && aligned_to(p.w, 16) && aligned_to(p.u, 16) &&
         aligned_to(p.output, 4) && strides_multiple_of(p.output_strides, B, H, L, 2);
}

// k's rows taken 16 bytes at a time (cp.async): what the state pass needs of the user's tensors.
bool keys_copyable(const ForwardStageParams& p) {
  return aligned_to(p.k, 16) && strides_multiple_of(p.k_strides, p.batch, p.heads, p.length, 8);
}

// W and U (and, for the register scan, its scores) from the workspace where the caller left them null, in
// a fixed order; `bytes` receives the workspace size those need. Given scores the fallback scan leaves
// unwritten.
ForwardStageParams resolve(const ForwardStageParams& p, std::size_t* bytes) {
  const std::size_t heads = std::size_t(p.batch) * p.heads, tokens = heads * p.length, es = size_of(p.dtype);
  WorkspaceCarver workspace(p.workspace);
  ForwardStageParams r = p;
  r.w = workspace.take(p.w, tokens * p.key_dim * es);
  r.u = workspace.take(p.u, tokens * p.value_dim * es);
  if (p.saved != nullptr) {  // training: W and U (with their residuals) and T where the backward reads them
    const SavedTensors s = saved_tensors(p.saved, p.batch, p.heads, p.length, p.key_dim, p.value_dim, p.chunk_size, nullptr);
    r.w = s.w, r.w_lo = s.w_lo, r.u = s.u, r.u_lo = s.u_lo, r.wy_inverse = s.wy_inverse;
  }
  if (register_scan(r)) {
    const std::size_t C = p.chunk_size, blocks = heads * chunk_count(p.length, p.chunk_size);
    r.scores = workspace.take(p.scores, blocks * C * C * es);
  } else {
    r.scores = nullptr;
  }
  if (bytes != nullptr) *bytes = workspace.bytes();
  return r;
}

// Whether the caller gave any of the stage tests' intermediates (the one walk's: segments do not write them).
bool stage_outputs_given(const ForwardStageParams& p) {
  return p.w || p.u || p.w_lo || p.u_lo || p.scores || p.wy_system || p.wy_inverse || p.v_new || p.boundary_states;
}

// Whether the inputs can be walked as segments (ForwardParams::segments): the register scan's, no training
// buffer, no one-walk intermediate asked for.
bool segments_take(const ForwardStageParams& p) {
  return p.saved == nullptr && !stage_outputs_given(p) && register_scan(resolve(p, nullptr));
}

// The segments forward() walks (folded = 0: the one walk). Validated arguments.
SegmentLayout segment_layout_of(const ForwardStageParams& p) {
  if (p.segments == 1 || !segments_take(p)) return {0, p.length, p.length};
  const int sequences = p.batch * p.heads;
  if (p.segments > 1) return segment_layout(p.length, choose_segments(p.segments, sequences, p.length, p.chunk_size, 1, 1));
  // The register scan: one block per 64 value rows, two blocks to an SM.
  const int blocks = (p.value_dim + kTcSlice - 1) / kTcSlice;
  const Segmentation seg = choose_segments(0, sequences, p.length, p.chunk_size, blocks, 2 * multiprocessor_count());
  return segment_layout(p.length, even_segments(seg, p.length, p.chunk_size));  // a last run of its own would walk alone
}

void require_shape(DType dtype, int batch, int heads, int length, const char* length_name, int key_dim, int value_dim) {
  require_dtype(dtype, {DType::f32, DType::bf16, DType::f16});
  require_sizes(batch, heads, length, length_name, key_dim, value_dim);
}

std::vector<TensorArgument> tensors_of(const ForwardStageParams& p) {
  const std::size_t es = size_of(p.dtype);
  const int L = p.length, DK = p.key_dim, DV = p.value_dim, H = p.heads, C = p.chunk_size, N = chunk_count(L, C);
  return {{"q", p.q, p.q_strides, L, DK, es},
          {"k", p.k, p.k_strides, L, DK, es},
          {"v", p.v, p.v_strides, L, DV, es},
          {"beta", p.beta, p.beta_strides, L, 1, es},
          {"log_gate", p.log_gate, p.log_gate_strides, L, 1, 4, false, false},
          {"initial_state", p.initial_state, p.initial_state_strides, DV, DK, 4, false, false},
          {"output", p.output, p.output_strides, L, DV, es, true},
          {"final_state", p.final_state, p.final_state_strides, DV, DK, 4, true},
          {"w", p.w, contiguous(H, L, DK), L, DK, es, true, false},
          {"u", p.u, contiguous(H, L, DV), L, DV, es, true, false},
          {"w_lo", p.w_lo, contiguous(H, L, DK), L, DK, es, true, false},
          {"u_lo", p.u_lo, contiguous(H, L, DV), L, DV, es, true, false},
          {"scores", p.scores, contiguous(H, N, C * C), N, C * C, es, true, false},
          {"wy_system", p.wy_system, contiguous(H, N, C * C), N, C * C, 4, true, false},
          {"wy_inverse", p.wy_inverse, contiguous(H, N, C * C), N, C * C, 4, true, false},
          {"v_new", p.v_new, contiguous(H, L, DV), L, DV, 4, true, false},
          {"boundary_states", p.boundary_states, contiguous(H, N, DV * DK), N, DV * DK, 4, true, false}};
}

// Order: everything that needs no CUDA call first (dtype, sizes, chunk size, strides, null pointers,
// aliasing), then device pointers and alignment.
void validate_stages(const ForwardStageParams& p) {
  require_shape(p.dtype, p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_chunk_size(p.chunk_size);
  for (auto [pointer, name] : {std::pair<const void*, const char*>{p.w_lo, "w_lo"}, {p.u_lo, "u_lo"}})
    require_argument(pointer == nullptr || p.dtype != DType::f32, name, "is for 16-bit inputs only (fp32 W and U are stored exactly)");
  std::size_t saved = 0;
  if (p.saved != nullptr) {
    saved = saved_bytes(p);
    require_argument(saved != 0, "saved", "must be null: a training forward keeps nothing for these inputs (saved_bytes is 0)");
    for (auto [pointer, name] : {std::pair<const void*, const char*>{p.w, "w"}, {p.u, "u"}, {p.w_lo, "w_lo"}, {p.u_lo, "u_lo"},
                                 {p.wy_inverse, "wy_inverse"}, {p.v_new, "v_new"}})
      require_argument(pointer == nullptr, name, "must be null with saved (which holds it)");
    require_argument(p.boundary_states == nullptr, "boundary_states",
                     "must be null with saved (the state pass keeps S_[c] there; the tensor-core backward's stages expose it)");
  }
  require_argument(p.segments >= 0, "segments", "must be >= 0 (0 chooses, 1 is one walk)");
  if (p.segments > 1) {
    require_argument(long(p.heads) * p.segments <= kMaxGridRows, "segments", "heads · segments exceeds " + std::to_string(kMaxGridRows));
    require_argument(segments_take(p), "segments",
                     "more than one needs the register scan's inputs (bf16 or fp16, key_dim <= 128, key_dim and value_dim "
                     "multiples of 8, q and k rows 16-byte aligned, output pairs 4-byte aligned), saved null and no "
                     "one-walk intermediate");
  }
  std::size_t bytes = 0;
  resolve(p, &bytes);
  require_argument(bytes == 0 || p.workspace != nullptr, "workspace",
                   "must not be null: " + std::to_string(bytes) + " bytes are needed (workspace_bytes)");
  std::vector<Extent> packed{packed_extent("workspace", p.workspace, bytes, true), packed_extent("saved", p.saved, saved, true)};
  const bool segment_outputs = p.segment_states || p.segment_transitions || p.segment_incoming;
  require_argument(!segment_outputs || p.segments > 1, "segment_states", "and the other segment_* are written only with segments > 1");
  if (segment_outputs) {
    const SegmentFloats f = segment_floats(p, segment_layout_of(p));
    packed.push_back(packed_extent("segment_states", p.segment_states, f.states * sizeof(float), true));
    packed.push_back(packed_extent("segment_transitions", p.segment_transitions, f.transitions * sizeof(float), true));
    packed.push_back(packed_extent("segment_incoming", p.segment_incoming, f.incoming * sizeof(float), true));
  }
  const auto tensors = tensors_of(p);
  require_tensor_arguments(p.batch, p.heads, tensors, packed);
  require_device_tensors(tensors);
  if (bytes != 0) require_tensor(p.workspace, workspace_alignment, "workspace");
  if (saved != 0) require_tensor(p.saved, workspace_alignment, "saved");
}

std::vector<TensorArgument> tensors_of(const DecodeParams& p) {
  const std::size_t es = size_of(p.dtype);
  const int T = p.tokens, DK = p.key_dim, DV = p.value_dim;
  const bool in_place = decode_state_in_place(p.initial_state, p.initial_state_strides, p.final_state, p.final_state_strides);
  return {{"q", p.q, p.q_strides, T, DK, es},
          {"k", p.k, p.k_strides, T, DK, es},
          {"v", p.v, p.v_strides, T, DV, es},
          {"beta", p.beta, p.beta_strides, T, 1, es},
          {"log_gate", p.log_gate, p.log_gate_strides, T, 1, 4, false, false},
          {"initial_state", in_place ? nullptr : p.initial_state, p.initial_state_strides, DV, DK, 4, false, false},
          {"output", p.output, p.output_strides, T, DV, es, true},
          {"final_state", p.final_state, p.final_state_strides, DV, DK, 4, true}};
}

template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t stream, const std::string& name,
            const Args&... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "shared-memory size of " + name);
  kernel<<<grid, threads, smem, stream>>>(args...);
  check_launch(name);
}

template <class T, int C>
void prepare_typed(const ForwardStageParams& p, cudaStream_t stream) {
  const std::size_t smem = wy_prepare_async_layout(sizeof(T), C, p.key_dim, p.value_dim).bytes;
  const dim3 grid(chunk_count(p.length, C), p.batch * p.heads);
  const auto kernel = for_gates(p.log_gate, wy_prepare_async_kernel<T, C, true>, wy_prepare_async_kernel<T, C, false>);
  launch(kernel, grid, wy_prepare_async_threads(C), smem, stream,
         "wy_prepare_async_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">", p);
}

template <class T, int C, int BV>
void fallback_scan(const ForwardStageParams& p, cudaStream_t stream) {
  const std::size_t smem = scan_layout(sizeof(T), C, BV, p.key_dim).bytes;
  const dim3 grid((p.value_dim + BV - 1) / BV, p.batch * p.heads);
  launch(chunk_scan_shared_kernel<T, C, BV>, grid, kScanThreads, smem, stream,
         "chunk_scan_shared_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ", BV=" + std::to_string(BV) + ">", p);
}

int max_shared_bytes() {
  static const int bytes = [] {
    int device = 0, value = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    return value;
  }();
  return bytes;
}

// Value rows of S per fallback-scan block: 64, halved until its shared memory fits (DK = 256 with 64
// does not on the H200); fp32 inputs always 16 (shared memory).
int fitting_slice(const ForwardStageParams& p, int element_size, int chunk) {
  int slice = kDefaultValueSlice;
  while (slice > 16 && scan_layout(element_size, chunk, slice, p.key_dim).bytes > static_cast<std::size_t>(max_shared_bytes()))
    slice /= 2;
  return slice;
}

template <class T, int C>
void scan_typed(const ForwardStageParams& p, cudaStream_t stream) {
  if constexpr (!kTensorCore<T>) {
    fallback_scan<T, C, 16>(p, stream);
  } else if (register_scan(p)) {
    constexpr std::size_t smem = tc_scan_layout(C).bytes;
    const dim3 grid((p.value_dim + kTcSlice - 1) / kTcSlice, p.batch * p.heads);
    const auto kernel = for_gates(p.log_gate, chunk_scan_registers_kernel<T, C, true>, chunk_scan_registers_kernel<T, C, false>);
    launch(kernel, grid, kTcScanThreads, smem, stream,
           "chunk_scan_registers_kernel<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">", p, StatePassOutputs{});
  } else {
    switch (fitting_slice(p, sizeof(T), C)) {
      case 16: return fallback_scan<T, C, 16>(p, stream);
      case 32: return fallback_scan<T, C, 32>(p, stream);
      default: return fallback_scan<T, C, 64>(p, stream);
    }
  }
}

// The training forward's second half (ForwardParams::saved; bf16, the tensor-core backward's sizes): the
// backward's state pass writes S_[c] rounded once and V̄ as a pair into the saved buffer (and the final state),
// and the output is formed from those by chunk_output_kernel, every chunk at once. Inputs off the register
// scan's alignment take the scan for the output after the state pass; a k off cp.async's alignment leaves the
// state pass out (the backward then takes its fp32 kernels, which do not read the buffer).
template <class T, int C>
void training_scan(const ForwardStageParams& p, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const std::string suffix = "<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">";
    const SavedTensors s = saved_tensors(p.saved, p.batch, p.heads, p.length, p.key_dim, p.value_dim, C, nullptr);
    const StatePassOutputs pairs{s.s, s.v_hi, s.v_lo};
    const int heads = p.batch * p.heads, N = chunk_count(p.length, C);
    const auto state_pass = for_gates(p.log_gate, chunk_scan_registers_kernel<T, C, true, true>, chunk_scan_registers_kernel<T, C, false, true>);
    const auto output = for_gates(p.log_gate, chunk_output_kernel<T, C, true>, chunk_output_kernel<T, C, false>);
    if (keys_copyable(p))
      launch(state_pass, dim3((p.value_dim + kTcSlice - 1) / kTcSlice, heads), kTcScanThreads, tc_scan_layout(C).bytes, stream,
             "chunk_scan_registers_kernel<StatePass>" + suffix, p, pairs);
    if (register_scan(p)) {
      launch(output, dim3(N, heads), chunk_output_threads(C), chunk_output_layout(C).bytes, stream, "chunk_output_kernel" + suffix, p,
             pairs);
      return;
    }
  }
  scan_typed<T, C>(p, stream);
}

template <template <class, int> class Op>
void dispatch(const ForwardStageParams& p, cudaStream_t stream) {
  auto by_chunk = [&](auto type_tag) {
    using T = decltype(type_tag);
    switch (p.chunk_size) {
      case 16: return Op<T, 16>::run(p, stream);
      case 32: return Op<T, 32>::run(p, stream);
      default: return Op<T, 64>::run(p, stream);
    }
  };
  switch (p.dtype) {
    case DType::f32: return by_chunk(float{});
    case DType::bf16: return by_chunk(__nv_bfloat16{});
    default: return by_chunk(__half{});
  }
}

// The segments' launches for run_segments (delta_rule_segments.cuh), on the stream.
template <class T, int C>
struct SegmentLaunches {
  cudaStream_t stream;
  ForwardStageParams resolve(const ForwardStageParams& p) const { return delta_rule::resolve(p, nullptr); }
  void prepare(const ForwardStageParams& p) const { prepare_typed<T, C>(p, stream); }
  void scan(const ForwardStageParams& p, Summary summary) const {
    const dim3 grid((p.value_dim + kTcSlice - 1) / kTcSlice, p.batch * p.heads);
    const std::string suffix = "<" + name_of(p.dtype) + ", C=" + std::to_string(C) + ">";
    if (summary == Summary::state)
      launch(for_gates(p.log_gate, chunk_scan_registers_kernel<T, C, true, false, Summary::state>,
                       chunk_scan_registers_kernel<T, C, false, false, Summary::state>),
             grid, kTcScanThreads, tc_scan_layout(C).bytes, stream, "chunk_scan_registers_kernel<Summary::state>" + suffix, p,
             StatePassOutputs{});
    else if (summary == Summary::transition)
      launch(for_gates(p.log_gate, chunk_scan_registers_kernel<T, C, true, false, Summary::transition>,
                       chunk_scan_registers_kernel<T, C, false, false, Summary::transition>),
             grid, kTcScanThreads, tc_scan_layout(C).bytes, stream, "chunk_scan_registers_kernel<Summary::transition>" + suffix,
             p, StatePassOutputs{});
    else
      scan_typed<T, C>(p, stream);  // the register scan: the segments take its inputs alone
  }
  void segment_scan(const SegmentScan& s) const {
    launch(segment_scan_kernel<>, dim3((s.value_dim + kSegmentScanRows - 1) / kSegmentScanRows, s.heads), kSegmentScanThreads,
           segment_scan_shared_bytes(s.key_dim), stream, "segment_scan_kernel", s);
  }
  void copy_state(const StateCopy& c) const {
    const std::int64_t entries = std::int64_t(c.heads) * c.rows * c.cols;
    launch(copy_state_kernel, dim3(unsigned((entries + kStateCopyThreads - 1) / kStateCopyThreads)), kStateCopyThreads, 0, stream,
           "copy_state_kernel", c);
  }
};

// The forward over segments: the segment_* intermediates not given from the stream's pool.
template <class T, int C>
void segments_typed(const ForwardStageParams& p, const SegmentLayout& layout, cudaStream_t stream) {
  if constexpr (kTensorCore<T>) {
    // The runs' W, U and scores in the caller's workspace where it holds them (runs of whole chunks), else pooled too;
    // the final states of the runs walked together pooled.
    std::size_t runs = 0, given = 0;
    resolve(segment_view(p, 0, 0, runs_walked_together(layout), layout.length), &runs);
    resolve(p, &given);
    const SegmentFloats floats = segment_floats(p, layout);
    const std::size_t finals_bytes = sizeof(float) * std::size_t(p.heads) * (layout.folded + 1) * p.value_dim * p.key_dim;
    void* workspace = p.workspace;
    float* finals = nullptr;
    const auto carve = [&](WorkspaceCarver& c, ForwardStageParams& q) {
      if (runs > given) workspace = c.take(nullptr, runs);
      finals = static_cast<float*>(c.take(nullptr, finals_bytes));
      q.segment_states = static_cast<float*>(c.take(p.segment_states, floats.states * sizeof(float)));
      q.segment_transitions = static_cast<float*>(c.take(p.segment_transitions, floats.transitions * sizeof(float)));
      q.segment_incoming = static_cast<float*>(c.take(p.segment_incoming, floats.incoming * sizeof(float)));
    };
    ForwardStageParams q = p;
    WorkspaceCarver sizing(nullptr);
    carve(sizing, q);
    const StreamMemory memory(sizing.bytes(), stream, "the segments' states");
    WorkspaceCarver carver(memory.data);
    carve(carver, q);
    SegmentLaunches<T, C> launches{stream};
    run_segments(q, layout, workspace, finals, launches);
  }
}

template <class T, int C>
struct PrepareOp {
  static void run(const ForwardStageParams& p, cudaStream_t stream) { prepare_typed<T, C>(p, stream); }
};
template <class T, int C>
struct ScanOp {
  static void run(const ForwardStageParams& p, cudaStream_t stream) { scan_typed<T, C>(p, stream); }
};
template <class T, int C>
struct TrainingScanOp {
  static void run(const ForwardStageParams& p, cudaStream_t stream) { training_scan<T, C>(p, stream); }
};

// The decode: cuda/decode_kernels.cuh's row-group stream.
template <class T>
void decode_typed(const DecodeParams& p, cudaStream_t stream) {
  decoding::DecodeView view = decoding::view_of(p);
  decoding::set_vector_access(view, sizeof(T), sizeof(float));
  decoding::with_row_shape(view, [&](auto shape) {
    using Shape = decltype(shape);
    decoding::delta_rule_decode_kernel<T, Shape>
        <<<decoding::grid_of(view, Shape::kLanes), decoding::kThreads, 0, stream>>>(view);
  });
  check_launch("delta_rule_decode_kernel<" + name_of(p.dtype) + ">");
}

}  // namespace

void set_contiguous_strides(ForwardParams& p) {
  p.q_strides = p.k_strides = contiguous(p.heads, p.length, p.key_dim);
  p.v_strides = p.output_strides = contiguous(p.heads, p.length, p.value_dim);
  p.beta_strides = p.log_gate_strides = contiguous(p.heads, p.length, 1);
  p.initial_state_strides = p.final_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}
void set_contiguous_strides(DecodeParams& p) {
  p.q_strides = p.k_strides = contiguous(p.heads, p.tokens, p.key_dim);
  p.v_strides = p.output_strides = contiguous(p.heads, p.tokens, p.value_dim);
  p.beta_strides = p.log_gate_strides = contiguous(p.heads, p.tokens, 1);
  p.initial_state_strides = p.final_state_strides = contiguous(p.heads, p.value_dim, p.key_dim);
}

std::size_t workspace_bytes(const ForwardParams& p) { return testing::workspace_bytes(ForwardStageParams{p, {}}); }
std::size_t saved_bytes(const ForwardParams& p) {
  require_shape(p.dtype, p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_chunk_size(p.chunk_size);
  return saved_tensor_bytes(p.dtype, p.batch, p.heads, p.length, p.key_dim, p.value_dim, p.chunk_size);
}
void validate(const ForwardParams& p) { validate_stages(ForwardStageParams{p, {}}); }
void forward(const ForwardParams& p, cudaStream_t stream) { testing::forward(ForwardStageParams{p, {}}, stream); }

void validate(const DecodeParams& p) {
  require_shape(p.dtype, p.batch, p.heads, p.tokens, "tokens", p.key_dim, p.value_dim);
  const auto tensors = tensors_of(p);
  require_tensor_arguments(p.batch, p.heads, tensors);
  require_device_tensors(tensors);
}

void decode(const DecodeParams& p, cudaStream_t stream) {
  validate(p);
  switch (p.dtype) {
    case DType::f32: return decode_typed<float>(p, stream);
    case DType::bf16: return decode_typed<__nv_bfloat16>(p, stream);
    default: return decode_typed<__half>(p, stream);
  }
}

namespace testing {

bool uses_register_scan(const ForwardStageParams& p) { return register_scan(resolve(p, nullptr)); }

std::size_t workspace_bytes(const ForwardStageParams& p) {
  require_shape(p.dtype, p.batch, p.heads, p.length, "length", p.key_dim, p.value_dim);
  require_chunk_size(p.chunk_size);  // the scores' size depends on it
  std::size_t bytes = 0;
  resolve(p, &bytes);
  return bytes;
}

void validate(const ForwardStageParams& p) { validate_stages(p); }

void wy_prepare(const ForwardStageParams& p, cudaStream_t stream) {
  validate_stages(p);
  dispatch<PrepareOp>(resolve(p, nullptr), stream);
}

void chunk_scan(const ForwardStageParams& p, cudaStream_t stream) {
  validate_stages(p);
  dispatch<ScanOp>(resolve(p, nullptr), stream);
}

void forward(const ForwardStageParams& p, cudaStream_t stream) {
  validate_stages(p);
  if (const SegmentLayout layout = segment_layout_of(p); layout.folded > 0) {
    const auto by_chunk = [&](auto type_tag) {
      using T = decltype(type_tag);
      switch (p.chunk_size) {
        case 16: return segments_typed<T, 16>(p, layout, stream);
        case 32: return segments_typed<T, 32>(p, layout, stream);
        default: return segments_typed<T, 64>(p, layout, stream);
      }
    };
    if (p.dtype == DType::bf16) by_chunk(__nv_bfloat16{});
    else by_chunk(__half{});
    return;
  }
  const ForwardStageParams r = resolve(p, nullptr);
  dispatch<PrepareOp>(r, stream);
  if (r.saved != nullptr) dispatch<TrainingScanOp>(r, stream);
  else dispatch<ScanOp>(r, stream);
}

}  // namespace testing

}  // namespace deltaproof::cuda::delta_rule
