#include "cuda/check.hpp"

namespace deltaproof::cuda {

bool is_device_pointer(const void* pointer) {
  if (pointer == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later checks do not see it
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

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
