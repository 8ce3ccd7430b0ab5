// Fuzz target: the `deltaproof` command line (tools/main.cpp) — CLI11's parsing, every flag's
// validator and the dispatch to a command — with the commands replaced by stubs that check what
// they were handed. An input is the arguments after `deltaproof`, one per line.
//
// Finding = a crash, a sanitizer report, an exit code other than 0 or 2 (the stubs return 0), or a
// command called with options outside what commands.hpp and --help promise (the stubs abort).
#include "tools/commands.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace deltaproof::tools {
int run_command_line(int argc, char** argv);
}

namespace {

using deltaproof::tools::CaseOptions;
using deltaproof::tools::CheckOptions;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "command-line fuzz: a command was called with %s\n", what.c_str());
  std::abort();
}

void require(bool ok, const std::string& what) {
  if (!ok) broken(what);
}

bool one_of(const std::string& s, const std::set<std::string>& allowed) { return allowed.count(s) != 0; }

// The decimals the commands convert exactly (tools/delta_rule_commands.cpp: parse_decimal) or hand
// to MPFR (--step): [+-] digits [. digits] [e [+-] digits], nothing else, exponent within ±300.
bool plain_decimal(const std::string& s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  bool digits = false, point = false;
  for (; i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.'); ++i) {
    if (s[i] == '.') {
      if (point) return false;
      point = true;
    } else {
      digits = true;
    }
  }
  if (!digits) return false;
  if (i == s.size()) return true;
  if (s[i] != 'e' && s[i] != 'E') return false;
  ++i;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  int exponent = 0, exponent_digits = 0;
  for (; i < s.size() && std::isdigit((unsigned char)s[i]); ++i)
    if (++exponent_digits <= 4) exponent = exponent * 10 + (s[i] - '0');
  return i == s.size() && exponent_digits >= 1 && exponent_digits <= 4 && exponent <= 300;
}

void require_gate(const std::string& flag, const std::string& value, bool zero_allowed) {
  if (value == "random") return;
  require(plain_decimal(value), flag + " '" + value + "', not \"random\" or a plain decimal");
  const double x = std::strtod(value.c_str(), nullptr);
  require((zero_allowed ? x >= 0 : x > 0) && x <= 1, flag + " " + value + " outside its range");
}

void require_case(const CaseOptions& o, const std::string& op) {
  using deltaproof::tools::max_head_dim;
  using deltaproof::tools::max_length;
  require(o.op == op, "--op " + o.op + " in the command of --op " + op);
  require(o.impl == "reference", "--impl " + o.impl + " on a reference command");
  require(o.length >= 1 && o.length <= max_length, "--L " + std::to_string(o.length));
  require(o.chunk_size >= 1 && o.chunk_size <= max_length, "--C " + std::to_string(o.chunk_size));
  require(o.key_dim >= 1 && o.key_dim <= max_head_dim, "--dk " + std::to_string(o.key_dim));
  require(o.value_dim >= 1 && o.value_dim <= max_head_dim, "--dv " + std::to_string(o.value_dim));
  require(one_of(o.scalar, {"exact", "high", "double", "float"}), "--scalar " + o.scalar);
  require(one_of(o.form, {"chunk", "recurrent", "parallel"}), "--form " + o.form);
  require(plain_decimal(o.step), "--step '" + o.step + "', not a plain decimal");
  const double step = std::strtod(o.step.c_str(), nullptr);
  require(step >= 1e-60 && step <= 1e-3, "--step " + o.step + " outside [1e-60, 1e-3]");
  require(o.digits >= 1 && o.digits <= 90, "--digits " + std::to_string(o.digits));
  require_gate("--beta", o.beta, true);
  require_gate("--alpha", o.alpha, false);
  require(one_of(o.keys, {"small", "unnormalized"}), "--keys " + o.keys);
}

}  // namespace

// The commands, stubbed: each checks its options and returns 0.
namespace deltaproof::tools {
int verify_linear_attention(const CaseOptions& o) { return require_case(o, "linear"), 0; }
int gradcheck_linear_attention(const CaseOptions& o) { return require_case(o, "linear"), 0; }
int verify_delta_rule(const CaseOptions& o) { return require_case(o, "delta"), 0; }
int gradcheck_delta_rule(const CaseOptions& o) { return require_case(o, "delta"), 0; }
int verify_gated_delta_rule(const CaseOptions& o) { return require_case(o, "gated-delta"), 0; }
int gradcheck_gated_delta_rule(const CaseOptions& o) { return require_case(o, "gated-delta"), 0; }
int verify_ttt(const CaseOptions& o) { return require_case(o, "ttt"), 0; }
int verify_lact(const CaseOptions& o) { return require_case(o, "lact"), 0; }
int masks_lact(const CaseOptions& o) {
  require(o.op == "lact", "masks with op " + o.op);
  require(one_of(o.schedule, {"update-apply", "apply-update", "single"}), "--schedule " + o.schedule);
  require(one_of(o.fast_weight, {"linear", "swiglu"}), "--fast-weight " + o.fast_weight);
  require(o.length >= 1 && o.length <= max_length, "masks --L " + std::to_string(o.length));
  require(o.chunk_size >= 1 && o.chunk_size <= max_length, "masks --C " + std::to_string(o.chunk_size));
  require(o.window >= 0 && o.window <= max_length, "--window " + std::to_string(o.window));
  require(o.key_dim >= 1 && o.key_dim <= max_head_dim, "masks --dk " + std::to_string(o.key_dim));
  require(o.value_dim >= 1 && o.value_dim <= max_head_dim, "masks --dv " + std::to_string(o.value_dim));
  return 0;
}
int check(const CheckOptions& o) {
  require(one_of(o.op, {"linear", "delta", "gated-delta"}), "check --op " + o.op);
  require(one_of(o.layout, {"bhld", "blhd"}), "--layout " + o.layout);
  return 0;
}
}  // namespace deltaproof::tools

// Help texts and one-line errors are the expected outcome of most inputs: kept off the terminal.
std::ostringstream sink;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::cout.rdbuf(sink.rdbuf());
  std::cerr.rdbuf(sink.rdbuf());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> arguments{"deltaproof"};
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      arguments.push_back(current);
      current.clear();
    } else {
      current.push_back(char(data[i]));
    }
  }
  if (!current.empty()) arguments.push_back(current);
  if (arguments.size() > 64) return 0;
  std::vector<char*> argv;
  for (auto& a : arguments) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int code = deltaproof::tools::run_command_line(int(arguments.size()), argv.data());
  // The sink grows with every help text; empty it so that memory stays flat over millions of runs.
  sink.str("");
  if (code != 0 && code != 2) {
    std::fprintf(stderr, "command-line fuzz: exit code %d\n", code);
    std::abort();
  }
  return 0;
}
