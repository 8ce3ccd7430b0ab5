// Element types of kernel inputs (accumulation is always fp32, or fp64 for the double build).
#pragma once

#include <cstddef>
#include <string>

namespace deltaproof::cuda {

enum class DType { f32, f64, bf16, f16 };

inline std::size_t size_of(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    default: return 2;
  }
}

// The accumulation type of kernels whose inputs are `t` (and of their states): fp64 for fp64, else fp32.
inline DType accumulator_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

inline std::string name_of(DType t) {
  switch (t) {
    case DType::f64: return "fp64";
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    default: return "fp16";
  }
}

}  // namespace deltaproof::cuda
