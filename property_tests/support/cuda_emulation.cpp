// The emulated machine behind cuda_emulation.hpp, and the tensor-core primitives that
// cuda/tensor_core.cuh calls under DELTAPROOF_CUDA_EMULATION.
#include "property_tests/support/cuda_emulation.hpp"

#include "cuda/tensor_core.cuh"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its stack pointer in *save, loads
// `load` and pops the same registers from there (System V x86-64: rbx, rbp, r12–r15).
asm(R"(
    .text
    .globl deltaproof_emulation_switch
    .type deltaproof_emulation_switch, @function
deltaproof_emulation_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size deltaproof_emulation_switch, .-deltaproof_emulation_switch
)");
extern "C" void deltaproof_emulation_switch(void** save, void* load);
#endif

namespace deltaproof::emulation {
namespace {

constexpr std::size_t kStackBytes = 128 * 1024, kPageBytes = 4096;
constexpr unsigned char kSharedGuardByte = 0xA5;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kAddressShift = 24;  // an emulated shared address: (buffer << 24) | byte offset

// A fiber's stack, with an inaccessible page below it: an overflow faults instead of corrupting.
struct Stack {
  unsigned char* base = nullptr;
  Stack() {
    void* p = mmap(nullptr, kStackBytes + kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("emulation: no memory for a thread's stack");
    base = static_cast<unsigned char*>(p);
    mprotect(base, kPageBytes, PROT_NONE);
  }
  Stack(Stack&& o) noexcept : base(std::exchange(o.base, nullptr)) {}
  Stack& operator=(Stack&&) = delete;
  ~Stack() {
    if (base) munmap(base, kStackBytes + kPageBytes);
  }
  void* top() const { return base + kPageBytes + kStackBytes; }
};

enum class Wait : std::uint8_t { running, block, warp, done, failed };
enum class Collective : std::uint8_t { sync_warp, shuffle, ldmatrix, ldmatrix_trans, mma_bf16, mma_f16, wmma_load, wmma_store, wmma_mma };

const char* name_of(Collective op, Shuffle kind) {
  switch (op) {
    case Collective::sync_warp: return "__syncwarp";
    case Collective::ldmatrix: return "ldmatrix.x4";
    case Collective::ldmatrix_trans: return "ldmatrix.x4.trans";
    case Collective::mma_bf16: return "mma.sync.m16n8k16 (bf16)";
    case Collective::mma_f16: return "mma.sync.m16n8k16 (f16)";
    case Collective::wmma_load: return "wmma::load_matrix_sync";
    case Collective::wmma_store: return "wmma::store_matrix_sync";
    case Collective::wmma_mma: return "wmma::mma_sync";
    default: break;
  }
  switch (kind) {
    case Shuffle::index: return "__shfl_sync";
    case Shuffle::up: return "__shfl_up_sync";
    case Shuffle::down: return "__shfl_down_sync";
    default: return "__shfl_xor_sync";
  }
}

struct Fiber {
  void* sp = nullptr;
  Wait wait = Wait::running;
};

// A lane's side of the warp exchange: what it brings to a collective and what it takes away.
struct Lane {
  Collective op = Collective::sync_warp;
  Shuffle kind = Shuffle::index;
  int operand = 0, width = kWarpSize;
  std::size_t size = 0;
  // WMMA: the tile in memory, its leading dimension and layout, the lane's fragments (on its stack).
  const unsigned char* tile = nullptr;
  unsigned ldm = 0;
  bool col_major = false;
  WmmaElement element = WmmaElement::f32;
  const void* fragments[3] = {};
  void* result_fragment = nullptr;
  alignas(16) unsigned char in[48];
  alignas(16) unsigned char out[16];
};

struct PendingCopy {
  unsigned char* dst;
  const unsigned char* src;  // nullptr: zero-fill
  unsigned char snapshot[16];
};
struct CopyQueue {
  std::vector<PendingCopy> open;                   // issued since the last commit
  std::deque<std::vector<PendingCopy>> committed;  // oldest first
  bool idle() const {
    return open.empty() && std::all_of(committed.begin(), committed.end(), [](const auto& g) { return g.empty(); });
  }
};

struct Machine {
  std::vector<Stack> stacks;
  std::vector<Fiber> fibers;
  std::vector<Lane> lanes;
  std::vector<CopyQueue> copies;
  std::vector<unsigned char*> shared;  // every DELTAPROOF_EMULATION_SHARED_MEMORY buffer
  void* main_sp = nullptr;
  const std::function<void()>* body = nullptr;
  int current = -1, threads = 0;
  bool running = false;
  dim3 block_dim, grid;
  uint3 block{};
  std::size_t shared_bytes = 0;
  std::string error;  // set by a fiber that misused a primitive; it then parks for good
};

Machine& machine() {
  static Machine m;
  return m;
}

std::map<const unsigned char*, std::size_t>& device_buffers() {
  static std::map<const unsigned char*, std::size_t> buffers;
  return buffers;
}

// The prefixes of error messages: the block, a warp of it, a thread of it.
std::string where_block() {
  const uint3 b = machine().block;
  return "emulated block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
}
std::string where_warp(int warp) { return where_block() + " warp " + std::to_string(warp) + ": "; }
std::string where(int thread) {
  return where_block() + " thread " + std::to_string(thread) + " (warp " + std::to_string(thread / kWarpSize) + ", lane " +
         std::to_string(thread % kWarpSize) + "): ";
}

Machine& in_kernel() {
  Machine& m = machine();
  if (!m.running || m.current < 0) throw std::logic_error("emulation: a device built-in called outside emulation::launch");
  return m;
}

#if defined(__x86_64__)
void park(Wait why) {
  Machine& m = machine();
  Fiber& self = m.fibers[m.current];
  self.wait = why;
  deltaproof_emulation_switch(&self.sp, m.main_sp);
}

// The calling thread misused a primitive: recorded, and the thread never runs again.
[[noreturn]] void fail(const std::string& what) {
  Machine& m = machine();
  if (m.error.empty()) m.error = what;
  park(Wait::failed);
  __builtin_unreachable();
}

[[noreturn]] void fiber_main() {
  std::string thrown;
  try {
    (*machine().body)();
  } catch (const std::exception& e) {
    thrown = e.what();
  } catch (...) {
    thrown = "an unknown exception";
  }
  if (!thrown.empty()) fail("the kernel threw " + thrown);
  park(Wait::done);
  __builtin_unreachable();
}
#else
void park(Wait) { throw std::logic_error("emulation: x86-64 only"); }
[[noreturn]] void fail(const std::string& what) { throw std::logic_error(what); }
#endif

// Enters a warp-collective operation: the lane's slot, to be filled before park(Wait::warp).
Lane& enter(Collective op, unsigned mask) {
  Machine& m = in_kernel();
  if (mask != kFullMask) fail(std::string(name_of(op, Shuffle::index)) + " with a partial mask (the emulation insists on all 32 lanes)");
  Lane& lane = m.lanes[m.current];
  lane.op = op;
  return lane;
}

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

// The PTX shfl.sync source lane (ISA 9.7.9.x): segments of `width` lanes; out of range → own lane.
int source_lane(Shuffle kind, int lane, int operand, int width) {
  const int segmask = kWarpSize - width, b = operand & 31;
  const int first = lane & segmask, last = first | (31 & ~segmask);
  switch (kind) {
    case Shuffle::up: return lane - b >= first ? lane - b : lane;
    case Shuffle::down: return lane + b <= last ? lane + b : lane;
    case Shuffle::xor_lanes: return (lane ^ b) <= last ? lane ^ b : lane;
    default: return first | (b & ~segmask);
  }
}

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

double value_of(unsigned bits16, bool bf16) {
  if (bf16) return std::bit_cast<float>(bits16 << 16);
  return half_values()[bits16];
}

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

std::size_t size_of(WmmaElement e) { return e == WmmaElement::f32 ? 4 : 2; }

// Element e of the 16×16 tile (row-major index) lives in lane e/8, slot e%8 (the emulation's choice).
constexpr int kWmmaSlots = 8;

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

// Every lane of the warp waits at a collective: check they wait at the same one, then compute it.
void complete(int warp) {
  Machine& m = machine();
  const Lane* lanes = &m.lanes[warp * kWarpSize];
  for (int l = 1; l < kWarpSize; ++l)
    if (lanes[l].op != lanes[0].op ||
        (lanes[0].op == Collective::shuffle && (lanes[l].kind != lanes[0].kind || lanes[l].width != lanes[0].width || lanes[l].size != lanes[0].size)))
      throw std::runtime_error(where_warp(warp) + "lane 0 waits at " + name_of(lanes[0].op, lanes[0].kind) + ", lane " +
                               std::to_string(l) + " at " + name_of(lanes[l].op, lanes[l].kind) + " (divergent warp)");
  if (lanes[0].op == Collective::wmma_load || lanes[0].op == Collective::wmma_store || lanes[0].op == Collective::wmma_mma)
    for (int l = 1; l < kWarpSize; ++l)
      if (lanes[l].tile != lanes[0].tile || lanes[l].ldm != lanes[0].ldm || lanes[l].col_major != lanes[0].col_major ||
          lanes[l].element != lanes[0].element)
        throw std::runtime_error(where_warp(warp) + name_of(lanes[0].op, lanes[0].kind) + ": lane " + std::to_string(l) +
                                 " gives another pointer, leading dimension, layout or type than lane 0");
  switch (lanes[0].op) {
    case Collective::sync_warp: return;
    case Collective::wmma_load: return complete_wmma_transfer(warp, true);
    case Collective::wmma_store: return complete_wmma_transfer(warp, false);
    case Collective::wmma_mma: return complete_wmma_mma(warp);
    case Collective::shuffle:
      for (int l = 0; l < kWarpSize; ++l) {
        const int from = source_lane(lanes[l].kind, l, lanes[l].operand, lanes[l].width);
        std::memcpy(m.lanes[warp * kWarpSize + l].out, lanes[from].in, lanes[l].size);
      }
      return;
    case Collective::ldmatrix: return complete_ldmatrix(warp, false);
    case Collective::ldmatrix_trans: return complete_ldmatrix(warp, true);
    case Collective::mma_bf16: return complete_mma(warp, true);
    case Collective::mma_f16: return complete_mma(warp, false);
  }
}

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

void release(Wait from, int first, int count) {
  Machine& m = machine();
  for (int t = first; t < first + count; ++t)
    if (m.fibers[t].wait == from) m.fibers[t].wait = Wait::running;
}

#if defined(__x86_64__)
// Runs the current block to completion, its threads taken in `order` between barriers.
void run_block(const std::vector<int>& order) {
  Machine& m = machine();
  for (int t = 0; t < m.threads; ++t) {
    auto top = reinterpret_cast<std::uintptr_t>(m.stacks[t].top()) & ~std::uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top) - 8;  // r15 r14 r13 r12 rbx rbp, return address, padding
    std::fill(sp, sp + 8, nullptr);
    sp[6] = reinterpret_cast<void*>(&fiber_main);
    m.fibers[t] = {sp, Wait::running};
    m.copies[t] = {};
  }
  for (;;) {
    for (int t : order)
      if (m.fibers[t].wait == Wait::running) {
        m.current = t;
        deltaproof_emulation_switch(&m.main_sp, m.fibers[t].sp);
        m.current = -1;
        if (m.fibers[t].wait == Wait::failed) throw std::runtime_error(where(t) + m.error);
      }
    // Every thread is parked now.
    int alive = 0, at_block = 0;
    bool released = false;
    for (int first = 0; first < m.threads; first += kWarpSize) {
      const int count = std::min(kWarpSize, m.threads - first), warp = first / kWarpSize;
      int at_warp = 0, done = 0, blocked = 0;
      for (int t = first; t < first + count; ++t) {
        const Wait w = m.fibers[t].wait;
        at_warp += w == Wait::warp, done += w == Wait::done, blocked += w == Wait::block;
      }
      alive += count - done, at_block += blocked;
      if (at_warp == 0) continue;
      int waiting = first;
      while (m.fibers[waiting].wait != Wait::warp) ++waiting;
      const std::string op = name_of(m.lanes[waiting].op, m.lanes[waiting].kind);
      if (count < kWarpSize)
        throw std::runtime_error(where_warp(warp) + op + " in a warp of only " + std::to_string(count) + " threads");
      if (at_warp < kWarpSize)  // the others exited or wait at a block barrier: they never reach this one
        throw std::runtime_error(where_warp(warp) + std::to_string(at_warp) + " lanes wait at " + op + ", " +
                                 std::to_string(blocked) + " at a block barrier, " + std::to_string(done) +
                                 " exited (divergent " + op + ")");
      complete(warp);
      release(Wait::warp, first, count);
      released = true;
    }
    if (alive == 0) break;
    if (released) continue;
    if (at_block == alive) {
      release(Wait::block, 0, m.threads);
      continue;
    }
    throw std::runtime_error(where_block() + ": deadlocked");
  }
  for (int t = 0; t < m.threads; ++t)
    if (!m.copies[t].idle()) throw std::runtime_error(where(t) + "cp.async copies issued and never waited for");
}
#else
void run_block(const std::vector<int>&) { throw std::logic_error("emulation: x86-64 only"); }
#endif

struct RunningFlag {
  RunningFlag() { machine().running = true; }
  ~RunningFlag() {
    machine().running = false;
    machine().current = -1;
  }
};

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

// ---------------------------------------------------------------------------------------

void launch(const Launch& c, const std::function<void()>& kernel) {
  Machine& m = machine();
  if (m.running) throw std::logic_error("emulation::launch inside a launch");
  const long threads = long(c.block.x) * c.block.y * c.block.z;
  if (threads < 1 || threads > kMaxBlockThreads) throw std::invalid_argument("emulation::launch: block of " + std::to_string(threads) + " threads");
  if (c.grid.x < 1 || c.grid.y < 1 || c.grid.z < 1) throw std::invalid_argument("emulation::launch: empty grid");
  if (c.shared_bytes > kSharedCapacity)
    throw std::invalid_argument("emulation::launch: " + std::to_string(c.shared_bytes) + " bytes of shared memory, more than an H200 block has");
  if (c.shared_bytes > 0 && m.shared.empty())
    throw std::logic_error("emulation::launch: dynamic shared memory asked for, but no DELTAPROOF_EMULATION_SHARED_MEMORY");
  while (m.stacks.size() < std::size_t(threads)) m.stacks.emplace_back();
  m.threads = int(threads), m.block_dim = c.block, m.grid = c.grid, m.shared_bytes = c.shared_bytes, m.body = &kernel;
  m.fibers.assign(threads, {});
  m.lanes.assign(threads, {});
  m.copies.assign(threads, {});
  m.error.clear();

  std::vector<int> order(threads);
  std::iota(order.begin(), order.end(), 0);
  if (c.order == ThreadOrder::descending) std::reverse(order.begin(), order.end());
  std::vector<uint3> blocks;
  for (unsigned z = 0; z < c.grid.z; ++z)
    for (unsigned y = 0; y < c.grid.y; ++y)
      for (unsigned x = 0; x < c.grid.x; ++x) blocks.push_back(uint3{x, y, z});
  std::mt19937_64 engine(c.seed);
  if (c.order == ThreadOrder::shuffled) std::shuffle(blocks.begin(), blocks.end(), engine);

  const RunningFlag running;
  for (const uint3& b : blocks) {
    if (c.order == ThreadOrder::shuffled) std::shuffle(order.begin(), order.end(), engine);
    for (unsigned char* s : m.shared) {
      std::memset(s, kPoisonByte, c.shared_bytes);  // NaN: a read before any write poisons the result
      std::memset(s + c.shared_bytes, kSharedGuardByte, kSharedCapacity + kSharedGuard - c.shared_bytes);
    }
    m.block = b;
    run_block(order);
    for (const unsigned char* s : m.shared)
      if (std::any_of(s + c.shared_bytes, s + kSharedCapacity + kSharedGuard, [](unsigned char x) { return x != kSharedGuardByte; }))
        throw std::runtime_error(where_block() + ": a write past the launch's " + std::to_string(c.shared_bytes) +
                                 " bytes of dynamic shared memory");
  }
}

bool add_shared_memory(unsigned char* buffer) {
  machine().shared.push_back(buffer);
  return true;
}

uint3 thread_index() {
  const Machine& m = in_kernel();
  const unsigned t = unsigned(m.current), x = m.block_dim.x, y = m.block_dim.y;
  return uint3{t % x, t / x % y, t / (x * y)};
}
uint3 block_index() { return in_kernel().block; }
dim3 block_dim() { return in_kernel().block_dim; }
dim3 grid_dim() { return in_kernel().grid; }

void sync_threads() {
  in_kernel();
  park(Wait::block);
}

void sync_warp(unsigned mask) {
  enter(Collective::sync_warp, mask);
  park(Wait::warp);
}

void shuffle_bytes(Shuffle kind, unsigned mask, const void* value, void* result, std::size_t size, int operand, int width) {
  Machine& m = in_kernel();
  if (mask != kFullMask) fail(std::string(name_of(Collective::shuffle, kind)) + " with a partial mask (the emulation insists on all 32 lanes)");
  if (width < 1 || width > kWarpSize || !std::has_single_bit(unsigned(width)))
    fail(std::string(name_of(Collective::shuffle, kind)) + " with width " + std::to_string(width) + " (a power of two up to 32)");
  Lane& lane = m.lanes[m.current];
  lane.op = Collective::shuffle, lane.kind = kind, lane.operand = operand, lane.width = width, lane.size = size;
  std::memcpy(lane.in, value, size);
  park(Wait::warp);
  std::memcpy(result, lane.out, size);
}

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

// ---------------------------------------------------------------------------------------

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
