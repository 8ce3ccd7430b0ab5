// The subcommands of `deltaproof`, one function per (subcommand, op). main.cpp parses flags into
// CaseOptions and dispatches; each op's commands live in tools/<op>_commands.cpp.
// Every command returns the process exit code: 0 agree/pass, 1 disagree/fail, 2 bad input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace deltaproof::tools {

// Largest head dims and length the command line accepts (the kernels' limit is 256 too).
inline constexpr long max_head_dim = 256;
inline constexpr long max_length = 65536;

struct CaseOptions {
  std::string op = "linear";        // --op
  std::string impl = "reference";   // --impl reference|cuda
  long length = 67;                 // --L
  long chunk_size = 16;             // --C
  long key_dim = 15;                // --dk
  long value_dim = 9;               // --dv
  std::uint64_t seed = 1;           // --seed
  std::string scalar = "exact";     // --scalar exact|high|double|float (verify)
  std::string form = "chunk";       // --form chunk|recurrent|parallel (gradcheck)
  std::string step = "1e-20";       // --step, the central-difference step in High (gradcheck)
  int digits = 25;                  // --digits: pass when the relative error is below 10^-digits
  bool json = false;                // --json (gradcheck)
  // DeltaNet and Gated DeltaNet (--op delta, gated-delta)
  std::string beta = "random";      // --beta: "random" (p/8 per token) or a decimal in [0, 1]
  std::string alpha = "random";     // --alpha: "random" (p/8 per token) or a decimal in (0, 1]
  std::string keys = "small";       // --keys small (‖k‖ < 1) | unnormalized (entries up to 4)
  std::string schedule = "apply-update";  // --schedule update-apply|apply-update|single (masks)
  long window = 0;                        // --window: sliding-window attention branch, 0 = none (masks)
  std::string fast_weight = "linear";     // --fast-weight linear|swiglu (masks)
};

// Linear attention (tools/linear_attention_commands.cpp).
int verify_linear_attention(const CaseOptions& options);
int gradcheck_linear_attention(const CaseOptions& options);

// TTT and LaCT (tools/ttt_commands.cpp, tools/lact_commands.cpp). For ttt, --C is the mini-batch size b.
int verify_ttt(const CaseOptions& options);
int verify_lact(const CaseOptions& options);
int masks_lact(const CaseOptions& options);
// The CUDA commands' first step: exit code 2 and one line on stderr when the kernels cannot run this
// case (--C not 16, 32 or 64, named with or without a device; no device); nullopt when they can
// (tools/linear_attention_cuda_commands.cpp; CUDA builds only).
std::optional<int> cuda_case_unusable(const CaseOptions& options);
// Linear attention on the CUDA kernels (tools/linear_attention_cuda_commands.cpp; CUDA builds only).
// Without a device: one line on stderr, exit 2.
int verify_linear_attention_cuda(const CaseOptions& options);
int gradcheck_linear_attention_cuda(const CaseOptions& options);

// DeltaNet / Gated DeltaNet on the CUDA kernels, stage by stage (tools/delta_rule_cuda_commands.cpp;
// CUDA builds only).
int verify_delta_rule_cuda(const CaseOptions& options);
int verify_gated_delta_rule_cuda(const CaseOptions& options);
// Their backward kernel: stages vs the oracle, gradients vs float64, fp64 central differences
// (tools/delta_rule_cuda_gradcheck.cpp; CUDA builds only).
int gradcheck_delta_rule_cuda(const CaseOptions& options);
int gradcheck_gated_delta_rule_cuda(const CaseOptions& options);

// `deltaproof check` (tools/check_command.cpp): a kernel's tensor files judged against the oracle.
struct CheckOptions {
  std::string op;                   // --op linear|delta|gated-delta
  std::string inputs;               // --inputs: q, k, v (beta, g), optional h0, do, dht, cu_seqlens
  std::string outputs;              // --outputs: o, optional ht
  std::string grads;                // --grads: any of dq, dk, dv, dbeta, dg, dh0 ("" = none)
  std::string layout = "bhld";      // --layout bhld (deltaproof) | blhd (fla)
  bool cu_seqlens = false;          // --cu-seqlens: varlen, the inputs hold cu_seqlens
  double scale = 1.0;               // --scale: the kernel used scale·q
  bool qk_l2norm = false;           // --qk-l2norm: the kernel L2-normalised q and k itself
  bool tf32 = false;                // --tf32: fp32 operands were multiplied in TF32 (Triton's default)
  std::string state_dtype;          // --state-dtype: the kernel's declared running-state dtype ("" = fp32, fp64 for fp64)
  long chunk_size = 0;              // --chunk-size: the kernel's chunk size (0 = unknown: 16, 32 and 64 covered)
  bool json = false;                // --json
};
int check(const CheckOptions& options);

// DeltaNet and Gated DeltaNet (tools/delta_rule_commands.cpp).
int verify_delta_rule(const CaseOptions& options);
int gradcheck_delta_rule(const CaseOptions& options);
int verify_gated_delta_rule(const CaseOptions& options);
int gradcheck_gated_delta_rule(const CaseOptions& options);

}  // namespace deltaproof::tools
