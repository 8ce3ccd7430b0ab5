// Context parallelism: one sequence's tokens over several ranks (GPUs, or streams of one GPU), each rank holding
// one run of every sequence (docs/context_parallel.md). Linear attention's state after a run is the state before
// it plus the run's summary Σ v kᵀ, so a rank needs only the summaries of the ranks before it: every rank
// computes its summary (rank 0's from S_0), the ranks exchange them (all-gather), and each rank walks its run
// from its incoming state, Σ of the summaries before it.
//
// The exchange is a seam with two implementations: InProcessGroup's members (ranks as threads of one process, on
// one device or several: device-to-device copies and a barrier) and, where the build found NCCL, nccl_exchange
// (cuda/context_parallel_nccl.h, library deltaproof_cuda_nccl: one rank per GPU, ncclAllGather). Bytes exchanged per rank: B·H·DV·DK states (fp32: 4 bytes each; at
// B = 1, H = 16, D = 128, 1 MiB), whatever the length.
#pragma once

#include "cuda/linear_attention.h"

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace deltaproof::cuda::context_parallel {

// How the ranks exchange their summaries. all_gather: every rank passes `bytes` of device memory at `mine`;
// when it returns (stream-ordered on `stream`), `gathered` (size()·bytes of device memory) holds every rank's,
// in rank order. Every rank calls it the same number of times, with the same `bytes`.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_gather(const void* mine, void* gathered, std::size_t bytes, cudaStream_t stream) = 0;
};

// Ranks as threads of one process: make one InProcessGroup for `ranks`, then each thread takes its rank's
// exchange (member(r)). all_gather copies each rank's bytes into a shared staging buffer, waits for every rank,
// then copies the whole into `gathered`; host-blocking (the rank's stream is synchronised at the barrier).
class InProcessGroup {
 public:
  explicit InProcessGroup(int ranks);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;
  std::unique_ptr<Exchange> member(int rank);

 private:
  friend class InProcessMember;
  void arrive_and_wait();
  int ranks_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  long generation_ = 0;
  void* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
};

// Linear attention's forward over the ranks of `exchange`: `local` is this rank's run of every sequence (q, k,
// v and output of its tokens; the lengths may differ between ranks, at least 1 token each). initial_state is S_0 on rank 0 and ignored on the others; final_state, where given, is
// the state after this rank's run (S_L on the last rank). boundary_states must be null. local.segments splits
// the rank's own run further (0 chooses, as in linear_attention::forward).
void linear_attention_forward(const linear_attention::ForwardParams& local, Exchange& exchange, cudaStream_t stream = nullptr);

}  // namespace deltaproof::cuda::context_parallel
