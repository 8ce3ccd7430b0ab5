// What the tensor-file fuzz targets (tensor_file_fuzz.cpp, npy_fuzz.cpp) check on one file, read as
// `deltaproof check` reads it (verify/tensor_file.hpp). Findings, besides crashes and sanitizer
// reports:
//   - an error that is not std::invalid_argument, or not one line starting with the file's path;
//   - a file that reads but does not read back the same after write_tensor_file (names, shapes,
//     dtypes, values bit for bit; NaN as NaN);
//   - a kernel case the loader accepts (every op, layout, varlen) whose oracle outputs fail
//     validate_result, or which the judge, given the oracle's own outputs, does not call agreeing.
#pragma once

#include "verify/judge.hpp"
#include "verify/tensor_file.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace deltaproof::fuzz {

using namespace deltaproof::verify;

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "tensor-file fuzz: %s\n", what.c_str());
  std::abort();
}

// A file of this process under $TMPDIR (fuzzing: TMPDIR=/dev/shm keeps it in memory).
inline std::string scratch_path(const std::string& tag, const std::string& extension) {
  static const std::string directory = std::filesystem::temp_directory_path().string();
  return directory + "/deltaproof_fuzz_" + std::to_string(getpid()) + tag + extension;
}

inline void require_error_contract(const std::invalid_argument& e, const std::string& path) {
  const std::string message = e.what();
  if (message.rfind(path + ": ", 0) != 0) finding("error does not start with the file: " + message);
  if (message.find('\n') != std::string::npos || message.find('\r') != std::string::npos)
    finding("error is not one line: " + message);
}

inline bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

inline void require_same(const TensorFile& a, const TensorFile& b) {
  if (a.floating.size() != b.floating.size() || a.integer.size() != b.integer.size()) finding("round trip changed the tensor count");
  for (const auto& [name, t] : a.floating) {
    const auto it = b.floating.find(name);
    if (it == b.floating.end()) finding("round trip lost floating tensor '" + name + "'");
    const HostTensor& u = it->second;
    if (t.shape != u.shape || t.dtype != u.dtype || t.values.size() != u.values.size()) finding("round trip changed '" + name + "'");
    for (size_t i = 0; i < t.values.size(); ++i)
      if (!same_value(t.values[i], u.values[i])) finding("round trip changed an entry of '" + name + "'");
  }
  for (const auto& [name, t] : a.integer) {
    const auto it = b.integer.find(name);
    if (it == b.integer.end()) finding("round trip lost integer tensor '" + name + "'");
    if (t.shape != it->second.shape || t.values != it->second.values || t.wide != it->second.wide)
      finding("round trip changed '" + name + "'");
  }
}

// Cases small enough to judge on every input, with entries that keep the oracle far from overflow.
inline bool small_and_modest(const KernelCase& c) {
  Index total = 0;
  bool modest = true;
  auto visit = [&](const HostTensor& t) {
    total += t.size();
    for (double x : t.values) modest = modest && std::fabs(x) <= 64;
  };
  for (const HostTensor* t : {&c.q, &c.k, &c.v}) visit(*t);
  for (const auto* t : {&c.beta, &c.g, &c.h0, &c.d_o, &c.d_ht})
    if (*t) visit(**t);
  return total <= 4096 && modest && std::fabs(c.scale) <= 64;
}

// Every op, layout and varlen flag through the loader; accepted small cases through the judge.
inline void check_loaders(const std::string& path) {
  for (Op op : {Op::linear, Op::delta, Op::gated_delta})
    for (Layout layout : {Layout::bhld, Layout::blhd})
      for (bool varlen : {false, true}) {
        KernelCase c;
        try {
          c = read_kernel_case(path, CaseFlags{op, layout, varlen, 1.0, false});
        } catch (const std::invalid_argument& e) {
          require_error_contract(e, path);
          continue;
        }
        if (!small_and_modest(c)) continue;
        const KernelResult truth = oracle(c, 1);
        try {
          validate_result(c, truth);
        } catch (const std::invalid_argument& e) {
          finding(std::string("the oracle's own outputs fail validate_result: ") + e.what());
        }
        JudgeOptions options;
        options.threads = 1;
        const Verdict v = judge(c, truth, options);
        if (!v.agrees()) finding("the judge does not agree with the oracle's own outputs:\n" + describe(c) + "\n" + format_table(v));
      }
}

// The whole check of one file (its extension picks the format).
inline void check_tensor_file(const std::string& path) {
  TensorFile file;
  try {
    file = read_tensor_file(path);
  } catch (const std::invalid_argument& e) {
    require_error_contract(e, path);
    return;
  }
  const std::string copy = scratch_path("_copy", std::filesystem::path(path).extension().string());
  try {
    write_tensor_file(copy, file);
  } catch (const std::invalid_argument& e) {
    finding(std::string("a file that reads does not write back: ") + e.what());
  }
  require_same(file, read_tensor_file(copy));
  check_loaders(path);
}

}  // namespace deltaproof::fuzz
