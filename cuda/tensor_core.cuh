// Device-only wrappers for the raw tensor-core path shared by the kernels: ldmatrix,
// mma.sync m16n8k16 with fp32 accumulation, 16-bit pairs (with the hi + lo split that carries
// an fp32 operand to about 16 bits) and cp.async. Include from .cu files only, or from the CPU
// emulation (property_tests/support/cuda_emulation.hpp) with DELTAPROOF_CUDA_EMULATION defined:
// then each inline-asm body below is replaced by a call into the emulated warp; nothing else
// changes, and nvcc never sees the macro.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#ifdef DELTAPROOF_CUDA_EMULATION
namespace deltaproof::emulation {  // defined in property_tests/support/cuda_emulation_tensor_core.cpp
unsigned shared_address(const void* p);
void ldmatrix_x4(unsigned (&r)[4], unsigned address, bool transposed);
void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, bool bf16);
void copy_async_16(unsigned address, const void* src, bool valid);
void copy_async_commit();
void copy_async_wait(int pending);  // pending < 0: wait_all
}  // namespace deltaproof::emulation
#endif

namespace deltaproof::cuda::tensor_core {

__device__ __forceinline__ unsigned smem_address(const void* p) {
#ifdef DELTAPROOF_CUDA_EMULATION
  return ::deltaproof::emulation::shared_address(p);
#else
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
#endif
}

// Four 8×8 b16 matrices from shared memory; lane l supplies the row address of matrix l/8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
#ifdef DELTAPROOF_CUDA_EMULATION
  ::deltaproof::emulation::ldmatrix_x4(r, address, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned address) {
#ifdef DELTAPROOF_CUDA_EMULATION
  ::deltaproof::emulation::ldmatrix_x4(r, address, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
#endif
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) { ldmatrix_x4(r, smem_address(row)); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) { ldmatrix_x4_trans(r, smem_address(row)); }

// d += a·b for one 16×8 fp32 tile (k = 16), operands in T (bf16 or fp16). Registers only (not
// volatile), so the compiler may schedule it between the shared-memory loads.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#ifdef DELTAPROOF_CUDA_EMULATION
  ::deltaproof::emulation::mma_16816(d, a, b0, b1, std::is_same_v<T, __nv_bfloat16>);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats rounded to nearest even in T, x0 in the low half (the element with the lower index).
template <class T>
__device__ __forceinline__ unsigned pack_pair(float x0, float x1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
    return *reinterpret_cast<const unsigned*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(x0, x1);
    return *reinterpret_cast<const unsigned*>(&v);
  }
}
template <class T>
__device__ __forceinline__ float2 unpack_pair(unsigned x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&x);
    return make_float2(__low2float(v), __high2float(v));
  } else {
    const __half2 v = *reinterpret_cast<const __half2*>(&x);
    return make_float2(__low2float(v), __high2float(v));
  }
}
// x = hi + lo + O(u²|x|) for a pair (hi = T(x), lo = T(x − hi), both exact to form): an fp32
// operand enters the tensor cores to about 16 bits instead of 8.
template <class T>
__device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo) {
  hi = pack_pair<T>(x0, x1);
  const float2 h = unpack_pair<T>(hi);
  lo = pack_pair<T>(x0 - h.x, x1 - h.y);
}

// Two neighbouring n8 accumulator tiles (n, n + 1) of one fragment row, each lane holding one 16-bit
// pair of each, stored with one 8-byte write per lane: after one exchange with the neighbouring lane,
// lanes t = 0, 2 write tile n's columns 0–3 and 4–7 and lanes t = 1, 3 tile n + 1's. A row's four lanes
// then fill one 32-byte sector per instruction, where 4-byte pair stores fill half of two (and the L2
// merges halves). Every lane of the warp must call it (the exchange); `columns_left` (a multiple of 4:
// the row length is a multiple of 8) counts tile n's valid columns from `tile_n`, which is 8-byte aligned.
template <class T>
__device__ __forceinline__ void store_tile_pairs(T* tile_n, unsigned pair_n, unsigned pair_n1, int t, bool row_valid,
                                                 int columns_left) {
  const bool second = t & 1;
  const unsigned neighbour = __shfl_xor_sync(0xffffffffu, second ? pair_n : pair_n1, 1);
  const int column = 8 * (t & 1) + 2 * (t & 2);
  if (row_valid && column < columns_left)
    *reinterpret_cast<uint2*>(tile_n + column) = second ? make_uint2(neighbour, pair_n1) : make_uint2(pair_n, neighbour);
}

// 16-byte asynchronous copy global → shared; zero-fills when !valid (src-size 0 reads nothing). The destination
// as a shared-memory address (smem_address), so that a run of copies converts its base once, or as a pointer.
__device__ __forceinline__ void copy_async_16(unsigned address, const void* src, bool valid) {
#ifdef DELTAPROOF_CUDA_EMULATION
  ::deltaproof::emulation::copy_async_16(address, src, valid);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, bool valid) { copy_async_16(smem_address(dst), src, valid); }
__device__ __forceinline__ void copy_async_commit() {
#ifdef DELTAPROOF_CUDA_EMULATION
  ::deltaproof::emulation::copy_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Wait until at most `pending` of this thread's committed copy groups are still in flight.
template <int pending>
__device__ __forceinline__ void copy_async_wait() {
#ifdef DELTAPROOF_CUDA_EMULATION
  ::deltaproof::emulation::copy_async_wait(pending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}
__device__ __forceinline__ void copy_async_wait_all() {
#ifdef DELTAPROOF_CUDA_EMULATION
  ::deltaproof::emulation::copy_async_wait(-1);
#else
  asm volatile("cp.async.wait_all;\n" ::);
#endif
}

}  // namespace deltaproof::cuda::tensor_core
