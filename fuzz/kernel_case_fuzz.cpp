// Fuzz target: KernelCase::validate (verify/kernel_case.cpp), the gate every case passes before the
// judge, the Python module or the command line reads it — shapes, layouts, cu_seqlens, optional
// tensors, non-finite values, and extents no file could hold (negative, past 2⁶³ in product).
// An input is decoded byte by byte into a case (see `Bytes` and `decode`).
//
// Findings, besides crashes and sanitizer reports:
//   - validate() throwing anything but std::invalid_argument, or an empty or multi-line message;
//   - validate() accepting a case that breaks a rule it promises (checked here independently:
//     `require_valid`);
//   - an accepted small case whose oracle outputs fail validate_result, or which the judge, given the
//     oracle's own outputs, does not call agreeing.
#include "verify/judge.hpp"
#include "verify/kernel_case.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace {

using namespace deltaproof::verify;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "kernel-case fuzz: %s\n", what.c_str());
  std::abort();
}

// Reads the input front to back; past its end every read is 0.
struct Bytes {
  const std::uint8_t* data;
  std::size_t size, at = 0;
  unsigned byte() { return at < size ? data[at++] : 0; }
  std::int64_t wide() {
    std::uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | byte();
    return std::int64_t(u);
  }
};

// An extent: mostly small, sometimes one of the values that break arithmetic.
Index extent(Bytes& in) {
  const unsigned b = in.byte();
  if (b < 240) return b % 7;
  switch (b) {
    case 240: return -1;
    case 241: return std::numeric_limits<Index>::max();
    case 242: return std::numeric_limits<Index>::min();
    case 243: return Index(1) << 32;
    case 244: return (Index(1) << 31) + 1;
    default: return in.wide();
  }
}

double value(Bytes& in) {
  const unsigned b = in.byte();
  if (b == 255) return std::numeric_limits<double>::quiet_NaN();
  if (b == 254) return std::numeric_limits<double>::infinity();
  if (b == 253) return -std::numeric_limits<double>::infinity();
  return (int(b) - 126) / 8.0;
}

// A tensor of the expected shape, sometimes with one extent changed or a wrong number of values.
HostTensor tensor(Bytes& in, std::vector<Index> shape) {
  const unsigned how = in.byte();
  if (how >= 224 && !shape.empty()) shape[how % shape.size()] = extent(in);
  HostTensor t;
  t.shape = shape;
  t.dtype = DType(in.byte() % 4);
  Index n = 1;
  for (Index d : shape) {
    if (d < 0 || d > 4096 || n * d > 4096) return t;  // no values: validate() must still refuse it
    n *= d;
  }
  if (how >= 208 && how < 224) n += how % 2 ? 1 : -1;  // values and shape disagree
  for (Index i = 0; i < n; ++i) t.values.push_back(value(in));
  return t;
}

KernelCase decode(Bytes& in) {
  KernelCase c;
  c.op = Op(in.byte() % 3);
  c.layout = Layout(in.byte() % 2);
  const unsigned flags = in.byte();
  const Index B = extent(in), H = extent(in), L = extent(in), DK = extent(in), DV = extent(in);
  auto token = [&](Index d) {
    return c.layout == Layout::bhld ? std::vector<Index>{B, H, L, d} : std::vector<Index>{B, L, H, d};
  };
  const std::vector<Index> gate = c.layout == Layout::bhld ? std::vector<Index>{B, H, L} : std::vector<Index>{B, L, H};
  if (flags & 1) {  // varlen: cu_seqlens drawn, sometimes a few steps away from a valid one
    const unsigned count = in.byte() % 6;
    Index at = 0;
    for (unsigned i = 0; i < count; ++i) {
      const unsigned b = in.byte();
      at = b >= 250 ? in.wide() : i == 0 ? Index(b % 2) * (b % 3) : at + Index(b % 4) - (b >= 200);
      c.cu_seqlens.push_back(at);
    }
  }
  const Index N = c.cu_seqlens.empty() ? B : Index(c.cu_seqlens.size()) - 1;
  const std::vector<Index> state = c.layout == Layout::bhld ? std::vector<Index>{N, H, DV, DK} : std::vector<Index>{N, H, DK, DV};
  c.q = tensor(in, token(DK));
  c.k = tensor(in, token(DK));
  c.v = tensor(in, token(DV));
  if (bool(flags & 2) != (c.op == Op::linear)) c.beta = tensor(in, gate);
  if (bool(flags & 4) == (c.op == Op::gated_delta)) c.g = tensor(in, gate);
  if (flags & 8) c.h0 = tensor(in, state);
  if (flags & 16) c.d_o = tensor(in, token(DV));
  if (flags & 32) c.d_ht = tensor(in, state);
  c.scale = flags & 64 ? value(in) : 1.0;
  c.l2_normalize_qk = flags & 128;
  return c;
}

// What validate() promises, checked without it.
void require_valid(const KernelCase& c) {
  auto rule = [](bool ok, const char* what) {
    if (!ok) finding(std::string("validate() accepted a case that breaks: ") + what);
  };
  auto product = [](const std::vector<Index>& shape) {
    long double n = 1;
    for (Index d : shape) n *= (long double)d;
    return n;
  };
  auto well_formed = [&](const HostTensor& t, const std::vector<Index>& expected, const char* what) {
    rule(t.shape == expected, what);
    for (Index d : t.shape) rule(d >= 0, "extents are non-negative");
    rule(product(t.shape) == (long double)t.values.size(), "values match the shape");
    for (double x : t.values) rule(std::isfinite(x), "every value is finite");
  };
  rule(c.q.shape.size() == 4 && c.v.shape.size() == 4, "q and v have four dimensions");
  rule(c.heads() >= 1 && c.key_dim() >= 1 && c.value_dim() >= 1, "heads and head dims are at least 1");
  rule(c.batch() >= 0 && c.total_length() >= 0, "batch and length are non-negative");
  well_formed(c.q, c.token_shape(c.key_dim()), "q has its shape");
  well_formed(c.k, c.token_shape(c.key_dim()), "k has q's shape");
  well_formed(c.v, c.token_shape(c.value_dim()), "v has its shape");
  rule(std::isfinite(c.scale), "scale is finite");
  if (!c.cu_seqlens.empty()) {
    rule(c.batch() == 1, "varlen has batch 1");
    rule(c.cu_seqlens.size() >= 2 && c.cu_seqlens.front() == 0 && c.cu_seqlens.back() == c.total_length(),
         "cu_seqlens runs from 0 to T");
    for (size_t i = 1; i < c.cu_seqlens.size(); ++i) rule(c.cu_seqlens[i] >= c.cu_seqlens[i - 1], "cu_seqlens does not decrease");
  }
  rule(c.beta.has_value() == (c.op != Op::linear), "beta is there exactly for the delta ops");
  rule(c.g.has_value() == (c.op == Op::gated_delta), "g is there exactly for gated-delta");
  if (c.beta) well_formed(*c.beta, c.gate_shape(), "beta has the gate shape");
  if (c.g) well_formed(*c.g, c.gate_shape(), "g has the gate shape");
  if (c.h0) well_formed(*c.h0, c.state_shape(), "h0 has the state shape");
  if (c.d_o) well_formed(*c.d_o, c.token_shape(c.value_dim()), "do has o's shape");
  if (c.d_ht) {
    rule(c.d_o.has_value(), "dht comes with do");
    well_formed(*c.d_ht, c.state_shape(), "dht has the state shape");
  }
}


}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in{data, size};
  const KernelCase c = decode(in);
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    if (message.empty() || message.find('\n') != std::string::npos) finding("validate() error is empty or not one line");
    return 0;
  }
  require_valid(c);
  // The harness's budget: a case with L = 0 holds no inputs but may imply huge states.
  if (c.sequences() * c.heads() * c.key_dim() * c.value_dim() > 65536) return 0;
  // Inputs are n/8 with |n| <= 126 and at most a few thousand entries: the oracle stays finite.
  const KernelResult truth = oracle(c, 1);
  try {
    validate_result(c, truth);
  } catch (const std::invalid_argument& e) {
    finding(std::string("the oracle's own outputs fail validate_result: ") + e.what());
  }
  JudgeOptions options;
  options.threads = 1;
  const Verdict verdict = judge(c, truth, options);
  if (!verdict.agrees()) finding("the judge does not agree with the oracle's own outputs:\n" + describe(c) + "\n" + format_table(verdict));
  return 0;
}
