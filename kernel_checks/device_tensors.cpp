#include "kernel_checks/device_tensors.hpp"

#include "cuda/check.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace deltaproof::verify {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes_ > 0) cuda::check(cudaMalloc(&data_, bytes_), "cudaMalloc of " + std::to_string(bytes_) + " bytes");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

namespace {

// One floating format as bit patterns (held in uint64): its value, and the neighbours of a value.
// Rounding is decided among the double-rounded candidate and its two neighbours, in exact
// arithmetic, so a double rounding (Exact → double → bf16) can never pick the wrong one.
struct Format {
  cuda::DType dtype;

  std::uint64_t nearest_guess(double d) const {
    switch (dtype) {
      case cuda::DType::f64: return bits(d);
      case cuda::DType::f32: return bits(static_cast<float>(d));
      case cuda::DType::bf16: return bits16(Eigen::bfloat16(static_cast<float>(d)));
      default: return bits16(Eigen::half(static_cast<float>(d)));
    }
  }
  double value(std::uint64_t b) const {
    switch (dtype) {
      case cuda::DType::f64: { double d; std::memcpy(&d, &b, 8); return d; }
      case cuda::DType::f32: { std::uint32_t u = static_cast<std::uint32_t>(b); float f; std::memcpy(&f, &u, 4); return f; }
      case cuda::DType::bf16: return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(static_cast<std::uint16_t>(b)));
      default: return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(static_cast<std::uint16_t>(b)));
    }
  }
  std::uint64_t sign_bit() const { return std::uint64_t{1} << (8 * cuda::size_of(dtype) - 1); }
  // Sign-magnitude encodings: the next value up or down is the magnitude ± 1 ulp.
  std::uint64_t up(std::uint64_t b) const {
    if (b == sign_bit()) return 1;  // −0 → smallest positive
    return (b & sign_bit()) ? b - 1 : b + 1;
  }
  std::uint64_t down(std::uint64_t b) const {
    if (b == 0) return sign_bit() | 1;
    return (b & sign_bit()) ? b + 1 : b - 1;
  }

  static std::uint64_t bits(double d) { std::uint64_t b; std::memcpy(&b, &d, 8); return b; }
  static std::uint64_t bits(float f) { std::uint32_t b; std::memcpy(&b, &f, 4); return b; }
  template <class T>
  static std::uint64_t bits16(T x) { return Eigen::numext::bit_cast<std::uint16_t>(x); }
};

Exact exact_of(double d) { return Exact(d); }  // every double is a dyadic rational: exact

std::uint64_t round_bits(const Exact& x, cuda::DType dtype) {
  const Format f{dtype};
  const double guess_double = ref::scalar_cast<double>(x);
  const std::uint64_t guess = f.nearest_guess(guess_double);
  if (!std::isfinite(f.value(guess)))
    throw std::invalid_argument("round_to: value " + std::to_string(guess_double) + " overflows " + cuda::name_of(dtype));
  std::uint64_t best = guess;
  Exact best_error = abs(exact_of(f.value(guess)) - x);
  for (std::uint64_t candidate : {f.down(guess), f.up(guess)}) {
    const double v = f.value(candidate);
    if (!std::isfinite(v)) continue;
    const Exact error = abs(exact_of(v) - x);
    if (error < best_error || (error == best_error && (candidate & 1) == 0)) best = candidate, best_error = error;
  }
  return best;
}

void check_shape(Index b, Index h, Index r, Index c) {
  if (b < 0 || h < 0 || r < 0 || c < 0) throw std::invalid_argument("device tensor: negative extent");
}

}  // namespace

Exact round_to(const Exact& x, cuda::DType dtype) { return exact_of(Format{dtype}.value(round_bits(x, dtype))); }

Tensor4<Exact> round_to(const Tensor4<Exact>& t, cuda::DType dtype) {
  Tensor4<Exact> out = t;
  for (Exact& x : out.data) x = round_to(x, dtype);
  return out;
}

DeviceTensor allocate(cuda::DType dtype, Index batch, Index heads, Index rows, Index cols) {
  check_shape(batch, heads, rows, cols);
  DeviceTensor t;
  t.dtype = dtype, t.batch = batch, t.heads = heads, t.rows = rows, t.cols = cols;
  // At least one element, so that even an empty tensor has a valid device address.
  t.buffer = DeviceBuffer(std::max<std::size_t>(1, t.count()) * cuda::size_of(dtype));
  cuda::check(cudaMemset(t.data(), 0xFF, t.buffer.bytes()), "cudaMemset");
  return t;
}

Uploaded upload(const Tensor4<Exact>& t, cuda::DType dtype) {
  Uploaded u{allocate(dtype, t.batch, t.heads, t.rows, t.cols), Tensor4<Exact>(t.batch, t.heads, t.rows, t.cols)};
  const std::size_t width = cuda::size_of(dtype);
  std::vector<unsigned char> host(t.data.size() * width);
  const Format f{dtype};
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    const std::uint64_t b = round_bits(t.data[i], dtype);
    std::memcpy(host.data() + i * width, &b, width);  // little-endian: the low bytes hold the pattern
    u.exact.data[i] = exact_of(f.value(b));
  }
  if (!host.empty()) cuda::check(cudaMemcpy(u.device.data(), host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  return u;
}

Tensor4<Exact> download(const void* device_data, cuda::DType dtype, Index batch, Index heads, Index rows, Index cols) {
  check_shape(batch, heads, rows, cols);
  Tensor4<Exact> out(batch, heads, rows, cols);
  const std::size_t width = cuda::size_of(dtype);
  std::vector<unsigned char> host(out.data.size() * width);
  cuda::check(cudaDeviceSynchronize(), "synchronize before download");
  if (!host.empty()) cuda::check(cudaMemcpy(host.data(), device_data, host.size(), cudaMemcpyDeviceToHost), "download");
  const Format f{dtype};
  for (std::size_t i = 0; i < out.data.size(); ++i) {
    std::uint64_t b = 0;
    std::memcpy(&b, host.data() + i * width, width);
    const double v = f.value(b);
    if (!std::isfinite(v)) throw std::runtime_error("download: entry " + std::to_string(i) + " is not finite (never written?)");
    out.data[i] = exact_of(v);
  }
  return out;
}

Tensor4<Exact> download(const DeviceTensor& t) { return download(t.data(), t.dtype, t.batch, t.heads, t.rows, t.cols); }

std::vector<unsigned char> download_bytes(const DeviceTensor& t) {
  std::vector<unsigned char> host(t.count() * cuda::size_of(t.dtype));
  cuda::check(cudaDeviceSynchronize(), "synchronize before download");
  if (!host.empty()) cuda::check(cudaMemcpy(host.data(), t.data(), host.size(), cudaMemcpyDeviceToHost), "download");
  return host;
}

}  // namespace deltaproof::verify
