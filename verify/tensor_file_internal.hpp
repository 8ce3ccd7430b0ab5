// What the tensor-file readers and writers share (not part of verify's interface): errors in one line
// naming the file and the tensor, the element types both containers store and their byte codecs, one
// tensor between container bytes and memory, and whole files as bytes.
//   tensor_file.cpp              the entry points by extension, round_to, the loaders of `deltaproof check`
//   tensor_file_codec.cpp        what this header declares
//   tensor_file_safetensors.cpp  .safetensors
//   tensor_file_npz.cpp          .npz and its .npy members
#pragma once

#include "verify/tensor_file.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace deltaproof::verify::tensor_files {

// Errors: one line, "<file>: <tensor>: <what>" (std::invalid_argument).
[[noreturn]] void fail(const std::string& path, const std::string& what);
[[noreturn]] void fail(const std::string& path, const std::string& tensor, const std::string& what);

std::string shape_text(const std::vector<Index>& shape);

// The stored element types of both containers.
enum class Stored { bf16, f16, f32, f64, i32, i64 };

std::size_t bytes_of(Stored t);
Stored stored_of(DType d);

// Element count of a shape, or nullopt on a negative extent or overflow past 2⁶².
std::optional<Index> element_count(const std::vector<Index>& shape);

// An unsigned integer of `bytes` bytes in the file's byte order; little-endian bytes of one. Bytes are
// assembled explicitly, so nothing here depends on the host's byte order.
std::uint64_t load_unsigned(const unsigned char* p, std::size_t bytes, bool little_endian);
void store_unsigned(std::uint64_t u, std::size_t bytes, std::vector<unsigned char>& out);

// One tensor as a container holds it.
struct RawTensor {
  Stored type;
  std::vector<Index> shape;
  const unsigned char* data;  // element_count(shape) · bytes_of(type) bytes
  bool little_endian = true;
};

// Decodes `raw` into file.floating (exact doubles) or file.integer under `name`.
void add_tensor(TensorFile& file, const std::string& name, const RawTensor& raw);

// Little-endian bytes of a tensor; throws (naming it) if a value does not fit its dtype, or an
// integer tensor's value does not fit int32 where it is not wide.
std::vector<unsigned char> encode_tensor(const std::string& path, const std::string& name, const HostTensor& t);
std::vector<unsigned char> encode_integers(const std::string& path, const std::string& name, const IntegerTensor& t);

// A whole file's bytes; a file written through a temporary renamed into place.
std::vector<unsigned char> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes);

bool ends_with(const std::string& s, const std::string& tail);

// The containers.
TensorFile read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const TensorFile& contents);
TensorFile read_npz(const std::string& path);
void write_npz(const std::string& path, const TensorFile& contents);

}  // namespace deltaproof::verify::tensor_files
