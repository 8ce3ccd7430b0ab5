// Device buffers, and exact transfers between the oracle's Tensor4<Exact> and device tensors of any
// kernel dtype: the upload every verdict on a CUDA kernel starts from (tests and the command line).
//
// Policy (the design page's numerical policy): a kernel is compared with the oracle evaluated on the
// exact values of its rounded inputs. `upload` rounds each exact entry to the dtype (round to
// nearest, ties to even, decided in exact arithmetic) and returns those exact values alongside
// the device copy; `download` reads any dtype back without loss (every binary float is a
// dyadic rational).
#pragma once

#include "cuda/types.hpp"
#include "reference/batch.hpp"
#include "reference/scalar.hpp"
#include "verify/kernel_case.hpp"

#include <cstddef>
#include <utility>

namespace deltaproof::verify {

using ref::Exact;
using ref::Index;
using ref::Tensor4;

// The verdict library's name for a kernel's element type (verify/ knows no CUDA).
inline DType verify_dtype(cuda::DType d) {
  switch (d) {
    case cuda::DType::f64: return DType::f64;
    case cuda::DType::f32: return DType::f32;
    case cuda::DType::bf16: return DType::bf16;
    default: return DType::f16;
  }
}

// Owns one cudaMalloc allocation; move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A [B, H, rows, cols] contiguous tensor of one dtype on the device.
struct DeviceTensor {
  DeviceBuffer buffer;
  cuda::DType dtype = cuda::DType::f32;
  Index batch = 0, heads = 0, rows = 0, cols = 0;

  void* data() const { return buffer.get(); }
  std::size_t count() const { return static_cast<std::size_t>(batch * heads * rows * cols); }
};

// The exact value of x rounded to nearest (ties to even) in dtype.
Exact round_to(const Exact& x, cuda::DType dtype);
Tensor4<Exact> round_to(const Tensor4<Exact>& t, cuda::DType dtype);

// A device tensor and the exact values of its entries (the oracle's inputs).
struct Uploaded {
  DeviceTensor device;
  Tensor4<Exact> exact;
};

// Rounds every entry of t to dtype and copies it to the device.
Uploaded upload(const Tensor4<Exact>& t, cuda::DType dtype);

// Uninitialized is never what a test wants: the tensor is filled with a NaN pattern (0xFF bytes),
// so an entry the kernel forgot to write cannot pass as a plausible value.
DeviceTensor allocate(cuda::DType dtype, Index batch, Index heads, Index rows, Index cols);

// Exact values of every entry (the device is synchronized first).
Tensor4<Exact> download(const DeviceTensor& t);
Tensor4<Exact> download(const void* device_data, cuda::DType dtype, Index batch, Index heads, Index rows, Index cols);

// Raw bytes of a device tensor, for bitwise-determinism checks.
std::vector<unsigned char> download_bytes(const DeviceTensor& t);

}  // namespace deltaproof::verify
