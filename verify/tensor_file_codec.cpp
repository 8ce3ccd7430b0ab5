// The tensor files below their containers: errors, the stored element types and their exact byte
// codecs, one tensor between container bytes and memory, whole files as bytes. Both containers
// (tensor_file_safetensors.cpp, tensor_file_npz.cpp) read and write through these, so a value means
// the same in either.
#include "verify/tensor_file_internal.hpp"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>

namespace deltaproof::verify::tensor_files {

// ---------------------------------------------------------------------------------------------
// Errors: one line, "<file>: <tensor>: <what>".

namespace {
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}
}  // namespace

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

// ---------------------------------------------------------------------------------------------
// Element types.

std::size_t bytes_of(Stored t) {
  switch (t) {
    case Stored::bf16:
    case Stored::f16: return 2;
    case Stored::f32:
    case Stored::i32: return 4;
    default: return 8;
  }
}
Stored stored_of(DType d) {
  switch (d) {
    case DType::bf16: return Stored::bf16;
    case DType::f16: return Stored::f16;
    case DType::f32: return Stored::f32;
    default: return Stored::f64;
  }
}

namespace {
bool is_integer(Stored t) { return t == Stored::i32 || t == Stored::i64; }
DType dtype_of(Stored t) {
  switch (t) {
    case Stored::bf16: return DType::bf16;
    case Stored::f16: return DType::f16;
    case Stored::f32: return DType::f32;
    default: return DType::f64;
  }
}
}  // namespace

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

namespace {

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// One tensor between container and memory.

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

}  // namespace deltaproof::verify::tensor_files
