// deltaproof: verify forms against each other, check gradients, over exact rationals and more.
//
//   deltaproof verify    [--op linear|delta|gated-delta] [--L --C --dk --dv --seed] [--scalar exact|high|double|float]
//   deltaproof gradcheck [--op linear|delta|gated-delta] [--form chunk|recurrent|parallel] [--L --C --dk --dv --seed]
//                        [--step 1e-20] [--digits 25] [--json]   (--impl cuda: --C defaults to 64)
//   delta ops also take [--beta random|x in [0,1]] [--alpha random|x in (0,1]] [--keys small|unnormalized]
//   deltaproof verify    --op ttt|lact [--L --C --dk --dv --seed]      (TTT: --C is the mini-batch size b)
//   deltaproof masks     [--schedule update-apply|apply-update|single] [--L --C --window]
//                        [--fast-weight linear|swiglu] [--dk --dv --seed]
//   deltaproof --version
//   deltaproof check     --op linear|delta|gated-delta --inputs IN --outputs OUT [--grads G]
//                        [--layout bhld|blhd] [--cu-seqlens] [--scale X] [--qk-l2norm] [--tf32]
//                        [--state-dtype bf16|fp16|fp32|fp64] [--chunk-size C] [--json]
//                        (IN, OUT, G: .safetensors or .npz; see verify/tensor_file.hpp; NaN or ±Inf
//                        in any tensor, input or output, is bad input: exit 2 naming the tensor and entry)
//
// Exit codes: 0 agree/pass, 1 disagree/fail, 2 bad input (one line naming the flag), 3 inconclusive (check).
#include "tools/commands.hpp"
#include "verify/version.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>

namespace {

using deltaproof::tools::CaseOptions;
using Command = int (*)(const CaseOptions&);

struct OpCommands {
  Command verify = nullptr, gradcheck = nullptr;
};

// One entry per op; the CUDA variants are looked up separately under --impl cuda.
const std::map<std::string, OpCommands>& reference_ops() {
  static const std::map<std::string, OpCommands> ops = {
      {"linear", {deltaproof::tools::verify_linear_attention, deltaproof::tools::gradcheck_linear_attention}},
      {"delta", {deltaproof::tools::verify_delta_rule, deltaproof::tools::gradcheck_delta_rule}},
      {"gated-delta", {deltaproof::tools::verify_gated_delta_rule, deltaproof::tools::gradcheck_gated_delta_rule}},
      {"ttt", {deltaproof::tools::verify_ttt, nullptr}},
      {"lact", {deltaproof::tools::verify_lact, nullptr}},
  };
  return ops;
}
const std::map<std::string, OpCommands>& cuda_ops() {
  static const std::map<std::string, OpCommands> ops = {
#ifdef DELTAPROOF_WITH_CUDA
      {"linear", {deltaproof::tools::verify_linear_attention_cuda, deltaproof::tools::gradcheck_linear_attention_cuda}},
      {"delta", {deltaproof::tools::verify_delta_rule_cuda, deltaproof::tools::gradcheck_delta_rule_cuda}},
      {"gated-delta", {deltaproof::tools::verify_gated_delta_rule_cuda, deltaproof::tools::gradcheck_gated_delta_rule_cuda}},
#endif
  };
  return ops;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& [name, commands] : reference_ops()) names.push_back(name);
  return names;
}

// The shape, seed and implementation flags every subcommand takes.
void add_case_options(CLI::App& sub, CaseOptions& o) {
  using deltaproof::tools::max_head_dim;
  using deltaproof::tools::max_length;
  sub.add_option("--op", o.op, "operation")->check(CLI::IsMember(op_names()))->capture_default_str();
  sub.add_option("--impl", o.impl, "implementation under test")
      ->check(CLI::IsMember({"reference", "cuda"}))->capture_default_str();
  sub.add_option("--L", o.length, "sequence length")->check(CLI::Range(1L, max_length))->capture_default_str();
  sub.add_option("--C", o.chunk_size, "chunk size")->check(CLI::Range(1L, max_length))->capture_default_str();
  sub.add_option("--dk", o.key_dim, "key head dim")->check(CLI::Range(1L, max_head_dim))->capture_default_str();
  sub.add_option("--dv", o.value_dim, "value head dim")->check(CLI::Range(1L, max_head_dim))->capture_default_str();
  sub.add_option("--seed", o.seed, "seed of the random case")->capture_default_str();
}

// A plain decimal, [+-] digits [. digits] [e [+-] digits] with |exponent| <= 300, as a double: the
// strings the commands read exactly (parse_decimal) or hand to MPFR (--step), and nothing else, so
// that no value passes here that a command then misreads (hex floats, spaces, 1e-400).
std::optional<double> plain_decimal(const std::string& s) {
  size_t i = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  bool digits = false, point = false;
  for (; i < s.size() && (std::isdigit((unsigned char)s[i]) || (s[i] == '.' && !point)); ++i)
    (s[i] == '.' ? point : digits) = true;
  if (!digits) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    i += 1 + (i + 1 < s.size() && (s[i + 1] == '+' || s[i + 1] == '-'));
    const size_t exponent_at = i;
    while (i < s.size() && std::isdigit((unsigned char)s[i]) && i - exponent_at < 4) ++i;
    if (i == exponent_at || std::atoi(s.c_str() + exponent_at) > 300) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  return std::strtod(s.c_str(), nullptr);
}

// Gate flags of --op delta / gated-delta: "random" or one decimal for every token.
CLI::Validator gate_value(const std::string& range, double low, bool low_open, double high) {
  return CLI::Validator(
      [=](const std::string& s) -> std::string {
        if (s == "random") return "";
        const auto x = plain_decimal(s);
        if (x && (low_open ? *x > low : *x >= low) && *x <= high) return "";
        return "Value " + s + " is not \"random\" or a decimal in " + range;
      },
      "random|" + range);
}

void add_delta_options(CLI::App& sub, CaseOptions& o) {
  sub.add_option("--beta", o.beta, "delta ops: beta for every token, or random p/8")
      ->check(gate_value("[0, 1]", 0, false, 1))->capture_default_str();
  sub.add_option("--alpha", o.alpha, "gated-delta: gate alpha for every token, or random p/8")
      ->check(gate_value("(0, 1]", 0, true, 1))->capture_default_str();
  sub.add_option("--keys", o.keys, "delta ops: small (|k| < 1) or unnormalized keys")
      ->check(CLI::IsMember({"small", "unnormalized"}))->capture_default_str();
}

int dispatch(const std::string& subcommand, const CaseOptions& o) {
  const auto& table = o.impl == "cuda" ? cuda_ops() : reference_ops();
  const auto entry = table.find(o.op);
  const Command command = entry == table.end() ? nullptr
                          : subcommand == "verify" ? entry->second.verify : entry->second.gradcheck;
  if (!command) {
    std::cerr << "deltaproof: --impl " << o.impl << ": no " << subcommand << " for --op " << o.op << " in this build\n";
    return 2;
  }
  return command(o);
}

}  // namespace

// The whole command line: parse argv, run the chosen command, return its exit code. main() is this;
// the fuzz target (fuzz/command_line_fuzz.cpp) builds this file without main(), commands stubbed.
namespace deltaproof::tools {
int run_command_line(int argc, char** argv);
}

int deltaproof::tools::run_command_line(int argc, char** argv) {
  CLI::App app{"deltaproof: exact verification of linear-attention forms and kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("deltaproof ") + deltaproof::verify::version());
  CaseOptions verify_options;
  // Finite differences cost two forward passes per input element: a smaller default case.
  CaseOptions gradcheck_options;
  gradcheck_options.length = 20, gradcheck_options.chunk_size = 8, gradcheck_options.key_dim = 5,
  gradcheck_options.value_dim = 4;

  CLI::App* verify = app.add_subcommand("verify", "evaluate every form on one case and compare them pairwise");
  add_case_options(*verify, verify_options);
  add_delta_options(*verify, verify_options);
  verify->add_option("--scalar", verify_options.scalar, "scalar type of the forms")
      ->check(CLI::IsMember({"exact", "high", "double", "float"}))->capture_default_str();

  CLI::App* gradcheck = app.add_subcommand("gradcheck", "analytic gradients vs central differences in High");
  add_case_options(*gradcheck, gradcheck_options);
  add_delta_options(*gradcheck, gradcheck_options);
  gradcheck->add_option("--form", gradcheck_options.form, "form whose backward is checked")
      ->check(CLI::IsMember({"chunk", "recurrent", "parallel"}))->capture_default_str();
  gradcheck->add_option("--step", gradcheck_options.step, "central-difference step h (a decimal, 1e-60 <= h <= 1e-3)")
      ->check([](const std::string& s) -> std::string {
        const auto h = plain_decimal(s);
        if (h && *h >= 1e-60 && *h <= 1e-3) return "";
        return "Value " + s + " is not a decimal in [1e-60, 1e-3]";
      })
      ->capture_default_str();
  gradcheck->add_option("--digits", gradcheck_options.digits, "pass when the relative error is below 10^-digits")
      ->check(CLI::Range(1, 90))->capture_default_str();
  gradcheck->add_flag("--json", gradcheck_options.json, "machine-readable output");

  // LaCT dependency masks: a small default case, since the grid is L x L.
  CaseOptions masks_options;
  masks_options.op = "lact", masks_options.length = 12, masks_options.chunk_size = 4, masks_options.key_dim = 3,
  masks_options.value_dim = 2;
  CLI::App* masks = app.add_subcommand("masks", "LaCT dependency masks of a schedule: predicted vs measured, as grids");
  masks->add_option("--schedule", masks_options.schedule, "LaCT schedule")
      ->check(CLI::IsMember({"update-apply", "apply-update", "single"}))->capture_default_str();
  masks->add_option("--L", masks_options.length, "sequence length")
      ->check(CLI::Range(1L, deltaproof::tools::max_length))->capture_default_str();
  masks->add_option("--C", masks_options.chunk_size, "chunk size")
      ->check(CLI::Range(1L, deltaproof::tools::max_length))->capture_default_str();
  masks->add_option("--window", masks_options.window, "sliding-window attention branch (0 = none)")
      ->check(CLI::Range(0L, deltaproof::tools::max_length))->capture_default_str();
  masks->add_option("--fast-weight", masks_options.fast_weight, "fast-weight network")
      ->check(CLI::IsMember({"linear", "swiglu"}))->capture_default_str();
  masks->add_option("--dk", masks_options.key_dim, "key head dim")
      ->check(CLI::Range(1L, deltaproof::tools::max_head_dim))->capture_default_str();
  masks->add_option("--dv", masks_options.value_dim, "value head dim")
      ->check(CLI::Range(1L, deltaproof::tools::max_head_dim))->capture_default_str();
  masks->add_option("--seed", masks_options.seed, "seed of the random case")->capture_default_str();

  deltaproof::tools::CheckOptions check_options;
  CLI::App* check = app.add_subcommand("check", "judge a kernel's outputs and gradients, read from tensor files, "
                                                "against the oracle on the exact values of its inputs");
  check->add_option("--op", check_options.op, "operation")
      ->required()->check(CLI::IsMember({"linear", "delta", "gated-delta"}));
  check->add_option("--inputs", check_options.inputs, "inputs file: q, k, v (beta, g), optional h0, do, dht, cu_seqlens")
      ->required();
  check->add_option("--outputs", check_options.outputs, "outputs file: o, optional ht")->required();
  check->add_option("--grads", check_options.grads, "gradients file: any of dq, dk, dv, dbeta, dg, dh0 (needs do)");
  check->add_option("--layout", check_options.layout, "bhld (deltaproof) or blhd (fla: [B, T, H, D], states [N, H, DK, DV])")
      ->check(CLI::IsMember({"bhld", "blhd"}))->capture_default_str();
  check->add_flag("--cu-seqlens", check_options.cu_seqlens, "varlen: the inputs hold cu_seqlens (int32 or int64), B = 1");
  check->add_option("--scale", check_options.scale, "the kernel used scale * q (fla's scale)")->capture_default_str();
  check->add_flag("--qk-l2norm", check_options.qk_l2norm, "the kernel L2-normalised q and k itself");
  check->add_flag("--tf32", check_options.tf32, "fp32 operands were multiplied in TF32 (Triton's tl.dot default)");
  check->add_option("--state-dtype", check_options.state_dtype,
                    "the kernel keeps its running state in this dtype (default fp32; fp64 for fp64 inputs)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32", "fp64"}));
  check->add_option("--chunk-size", check_options.chunk_size, "the kernel's chunk size (default: 16, 32 and 64 covered)")
      ->check(CLI::Range(1L, deltaproof::tools::max_length));
  check->add_flag("--json", check_options.json, "machine-readable output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "deltaproof: " << e.what() << "\n";
    return 2;
  }
  // The kernels take C = 16, 32 or 64: without --C, --impl cuda uses 64 (gradcheck's reference default is 8).
  if (gradcheck_options.impl == "cuda" && gradcheck->get_option("--C")->count() == 0) gradcheck_options.chunk_size = 64;
  if (masks->parsed()) return deltaproof::tools::masks_lact(masks_options);
  if (check->parsed()) return deltaproof::tools::check(check_options);
  return verify->parsed() ? dispatch("verify", verify_options) : dispatch("gradcheck", gradcheck_options);
}

#ifndef DELTAPROOF_COMMAND_LINE_WITHOUT_MAIN
#include "reference/parallel.hpp"

int main(int argc, char** argv) {
  // DELTAPROOF_THREADS=n: the oracle's threads (default: every core); the library reads no environment.
  if (const char* threads = std::getenv("DELTAPROOF_THREADS")) deltaproof::ref::set_thread_count(unsigned(std::max(0, std::atoi(threads))));
  return deltaproof::tools::run_command_line(argc, argv);
}
#endif
