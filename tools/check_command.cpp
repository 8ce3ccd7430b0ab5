// `deltaproof check`: the verdict on any kernel, from files. The inputs a kernel was given and what
// it produced are read (verify/tensor_file.hpp), the oracle is evaluated on the exact values of
// those inputs and every produced tensor is judged within its derived bound (verify/judge.hpp).
// This file only parses, prints and maps the verdict to an exit code: 0 agree, 1 disagree, 2 bad input,
// 3 inconclusive (an error beyond a bound whose premise the inputs break: the premise and what was
// measured are printed, and in --json the verdict's "status" and "premise"). A NaN or ±Inf in any tensor
// (g = −∞ too) is refused as bad input (exit 2, the file, tensor and entry named), never judged: the
// bounds hold for finite numbers only (tools/tests/check_cli_test.sh).
#include "tools/commands.hpp"
#include "verify/judge.hpp"
#include "verify/tensor_file.hpp"
#include "verify/version.hpp"

#include <cmath>
#include <iostream>
#include <stdexcept>

namespace deltaproof::tools {

namespace {

using verify::HostTensor;
using verify::KernelCase;
using verify::KernelResult;

// The tensors of a run, in the order they are printed: name and tensor.
std::vector<std::pair<std::string, const HostTensor*>> tensors_of(const KernelCase& c, const KernelResult& r) {
  std::vector<std::pair<std::string, const HostTensor*>> all = {{"q", &c.q}, {"k", &c.k}, {"v", &c.v}};
  const std::pair<const char*, const std::optional<HostTensor>*> optional[] = {
      {"beta", &c.beta}, {"g", &c.g},   {"h0", &c.h0}, {"do", &c.d_o},       {"dht", &c.d_ht}, {"o", &r.o},
      {"ht", &r.ht},     {"dq", &r.dq}, {"dk", &r.dk}, {"dv", &r.dv}, {"dbeta", &r.dbeta}, {"dg", &r.dg}, {"dh0", &r.dh0}};
  for (const auto& [name, t] : optional)
    if (*t) all.emplace_back(name, &**t);
  return all;
}

// One line: op, layout, flags, then every tensor's shape and dtype.
std::string header_line(const CheckOptions& o, const KernelCase& c, const KernelResult& r) {
  std::string line = "deltaproof check --op " + verify::name_of(c.op) + " --layout " + verify::name_of(c.layout);
  if (!c.cu_seqlens.empty()) line += ", varlen " + std::to_string(c.sequences()) + " sequences";
  if (c.scale != 1.0) {
    char text[40];
    std::snprintf(text, sizeof text, ", scale %.17g", c.scale);
    line += text;
  }
  if (c.l2_normalize_qk) line += ", qk l2norm";
  if (o.tf32) line += ", tf32 operands";
  line += ":";
  bool first = true;
  for (const auto& [name, t] : tensors_of(c, r)) {
    line += std::string(first ? " " : ", ") + name + " " + t->shape_string() + " " + verify::name_of(t->dtype);
    first = false;
  }
  return line;
}

nlohmann::json case_json(const CheckOptions& o, const KernelCase& c, const KernelResult& r) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, t] : tensors_of(c, r)) tensors[name] = {{"shape", t->shape}, {"dtype", verify::name_of(t->dtype)}};
  nlohmann::json j = {{"op", verify::name_of(c.op)},
                      {"layout", verify::name_of(c.layout)},
                      {"inputs", o.inputs},
                      {"outputs", o.outputs},
                      {"scale", c.scale},
                      {"qk_l2norm", c.l2_normalize_qk},
                      {"tf32", o.tf32},
                      {"tensors", tensors}};
  j["grads"] = o.grads.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.grads);
  j["cu_seqlens"] = c.cu_seqlens.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.cu_seqlens);
  return j;
}

int bad_input(const std::string& message) {
  std::cerr << "deltaproof check: " << message << "\n";
  return 2;
}

}  // namespace

int check(const CheckOptions& o) {
  if (!std::isfinite(o.scale)) return bad_input("--scale: must be finite");
  KernelCase c;
  KernelResult r;
  verify::Verdict verdict;
  try {
    const verify::CaseFlags flags{verify::parse_op(o.op), verify::parse_layout(o.layout), o.cu_seqlens, o.scale, o.qk_l2norm};
    c = verify::read_kernel_case(o.inputs, flags);
    r = verify::read_kernel_result(c, o.outputs, o.grads);
    verify::JudgeOptions options;
    options.tf32_operands = o.tf32;
    if (!o.state_dtype.empty()) options.state_dtype = verify::parse_dtype(o.state_dtype);
    options.chunk_size = o.chunk_size;
    verdict = verify::judge(c, r, options);
  } catch (const std::invalid_argument& e) {
    return bad_input(e.what());
  } catch (const std::exception& e) {  // the judge could not give a verdict: nothing on stdout either
    return bad_input(std::string("no verdict: ") + e.what());
  }
  if (o.json) {
    nlohmann::json j = verify::to_json(verdict);
    j["case"] = case_json(o, c, r);
    j["deltaproof_version"] = verify::version();
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << header_line(o, c, r) << "\n" << verify::format_table(verdict);
    std::string disagreeing, undecided;
    for (const auto& row : verdict.comparisons) {
      if (row.status() == verify::Status::disagree) disagreeing += (disagreeing.empty() ? "" : ", ") + row.tensor;
      if (row.status() == verify::Status::inconclusive) undecided += (undecided.empty() ? "" : ", ") + row.tensor;
    }
    if (!disagreeing.empty()) std::cout << "verdict: DISAGREE (" << disagreeing << ")\n";
    else if (!undecided.empty())
      std::cout << "verdict: INCONCLUSIVE (" << undecided << "): " << verify::describe(*verdict.premise()) << "\n";
    else std::cout << "verdict: agree\n";
  }
  switch (verdict.status()) {
    case verify::Status::agree: return 0;
    case verify::Status::disagree: return 1;
    default: return 3;
  }
}

}  // namespace deltaproof::tools
