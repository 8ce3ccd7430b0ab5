// .safetensors (the PyTorch world's tensor file), read and written through the shared codecs of
// tensor_file_internal.hpp: the header parsed by nlohmann-json, every byte range checked against the
// file. The format: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
// then the data; offsets are relative to the first byte after the header.
#include "verify/tensor_file_internal.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>

namespace deltaproof::verify::tensor_files {

namespace {

std::optional<Stored> safetensors_type(const std::string& s) {
  if (s == "BF16") return Stored::bf16;
  if (s == "F16") return Stored::f16;
  if (s == "F32") return Stored::f32;
  if (s == "F64") return Stored::f64;
  if (s == "I32") return Stored::i32;
  if (s == "I64") return Stored::i64;
  return std::nullopt;
}

const char* safetensors_name(Stored t) {
  switch (t) {
    case Stored::bf16: return "BF16";
    case Stored::f16: return "F16";
    case Stored::f32: return "F32";
    case Stored::f64: return "F64";
    case Stored::i32: return "I32";
    default: return "I64";
  }
}

// A non-negative integer of a JSON header, or nullopt.
std::optional<Index> json_count(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    if (u <= std::uint64_t(std::numeric_limits<Index>::max())) return Index(u);
  } else if (j.is_number_integer()) {
    const auto i = j.get<std::int64_t>();
    if (i >= 0) return i;
  }
  return std::nullopt;
}

}  // namespace

TensorFile read_safetensors(const std::string& path) {
  const std::vector<unsigned char> bytes = read_bytes(path);
  if (bytes.size() < 8)
    fail(path, "truncated: " + std::to_string(bytes.size()) + " bytes, a safetensors file starts with an 8-byte header length");
  const std::uint64_t header_length = load_unsigned(bytes.data(), 8, true);
  if (header_length > bytes.size() - 8)
    fail(path, "truncated: the header length says " + std::to_string(header_length) + " bytes, " +
                   std::to_string(bytes.size() - 8) + " follow");
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  const nlohmann::json header = nlohmann::json::parse(header_begin, header_begin + header_length, nullptr, false);
  if (header.is_discarded()) fail(path, "header is not valid JSON");
  if (!header.is_object()) fail(path, "header is not a JSON object");
  const unsigned char* data = bytes.data() + 8 + header_length;
  const std::uint64_t data_size = bytes.size() - 8 - header_length;

  TensorFile file;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      fail(path, name, "header entry lacks dtype, shape or data_offsets");
    if (!entry["dtype"].is_string()) fail(path, name, "dtype is not a string");
    const std::string dtype_name = entry["dtype"].get<std::string>();
    const auto type = safetensors_type(dtype_name);
    if (!type) fail(path, name, "unsupported dtype " + dtype_name + " (expected BF16, F16, F32, F64, I32 or I64)");
    std::vector<Index> shape;
    if (!entry["shape"].is_array()) fail(path, name, "shape is not a list");
    for (const auto& d : entry["shape"]) {
      const auto extent = json_count(d);
      if (!extent) fail(path, name, "shape holds a value that is not a non-negative integer");
      shape.push_back(*extent);
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !json_count(offsets[0]) || !json_count(offsets[1]))
      fail(path, name, "data_offsets is not a pair of non-negative integers");
    const Index begin = *json_count(offsets[0]), end = *json_count(offsets[1]);
    const auto count = element_count(shape);
    if (!count) fail(path, name, "shape " + shape_text(shape) + " is too large");
    if (begin > end || std::uint64_t(end) > data_size)
      fail(path, name, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                           "] out of range: the data holds " + std::to_string(data_size) + " bytes (truncated file?)");
    if (std::uint64_t(end - begin) != std::uint64_t(*count) * bytes_of(*type))
      fail(path, name, "data_offsets span " + std::to_string(end - begin) + " bytes, shape " + shape_text(shape) + " of " +
                           dtype_name + " needs " + std::to_string(std::uint64_t(*count) * bytes_of(*type)));
    add_tensor(file, name, RawTensor{*type, shape, data + begin, true});
  }
  return file;
}

void write_safetensors(const std::string& path, const TensorFile& contents) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<unsigned char> data;
  auto append = [&](const std::string& name, Stored type, const std::vector<Index>& shape,
                    const std::vector<unsigned char>& bytes) {
    header[name] = {{"dtype", safetensors_name(type)}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data.insert(data.end(), bytes.begin(), bytes.end());
  };
  for (const auto& [name, t] : contents.floating) append(name, stored_of(t.dtype), t.shape, encode_tensor(path, name, t));
  for (const auto& [name, t] : contents.integer) {
    if (contents.floating.count(name)) fail(path, name, "named twice (floating and integer)");
    append(name, t.wide ? Stored::i64 : Stored::i32, t.shape, encode_integers(path, name, t));
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';  // the format allows trailing spaces; keeps the data 8-byte aligned
  std::vector<unsigned char> bytes;
  store_unsigned(text.size(), 8, bytes);
  bytes.insert(bytes.end(), text.begin(), text.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(path, bytes);
}

}  // namespace deltaproof::verify::tensor_files
