// How the kernels' tensors are laid out, for both families (linear_attention.h, delta_rule.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaproof::cuda {

// Where entry (b, h, i, j) of a [B, H, rows, cols] tensor lives: data + b*batch + h*head + i*row + j,
// in elements (the column stride is 1). Any order of the three is allowed as long as no two entries
// share an address: fla's [B, T, H, D] tensor viewed as [B, H, T, D] is {T·H·D, D, H·D}. A per-token
// vector [B, H, L] (β, g and their gradients) is [B, H, L, 1]: `row` is its token stride.
struct Strides {
  std::int64_t batch = 0, head = 0, row = 0;
  // Offset of row 0 of head (b, h).
  __host__ __device__ std::int64_t head_offset(int b, int h) const { return b * batch + h * head; }
};

// Strides of a packed [B, H, rows, cols] tensor.
inline Strides contiguous(int heads, int rows, int cols) {
  return {std::int64_t{heads} * rows * cols, std::int64_t{rows} * cols, cols};
}

// The chunk sizes the chunkwise kernels are built for, and the largest head dim (DK and DV).
inline constexpr int supported_chunk_sizes[] = {16, 32, 64};
inline constexpr int max_head_dim = 256;

// The longest sequence (L, or T decode tokens) a launcher takes. Every memory offset in the kernels
// is 64-bit (int64 strides, size_t for packed intermediates), but chunk arithmetic is int:
// (L + C − 1) / C and chunk·C + i stay below 2³¹ only while L <= 2³¹ − 64 (C <= 64). Longer
// sequences are refused, never wrapped.
inline constexpr int max_sequence_length = INT32_MAX - 63;  // 2³¹ − 64

// Number of chunks N = ceil(L / C).
inline int chunk_count(int length, int chunk_size) { return (length + chunk_size - 1) / chunk_size; }

}  // namespace deltaproof::cuda
