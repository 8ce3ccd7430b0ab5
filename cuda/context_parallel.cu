// Context parallelism's in-process exchange (the NCCL one: context_parallel_nccl.cu; linear attention's forward
// over ranks is in linear_attention.cu, beside its kernels).
#include "cuda/context_parallel.h"

#include "cuda/check.hpp"

#include <stdexcept>
#include <string>

namespace deltaproof::cuda::context_parallel {

class InProcessMember final : public Exchange {
 public:
  InProcessMember(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.ranks_; }
  void all_gather(const void* mine, void* gathered, std::size_t bytes, cudaStream_t stream) override {
    {  // the first rank to arrive sizes the staging buffer; every rank has synchronised nothing yet
      std::lock_guard<std::mutex> lock(group_.mutex_);
      if (group_.staging_bytes_ < bytes * group_.ranks_) {
        if (group_.staging_) check(cudaFree(group_.staging_), "cudaFree (exchange staging)");
        group_.staging_ = nullptr;
        check(cudaMalloc(&group_.staging_, bytes * group_.ranks_), "cudaMalloc (exchange staging)");
        group_.staging_bytes_ = bytes * group_.ranks_;
      }
    }
    group_.arrive_and_wait();  // the staging buffer is sized before anyone copies into it
    check(cudaMemcpyAsync(static_cast<char*>(group_.staging_) + rank_ * bytes, mine, bytes, cudaMemcpyDefault, stream),
          "cudaMemcpyAsync (summary to the exchange)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (exchange)");
    group_.arrive_and_wait();  // every rank's summary is staged
    check(cudaMemcpyAsync(gathered, group_.staging_, bytes * group_.ranks_, cudaMemcpyDefault, stream),
          "cudaMemcpyAsync (summaries from the exchange)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (exchange)");
    group_.arrive_and_wait();  // every rank has read the staging buffer: it may be reused
  }

 private:
  InProcessGroup& group_;
  int rank_;
};

InProcessGroup::InProcessGroup(int ranks) : ranks_(ranks) {
  if (ranks < 1) throw std::invalid_argument("ranks: " + std::to_string(ranks) + " (at least 1)");
}
InProcessGroup::~InProcessGroup() {
  if (staging_) cudaFree(staging_);
}
std::unique_ptr<Exchange> InProcessGroup::member(int rank) {
  if (rank < 0 || rank >= ranks_)
    throw std::invalid_argument("rank: " + std::to_string(rank) + " (0.." + std::to_string(ranks_ - 1) + ")");
  return std::make_unique<InProcessMember>(*this, rank);
}
void InProcessGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  const long generation = generation_;
  if (++arrived_ == ranks_) {
    arrived_ = 0, ++generation_;
    all_arrived_.notify_all();
    return;
  }
  all_arrived_.wait(lock, [&] { return generation_ != generation; });
}

}  // namespace deltaproof::cuda::context_parallel
