// The emulated machine's state and the few operations on it that its three parts share (not part of
// the emulation's interface, cuda_emulation.hpp):
//   cuda_emulation.cpp              fibers and blocks: launch, the built-ins, barriers, the warp exchange
//                                   and its shuffles
//   cuda_emulation_tensor_core.cpp  what a warp exchanges through the tensor cores (ldmatrix, mma.sync,
//                                   WMMA) and cp.async: cuda/tensor_core.cuh's primitives
//   cuda_emulation_memory.cpp       device buffers and tensors, their 16-bit formats, read() and write()
#pragma once

#include "property_tests/support/cuda_emulation.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace deltaproof::emulation::detail {

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

// The one machine, and every live DeviceBuffer (its data and size), which cp.async accepts as a source.
Machine& machine();
std::map<const unsigned char*, std::size_t>& device_buffers();

// The prefixes of error messages: the block, a warp of it, a thread of it.
std::string where_block();
std::string where_warp(int warp);
std::string where(int thread);

// The machine, from inside a kernel (a device built-in called outside emulation::launch is an error).
Machine& in_kernel();

// Parks the calling thread (the fiber switches back to the machine) until its wait is released.
void park(Wait why);
// The calling thread misused a primitive: recorded, and the thread never runs again.
[[noreturn]] void fail(const std::string& what);

// Enters a warp-collective operation: the lane's slot, to be filled before park(Wait::warp).
Lane& enter(Collective op, unsigned mask);

// The value of a 16-bit pattern, bf16 or fp16 (exact in double).
double value_of(unsigned bits16, bool bf16);

// The tensor-core collectives, completed for the whole warp once every lane waits at one.
void complete_ldmatrix(int warp, bool transposed);
void complete_mma(int warp, bool bf16);
void complete_wmma_transfer(int warp, bool to_fragment);
void complete_wmma_mma(int warp);

}  // namespace deltaproof::emulation::detail
