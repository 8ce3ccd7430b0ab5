// A CUDA block on the CPU: the project's kernels compiled by g++ from their own source and run
// thread by thread, so that a kernel can be checked before any GPU time is spent.
//
// NOT a GPU. Every thread of a block is a fiber (its own stack, switched by a small x86-64 context
// switch); blocks run one after another. __syncthreads() parks a fiber until every live thread of
// the block has arrived; warp-collective operations (__syncwarp, the four shuffles, ldmatrix,
// mma.sync) park every lane of the warp at one exchange, which completes only when all 32 lanes
// reach the same operation with the full mask (a lane elsewhere, exited or at a block barrier, is
// a divergence and an error). Dynamic shared memory is poisoned with NaN bytes before each block
// and guarded past the size the launch asks for; device buffers are host memory poisoned with NaN
// and fenced by guard bytes. cp.async copies land at the latest moment the PTX ISA allows (the
// thread's covering wait_group / wait_all), their destinations poisoned meanwhile. Threads run in
// ascending, descending or shuffled order between barriers (shuffled also shuffles the blocks), so
// that a result depending on the order is a race made visible. mma.sync sums its exact products and
// the fp32 accumulator exactly and rounds once toward zero. What it cannot show: the GPU memory
// model, CUDA's own expf (glibc's here), timing. compute-sanitizer on a GPU remains the word on
// memory and races.
//
// Use (see delta_rule_backward_cpu_emulation_test.cpp): include this header, put
// DELTAPROOF_EMULATION_SHARED_MEMORY(smem) in the kernels' namespace, include the kernel source
// (with DELTAPROOF_CUDA_EMULATION defined if it uses cuda/tensor_core.cuh), then
// emulation::launch({grid, block, shared_bytes, order}, kernel, args...).
#pragma once

#include "cuda/types.hpp"
#include "reference/batch.hpp"
#include "reference/scalar.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>  // before the built-in macros below: it names parameters gridDim and blockDim

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace deltaproof::emulation {

constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
constexpr std::size_t kSharedCapacity = 232448;  // the H200's opt-in maximum of dynamic shared memory per block
constexpr std::size_t kSharedGuard = 4096;       // checked bytes past the capacity
constexpr unsigned char kPoisonByte = 0xFF;      // NaN in fp16, bf16, fp32 and fp64

enum class ThreadOrder { ascending, descending, shuffled };

struct Launch {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes = 0;  // dynamic shared memory, at most kSharedCapacity
  ThreadOrder order = ThreadOrder::ascending;
  std::uint64_t seed = 1;  // of the shuffled orders
};

// Runs kernel() as every thread of every block of the grid. Throws std::runtime_error naming the
// block and thread on a misused primitive (divergent or partial-mask collective, address outside
// the dynamic shared memory, cp.async race or copy never waited for) and on a write past the
// dynamic shared memory.
void launch(const Launch& config, const std::function<void()>& kernel);

template <class... Params, class... Args>
void launch(const Launch& config, void (*kernel)(Params...), const Args&... args) {
  launch(config, std::function<void()>([&] { kernel(args...); }));
}

// In a GoogleTest body: skipped where the emulation cannot run (its context switch is x86-64 only).
#if defined(__x86_64__)
#define DELTAPROOF_EMULATION_REQUIRE_X86_64()
#else
#define DELTAPROOF_EMULATION_REQUIRE_X86_64() GTEST_SKIP() << "the emulation's context switch is x86-64 only"
#endif

// Places the kernels' `extern __shared__ unsigned char NAME[]` in the current namespace: the
// capacity plus the guard, handed to the machine, which poisons and checks it around every block.
#define DELTAPROOF_EMULATION_SHARED_MEMORY(name)                                                             \
  alignas(1024) unsigned char name[::deltaproof::emulation::kSharedCapacity + ::deltaproof::emulation::kSharedGuard]; \
  inline const bool name##_known_to_the_emulation = ::deltaproof::emulation::add_shared_memory(name)
bool add_shared_memory(unsigned char* buffer);

// ---------------------------------------------------------------------------------------
// The built-ins, as the kernel source sees them through the macros at the end of this header.

uint3 thread_index();
uint3 block_index();
dim3 block_dim();
dim3 grid_dim();
void sync_threads();
void sync_warp(unsigned mask = 0xffffffffu);

enum class Shuffle { index, up, down, xor_lanes };
void shuffle_bytes(Shuffle kind, unsigned mask, const void* value, void* result, std::size_t size, int operand, int width);

template <class T>
T shuffle(Shuffle kind, unsigned mask, T value, int operand, int width = kWarpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "a shuffle moves at most 16 bytes");
  T result;
  shuffle_bytes(kind, mask, &value, &result, sizeof(T), operand, width);
  return result;
}
template <class T>
T shfl_sync(unsigned mask, T value, int source_lane, int width = kWarpSize) { return shuffle(Shuffle::index, mask, value, source_lane, width); }
template <class T>
T shfl_up_sync(unsigned mask, T value, unsigned delta, int width = kWarpSize) { return shuffle(Shuffle::up, mask, value, int(delta), width); }
template <class T>
T shfl_down_sync(unsigned mask, T value, unsigned delta, int width = kWarpSize) { return shuffle(Shuffle::down, mask, value, int(delta), width); }
template <class T>
T shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = kWarpSize) { return shuffle(Shuffle::xor_lanes, mask, value, lane_mask, width); }

// WMMA (nvcuda::wmma below, m16n16k16 only): warp-collective loads, stores and products of fragments.
enum class WmmaElement { f32, f16, bf16 };
void wmma_load(void* fragment, const void* p, unsigned ldm, bool col_major, WmmaElement element);
void wmma_store(void* p, const void* fragment, unsigned ldm, bool col_major, WmmaElement element);
void wmma_mma(float* d, const void* a, const void* b, const float* c, bool bf16);

// One m16n8k16 product-sum as the emulated tensor cores form it: Σ_k a_k b_k + c exactly, rounded
// once toward zero to fp32 (±inf past the fp32 range; NaN or inf in, the IEEE result out).
float dot16_round_toward_zero(const double (&a)[16], const double (&b)[16], float c);

// ---------------------------------------------------------------------------------------
// Host memory standing in for a device allocation: 256-byte aligned (as cudaMalloc's), NaN-poisoned,
// fenced by guard bytes, and known to cp.async as a valid source.

class DeviceBuffer {
 public:
  // Zero bytes: an empty buffer whose data() is null.
  DeviceBuffer() = default;
  DeviceBuffer(std::string name, std::size_t bytes);
  DeviceBuffer(DeviceBuffer&&) noexcept = default;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  void* data() { return bytes_ ? bytes_.get() + kGuard : nullptr; }
  const void* data() const { return bytes_ ? bytes_.get() + kGuard : nullptr; }
  std::size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool empty() const { return !bytes_; }
  // Throws std::runtime_error when a guard byte on either side was overwritten.
  void check_guards() const;
  // The guard byte just before the data (for tests of the check itself).
  unsigned char& front_guard() { return bytes_[kGuard - 1]; }

  static constexpr std::size_t kGuard = 256;  // also the alignment
  static constexpr unsigned char kGuardByte = 0x5A;

 private:
  struct AlignedDelete {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(kGuard)); }
  };
  std::unique_ptr<unsigned char[], AlignedDelete> bytes_;
  std::size_t size_ = 0;
  std::string name_;
};

// A tensor of `dtype` in a DeviceBuffer, [batch, heads, rows, cols].
struct Tensor {
  DeviceBuffer buffer;
  cuda::DType dtype = cuda::DType::f32;
  ref::Index batch = 0, heads = 0, rows = 0, cols = 0;

  Tensor() = default;
  Tensor(const std::string& name, cuda::DType d, ref::Index b, ref::Index h, ref::Index r, ref::Index c);
  void* data() { return buffer.data(); }
  std::size_t count() const { return std::size_t(batch * heads * rows * cols); }
};

// The exact entries of t (each representable in d) in a new tensor.
Tensor write(const std::string& name, const ref::Tensor4<ref::Exact>& t, cuda::DType d);
// The exact values of every entry; an entry never written (still NaN) or a broken guard is an error.
// An empty tensor reads as an empty Tensor4.
ref::Tensor4<ref::Exact> read(const Tensor& t);

}  // namespace deltaproof::emulation

// ---------------------------------------------------------------------------------------
// nvcuda::wmma (what <mma.h> declares only for nvcc), m16n16k16 with fp32 accumulators. The
// mapping of tile elements to lanes is unspecified by CUDA; here lane l holds elements 8l..8l+7 of
// the row-major tile. Every load, store and product is a warp collective that insists on one
// pointer, leading dimension and layout for all 32 lanes, 32-byte aligned tiles and leading
// dimensions of whole 16-byte units (the WMMA rules), inside the launch's shared memory when the
// tile lies there.
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int m, int n, int k, class T, class Layout = void>
struct fragment {
  static_assert(m == 16 && n == 16 && k == 16, "the emulation has the m16n16k16 shape only");
  static constexpr int num_elements = 8;
  T x[num_elements];
};

template <class T>
constexpr deltaproof::emulation::WmmaElement wmma_element_of() {
  if constexpr (std::is_same_v<T, float>) return deltaproof::emulation::WmmaElement::f32;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return deltaproof::emulation::WmmaElement::bf16;
  else {
    static_assert(std::is_same_v<T, __half>, "WMMA elements: float, __half, __nv_bfloat16");
    return deltaproof::emulation::WmmaElement::f16;
  }
}

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_void_v<Layout>, "an accumulator load names its layout");
  deltaproof::emulation::wmma_load(f.x, p, ldm, std::is_same_v<Layout, col_major>, wmma_element_of<T>());
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t layout) {
  deltaproof::emulation::wmma_load(f.x, p, ldm, layout == mem_col_major, wmma_element_of<float>());
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t layout) {
  deltaproof::emulation::wmma_store(p, f.x, ldm, layout == mem_col_major, wmma_element_of<float>());
}
template <class Use, class T, class Layout, class V>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const V& value) {
  for (T& x : f.x) x = T(value);
}
template <class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  deltaproof::emulation::wmma_mma(d.x, a.x, b.x, c.x, std::is_same_v<T, __nv_bfloat16>);
}

}  // namespace nvcuda::wmma

// ---------------------------------------------------------------------------------------
// The CUDA built-ins the kernel source uses, mapped onto the machine.
#undef threadIdx
#undef blockIdx
#undef gridDim
#undef blockDim
#define threadIdx (::deltaproof::emulation::thread_index())
#define blockIdx (::deltaproof::emulation::block_index())
#define gridDim (::deltaproof::emulation::grid_dim())
#define blockDim (::deltaproof::emulation::block_dim())
#define __syncthreads() ::deltaproof::emulation::sync_threads()
#define __syncwarp(...) ::deltaproof::emulation::sync_warp(__VA_ARGS__)
#define __shfl_sync(...) ::deltaproof::emulation::shfl_sync(__VA_ARGS__)
#define __shfl_up_sync(...) ::deltaproof::emulation::shfl_up_sync(__VA_ARGS__)
#define __shfl_down_sync(...) ::deltaproof::emulation::shfl_down_sync(__VA_ARGS__)
#define __shfl_xor_sync(...) ::deltaproof::emulation::shfl_xor_sync(__VA_ARGS__)
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
