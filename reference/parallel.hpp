// Work spread over the machine's cores: the heads of a batch, the columns of a large product.
//
// Threads: set_thread_count(n) (a program's choice: the command line's DELTAPROOF_THREADS), else the
// hardware's count; the library itself reads no environment. Each index is computed
// exactly as it would be serially (same operations, same order), so results do not depend on the
// thread count. Inside a worker everything runs serially: no nested pools.
#pragma once

#include <Eigen/Core>
#include <mpfr.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace deltaproof::ref {

namespace detail {
inline std::atomic<unsigned> chosen_threads{0};  // 0: the hardware's count
}

// n >= 1 threads from now on; 0 returns to the hardware's count.
inline void set_thread_count(unsigned n) { detail::chosen_threads = n; }

inline unsigned thread_count() {
  const unsigned n = detail::chosen_threads;
  return n >= 1 ? n : std::max(1u, std::thread::hardware_concurrency());
}

namespace detail {
inline thread_local bool in_worker = false;
}

// f(i) for every i in [0, count), in contiguous ranges, one per thread; the first exception thrown
// by any f(i) is rethrown here once all threads have finished.
template <class F>
void parallel_for(Eigen::Index count, F&& f) {
  const Eigen::Index threads = detail::in_worker ? 1 : std::min<Eigen::Index>(count, thread_count());
  if (threads <= 1) {
    for (Eigen::Index i = 0; i < count; ++i) f(i);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto work = [&](Eigen::Index w) {
    detail::in_worker = true;
    try {
      for (Eigen::Index i = w * count / threads; i < (w + 1) * count / threads; ++i) f(i);
    } catch (...) {
      errors[static_cast<size_t>(w)] = std::current_exception();
    }
    detail::in_worker = false;
    // MPFR caches its constants per thread, and a thread that ends would keep them allocated.
    if (w != 0) mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);
  };
  std::vector<std::thread> pool;
  for (Eigen::Index w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace deltaproof::ref
