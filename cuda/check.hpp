// Error handling shared by every kernel launcher (host side only; no Eigen, no Boost).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace deltaproof::cuda {

// A CUDA call or launch failed: carries cudaGetErrorString and the operation's name.
class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& what_failed, cudaError_t code)
      : std::runtime_error(what_failed + ": " + cudaGetErrorString(code)), code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

inline void check(cudaError_t code, const std::string& what) {
  if (code != cudaSuccess) throw CudaError(what, code);
}

// After a launch: configuration errors at once, execution errors at the next sync.
inline void check_launch(const std::string& kernel_name) { check(cudaGetLastError(), "launch of " + kernel_name); }

// Argument validation: std::invalid_argument naming the argument.
inline void require_argument(bool ok, const std::string& argument, const std::string& what_is_allowed) {
  if (!ok) throw std::invalid_argument(argument + ": " + what_is_allowed);
}

// True when the pointer addresses device memory (cudaMalloc or managed), false for host
// memory, null, or an address CUDA does not know.
bool is_device_pointer(const void* pointer);

inline void require_device_pointer(const void* pointer, const std::string& argument) {
  require_argument(pointer != nullptr, argument, "must not be null");
  require_argument(is_device_pointer(pointer), argument, "must be a device pointer (cudaMalloc)");
}

// The longest sequence (L, or T decode tokens) a launcher takes. Every memory offset in the kernels
// is 64-bit (size_t or int64 strides), but chunk arithmetic is int: (L + C − 1) / C and chunk·C + i
// stay below 2³¹ only while L <= 2³¹ − 64 (C <= 64). Longer sequences are refused, never wrapped.
inline constexpr int max_sequence_length = INT32_MAX - 63;  // 2³¹ − 64

inline void require_sequence_length(int length, const std::string& argument) {
  require_argument(length >= 1 && length <= max_sequence_length, argument,
                   "must be in 1.." + std::to_string(max_sequence_length) + " (chunk indices are 32-bit), got " +
                       std::to_string(length));
}

inline void require_aligned(const void* pointer, std::size_t bytes, const std::string& argument) {
  require_argument(reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0, argument,
                   "must be aligned to " + std::to_string(bytes) + " bytes");
}

// Whether a CUDA device can be used in this process (false on CI: no GPU).
bool gpu_available();
std::string gpu_name();

}  // namespace deltaproof::cuda
