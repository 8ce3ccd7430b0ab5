#include "verify/tensor_file.hpp"

#include <nlohmann/json.hpp>
#include <zip.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

namespace deltaproof::verify {

namespace {

// ---------------------------------------------------------------------------------------------
// Errors: one line, "<file>: <tensor>: <what>".

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::invalid_argument(one_line(path + ": " + what));
}
[[noreturn]] void fail(const std::string& path, const std::string& tensor, const std::string& what) {
  throw std::invalid_argument(one_line(path + ": " + tensor + ": " + what));
}

std::string shape_text(const std::vector<Index>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The stored element types of both containers.
enum class Stored { bf16, f16, f32, f64, i32, i64 };

std::size_t bytes_of(Stored t) {
  switch (t) {
    case Stored::bf16:
    case Stored::f16: return 2;
    case Stored::f32:
    case Stored::i32: return 4;
    default: return 8;
  }
}
bool is_integer(Stored t) { return t == Stored::i32 || t == Stored::i64; }
Stored stored_of(DType d) {
  switch (d) {
    case DType::bf16: return Stored::bf16;
    case DType::f16: return Stored::f16;
    case DType::f32: return Stored::f32;
    default: return Stored::f64;
  }
}
DType dtype_of(Stored t) {
  switch (t) {
    case Stored::bf16: return DType::bf16;
    case Stored::f16: return DType::f16;
    case Stored::f32: return DType::f32;
    default: return DType::f64;
  }
}

// Element count of a shape, or nullopt on a negative extent or overflow past 2⁶².
std::optional<Index> element_count(const std::vector<Index>& shape) {
  Index n = 1;
  for (Index d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > (Index(1) << 62) / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Element codecs. Bytes are assembled explicitly in the file's byte order, so nothing here depends
// on the host's.

std::uint64_t load_unsigned(const unsigned char* p, std::size_t bytes, bool little_endian) {
  std::uint64_t u = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    const std::size_t at = little_endian ? bytes - 1 - i : i;
    u = (u << 8) | p[at];
  }
  return u;
}

void store_unsigned(std::uint64_t u, std::size_t bytes, std::vector<unsigned char>& out) {
  for (std::size_t i = 0; i < bytes; ++i) out.push_back((unsigned char)(u >> (8 * i)));  // little-endian
}

double decode_half(std::uint32_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = int((bits >> 10) & 0x1F);
  const int mantissa = int(bits & 0x3FF);
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -24);  // zero and subnormals
  if (exponent == 31) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  return sign * std::ldexp(double(1024 + mantissa), exponent - 25);
}

double decode_float(Stored t, std::uint64_t u) {
  switch (t) {
    case Stored::bf16: return double(std::bit_cast<float>(std::uint32_t(u) << 16));
    case Stored::f16: return decode_half(std::uint32_t(u));
    case Stored::f32: return double(std::bit_cast<float>(std::uint32_t(u)));
    default: return std::bit_cast<double>(u);
  }
}

// Bit pattern of x, which round_to(dtype) leaves unchanged (checked by the caller).
std::uint64_t encode_float(Stored t, double x) {
  switch (t) {
    case Stored::f64: return std::bit_cast<std::uint64_t>(x);
    case Stored::f32: return std::bit_cast<std::uint32_t>(float(x));
    case Stored::bf16: {
      if (std::isnan(x)) return std::signbit(x) ? 0xFFC0 : 0x7FC0;
      return std::bit_cast<std::uint32_t>(float(x)) >> 16;
    }
    default: {  // fp16
      const std::uint32_t sign = std::signbit(x) ? 0x8000 : 0;
      if (std::isnan(x)) return sign | 0x7E00;
      if (std::isinf(x)) return sign | 0x7C00;
      const double a = std::fabs(x);
      if (a < 0x1p-14) return sign | std::uint32_t(std::ldexp(a, 24));  // zero and subnormals
      const int e = std::ilogb(a);
      const auto mantissa = std::uint32_t(std::ldexp(a, 10 - e)) - 1024;
      return sign | (std::uint32_t(e + 15) << 10) | mantissa;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One tensor between container and memory.

struct RawTensor {
  Stored type;
  std::vector<Index> shape;
  const unsigned char* data;  // element_count(shape) · bytes_of(type) bytes
  bool little_endian = true;
};

void add_tensor(TensorFile& file, const std::string& name, const RawTensor& raw) {
  const Index n = *element_count(raw.shape);
  const std::size_t width = bytes_of(raw.type);
  if (is_integer(raw.type)) {
    IntegerTensor t{raw.shape, {}, raw.type == Stored::i64};
    t.values.reserve(size_t(n));
    for (Index i = 0; i < n; ++i) {
      const std::uint64_t u = load_unsigned(raw.data + size_t(i) * width, width, raw.little_endian);
      t.values.push_back(raw.type == Stored::i64 ? std::bit_cast<std::int64_t>(u)
                                                 : std::int64_t(std::bit_cast<std::int32_t>(std::uint32_t(u))));
    }
    file.integer[name] = std::move(t);
  } else {
    HostTensor t;
    t.shape = raw.shape;
    t.dtype = dtype_of(raw.type);
    t.values.reserve(size_t(n));
    for (Index i = 0; i < n; ++i)
      t.values.push_back(decode_float(raw.type, load_unsigned(raw.data + size_t(i) * width, width, raw.little_endian)));
    file.floating[name] = std::move(t);
  }
}

// Little-endian bytes of a tensor; throws (naming it) if a value does not fit its dtype.
std::vector<unsigned char> encode_tensor(const std::string& path, const std::string& name, const HostTensor& t) {
  const auto n = element_count(t.shape);
  if (!n || size_t(*n) != t.values.size())
    fail(path, name, "holds " + std::to_string(t.values.size()) + " values for shape " + shape_text(t.shape));
  const Stored type = stored_of(t.dtype);
  std::vector<unsigned char> out;
  out.reserve(t.values.size() * bytes_of(type));
  for (size_t i = 0; i < t.values.size(); ++i) {
    const double x = t.values[i];
    if (std::isfinite(x) && round_to(t.dtype, x) != x) {
      char text[64];
      std::snprintf(text, sizeof text, "%.17g", x);
      fail(path, name, "entry " + std::to_string(i) + " (" + text + ") is not exactly representable in " + name_of(t.dtype));
    }
    store_unsigned(encode_float(type, x), bytes_of(type), out);
  }
  return out;
}

std::vector<unsigned char> encode_integers(const std::string& path, const std::string& name, const IntegerTensor& t) {
  const auto n = element_count(t.shape);
  if (!n || size_t(*n) != t.values.size())
    fail(path, name, "holds " + std::to_string(t.values.size()) + " values for shape " + shape_text(t.shape));
  std::vector<unsigned char> out;
  for (std::int64_t x : t.values) {
    if (!t.wide && (x < std::numeric_limits<std::int32_t>::min() || x > std::numeric_limits<std::int32_t>::max()))
      fail(path, name, "value " + std::to_string(x) + " does not fit in int32");
    store_unsigned(std::uint64_t(x), t.wide ? 8 : 4, out);
  }
  return out;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "read error");
  return bytes;
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  const std::string temporary = path + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, std::string("cannot write (") + std::strerror(errno) + ")");
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    if (!out) fail(path, "write error");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) fail(path, std::string("cannot write (") + std::strerror(errno) + ")");
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// ---------------------------------------------------------------------------------------------
// safetensors: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
// then the data; offsets are relative to the first byte after the header.

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

// ---------------------------------------------------------------------------------------------
// .npy header: magic "\x93NUMPY", version, header length, then a Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// parsed here by a small recursive-descent reader of that literal subset (strings, True/False,
// integers, tuples and lists, dicts).

struct Literal {
  enum Kind { string, boolean, integer, sequence, dict } kind = string;
  std::string text;
  bool truth = false;
  Index number = 0;
  std::vector<Literal> items;      // a sequence's items, or a dict's values
  std::vector<std::string> keys;   // a dict's keys, one per item (std::pair would need Literal complete)
};

class LiteralParser {
 public:
  explicit LiteralParser(const std::string& s) : s_(s) {}

  // The whole header: one dict, then only whitespace.
  std::optional<Literal> parse_header() {
    auto value = parse_value(0);
    skip_space();
    if (!value || value->kind != Literal::dict || at_ != s_.size()) return std::nullopt;
    return value;
  }

 private:
  void skip_space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < s_.size() && s_[at_] == c) return ++at_, true;
    return false;
  }
  bool take_word(const char* word) {
    skip_space();
    const size_t n = std::strlen(word);
    if (s_.compare(at_, n, word) != 0) return false;
    at_ += n;
    return true;
  }

  std::optional<Literal> parse_value(int depth) {
    if (depth > 8) return std::nullopt;
    skip_space();
    if (at_ >= s_.size()) return std::nullopt;
    const char c = s_[at_];
    Literal v;
    if (c == '\'' || c == '"') {
      auto text = parse_string();
      if (!text) return std::nullopt;
      v.kind = Literal::string, v.text = *text;
    } else if (take_word("True")) {
      v.kind = Literal::boolean, v.truth = true;
    } else if (take_word("False")) {
      v.kind = Literal::boolean, v.truth = false;
    } else if (c >= '0' && c <= '9') {
      v.kind = Literal::integer;
      while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') {
        if (v.number > (std::numeric_limits<Index>::max() - 9) / 10) return std::nullopt;
        v.number = v.number * 10 + (s_[at_++] - '0');
      }
      if (at_ < s_.size() && s_[at_] == 'L') ++at_;  // Python 2 long literal in old files
    } else if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++at_;
      v.kind = Literal::sequence;
      while (!take(close)) {
        auto item = parse_value(depth + 1);
        if (!item) return std::nullopt;
        v.items.push_back(std::move(*item));
        if (!take(',')) {
          if (!take(close)) return std::nullopt;
          break;
        }
      }
    } else if (c == '{') {
      ++at_;
      v.kind = Literal::dict;
      while (!take('}')) {
        skip_space();
        auto key = parse_string();
        if (!key || !take(':')) return std::nullopt;
        auto value = parse_value(depth + 1);
        if (!value) return std::nullopt;
        v.keys.push_back(*key);
        v.items.push_back(std::move(*value));
        if (!take(',')) {
          if (!take('}')) return std::nullopt;
          break;
        }
      }
    } else {
      return std::nullopt;
    }
    return v;
  }

  std::optional<std::string> parse_string() {
    if (at_ >= s_.size() || (s_[at_] != '\'' && s_[at_] != '"')) return std::nullopt;
    const char quote = s_[at_++];
    std::string out;
    while (at_ < s_.size() && s_[at_] != quote) {
      if (s_[at_] == '\\') {
        if (++at_ >= s_.size()) return std::nullopt;
      }
      out += s_[at_++];
    }
    if (at_ >= s_.size()) return std::nullopt;
    ++at_;
    return out;
  }

  const std::string& s_;
  size_t at_ = 0;
};

// descr → stored type and byte order. '<V2' and '<u2' are bf16 bit patterns (see the header).
std::optional<std::pair<Stored, bool>> npy_type(const std::string& descr) {
  if (descr.size() < 3) return std::nullopt;
  const char order = descr[0];
  const std::string code = descr.substr(1);
  if (code == "V2" && (order == '<' || order == '|')) return std::pair{Stored::bf16, true};
  if (order != '<' && order != '>') return std::nullopt;
  const bool little = order == '<';
  if (code == "f2") return std::pair{Stored::f16, little};
  if (code == "f4") return std::pair{Stored::f32, little};
  if (code == "f8") return std::pair{Stored::f64, little};
  if (code == "i4") return std::pair{Stored::i32, little};
  if (code == "i8") return std::pair{Stored::i64, little};
  if (code == "u2") return std::pair{Stored::bf16, little};
  return std::nullopt;
}

const char* npy_descr(Stored t) {
  switch (t) {
    case Stored::bf16: return "<V2";
    case Stored::f16: return "<f2";
    case Stored::f32: return "<f4";
    case Stored::f64: return "<f8";
    case Stored::i32: return "<i4";
    default: return "<i8";
  }
}

void read_npy(const std::string& path, const std::string& name, const std::vector<unsigned char>& bytes, TensorFile& file) {
  static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0) fail(path, name, "not a .npy entry (bad magic or truncated)");
  const int major = bytes[6];
  size_t header_at = 0, header_length = 0;
  if (major == 1) {
    header_length = size_t(load_unsigned(bytes.data() + 8, 2, true)), header_at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(path, name, "truncated .npy header");
    header_length = size_t(load_unsigned(bytes.data() + 8, 4, true)), header_at = 12;
  } else {
    fail(path, name, ".npy format version " + std::to_string(major) + " is not supported (1, 2 or 3)");
  }
  if (header_length > bytes.size() - header_at) fail(path, name, "truncated .npy header");
  const std::string text(reinterpret_cast<const char*>(bytes.data() + header_at), header_length);
  const auto header = LiteralParser(text).parse_header();
  if (!header) fail(path, name, ".npy header is not a Python dict literal");
  const Literal *descr = nullptr, *fortran = nullptr, *shape_literal = nullptr;
  for (size_t i = 0; i < header->keys.size(); ++i) {
    const std::string& key = header->keys[i];
    const Literal& value = header->items[i];
    if (key == "descr") descr = &value;
    else if (key == "fortran_order") fortran = &value;
    else if (key == "shape") shape_literal = &value;
    else fail(path, name, ".npy header has an unexpected key '" + key + "'");
  }
  if (!descr || !fortran || !shape_literal || header->keys.size() != 3)
    fail(path, name, ".npy header needs exactly the keys descr, fortran_order and shape");
  if (descr->kind != Literal::string)
    fail(path, name, "unsupported dtype: structured arrays are not tensors (expected a plain numeric descr)");
  const auto type = npy_type(descr->text);
  if (!type)
    fail(path, name, "unsupported dtype '" + descr->text + "' (expected <f2, <f4, <f8, <i4, <i8, or <V2/<u2 for bf16)");
  if (fortran->kind != Literal::boolean) fail(path, name, ".npy fortran_order is not True or False");
  if (fortran->truth) fail(path, name, "fortran_order True is not supported (save a C-contiguous array)");
  if (shape_literal->kind != Literal::sequence) fail(path, name, ".npy shape is not a tuple");
  std::vector<Index> shape;
  for (const auto& d : shape_literal->items) {
    if (d.kind != Literal::integer) fail(path, name, ".npy shape holds a value that is not a non-negative integer");
    shape.push_back(d.number);
  }
  const auto count = element_count(shape);
  if (!count) fail(path, name, "shape " + shape_text(shape) + " is too large");
  const size_t data_at = header_at + header_length;
  const std::uint64_t needed = std::uint64_t(*count) * bytes_of(type->first);
  const std::uint64_t held = bytes.size() - data_at;
  if (held != needed)
    fail(path, name, (held < needed ? "truncated: " : "trailing bytes: ") + std::to_string(held) + " data bytes, shape " +
                         shape_text(shape) + " of '" + descr->text + "' needs " + std::to_string(needed));
  add_tensor(file, name, RawTensor{type->first, shape, bytes.data() + data_at, type->second});
}

std::vector<unsigned char> write_npy(Stored type, const std::vector<Index>& shape, const std::vector<unsigned char>& data) {
  std::string shape_literal = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_literal += (i ? ", " : "") + std::to_string(shape[i]);
  shape_literal += shape.size() == 1 ? ",)" : ")";
  std::string header = std::string("{'descr': '") + npy_descr(type) + "', 'fortran_order': False, 'shape': " + shape_literal + ", }";
  // Pad with spaces so that the data starts on a 64-byte boundary, newline last (as numpy does).
  const size_t prefix = 10;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::vector<unsigned char> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  store_unsigned(header.size(), 2, out);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// ---------------------------------------------------------------------------------------------
// .npz through libzip.

std::string zip_error_text(int code) {
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string text = zip_error_strerror(&error);
  zip_error_fini(&error);
  return text;
}

struct ZipCloser {
  void operator()(zip_t* z) const {
    if (z) zip_discard(z);
  }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const {
    if (f) zip_fclose(f);
  }
};

TensorFile read_npz(const std::string& path) {
  {
    std::ifstream probe(path, std::ios::binary);
    if (!probe) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  }
  int code = 0;
  std::unique_ptr<zip_t, ZipCloser> archive(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code));
  if (!archive) fail(path, "not a readable .npz (zip) archive, truncated or damaged: " + zip_error_text(code));
  TensorFile file;
  const zip_int64_t entries = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < entries; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive.get(), zip_uint64_t(i), 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE))
      fail(path, "entry " + std::to_string(i) + " unreadable: " + zip_strerror(archive.get()));
    const std::string entry = st.name;
    if (!ends_with(entry, ".npy")) fail(path, entry, "entry is not a .npy file");
    const std::string name = entry.substr(0, entry.size() - 4);
    if (file.floating.count(name) || file.integer.count(name)) fail(path, name, "stored twice");
    std::unique_ptr<zip_file_t, ZipFileCloser> member(zip_fopen_index(archive.get(), zip_uint64_t(i), 0));
    if (!member) fail(path, name, std::string("cannot open the entry: ") + zip_strerror(archive.get()));
    if (st.size > (zip_uint64_t(1) << 40)) fail(path, name, "entry too large");
    std::vector<unsigned char> bytes(size_t(st.size));
    zip_int64_t got = 0;
    while (got < zip_int64_t(st.size)) {
      const zip_int64_t n = zip_fread(member.get(), bytes.data() + got, st.size - zip_uint64_t(got));
      if (n < 0) fail(path, name, std::string("entry truncated or damaged: ") + zip_file_strerror(member.get()));
      if (n == 0) break;
      got += n;
    }
    if (got != zip_int64_t(st.size))
      fail(path, name, "entry truncated: " + std::to_string(got) + " of " + std::to_string(st.size) + " bytes");
    read_npy(path, name, bytes, file);
  }
  return file;
}

void write_npz(const std::string& path, const TensorFile& contents) {
  // Encode everything first: a value that does not fit its dtype throws before the file is touched.
  std::vector<std::pair<std::string, std::vector<unsigned char>>> members;
  for (const auto& [name, t] : contents.floating)
    members.emplace_back(name, write_npy(stored_of(t.dtype), t.shape, encode_tensor(path, name, t)));
  for (const auto& [name, t] : contents.integer) {
    if (contents.floating.count(name)) fail(path, name, "named twice (floating and integer)");
    members.emplace_back(name, write_npy(t.wide ? Stored::i64 : Stored::i32, t.shape, encode_integers(path, name, t)));
  }
  // libzip deletes an archive left empty at zip_close; numpy writes the 22-byte end record alone.
  if (members.empty()) {
    std::vector<unsigned char> end_of_central_directory = {'P', 'K', 5, 6};
    end_of_central_directory.resize(22, 0);
    return write_bytes(path, end_of_central_directory);
  }
  int code = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
  if (!archive) fail(path, "cannot create the archive: " + zip_error_text(code));
  for (const auto& [name, bytes] : members) {
    zip_source_t* source = zip_source_buffer(archive, bytes.data(), bytes.size(), 0);  // `members` outlives zip_close
    const zip_int64_t at = source ? zip_file_add(archive, (name + ".npy").c_str(), source, ZIP_FL_OVERWRITE | ZIP_FL_ENC_UTF_8) : -1;
    if (at < 0) {
      const std::string why = zip_strerror(archive);
      if (source) zip_source_free(source);
      zip_discard(archive);
      fail(path, name, "cannot add to the archive: " + why);
    }
    zip_set_file_compression(archive, zip_uint64_t(at), ZIP_CM_STORE, 0);  // as np.savez
  }
  if (zip_close(archive) != 0) {
    const std::string why = zip_strerror(archive);
    zip_discard(archive);
    fail(path, "cannot write the archive: " + why);
  }
}

// ---------------------------------------------------------------------------------------------
// Loaders.

std::string names_of(const TensorFile& f) {
  std::string s;
  for (const auto& [name, t] : f.floating) s += (s.empty() ? "" : ", ") + name;
  for (const auto& [name, t] : f.integer) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "nothing" : s;
}

void require_known_names(const std::string& path, const TensorFile& f, const std::set<std::string>& known,
                         const std::string& role) {
  std::string list;
  for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
  for (const auto& [name, t] : f.floating)
    if (!known.count(name)) fail(path, name, "not " + role + " (expected " + list + ")");
  for (const auto& [name, t] : f.integer)
    if (!known.count(name)) fail(path, name, "not " + role + " (expected " + list + ")");
}

std::string index_text(const std::vector<Index>& shape, Index flat) {
  std::vector<Index> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::string s = "(";
  for (size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
  return s + ")";
}

void require_finite(const std::string& path, const std::string& name, const HostTensor& t) {
  for (size_t i = 0; i < t.values.size(); ++i)
    if (!std::isfinite(t.values[i]))
      fail(path, name, std::string("entry ") + index_text(t.shape, Index(i)) + " is " + (std::isnan(t.values[i]) ? "NaN" : "Inf"));
}

// A floating tensor of the file: nullopt when absent, an error when stored as integers.
std::optional<HostTensor> take_floating(const std::string& path, const TensorFile& f, const std::string& name) {
  if (auto it = f.integer.find(name); it != f.integer.end())
    fail(path, name, std::string("stored as ") + (it->second.wide ? "int64" : "int32") + ", expected bf16, fp16, fp32 or fp64");
  const auto it = f.floating.find(name);
  if (it == f.floating.end()) return std::nullopt;
  require_finite(path, name, it->second);
  return it->second;
}

HostTensor require_floating(const std::string& path, const TensorFile& f, const std::string& name) {
  auto t = take_floating(path, f, name);
  if (!t) fail(path, name, "missing (the file holds " + names_of(f) + ")");
  return *t;
}

template <class Check>
void prefixed(const std::string& path, Check&& check) {
  try {
    check();
  } catch (const std::invalid_argument& e) {
    fail(path, e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

double round_to(DType dtype, double x) {
  if (!std::isfinite(x) || x == 0 || dtype == DType::f64) return x;
  // Precision p (significand bits), least normal exponent, largest finite value.
  int precision = 24, min_exponent = -126;
  double largest = double(std::numeric_limits<float>::max());
  if (dtype == DType::bf16) precision = 8, largest = 0x1.FEp127;
  if (dtype == DType::f16) precision = 11, min_exponent = -14, largest = 65504.0;
  const int exponent = std::max(std::ilogb(x), min_exponent);  // subnormals share the least exponent's spacing
  const int shift = precision - 1 - exponent;
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(x, shift)), -shift);  // ties to even (default mode)
  return std::fabs(rounded) > largest ? std::copysign(HUGE_VAL, x) : rounded;
}

TensorFile read_tensor_file(const std::string& path) {
  if (ends_with(path, ".safetensors")) return read_safetensors(path);
  if (ends_with(path, ".npz")) return read_npz(path);
  fail(path, "unknown file type (expected .safetensors or .npz)");
}

void write_tensor_file(const std::string& path, const TensorFile& contents) {
  if (ends_with(path, ".safetensors")) return write_safetensors(path, contents);
  if (ends_with(path, ".npz")) return write_npz(path, contents);
  fail(path, "unknown file type (expected .safetensors or .npz)");
}

KernelCase read_kernel_case(const std::string& path, const CaseFlags& flags) {
  const TensorFile f = read_tensor_file(path);
  require_known_names(path, f, {"q", "k", "v", "beta", "g", "h0", "do", "dht", "cu_seqlens"}, "an input of a kernel case");
  KernelCase c;
  c.op = flags.op;
  c.layout = flags.layout;
  c.scale = flags.scale;
  c.l2_normalize_qk = flags.l2_normalize_qk;
  c.q = require_floating(path, f, "q");
  c.k = require_floating(path, f, "k");
  c.v = require_floating(path, f, "v");
  c.beta = take_floating(path, f, "beta");
  c.g = take_floating(path, f, "g");
  c.h0 = take_floating(path, f, "h0");
  c.d_o = take_floating(path, f, "do");
  c.d_ht = take_floating(path, f, "dht");
  if (f.floating.count("cu_seqlens"))
    fail(path, "cu_seqlens", "stored as " + name_of(f.floating.at("cu_seqlens").dtype) + ", expected int32 or int64");
  const auto cu = f.integer.find("cu_seqlens");
  if (flags.varlen) {
    if (cu == f.integer.end()) fail(path, "cu_seqlens", "missing (varlen inputs need it; the file holds " + names_of(f) + ")");
    if (cu->second.shape.size() != 1) fail(path, "cu_seqlens", "shape " + shape_text(cu->second.shape) + ", expected one dimension");
    if (cu->second.values.size() < 2) fail(path, "cu_seqlens", "needs at least two entries (0 and T)");
    c.cu_seqlens.assign(cu->second.values.begin(), cu->second.values.end());
  } else if (cu != f.integer.end()) {
    fail(path, "cu_seqlens", "present, but the case is not varlen (pass --cu-seqlens)");
  }
  prefixed(path, [&] { c.validate(); });
  return c;
}

KernelResult read_kernel_result(const KernelCase& c, const std::string& outputs_path, const std::string& gradients_path) {
  KernelResult forward;
  {
    const TensorFile f = read_tensor_file(outputs_path);
    require_known_names(outputs_path, f, {"o", "ht"}, "an output of a kernel");
    forward.o = require_floating(outputs_path, f, "o");
    forward.ht = take_floating(outputs_path, f, "ht");
    prefixed(outputs_path, [&] { validate_result(c, forward); });
  }
  if (gradients_path.empty()) return forward;
  KernelResult backward;
  const TensorFile f = read_tensor_file(gradients_path);
  require_known_names(gradients_path, f, {"dq", "dk", "dv", "dbeta", "dg", "dh0"}, "a gradient");
  if (f.floating.empty()) fail(gradients_path, "holds no gradient (expected any of dq, dk, dv, dbeta, dg, dh0)");
  backward.dq = take_floating(gradients_path, f, "dq");
  backward.dk = take_floating(gradients_path, f, "dk");
  backward.dv = take_floating(gradients_path, f, "dv");
  backward.dbeta = take_floating(gradients_path, f, "dbeta");
  backward.dg = take_floating(gradients_path, f, "dg");
  backward.dh0 = take_floating(gradients_path, f, "dh0");
  prefixed(gradients_path, [&] { validate_result(c, backward); });
  backward.o = std::move(forward.o);
  backward.ht = std::move(forward.ht);
  return backward;
}

void write_kernel_case(const std::string& path, const KernelCase& c) {
  TensorFile f;
  f.floating["q"] = c.q;
  f.floating["k"] = c.k;
  f.floating["v"] = c.v;
  if (c.beta) f.floating["beta"] = *c.beta;
  if (c.g) f.floating["g"] = *c.g;
  if (c.h0) f.floating["h0"] = *c.h0;
  if (c.d_o) f.floating["do"] = *c.d_o;
  if (c.d_ht) f.floating["dht"] = *c.d_ht;
  if (!c.cu_seqlens.empty())
    f.integer["cu_seqlens"] = IntegerTensor{{Index(c.cu_seqlens.size())}, {c.cu_seqlens.begin(), c.cu_seqlens.end()}, true};
  write_tensor_file(path, f);
}

void write_kernel_outputs(const std::string& path, const KernelResult& r) {
  TensorFile f;
  if (r.o) f.floating["o"] = *r.o;
  if (r.ht) f.floating["ht"] = *r.ht;
  write_tensor_file(path, f);
}

void write_kernel_gradients(const std::string& path, const KernelResult& r) {
  TensorFile f;
  const std::pair<const char*, const std::optional<HostTensor>*> grads[] = {
      {"dq", &r.dq}, {"dk", &r.dk}, {"dv", &r.dv}, {"dbeta", &r.dbeta}, {"dg", &r.dg}, {"dh0", &r.dh0}};
  for (const auto& [name, t] : grads)
    if (*t) f.floating[name] = **t;
  write_tensor_file(path, f);
}

}  // namespace deltaproof::verify
