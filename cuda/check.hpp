// CUDA errors, shared by every kernel launcher and their callers (host side only; no Eigen, no Boost).
// Argument checks are cuda/arguments.hpp's.
#pragma once

#include <cuda_runtime.h>

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

// Whether a CUDA device can be used in this process (false on CI: no GPU).
bool gpu_available();
std::string gpu_name();

}  // namespace deltaproof::cuda
