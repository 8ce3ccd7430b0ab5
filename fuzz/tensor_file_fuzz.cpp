// Fuzz target: a whole tensor file, as `deltaproof check` reads it. Built twice, with
// DELTAPROOF_FUZZ_EXTENSION ".safetensors" and ".npz"; the checks are tensor_file_checks.hpp's.
#include "fuzz/tensor_file_checks.hpp"

#ifndef DELTAPROOF_FUZZ_EXTENSION
#error "define DELTAPROOF_FUZZ_EXTENSION as \".safetensors\" or \".npz\""
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = deltaproof::fuzz::scratch_path("", DELTAPROOF_FUZZ_EXTENSION);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
    if (!out) deltaproof::fuzz::finding("cannot write the scratch file " + path);
  }
  deltaproof::fuzz::check_tensor_file(path);
  return 0;
}
