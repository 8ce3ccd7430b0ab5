// bf16 rounding of a double as the tests' kernels store it: to float, then to nearest even on the top 16 bits.
#pragma once

#include <cstdint>
#include <cstring>

namespace deltaproof::verify {

inline double round_bf16(double x) {
  float f = float(x);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace deltaproof::verify
