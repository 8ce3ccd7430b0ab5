// The emulated machine behind cuda_emulation.hpp, its fiber and block half: every thread a fiber on its
// own stack, blocks run one after another in the launch's order, barriers and the warp exchange at which
// every warp collective meets (its tensor-core side: cuda_emulation_tensor_core.cpp), and the shuffles.
#include "property_tests/support/cuda_emulation_machine.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
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

namespace deltaproof::emulation::detail {

namespace {
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
}  // namespace

Machine& machine() {
  static Machine m;
  return m;
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

namespace {

#if defined(__x86_64__)
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
#endif

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

}  // namespace
}  // namespace deltaproof::emulation::detail

namespace deltaproof::emulation {

using namespace detail;

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

}  // namespace deltaproof::emulation
