// Additive linear attention, host side: the passes of linear_attention_passes.cuh built from the API's parameters
// and launched (linear_attention.cu validates the arguments, then calls launch_forward / launch_backward /
// launch_decode). Everything here has internal linkage, as in the kernels' header.
#pragma once

#include "cuda/linear_attention_passes.cuh"
#include "cuda/linear_attention_segment_kernels.cuh"
#include "cuda/segments.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace deltaproof::cuda::linear_attention {
namespace {

// ---------------------------------------------------------------------------------------
// Host side: pass construction and dispatch (arguments already validated).

constexpr bool tensor_core_pass(DType dtype, int key_dim, int value_dim) {
  return dtype == DType::bf16 && key_dim <= kTcDim && value_dim <= kTcDim;
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
bool multiple_of_8(const Strides& s) { return s.batch % 8 == 0 && s.head % 8 == 0 && s.row % 8 == 0; }

Pass make_pass(const void* q, Strides qs, const void* k, Strides ks, const void* v, Strides vs, void* out, Strides os,
               int batch, int heads, int length, int key_dim, int value_dim, int chunk, bool reversed) {
  Pass p{};
  p.q = q, p.k = k, p.v = v, p.out = out;
  p.q_s = qs, p.k_s = ks, p.v_s = vs, p.out_s = os;
  p.batch = batch, p.heads = heads, p.length = length, p.key_dim = key_dim, p.value_dim = value_dim;
  p.chunk_size = chunk, p.reversed = reversed;
  return p;
}

void set_initial(Pass& p, const void* s0, const Strides& s, bool transposed) {
  p.s0 = s0;
  p.s0_b = s.batch, p.s0_h = s.head;
  p.s0_r = transposed ? 1 : s.row;
  p.s0_c = transposed ? s.row : 1;
}
void set_final(Pass& p, void* sf, const Strides& s) {
  p.s_final = sf;
  p.sf_b = s.batch, p.sf_h = s.head, p.sf_r = s.row, p.sf_c = 1;
}

// The forward's one pass; vec: every row 16-byte aligned and every width a multiple of 8 (16-byte copies).
struct ForwardPass {
  Pass pass;
  bool vec;
};
ForwardPass forward_pass(const ForwardParams& fp) {
  Pass p = make_pass(fp.q, fp.q_strides, fp.k, fp.k_strides, fp.v, fp.v_strides, fp.output, fp.output_strides,
                     fp.batch, fp.heads, fp.length, fp.key_dim, fp.value_dim, fp.chunk_size, false);
  set_initial(p, fp.initial_state, fp.initial_state_strides, false);
  set_final(p, fp.final_state, fp.final_state_strides);
  p.boundary = fp.boundary_states;
  const bool vec = fp.key_dim % 8 == 0 && fp.value_dim % 8 == 0 && aligned16(fp.q) && aligned16(fp.k) && aligned16(fp.v) &&
                   aligned16(fp.output) && multiple_of_8(fp.q_strides) && multiple_of_8(fp.k_strides) &&
                   multiple_of_8(fp.v_strides) && multiple_of_8(fp.output_strides);
  return {p, vec};
}

// The backward's three passes (chunkwise_backward rewritten, see the top of this file).
struct BackwardPasses {
  Pass dq, dk, dv;
  bool vec;
};
BackwardPasses backward_passes(const BackwardParams& bp) {
  const int B = bp.batch, H = bp.heads, L = bp.length, DK = bp.key_dim, DV = bp.value_dim, C = bp.chunk_size;
  BackwardPasses r;
  r.vec = DK % 8 == 0 && DV % 8 == 0 && aligned16(bp.q) && aligned16(bp.k) && aligned16(bp.v) && aligned16(bp.d_output) &&
          aligned16(bp.dq) && aligned16(bp.dk) && aligned16(bp.dv) && multiple_of_8(bp.q_strides) &&
          multiple_of_8(bp.k_strides) && multiple_of_8(bp.v_strides) && multiple_of_8(bp.d_output_strides) &&
          multiple_of_8(bp.dq_strides) && multiple_of_8(bp.dk_strides) && multiple_of_8(bp.dv_strides);
  // dQ = dO S_[c] + (dO Vᵀ ⊙ M) K: forward pass over (dO, V, K) with state Sᵀ.
  r.dq = make_pass(bp.d_output, bp.d_output_strides, bp.v, bp.v_strides, bp.k, bp.k_strides, bp.dq, bp.dq_strides, B, H,
                   L, DV, DK, C, false);
  set_initial(r.dq, bp.initial_state, bp.initial_state_strides, true);
  set_final(r.dq, nullptr, {});
  // dK = V G + (V dOᵀ ⊙ Mᵀ) Q: reversed pass over (V, dO, Q) with state Gᵀ, G starting at dS_L.
  r.dk = make_pass(bp.v, bp.v_strides, bp.d_output, bp.d_output_strides, bp.q, bp.q_strides, bp.dk, bp.dk_strides, B, H,
                   L, DV, DK, C, true);
  set_initial(r.dk, bp.d_final_state, bp.d_final_state_strides, true);
  set_final(r.dk, nullptr, {});
  // dV = K Gᵀ + (K Qᵀ ⊙ Mᵀ) dO: reversed pass over (K, Q, dO) with state G; its final state is dS_0.
  r.dv = make_pass(bp.k, bp.k_strides, bp.q, bp.q_strides, bp.d_output, bp.d_output_strides, bp.dv, bp.dv_strides, B, H,
                   L, DK, DV, C, true);
  set_initial(r.dv, bp.d_final_state, bp.d_final_state_strides, false);
  set_final(r.dv, bp.d_initial_state, bp.d_initial_state_strides);
  return r;
}

// A tensor-core pass's grid, block and shared memory: one block of 16 warps per head.
struct TcLaunch {
  dim3 grid;
  int threads;
  std::size_t shared_bytes;
};
TcLaunch tensor_core_launch(const Pass& p, bool fused_dk_dv) {
  const unsigned sequences = unsigned(p.batch * p.heads * p.segments);
  return {dim3(1, sequences), kTcThreads, fused_dk_dv ? TcLayout::bytes : TcForwardLayout::bytes};
}

// Whether a pass runs the kernels' segment instantiation: a pass over segments, or a segment-sum pass (no output).
[[maybe_unused]] bool over_segments(const Pass& p) { return p.segments > 1 || !p.out; }

// ---------------------------------------------------------------------------------------
// A pass over segments (docs/context_parallel.md, one GPU): R walks per sequence instead of one, for
// sequences too few to fill the GPU. Three launches: the segments' sums (the pass with no output and no
// initial state, every segment's final state kept: Σ v kᵀ over its tokens), their exclusive scan from S_0
// in the pass's direction, then the pass itself from each segment's incoming state. `sums` and
// `incoming` each hold B·H·R states of the pass (rows × cols, the accumulation type), packed.

struct SegmentedPass {
  Pass sums, pass;
  SegmentScan scan;
};
[[maybe_unused]] SegmentedPass segmented_pass(const Pass& p, Segmentation seg, void* sums, void* incoming) {
  const std::int64_t per = std::int64_t(p.value_dim) * p.key_dim, R = seg.segments;
  SegmentedPass s{p, p, {}};
  for (Pass* x : {&s.sums, &s.pass}) x->segments = seg.segments, x->segment_length = seg.length, x->boundary = nullptr;
  s.sums.out = nullptr, s.sums.s0 = nullptr;
  s.sums.s_final = sums;
  s.sums.sf_b = p.heads * R * per, s.sums.sf_h = R * per, s.sums.sf_r = p.key_dim, s.sums.sf_c = 1, s.sums.sf_seg = per;
  s.scan = {sums, incoming, p.s0, p.s0_b, p.s0_h, p.s0_r, p.s0_c, p.batch, p.heads, seg.segments, p.value_dim, p.key_dim,
            p.reversed};
  s.pass.s0 = incoming;
  s.pass.s0_b = p.heads * R * per, s.pass.s0_h = R * per, s.pass.s0_r = p.key_dim, s.pass.s0_c = 1, s.pass.s0_seg = per;
  s.pass.sf_seg = 0;  // the pass's last segment writes the final state
  return s;
}

[[maybe_unused]] unsigned scan_blocks(const SegmentScan& s) {
  const std::int64_t entries = std::int64_t(s.batch) * s.heads * s.rows * s.cols;
  return unsigned((entries + kScanThreads - 1) / kScanThreads);
}

// Context parallelism (cuda/context_parallel.h): rank `rank` holds one run of every sequence (`local`). Its
// summary, the run's Σ v kᵀ into `summary` ([B, H, DV, DK] packed, the state dtype), starts from S_0 on rank 0,
// so that the prefix sums of the ranks' summaries are the runs' incoming states.
[[maybe_unused]] ForwardPass rank_summary_pass(const ForwardParams& local, int rank, void* summary) {
  ForwardPass f = forward_pass(local);
  f.pass.out = nullptr, f.pass.boundary = nullptr;
  if (rank > 0) f.pass.s0 = nullptr;
  set_final(f.pass, summary, contiguous(local.heads, local.value_dim, local.key_dim));
  return f;
}
[[maybe_unused]] RankPrefix rank_prefix(const ForwardParams& local, int rank, const void* gathered, void* incoming) {
  return {gathered, incoming, std::int64_t(local.batch) * local.heads * local.value_dim * local.key_dim, rank};
}
[[maybe_unused]] unsigned prefix_blocks(const RankPrefix& p) { return unsigned((p.entries + kScanThreads - 1) / kScanThreads); }

// The CPU emulation (property_tests/linear_attention_cpu_emulation_test.cpp) runs the kernels above through the
// passes above; what follows launches them on a GPU.
#ifndef DELTAPROOF_CUDA_EMULATION

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t stream, const Pass& p,
            const std::string& name) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "cudaFuncSetAttribute for " + name);
  kernel<<<grid, threads, smem, stream>>>(p);
  check_launch(name);
}

template <class T, class A, class Policy, bool kSegments>
void run_generic(const Pass& p, cudaStream_t stream) {
  const dim3 grid((p.value_dim + kGenericTileV - 1) / kGenericTileV, p.batch * p.heads * p.segments);
  const std::size_t smem = generic_smem_bytes<A>(p.key_dim, p.chunk_size);
  const std::string name = std::string("linear_attention pass_generic") + (kSegments ? "(segments)" : "");
  switch (p.chunk_size) {
    case 16: launch(pass_generic<T, A, 16, Policy, kSegments>, grid, kGenericThreads, smem, stream, p, name + "<C=16>"); break;
    case 32: launch(pass_generic<T, A, 32, Policy, kSegments>, grid, kGenericThreads, smem, stream, p, name + "<C=32>"); break;
    default: launch(pass_generic<T, A, 64, Policy, kSegments>, grid, kGenericThreads, smem, stream, p, name + "<C=64>"); break;
  }
}
template <class T, class A, class Policy>
void run_generic(const Pass& p, cudaStream_t stream) {
  if (over_segments(p)) run_generic<T, A, Policy, true>(p, stream);
  else run_generic<T, A, Policy, false>(p, stream);
}

// A tensor-core pass; with kFused, p is the dV pass and dk the dK pass of one fused reversed scan.
template <int C, bool kFused, class Policy>
void launch_tensor_core(const Pass& p, const Pass& dk, bool vec, cudaStream_t stream) {
  const std::string name = std::string("linear_attention ") + (kFused ? "pass_tensor_core_dk_dv" : "pass_tensor_core_forward") +
                           "<C=" + std::to_string(C) + ">";
  const TcLaunch l = tensor_core_launch(p, kFused);
  if constexpr (kFused) {
    check(cudaFuncSetAttribute(pass_tensor_core_dk_dv<C, Policy>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(l.shared_bytes)),
          "cudaFuncSetAttribute for " + name);
    pass_tensor_core_dk_dv<C, Policy><<<l.grid, l.threads, l.shared_bytes, stream>>>(p, dk, vec);
  } else if (over_segments(p)) {
    check(cudaFuncSetAttribute(pass_tensor_core_forward<C, Policy, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(l.shared_bytes)),
          "cudaFuncSetAttribute for " + name);
    pass_tensor_core_forward<C, Policy, true><<<l.grid, l.threads, l.shared_bytes, stream>>>(p, vec);
  } else {
    check(cudaFuncSetAttribute(pass_tensor_core_forward<C, Policy>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(l.shared_bytes)),
          "cudaFuncSetAttribute for " + name);
    pass_tensor_core_forward<C, Policy><<<l.grid, l.threads, l.shared_bytes, stream>>>(p, vec);
  }
  check_launch(name);
}

template <bool kFused, class Policy>
void run_tensor_core(const Pass& p, const Pass& dk, bool vec, cudaStream_t stream) {
  switch (p.chunk_size) {
    case 16: launch_tensor_core<16, kFused, Policy>(p, dk, vec, stream); break;
    case 32: launch_tensor_core<32, kFused, Policy>(p, dk, vec, stream); break;
    default: launch_tensor_core<64, kFused, Policy>(p, dk, vec, stream); break;
  }
}

template <class Policy>
void run_pass(const Pass& p, DType dtype, bool vec, cudaStream_t stream) {
  if (tensor_core_pass(dtype, p.key_dim, p.value_dim)) {
    run_tensor_core<false, Policy>(p, p, vec, stream);
    return;
  }
  switch (dtype) {
    case DType::f32: run_generic<float, float, Policy>(p, stream); break;
    case DType::f64: run_generic<double, double, Policy>(p, stream); break;
    case DType::bf16: run_generic<__nv_bfloat16, float, Policy>(p, stream); break;
    case DType::f16: run_generic<__half, float, Policy>(p, stream); break;
  }
}

template <class Policy>
void run_scan(const SegmentScan& s, DType dtype, cudaStream_t stream) {
  if (dtype == DType::f64) segment_scan_kernel<double, Policy><<<scan_blocks(s), kScanThreads, 0, stream>>>(s);
  else segment_scan_kernel<float, Policy><<<scan_blocks(s), kScanThreads, 0, stream>>>(s);
  check_launch("linear_attention segment_scan_kernel");
}

// The segments of a pass on this device (SM count) when `requested` is 0.
Segmentation segmentation_on_device(const Pass& p, DType dtype, int requested) {
  if (p.boundary) return {1, p.length};  // validated: boundary states take one segment
  if (requested > 0) return choose_segments(requested, p.batch * p.heads, p.length, p.chunk_size, 1, 1);
  const int sms = multiprocessor_count();
  const bool tc = tensor_core_pass(dtype, p.key_dim, p.value_dim);
  // A tensor-core block fills an SM; the generic kernel's blocks (one per 32 value columns) fit about two.
  const int blocks = tc ? 1 : (p.value_dim + kGenericTileV - 1) / kGenericTileV;
  return choose_segments(0, p.batch * p.heads, p.length, p.chunk_size, blocks, tc ? sms : 2 * sms);
}

template <class Policy>
void run_segmented(const Pass& p, Segmentation seg, DType dtype, bool vec, cudaStream_t stream) {
  const std::size_t state_bytes = dtype == DType::f64 ? sizeof(double) : sizeof(float);
  const std::size_t bytes = state_bytes * std::size_t(p.batch) * p.heads * seg.segments * p.value_dim * p.key_dim;
  const StreamMemory buffers(2 * bytes, stream, "the segments' states");
  const SegmentedPass s = segmented_pass(p, seg, buffers.data, static_cast<char*>(buffers.data) + bytes);
  run_pass<Policy>(s.sums, dtype, vec, stream);
  run_scan<Policy>(s.scan, dtype, stream);
  run_pass<Policy>(s.pass, dtype, vec, stream);
}

// The launches of forward(), backward() and decode() after validation.
template <class Policy>
void launch_forward(const ForwardParams& fp, cudaStream_t stream) {
  const ForwardPass f = forward_pass(fp);
  const Segmentation seg = segmentation_on_device(f.pass, fp.dtype, fp.segments);
  if (seg.segments == 1) run_pass<Policy>(f.pass, fp.dtype, f.vec, stream);
  else run_segmented<Policy>(f.pass, seg, fp.dtype, f.vec, stream);
}

template <class Policy>
void launch_backward(const BackwardParams& bp, cudaStream_t stream) {
  const BackwardPasses b = backward_passes(bp);
  const Segmentation seg = segmentation_on_device(b.dq, bp.dtype, bp.segments);
  if (seg.segments > 1) {  // the three passes over the same segments, the reversed ones scanned from the end
    for (const Pass* p : {&b.dq, &b.dk, &b.dv}) run_segmented<Policy>(*p, seg, bp.dtype, b.vec, stream);
    return;
  }
  run_pass<Policy>(b.dq, bp.dtype, b.vec, stream);
  // On tensor cores both reversed passes run as one scan (same tiles, same G).
  if (tensor_core_pass(bp.dtype, bp.key_dim, bp.value_dim)) {
    run_tensor_core<true, Policy>(b.dv, b.dk, b.vec, stream);
    return;
  }
  run_pass<Policy>(b.dk, bp.dtype, b.vec, stream);
  run_pass<Policy>(b.dv, bp.dtype, b.vec, stream);
}

// The decode: cuda/decode_kernels.cuh's row-group stream.
template <class T, class A, class Policy>
void run_decode(const DecodeParams& p, cudaStream_t stream) {
  decoding::DecodeView view = decoding::view_of(p);
  decoding::set_vector_access(view, sizeof(T), sizeof(A));
  decoding::with_row_shape(view, [&](auto shape) {
    using Shape = decltype(shape);
    decode_rows_kernel<T, A, Shape, Policy>
        <<<decoding::grid_of(view, Shape::kLanes), decoding::kThreads, 0, stream>>>(view);
  });
  check_launch("linear_attention decode_rows_kernel");
}

template <class Policy>
void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::f32: run_decode<float, float, Policy>(p, stream); break;
    case DType::f64: run_decode<double, double, Policy>(p, stream); break;
    case DType::bf16: run_decode<__nv_bfloat16, float, Policy>(p, stream); break;
    case DType::f16: run_decode<__half, float, Policy>(p, stream); break;
  }
}

#endif  // DELTAPROOF_CUDA_EMULATION

}  // namespace
}  // namespace deltaproof::cuda::linear_attention
