#include "cuda/check.hpp"

namespace deltaproof::cuda {

bool gpu_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
}

std::string gpu_name() {
  cudaDeviceProp properties{};
  if (!gpu_available() || cudaGetDeviceProperties(&properties, 0) != cudaSuccess) return "none";
  return properties.name;
}

}  // namespace deltaproof::cuda
