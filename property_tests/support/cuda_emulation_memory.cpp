// Device memory on the emulated machine: host buffers standing in for device allocations (aligned,
// NaN-poisoned, fenced by guard bytes, known to cp.async as sources), tensors in them, the values of
// their 16-bit formats, and write() / read() between them and the oracle's exact tensors.
#include "property_tests/support/cuda_emulation_machine.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

namespace deltaproof::emulation::detail {

std::map<const unsigned char*, std::size_t>& device_buffers() {
  static std::map<const unsigned char*, std::size_t> buffers;
  return buffers;
}

namespace {
// fp16 bit patterns → their values (exact in float).
const std::array<float, 65536>& half_values() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (unsigned i = 0; i < 65536; ++i) {
      __half_raw raw;
      raw.x = static_cast<unsigned short>(i);
      t[i] = __half2float(__half(raw));
    }
    return t;
  }();
  return table;
}
}  // namespace

double value_of(unsigned bits16, bool bf16) {
  if (bf16) return std::bit_cast<float>(bits16 << 16);
  return half_values()[bits16];
}

}  // namespace deltaproof::emulation::detail

namespace deltaproof::emulation {

using namespace detail;

DeviceBuffer::DeviceBuffer(std::string name, std::size_t bytes) : size_(bytes), name_(std::move(name)) {
  if (bytes == 0) return;  // empty: data() is null, as for an absent optional tensor
  bytes_.reset(static_cast<unsigned char*>(::operator new[](bytes + 2 * kGuard, std::align_val_t(kGuard))));
  std::memset(bytes_.get(), kGuardByte, kGuard);
  std::memset(bytes_.get() + kGuard, kPoisonByte, bytes);
  std::memset(bytes_.get() + kGuard + bytes, kGuardByte, kGuard);
  device_buffers()[bytes_.get() + kGuard] = bytes;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (bytes_) device_buffers().erase(bytes_.get() + kGuard);
    bytes_ = std::move(other.bytes_), size_ = other.size_, name_ = std::move(other.name_);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (bytes_) device_buffers().erase(bytes_.get() + kGuard);
}

void DeviceBuffer::check_guards() const {
  if (!bytes_) return;
  for (std::size_t i = 0; i < kGuard; ++i)
    if (bytes_[i] != kGuardByte || bytes_[kGuard + size_ + i] != kGuardByte)
      throw std::runtime_error("emulation: a kernel wrote outside " + name_);
}

Tensor::Tensor(const std::string& name, cuda::DType d, ref::Index b, ref::Index h, ref::Index r, ref::Index c)
    : buffer(name, std::size_t(b * h * r * c) * cuda::size_of(d)), dtype(d), batch(b), heads(h), rows(r), cols(c) {}

namespace {
double element(const Tensor& t, std::size_t i) {
  const auto* p = static_cast<const unsigned char*>(t.buffer.data());
  switch (t.dtype) {
    case cuda::DType::f64: return std::bit_cast<double>(*reinterpret_cast<const std::uint64_t*>(p + 8 * i));
    case cuda::DType::f32: {
      float x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    default: {
      std::uint16_t bits;
      std::memcpy(&bits, p + 2 * i, 2);
      return value_of(bits, t.dtype == cuda::DType::bf16);
    }
  }
}
}  // namespace

Tensor write(const std::string& name, const ref::Tensor4<ref::Exact>& t, cuda::DType d) {
  Tensor out(name, d, t.batch, t.heads, t.rows, t.cols);
  auto* p = static_cast<unsigned char*>(out.data());
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    const double x = ref::to_double(t.data[i]);
    if (ref::Exact(x) != t.data[i]) throw std::invalid_argument("emulation: " + name + " is not exact in double");
    switch (d) {
      case cuda::DType::f64: std::memcpy(p + 8 * i, &x, 8); break;
      case cuda::DType::f32: {
        const float f = float(x);
        std::memcpy(p + 4 * i, &f, 4);
        break;
      }
      case cuda::DType::bf16: {
        const __nv_bfloat16 h = __float2bfloat16_rn(float(x));
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      default: {
        const __half h = __float2half_rn(float(x));
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
    }
  }
  return out;
}

// DELTAPROOF_EMULATION_DIGEST=file: each tensor read back appends its name and a 64-bit FNV-1a hash of its
// bytes to the file, so that two builds of the kernels can be compared bit for bit on the same cases
// (property_tests/emulation_digest.sh).
namespace {
void append_digest(const Tensor& t) {
  static const char* const path = std::getenv("DELTAPROOF_EMULATION_DIGEST");
  if (path == nullptr) return;
  std::uint64_t hash = 14695981039346656037ull;
  const auto* p = static_cast<const unsigned char*>(t.buffer.data());
  for (std::size_t i = 0; i < t.buffer.size(); ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  std::ofstream(path, std::ios::app) << t.buffer.name() << ' ' << std::hex << hash << '\n';
}
}  // namespace

ref::Tensor4<ref::Exact> read(const Tensor& t) {
  if (t.buffer.empty()) return {};
  t.buffer.check_guards();
  append_digest(t);
  ref::Tensor4<ref::Exact> out(t.batch, t.heads, t.rows, t.cols);
  for (std::size_t i = 0; i < t.count(); ++i) {
    const double x = element(t, i);
    if (!std::isfinite(x))
      throw std::runtime_error("emulation: " + t.buffer.name() + " entry " + std::to_string(i) + " not finite (never written?)");
    out.data[i] = ref::Exact(x);
  }
  return out;
}

}  // namespace deltaproof::emulation
