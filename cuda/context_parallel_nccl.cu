// The NCCL exchange of context parallelism (cuda/context_parallel_nccl.h).
#include "cuda/context_parallel_nccl.h"

#include <stdexcept>
#include <string>

namespace deltaproof::cuda::context_parallel {
namespace {

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(result));
}

class NcclExchange final : public Exchange {
 public:
  explicit NcclExchange(ncclComm_t comm) : comm_(comm) {
    check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* mine, void* gathered, std::size_t bytes, cudaStream_t stream) override {
    check_nccl(ncclAllGather(mine, gathered, bytes, ncclChar, comm_, stream), "ncclAllGather (summaries)");
  }

 private:
  ncclComm_t comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Exchange> nccl_exchange(ncclComm_t comm) {
  if (!comm) throw std::invalid_argument("comm: must not be null (an ncclComm_t from ncclCommInitRank)");
  return std::make_unique<NcclExchange>(comm);
}

}  // namespace deltaproof::cuda::context_parallel
