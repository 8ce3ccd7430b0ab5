// Context parallelism's exchange over NCCL (cuda/context_parallel.h): one rank per GPU, the ranks' summaries
// gathered with ncclAllGather on the caller's stream. In the library deltaproof_cuda_nccl, built where CMake finds
// NCCL (the CUDA toolkit's, or NCCL_ROOT); deltaproof_cuda itself does not link NCCL.
#pragma once

#include "cuda/context_parallel.h"

#include <nccl.h>

#include <memory>

namespace deltaproof::cuda::context_parallel {

// `comm`: the caller's communicator (ncclCommInitRank / ncclCommInitAll), kept open by the caller while the
// exchange is used; its rank and size are the exchange's.
std::unique_ptr<Exchange> nccl_exchange(ncclComm_t comm);

}  // namespace deltaproof::cuda::context_parallel
