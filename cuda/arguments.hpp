// Argument checks shared by the launchers of both kernel families (linear_attention.cu, delta_rule.cu,
// delta_rule_backward.cu): each throws std::invalid_argument whose message starts with the argument's
// name. Launcher code only; a user sees the messages, not this header. Every validate() runs the
// checks that need no CUDA call first (sizes, chunk size, dtype, strides, presence, aliasing), so that
// they fail the same with or without a device, then the device-pointer and alignment checks.
#pragma once

#include "cuda/layout.hpp"
#include "cuda/types.hpp"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace deltaproof::cuda {

inline void require_argument(bool ok, const std::string& argument, const std::string& what_is_allowed) {
  if (!ok) throw std::invalid_argument(argument + ": " + what_is_allowed);
}

void require_dtype(DType dtype, std::initializer_list<DType> allowed);
// batch, heads >= 1 and batch·heads <= 65535 (one grid row per head); the sequence length (named
// `length_name`: "length" or "tokens") in 1..max_sequence_length; key_dim, value_dim in 1..max_head_dim.
void require_sizes(int batch, int heads, int length, const std::string& length_name, int key_dim, int value_dim);
void require_chunk_size(int chunk_size);  // one of supported_chunk_sizes
void require_present(const void* pointer, const std::string& name);
// Strides of a [B, H, rows, cols] tensor (message names "<name>_strides.<field>"): no stride negative;
// the dimensions longer than 1, taken by increasing stride, each step past everything the smaller ones
// reach (so no two entries share an address, in any order of the dimensions); the largest offset fits
// in int64. Computed in 128 bits, so that no stride, however large, wraps a check.
void require_strides(const Strides& s, int batch, int heads, int rows, int cols, const std::string& name);
// A device pointer (cudaMalloc or managed) aligned to `alignment` bytes.
void require_tensor(const void* pointer, std::size_t alignment, const std::string& name);
void require_optional_tensor(const void* pointer, std::size_t alignment, const std::string& name);
bool is_device_pointer(const void* pointer);  // false for host memory, null or an address CUDA does not know

// Aliasing. The bytes a tensor's strides reach, from its first element to one past its last: an output
// that overlaps any other tensor (input or output) would be read after it was written, or written by two
// threads. A range check, not an element check: tensors interleaved in one buffer (a fused [.., 3, H, D]
// gradient) are refused when one of them is written.
struct Extent {
  std::string name;
  std::uintptr_t begin = 0, end = 0;  // empty (begin == end) for a null pointer
  bool written = false;
};
Extent extent_of(const std::string& name, const void* data, const Strides& s, int batch, int heads, int rows, int cols,
                 std::size_t element_size, bool written);
Extent packed_extent(const std::string& name, const void* data, std::size_t bytes, bool written);
// Every written extent apart from every other one; the message names both ("dq: overlaps q ...").
void require_disjoint(const std::vector<Extent>& tensors);

// Whether decode updates its state in place (initial_state == final_state, which each entry's one
// thread reads before it writes); in place, the strides must be equal ("initial_state_strides").
bool decode_state_in_place(const void* initial_state, const Strides& initial_strides, const void* final_state,
                           const Strides& final_strides);

// A workspace holds the intermediates its caller left null, each in a piece aligned to
// workspace_alignment bytes, in a fixed order (so that separate launches of one pipeline agree).
inline constexpr std::size_t workspace_alignment = 256;
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* workspace) : base_(static_cast<char*>(workspace)) {}
  // `given` when not null; else the next piece of `bytes` (null without a workspace: sizing only).
  void* take(void* given, std::size_t bytes) {
    if (given != nullptr) return given;
    void* at = base_ != nullptr ? base_ + used_ : nullptr;
    used_ += (bytes + workspace_alignment - 1) / workspace_alignment * workspace_alignment;
    return at;
  }
  std::size_t bytes() const { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

// One tensor argument of a launcher, [B, H, rows, cols] with its strides, for the checks that every
// validate() runs over all of its tensors.
struct TensorArgument {
  std::string name;
  const void* data = nullptr;
  Strides strides;
  int rows = 0, cols = 0;
  std::size_t element_size = 0;  // also the alignment required
  bool written = false, required = true;
};
// Without a CUDA call, in this order: the strides of every tensor given or required, every required
// tensor present, no written tensor overlapping another one (nor the packed regions `packed`, e.g. a
// workspace).
void require_tensor_arguments(int batch, int heads, const std::vector<TensorArgument>& tensors,
                              const std::vector<Extent>& packed = {});
// Then every tensor given is a device pointer aligned to its element size.
void require_device_tensors(const std::vector<TensorArgument>& tensors);

}  // namespace deltaproof::cuda
