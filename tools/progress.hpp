// Progress of a long command on stderr, one line per step:
//
//   deltaproof verify --op delta: [2/4] backward paths (3.1 s)
//   deltaproof verify --op delta: done (7.9 s)
//
// Nothing is printed until the command has run for a second (DELTAPROOF_PROGRESS_AFTER=S sets
// the delay; 0 prints every step), so short commands stay quiet; from then on each step prints as
// it starts. stdout (the verdict) is untouched.
#pragma once

#include <chrono>
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace deltaproof::tools {

class Progress {
 public:
  Progress(std::string command, int steps) : command_(std::move(command)), steps_(steps), delay_(delay_seconds()) {
    watcher_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      if (!wake_.wait_for(lock, std::chrono::duration<double>(delay_), [this] { return finished_; })) {
        shown_ = true;
        if (index_ > 0) print_step();
      }
    });
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() {
    {
      std::lock_guard lock(mutex_);
      finished_ = true;
      if (shown_) std::fprintf(stderr, "%s: done (%.1f s)\n", command_.c_str(), elapsed());
    }
    wake_.notify_all();
    watcher_.join();
  }

  // Announces the next step, about to start.
  void step(const std::string& name) {
    std::lock_guard lock(mutex_);
    ++index_;
    name_ = name;
    if (shown_ || elapsed() >= delay_) {
      shown_ = true;
      print_step();
    }
  }

 private:
  static double delay_seconds() {
    const char* s = std::getenv("DELTAPROOF_PROGRESS_AFTER");
    return s ? std::max(0.0, std::atof(s)) : 1.0;
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  void print_step() const {
    std::fprintf(stderr, "%s: [%d/%d] %s (%.1f s)\n", command_.c_str(), index_, steps_, name_.c_str(), elapsed());
  }

  const std::string command_;
  const int steps_;
  const double delay_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
  std::condition_variable wake_;
  bool finished_ = false, shown_ = false;
  int index_ = 0;
  std::string name_;
  std::thread watcher_;
};

}  // namespace deltaproof::tools
