// The tensor-core side of the emulated warp (cuda/tensor_core.cuh's primitives under
// DELTAPROOF_CUDA_EMULATION, and WMMA): what each lane brings to ldmatrix, mma.sync and the WMMA
// collectives, how the warp completes them once every lane waits at the same one (fragment layouts
// as the PTX ISA gives them; products summed exactly and rounded once toward zero), and cp.async,
// whose copies land at the latest moment the ISA allows. The fibers and the exchange itself:
// cuda_emulation.cpp.
#include "property_tests/support/cuda_emulation_machine.hpp"

#include "cuda/tensor_core.cuh"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace deltaproof::emulation::detail {

namespace {

// The bytes of one 16-byte row of shared memory at an emulated shared address, inside the launch's
// dynamic shared memory and naturally aligned, or an error naming what is wrong.
unsigned char* shared_row(unsigned address, std::string& error) {
  const Machine& m = machine();
  const unsigned buffer = address >> kAddressShift, offset = address & ((1u << kAddressShift) - 1);
  if (buffer >= m.shared.size()) {
    error = "address " + std::to_string(address) + " is not in shared memory";
    return nullptr;
  }
  if (offset % 16 != 0) {
    error = "shared offset " + std::to_string(offset) + " is not 16-byte aligned";
    return nullptr;
  }
  if (offset + 16 > m.shared_bytes) {
    error = "shared offset " + std::to_string(offset) + " + 16 is past the launch's " + std::to_string(m.shared_bytes) +
            " bytes of dynamic shared memory";
    return nullptr;
  }
  return m.shared[buffer] + offset;
}

std::size_t size_of(WmmaElement e) { return e == WmmaElement::f32 ? 4 : 2; }

// Element e of the 16×16 tile (row-major index) lives in lane e/8, slot e%8 (the emulation's choice).
constexpr int kWmmaSlots = 8;

// Lands one pending copy: its destination must still hold the poison written at issue (anything
// else was written there by another path while the copy was in flight) and its source must be
// unchanged since issue (else it was written while being read).
void land(const PendingCopy& copy) {
  if (std::any_of(copy.dst, copy.dst + 16, [](unsigned char x) { return x != kPoisonByte; }))
    fail("the destination of an in-flight cp.async was written before its wait (a race)");
  if (copy.src && std::memcmp(copy.src, copy.snapshot, 16) != 0)
    fail("the source of an in-flight cp.async changed before its wait (a race)");
  if (copy.src) std::memcpy(copy.dst, copy.src, 16);
  else std::memset(copy.dst, 0, 16);
}

// Σ over a fixed-point grid from 2^-kOffset: every bf16/fp16 product (≥ 2^-266) and fp32 value
// (≥ 2^-149) is an integer there, and 17 of them stay below 2^262: the sum is exact.
class WideSum {
 public:
  void add(double x) {
    if (x == 0) return;
    int exponent;
    const double fraction = std::frexp(x, &exponent);
    auto magnitude = static_cast<std::uint64_t>(std::fabs(std::ldexp(fraction, 53)));
    int position = exponent - 53 + kOffset;
    const int zeros = std::countr_zero(magnitude);
    magnitude >>= zeros, position += zeros;
    if (position < 0) throw std::logic_error("WideSum: a term below 2^-320");
    const unsigned __int128 shifted = static_cast<unsigned __int128>(magnitude) << (position % 64);
    const std::uint64_t part[2] = {static_cast<std::uint64_t>(shifted), static_cast<std::uint64_t>(shifted >> 64)};
    int i = position / 64;
    if (x > 0) {
      unsigned carry = 0;
      for (int j = 0; i < kLimbs; ++i, ++j) {
        const unsigned __int128 s = static_cast<unsigned __int128>(limb_[i]) + (j < 2 ? part[j] : 0) + carry;
        limb_[i] = static_cast<std::uint64_t>(s), carry = static_cast<unsigned>(s >> 64);
      }
    } else {
      unsigned borrow = 0;
      for (int j = 0; i < kLimbs; ++i, ++j) {
        const std::uint64_t sub = j < 2 ? part[j] : 0;
        const std::uint64_t r = limb_[i] - sub - borrow;
        borrow = (limb_[i] < sub || (limb_[i] == sub && borrow)) ? 1 : 0;
        limb_[i] = r;
      }
    }
  }

  float round_toward_zero() const {
    std::uint64_t v[kLimbs];
    std::copy(limb_, limb_ + kLimbs, v);
    const bool negative = v[kLimbs - 1] >> 63;
    if (negative) {  // two's complement: the magnitude
      unsigned carry = 1;
      for (auto& x : v) {
        const unsigned __int128 s = static_cast<unsigned __int128>(~x) + carry;
        x = static_cast<std::uint64_t>(s), carry = static_cast<unsigned>(s >> 64);
      }
    }
    int top = -1;
    for (int i = kLimbs - 1; i >= 0 && top < 0; --i)
      if (v[i]) top = 64 * i + 63 - std::countl_zero(v[i]);
    if (top < 0) return 0.0f;
    const int exponent = top - kOffset;
    if (exponent >= 128) return negative ? -INFINITY : INFINITY;
    const int lowest = std::max(exponent - 23, -149);  // weight of the last bit an fp32 keeps
    std::uint32_t kept = 0;
    for (int bit = top; bit >= lowest + kOffset; --bit) kept = kept << 1 | ((v[bit / 64] >> (bit % 64)) & 1);
    const float r = std::ldexp(static_cast<float>(kept), lowest);
    return negative ? -r : r;
  }

 private:
  static constexpr int kLimbs = 11, kOffset = 320;  // bit i weighs 2^(i − 320); the top bit is the sign
  std::uint64_t limb_[kLimbs] = {};
};

}  // namespace

void complete_ldmatrix(int warp, bool transposed) {
  Machine& m = machine();
  unsigned char rows[4][8][16];  // [matrix][row][bytes]: lane 8·matrix + row gave the row's address
  for (int l = 0; l < kWarpSize; ++l) {
    unsigned address;
    std::memcpy(&address, m.lanes[warp * kWarpSize + l].in, sizeof address);
    std::string error;
    const unsigned char* row = shared_row(address, error);
    if (!row) throw std::runtime_error(where(warp * kWarpSize + l) + "ldmatrix row: " + error);
    std::memcpy(rows[l / 8][l % 8], row, 16);
  }
  auto element = [&](int matrix, int r, int c) {
    std::uint16_t e;
    std::memcpy(&e, rows[matrix][r] + 2 * c, 2);
    return unsigned(e);
  };
  // Lane l holds row l/4, columns 2(l%4) and 2(l%4)+1 of each matrix (its transpose with .trans).
  for (int l = 0; l < kWarpSize; ++l) {
    const int g = l / 4, t = l % 4;
    unsigned r[4];
    for (int matrix = 0; matrix < 4; ++matrix)
      r[matrix] = transposed ? element(matrix, 2 * t, g) | element(matrix, 2 * t + 1, g) << 16
                             : element(matrix, g, 2 * t) | element(matrix, g, 2 * t + 1) << 16;
    std::memcpy(m.lanes[warp * kWarpSize + l].out, r, sizeof r);
  }
}

// D = A·B + C for the warp's m16n8k16 fragments (PTX ISA "Matrix Fragments for mma.m16n8k16 with
// floating point type"): g = lane/4, t = lane%4; A: a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..),
// a3 (g+8, 2t+8..); B: b0 (k = 2t.., n = g), b1 (k = 2t+8.., n = g); C, D: (g, 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1). Low half of each register = lower column (A) or row (B) index.
void complete_mma(int warp, bool bf16) {
  Machine& m = machine();
  double a[16][16], b[8][16];  // a[row][k], b[col][k]
  float c[16][8];
  for (int l = 0; l < kWarpSize; ++l) {
    const Lane& lane = m.lanes[warp * kWarpSize + l];
    unsigned ra[4], rb[2];
    float rc[4];
    std::memcpy(ra, lane.in, 16);
    std::memcpy(rb, lane.in + 16, 8);
    std::memcpy(rc, lane.in + 24, 16);
    const int g = l / 4, t = l % 4;
    for (int x = 0; x < 4; ++x) {
      const int row = g + 8 * (x % 2), col = 2 * t + 8 * (x / 2);
      a[row][col] = value_of(ra[x] & 0xffff, bf16);
      a[row][col + 1] = value_of(ra[x] >> 16, bf16);
    }
    for (int x = 0; x < 2; ++x) {
      b[g][2 * t + 8 * x] = value_of(rb[x] & 0xffff, bf16);
      b[g][2 * t + 8 * x + 1] = value_of(rb[x] >> 16, bf16);
    }
    for (int x = 0; x < 4; ++x) c[g + 8 * (x / 2)][2 * t + x % 2] = rc[x];
  }
  for (int l = 0; l < kWarpSize; ++l) {
    const int g = l / 4, t = l % 4;
    float d[4];
    for (int x = 0; x < 4; ++x) {
      const int row = g + 8 * (x / 2), col = 2 * t + x % 2;
      d[x] = dot16_round_toward_zero(a[row], b[col], c[row][col]);
    }
    std::memcpy(m.lanes[warp * kWarpSize + l].out, d, sizeof d);
  }
}

// A warp's load_matrix_sync (to_fragment) or store_matrix_sync, every lane's fragment at once.
void complete_wmma_transfer(int warp, bool to_fragment) {
  Machine& m = machine();
  const Lane& first = m.lanes[warp * kWarpSize];
  const std::size_t size = size_of(first.element), extent = (15 * std::size_t(first.ldm) + 16) * size;
  const std::string op = to_fragment ? "wmma::load_matrix_sync" : "wmma::store_matrix_sync";
  if (reinterpret_cast<std::uintptr_t>(first.tile) % 32 != 0)
    throw std::runtime_error(where_warp(warp) + op + ": the tile is not 32-byte aligned");
  if (first.ldm < 16 || first.ldm * size % 16 != 0)
    throw std::runtime_error(where_warp(warp) + op + ": leading dimension " + std::to_string(first.ldm) + " is not a multiple of 16 bytes ≥ 16 elements");
  for (const unsigned char* s : m.shared)
    if (first.tile >= s && first.tile < s + kSharedCapacity + kSharedGuard && first.tile + extent > s + m.shared_bytes)
      throw std::runtime_error(where_warp(warp) + op + ": the tile reaches past the launch's " + std::to_string(m.shared_bytes) +
                               " bytes of dynamic shared memory");
  auto* tile = const_cast<unsigned char*>(first.tile);
  for (int l = 0; l < kWarpSize; ++l) {
    const Lane& lane = m.lanes[warp * kWarpSize + l];
    auto* fragment = static_cast<unsigned char*>(const_cast<void*>(lane.fragments[0]));
    for (int i = 0; i < kWmmaSlots; ++i) {
      const int e = kWmmaSlots * l + i, r = e / 16, c = e % 16;
      unsigned char* at = tile + (first.col_major ? std::size_t(c) * first.ldm + r : std::size_t(r) * first.ldm + c) * size;
      if (to_fragment) std::memcpy(fragment + i * size, at, size);
      else std::memcpy(at, fragment + i * size, size);
    }
  }
}

// D = A·B + C for a warp's WMMA fragments, each entry one exact 16-term sum rounded toward zero.
void complete_wmma_mma(int warp) {
  Machine& m = machine();
  const bool bf16 = m.lanes[warp * kWarpSize].element == WmmaElement::bf16;
  double a[16][16], b[16][16];  // a[row][k], b[col][k]
  float c[16][16], d[16][16];
  for (int l = 0; l < kWarpSize; ++l) {
    const Lane& lane = m.lanes[warp * kWarpSize + l];
    for (int i = 0; i < kWmmaSlots; ++i) {
      const int e = kWmmaSlots * l + i, r = e / 16, col = e % 16;
      std::uint16_t bits;
      std::memcpy(&bits, static_cast<const unsigned char*>(lane.fragments[0]) + 2 * i, 2);
      a[r][col] = value_of(bits, bf16);
      std::memcpy(&bits, static_cast<const unsigned char*>(lane.fragments[1]) + 2 * i, 2);
      b[col][r] = value_of(bits, bf16);  // B's element (k = r, n = col)
      c[r][col] = static_cast<const float*>(lane.fragments[2])[i];
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) d[r][col] = dot16_round_toward_zero(a[r], b[col], c[r][col]);
  for (int l = 0; l < kWarpSize; ++l)
    for (int i = 0; i < kWmmaSlots; ++i) {
      const int e = kWmmaSlots * l + i;
      static_cast<float*>(m.lanes[warp * kWarpSize + l].result_fragment)[i] = d[e / 16][e % 16];
    }
}

}  // namespace deltaproof::emulation::detail

namespace deltaproof::emulation {

using namespace detail;

float dot16_round_toward_zero(const double (&a)[16], const double (&b)[16], float c) {
  // Products of 16-bit values are exact in double; so is the running sum while TwoSum's error
  // term stays zero, and then one rounding of it is the rounding of the exact sum.
  double s = c;
  bool exact = true;
  for (int k = 0; k < 16; ++k) {
    const double p = a[k] * b[k], t = s + p, bp = t - s;
    exact = exact && (s - (t - bp)) + (p - bp) == 0;
    s = t;
  }
  if (!std::isfinite(s)) return static_cast<float>(s);  // NaN or inf among the inputs
  if (exact) {
    if (std::fabs(s) >= 0x1p128) return s > 0 ? INFINITY : -INFINITY;
    float f = static_cast<float>(s);
    if (std::fabs(double(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    return f;
  }
  WideSum wide;
  wide.add(c);
  for (int k = 0; k < 16; ++k) wide.add(a[k] * b[k]);
  return wide.round_toward_zero();
}

// ---------------------------------------------------------------------------------------
// cuda/tensor_core.cuh's primitives.

unsigned shared_address(const void* p) {
  const Machine& m = in_kernel();
  const auto* byte = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < m.shared.size(); ++i)
    if (byte >= m.shared[i] && byte <= m.shared[i] + kSharedCapacity + kSharedGuard)
      return unsigned(i) << kAddressShift | unsigned(byte - m.shared[i]);
  fail("smem_address of a pointer outside shared memory");
}

void ldmatrix_x4(unsigned (&r)[4], unsigned address, bool transposed) {
  Lane& lane = enter(transposed ? Collective::ldmatrix_trans : Collective::ldmatrix, kFullMask);
  std::memcpy(lane.in, &address, sizeof address);
  park(Wait::warp);
  std::memcpy(r, lane.out, sizeof r);
}

void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, bool bf16) {
  Lane& lane = enter(bf16 ? Collective::mma_bf16 : Collective::mma_f16, kFullMask);
  std::memcpy(lane.in, a, 16);
  std::memcpy(lane.in + 16, &b0, 4);
  std::memcpy(lane.in + 20, &b1, 4);
  std::memcpy(lane.in + 24, d, 16);
  park(Wait::warp);
  std::memcpy(d, lane.out, sizeof d);
}

void copy_async_16(unsigned address, const void* src, bool valid) {
  Machine& m = in_kernel();
  std::string error;
  unsigned char* dst = shared_row(address, error);
  if (!dst) fail("cp.async destination: " + error);
  PendingCopy copy{dst, nullptr, {}};
  if (valid) {
    const auto* s = static_cast<const unsigned char*>(src);
    if (reinterpret_cast<std::uintptr_t>(s) % 16 != 0) fail("cp.async source not 16-byte aligned");
    const auto& buffers = device_buffers();
    auto it = buffers.upper_bound(s);
    if (it == buffers.begin() || s + 16 > std::prev(it)->first + std::prev(it)->second)
      fail("cp.async source outside every device buffer");
    copy.src = s;
    std::memcpy(copy.snapshot, s, 16);
  }
  std::memset(dst, kPoisonByte, 16);  // in flight: whoever reads it before the wait reads NaN
  m.copies[m.current].open.push_back(copy);
}

void copy_async_commit() {
  Machine& m = in_kernel();
  CopyQueue& q = m.copies[m.current];
  q.committed.push_back(std::move(q.open));
  q.open.clear();
}

void copy_async_wait(int pending) {
  Machine& m = in_kernel();
  CopyQueue& q = m.copies[m.current];
  if (pending < 0) {  // wait_all = commit_group; wait_group 0
    copy_async_commit();
    pending = 0;
  }
  while (q.committed.size() > std::size_t(pending)) {
    for (const PendingCopy& copy : q.committed.front()) land(copy);
    q.committed.pop_front();
  }
}

void wmma_load(void* fragment, const void* p, unsigned ldm, bool col_major, WmmaElement element) {
  Lane& lane = enter(Collective::wmma_load, kFullMask);
  lane.tile = static_cast<const unsigned char*>(p), lane.ldm = ldm, lane.col_major = col_major, lane.element = element;
  lane.fragments[0] = fragment;
  park(Wait::warp);
}

void wmma_store(void* p, const void* fragment, unsigned ldm, bool col_major, WmmaElement element) {
  Lane& lane = enter(Collective::wmma_store, kFullMask);
  lane.tile = static_cast<const unsigned char*>(p), lane.ldm = ldm, lane.col_major = col_major, lane.element = element;
  lane.fragments[0] = fragment;
  park(Wait::warp);
}

void wmma_mma(float* d, const void* a, const void* b, const float* c, bool bf16) {
  Lane& lane = enter(Collective::wmma_mma, kFullMask);
  lane.tile = nullptr, lane.ldm = 0, lane.col_major = false, lane.element = bf16 ? WmmaElement::bf16 : WmmaElement::f16;
  lane.fragments[0] = a, lane.fragments[1] = b, lane.fragments[2] = c, lane.result_fragment = d;
  park(Wait::warp);
}

}  // namespace deltaproof::emulation
