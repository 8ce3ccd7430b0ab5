// GPU tests run only where a CUDA device exists; elsewhere GoogleTest reports them skipped. Also the
// raw-memory helpers of the tests that lay tensors out with strides or plant NaN and Inf in them.
#pragma once

#include "cuda/check.hpp"
#include "cuda/layout.hpp"
#include "cuda/types.hpp"
#include "kernel_checks/device_tensors.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#define DELTAPROOF_REQUIRE_GPU()                                                       \
  do {                                                                                 \
    if (!::deltaproof::cuda::gpu_available()) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)

namespace deltaproof::testing {

// What argument validation named: the std::invalid_argument message of f(), or "no exception".
template <class F>
std::string rejection(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}
inline ::testing::AssertionResult starts_with(const std::string& message, const std::string& prefix) {
  if (message.rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected \"" << prefix << "...\", got: " << message;
}

inline std::vector<unsigned char> device_bytes(const void* data, std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  cuda::check(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  return host;
}
inline void set_device_bytes(void* data, const std::vector<unsigned char>& bytes) {
  cuda::check(cudaMemcpy(data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

// Element i of raw bytes of `dtype`, widened exactly to double (NaN and ±Inf kept).
inline double element(const std::vector<unsigned char>& bytes, cuda::DType dtype, std::size_t i) {
  const unsigned char* at = bytes.data() + i * cuda::size_of(dtype);
  switch (dtype) {
    case cuda::DType::f64: {
      double x;
      std::memcpy(&x, at, 8);
      return x;
    }
    case cuda::DType::f32: {
      float x;
      std::memcpy(&x, at, 4);
      return x;
    }
    case cuda::DType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, at, 2);
      const std::uint32_t w = std::uint32_t{h} << 16;
      float x;
      std::memcpy(&x, &w, 4);
      return x;
    }
    default: {
      std::uint16_t h;
      std::memcpy(&h, at, 2);
      const int exponent = (h >> 10) & 31, mantissa = h & 1023;
      const double sign = (h & 0x8000) ? -1 : 1;
      if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
      return sign * std::ldexp(exponent ? 1024 + mantissa : mantissa, (exponent ? exponent : 1) - 25);
    }
  }
}

// The bytes of x in `dtype`: NaN, ±Inf, or a number the dtype holds exactly (fp16: a normal one).
inline std::vector<unsigned char> encode(double x, cuda::DType dtype) {
  std::vector<unsigned char> bytes(cuda::size_of(dtype));
  if (dtype == cuda::DType::f64) {
    std::memcpy(bytes.data(), &x, 8);
  } else if (dtype == cuda::DType::f32 || dtype == cuda::DType::bf16) {
    const float f = static_cast<float>(x);
    std::uint32_t w;
    std::memcpy(&w, &f, 4);
    if (dtype == cuda::DType::f32) std::memcpy(bytes.data(), &w, 4);
    else std::memcpy(bytes.data(), reinterpret_cast<const unsigned char*>(&w) + 2, 2);  // exact values only
  } else {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    std::uint16_t h = std::isnan(x) ? 0x7E00 : std::isinf(x) ? (sign | 0x7C00) : 0;
    if (std::isfinite(x)) {
      int exponent;
      const double m = std::frexp(std::fabs(x), &exponent);  // x = m·2^e, m in [0.5, 1)
      h = x == 0 ? sign : std::uint16_t(sign | ((exponent + 14) << 10) | (std::uint16_t(std::ldexp(m, 11)) & 1023));
    }
    std::memcpy(bytes.data(), &h, 2);
  }
  return bytes;
}

// A [B, H, rows, cols] tensor laid out with `strides`, `offset` elements into its own buffer; the
// bytes its layout skips hold 0xFF (NaN in every dtype), so that a kernel reading them would show.
struct StridedTensor {
  verify::DeviceBuffer buffer;
  cuda::DType dtype = cuda::DType::f32;
  ref::Index batch = 0, heads = 0, rows = 0, cols = 0;
  cuda::Strides strides;
  std::size_t offset = 0;

  void* data() const { return static_cast<char*>(buffer.get()) + offset * cuda::size_of(dtype); }
  std::size_t position(ref::Index b, ref::Index h, ref::Index i, ref::Index j) const {
    return std::size_t(b * strides.batch + h * strides.head + i * strides.row + j);
  }
  // Its entries packed [B, H, rows, cols], as raw bytes (comparable with a packed tensor's).
  std::vector<unsigned char> packed_bytes() const {
    const std::size_t es = cuda::size_of(dtype);
    const std::vector<unsigned char> all = device_bytes(buffer.get(), buffer.bytes());
    std::vector<unsigned char> packed;
    for (ref::Index b = 0; b < batch; ++b)
      for (ref::Index h = 0; h < heads; ++h)
        for (ref::Index i = 0; i < rows; ++i)
          for (ref::Index j = 0; j < cols; ++j) {
            const unsigned char* at = all.data() + (offset + position(b, h, i, j)) * es;
            packed.insert(packed.end(), at, at + es);
          }
    return packed;
  }
};

// An empty strided tensor (every byte 0xFF), or a copy of a packed device tensor's entries.
inline StridedTensor strided(cuda::DType dtype, ref::Index batch, ref::Index heads, ref::Index rows, ref::Index cols,
                             cuda::Strides strides, std::size_t offset = 0) {
  StridedTensor t{verify::DeviceBuffer(), dtype, batch, heads, rows, cols, strides, offset};
  const std::size_t span = t.position(batch - 1, heads - 1, rows - 1, cols - 1) + 1;
  t.buffer = verify::DeviceBuffer((offset + span) * cuda::size_of(dtype));
  set_device_bytes(t.buffer.get(), std::vector<unsigned char>(t.buffer.bytes(), 0xFF));
  return t;
}
inline StridedTensor strided_copy(const verify::DeviceTensor& packed, cuda::Strides strides, std::size_t offset = 0) {
  StridedTensor t = strided(packed.dtype, packed.batch, packed.heads, packed.rows, packed.cols, strides, offset);
  const std::size_t es = cuda::size_of(packed.dtype);
  const std::vector<unsigned char> source = device_bytes(packed.data(), packed.count() * es);
  std::vector<unsigned char> all = device_bytes(t.buffer.get(), t.buffer.bytes());
  std::size_t n = 0;
  for (ref::Index b = 0; b < t.batch; ++b)
    for (ref::Index h = 0; h < t.heads; ++h)
      for (ref::Index i = 0; i < t.rows; ++i)
        for (ref::Index j = 0; j < t.cols; ++j, ++n)
          std::memcpy(all.data() + (offset + t.position(b, h, i, j)) * es, source.data() + n * es, es);
  set_device_bytes(t.buffer.get(), all);
  return t;
}

// Layouts: fla's [B, T, H, D] (token-major) viewed as [B, H, T, D], and packed rows padded by `pad`.
inline cuda::Strides token_major(ref::Index heads, ref::Index rows, ref::Index cols) {
  return {rows * heads * cols, cols, heads * cols};
}
inline cuda::Strides padded_rows(ref::Index heads, ref::Index rows, ref::Index cols, ref::Index pad) {
  return {heads * rows * (cols + pad), rows * (cols + pad), cols + pad};
}

}  // namespace deltaproof::testing
