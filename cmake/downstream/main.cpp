// Judges two "kernels" of linear attention through the installed verdict library: the oracle's own
// output (must agree) and the same output with one entry moved (must disagree), and checks one identity of
// the installed oracle over exact rationals. Exit 0 only if all three hold.
#include "reference/linear_attention.hpp"
#include "reference/random_inputs.hpp"
#include "verify/judge.hpp"
#include "verify/version.hpp"

#include <iostream>

namespace vf = deltaproof::verify;

int main() {
  vf::KernelCase c;
  c.op = vf::Op::linear;
  const vf::Index B = 1, H = 2, L = 19, D = 8;
  auto tensor = [](vf::Index d, double phase) {
    vf::HostTensor t{{B, H, L, d}, {}, vf::DType::f32};
    for (vf::Index i = 0; i < t.size(); ++i) t.values.push_back(double((i * 37 + int(phase * 11)) % 17 - 8) / 8);
    return t;
  };
  c.q = tensor(D, 0), c.k = tensor(D, 1), c.v = tensor(D, 2);
  const vf::KernelResult exact = vf::oracle(c);
  const bool agrees = vf::judge(c, exact).agrees();
  vf::KernelResult wrong = exact;
  wrong.o->values[5] += 0.25;
  const bool catches = !vf::judge(c, wrong).agrees();

  namespace ref = deltaproof::ref;
  ref::RandomDyadic random(1);
  ref::linear_attention::Inputs<ref::Exact> in;
  in.q = random.matrix<ref::Exact>(9, 3), in.k = random.matrix<ref::Exact>(9, 3), in.v = random.matrix<ref::Exact>(9, 2);
  const bool identity = ref::linear_attention::parallel_masked(in).output == ref::linear_attention::chunkwise(in, 4).output;

  std::cout << "deltaproof " << vf::version() << ": oracle output agrees " << agrees << ", planted error caught "
            << catches << ", parallel == chunkwise over Q " << identity << "\n";
  return agrees && catches && identity ? 0 : 1;
}
