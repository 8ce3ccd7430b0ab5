// What the context-parallel GPU tests share: a forward hook for kernel_checks' check_forward that splits the
// sequence over ranks (⌈L/R⌉ tokens each, every rank a thread with its own stream calling
// context_parallel::linear_attention_forward on its run), and the shapes they judge.
#pragma once

#include "cuda/check.hpp"
#include "cuda/context_parallel.h"
#include "cuda/linear_attention.h"
#include "kernel_checks/linear_attention_kernel_checks.hpp"
#include "verify/matrix_comparison.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace deltaproof::testing::context_parallel_ranks {

namespace kla = cuda::linear_attention;
namespace cp = cuda::context_parallel;
using verify::linear_attention::CudaCase;
using verify::linear_attention::CudaShape;
using verify::linear_attention::Kernels;

// Rank r's run of every sequence in p: rows [r·run, r·run + its length) of q, k, v and the output.
inline kla::ForwardParams run_of(const kla::ForwardParams& p, int r, int run, int ranks) {
  kla::ForwardParams local = p;
  const std::size_t element = cuda::size_of(p.dtype);
  const auto at = [&](const void* t, const cuda::Strides& s) {
    return static_cast<const char*>(t) + std::int64_t(r) * run * s.row * std::int64_t(element);
  };
  local.q = at(p.q, p.q_strides), local.k = at(p.k, p.k_strides), local.v = at(p.v, p.v_strides);
  local.output = const_cast<char*>(at(p.output, p.output_strides));
  local.length = std::min(run, p.length - r * run);
  if (r + 1 < ranks) local.final_state = nullptr;
  return local;
}

// The ranks a sequence of `length` tokens is split over when `requested`: ⌈length / requested⌉ tokens each, and no
// rank without tokens.
inline int run_length(int length, int requested) { return (length + requested - 1) / requested; }
inline int rank_count(int length, int requested) {
  const int run = run_length(length, requested);
  return (length + run - 1) / run;
}

// A forward hook for check_forward: the ranks as threads, rank r on device device_of(r) with its own stream, its
// exchange from make(r), and the tensors params_of(r) (p's, or copies of them on its device); exceptions of any
// rank rethrown.
using ExchangeFactory = std::function<std::unique_ptr<cp::Exchange>(int rank, int ranks)>;
inline void run_ranks(const kla::ForwardParams& p, int requested, const std::function<int(int)>& device_of, const ExchangeFactory& make,
                      const std::function<kla::ForwardParams(int)>& params_of) {
  const int run = run_length(p.length, requested), ranks = rank_count(p.length, requested);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        cuda::check(cudaSetDevice(device_of(r)), "cudaSetDevice");
        cudaStream_t stream;
        cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        const std::unique_ptr<cp::Exchange> exchange = make(r, ranks);
        cp::linear_attention_forward(run_of(params_of(r), r, run, ranks), *exchange, stream);
        cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        cuda::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  cuda::check(cudaSetDevice(0), "cudaSetDevice");
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

inline std::string failures(const CudaCase& c, const Kernels& kernels) {
  try {
    const std::vector<verify::Comparison> rows = verify::linear_attention::check_forward(c, false, kernels);
    return verify::all_agree(rows) ? std::string() : verify::linear_attention::describe(c.shape) + "\n" + verify::describe_failures(rows);
  } catch (const std::exception& e) {
    return verify::linear_attention::describe(c.shape) + ": exception: " + e.what();
  }
}

inline const CudaShape kShapes[] = {
    {1, 2, 300, 64, 64, 64, true, cuda::DType::bf16},
    {2, 1, 130, 40, 24, 16, false, cuda::DType::f32},
    {1, 3, 77, 128, 128, 32, true, cuda::DType::bf16},
};

}  // namespace deltaproof::testing::context_parallel_ranks
