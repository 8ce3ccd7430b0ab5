#include "cuda/arguments.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>

namespace deltaproof::cuda {

void require_dtype(DType dtype, std::initializer_list<DType> allowed) {
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : d == *(allowed.end() - 1) ? " or " : ", ") + name_of(d);
  const bool known = dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16;
  require_argument(std::find(allowed.begin(), allowed.end(), dtype) != allowed.end(), "dtype",
                   "must be " + names + ", got " + (known ? name_of(dtype) : "value " + std::to_string(int(dtype))));
}

void require_sizes(int batch, int heads, int length, const std::string& length_name, int key_dim, int value_dim) {
  require_argument(batch >= 1, "batch", "must be >= 1, got " + std::to_string(batch));
  require_argument(heads >= 1, "heads", "must be >= 1, got " + std::to_string(heads));
  require_argument(std::int64_t{batch} * heads <= 65535, "batch*heads",
                   "must be <= 65535 (one grid row per head), got " + std::to_string(std::int64_t{batch} * heads));
  require_argument(length >= 1 && length <= max_sequence_length, length_name,
                   "must be in 1.." + std::to_string(max_sequence_length) + " (chunk indices are 32-bit), got " +
                       std::to_string(length));
  require_argument(key_dim >= 1 && key_dim <= max_head_dim, "key_dim",
                   "must be in 1.." + std::to_string(max_head_dim) + ", got " + std::to_string(key_dim));
  require_argument(value_dim >= 1 && value_dim <= max_head_dim, "value_dim",
                   "must be in 1.." + std::to_string(max_head_dim) + ", got " + std::to_string(value_dim));
}

void require_chunk_size(int chunk_size) {
  const bool supported = std::find(std::begin(supported_chunk_sizes), std::end(supported_chunk_sizes), chunk_size) !=
                         std::end(supported_chunk_sizes);
  require_argument(supported, "chunk_size", "must be 16, 32 or 64, got " + std::to_string(chunk_size));
}

void require_present(const void* pointer, const std::string& name) { require_argument(pointer != nullptr, name, "must not be null"); }

namespace {

using Wide = __int128;

std::string decimal(Wide x) {
  std::string s;
  const bool negative = x < 0;
  if (negative) x = -x;
  do s.insert(s.begin(), char('0' + int(x % 10))); while ((x /= 10) != 0);
  return negative ? "-" + s : s;
}

// One past the largest offset of valid strides (the number of elements their extent covers).
Wide reach(const Strides& s, int batch, int heads, int rows, int cols) {
  return Wide(cols) + Wide(rows - 1) * s.row + Wide(heads - 1) * s.head + Wide(batch - 1) * s.batch;
}

}  // namespace

void require_strides(const Strides& s, int batch, int heads, int rows, int cols, const std::string& name) {
  struct Dimension {
    const char* field;
    std::int64_t stride;
    int size;
  };
  std::array<Dimension, 3> dims = {{{"row", s.row, rows}, {"head", s.head, heads}, {"batch", s.batch, batch}}};
  for (const Dimension& d : dims) require_argument(d.stride >= 0, name + "_strides." + d.field, "must be >= 0");
  std::stable_sort(dims.begin(), dims.end(), [](const Dimension& a, const Dimension& b) { return a.stride < b.stride; });
  Wide span = cols;  // the elements reached by the dimensions taken so far (columns: stride 1)
  for (const Dimension& d : dims) {
    if (d.size <= 1) continue;  // its stride is never multiplied by more than 0
    require_argument(d.stride >= span, name + "_strides." + d.field,
                     "must be >= " + decimal(span) + " (what the dimensions with smaller strides reach), got " +
                         std::to_string(d.stride) + ": two entries would share an address");
    span += Wide(d.size - 1) * d.stride;
  }
  require_argument(span - 1 <= Wide(INT64_MAX), name + "_strides",
                   "the largest offset (B-1)*batch + (H-1)*head + (rows-1)*row + cols - 1 must fit in 64 bits");
}

bool is_device_pointer(const void* pointer) {
  if (pointer == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // clear the error so that later checks do not see it
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

void require_tensor(const void* pointer, std::size_t alignment, const std::string& name) {
  require_present(pointer, name);
  require_argument(is_device_pointer(pointer), name, "must be a device pointer (cudaMalloc)");
  require_argument(reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0, name,
                   "must be aligned to " + std::to_string(alignment) + " bytes");
}

void require_optional_tensor(const void* pointer, std::size_t alignment, const std::string& name) {
  if (pointer != nullptr) require_tensor(pointer, alignment, name);
}

Extent extent_of(const std::string& name, const void* data, const Strides& s, int batch, int heads, int rows, int cols,
                 std::size_t element_size, bool written) {
  return packed_extent(name, data, std::size_t(std::min<Wide>(reach(s, batch, heads, rows, cols) * Wide(element_size), Wide(SIZE_MAX))),
                       written);
}

Extent packed_extent(const std::string& name, const void* data, std::size_t bytes, bool written) {
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(data);
  if (data == nullptr) return {name, 0, 0, written};
  return {name, begin, begin + std::min<std::uintptr_t>(bytes, UINTPTR_MAX - begin), written};
}

void require_disjoint(const std::vector<Extent>& tensors) {
  const auto range = [](const Extent& e) {
    char text[64];
    std::snprintf(text, sizeof text, "[%#llx, %#llx)", static_cast<unsigned long long>(e.begin), static_cast<unsigned long long>(e.end));
    return std::string(text);
  };
  for (std::size_t j = 0; j < tensors.size(); ++j)
    for (std::size_t i = 0; i < j; ++i) {
      const Extent &a = tensors[i], &b = tensors[j];
      if (!a.written && !b.written) continue;  // inputs may share memory with each other
      if (a.begin == a.end || b.begin == b.end || a.end <= b.begin || b.end <= a.begin) continue;
      const Extent& output = b.written ? b : a;
      const Extent& other = b.written ? a : b;
      require_argument(false, output.name,
                       "overlaps " + other.name + " (bytes " + range(output) + " and " + range(other) +
                           "): an output may share memory with no other tensor");
    }
}

bool decode_state_in_place(const void* initial_state, const Strides& initial_strides, const void* final_state,
                           const Strides& final_strides) {
  if (initial_state == nullptr || initial_state != final_state) return false;
  require_argument(initial_strides.batch == final_strides.batch && initial_strides.head == final_strides.head &&
                       initial_strides.row == final_strides.row,
                   "initial_state_strides", "must equal final_state_strides when the state is updated in place");
  return true;
}

void require_tensor_arguments(int batch, int heads, const std::vector<TensorArgument>& tensors,
                              const std::vector<Extent>& packed) {
  for (const TensorArgument& t : tensors)
    if (t.data != nullptr || t.required) require_strides(t.strides, batch, heads, t.rows, t.cols, t.name);
  for (const TensorArgument& t : tensors)
    if (t.required) require_present(t.data, t.name);
  std::vector<Extent> extents = packed;
  for (const TensorArgument& t : tensors)
    extents.push_back(extent_of(t.name, t.data, t.strides, batch, heads, t.rows, t.cols, t.element_size, t.written));
  require_disjoint(extents);
}

void require_device_tensors(const std::vector<TensorArgument>& tensors) {
  for (const TensorArgument& t : tensors) require_optional_tensor(t.data, t.element_size, t.name);
}

}  // namespace deltaproof::cuda
