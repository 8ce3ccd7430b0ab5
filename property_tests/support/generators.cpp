#include "property_tests/support/generators.hpp"

#include "property_tests/support/case_rules.hpp"

#include <algorithm>

namespace deltaproof::testing {

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "{L=" << s.length << ", DK=" << s.key_dim << ", DV=" << s.value_dim << ", C=" << s.chunk_size
            << ", S_0=" << (s.with_initial_state ? "given" : "absent") << "}";
}

rc::Gen<Shape> gen_shape(ShapeLimits limits) {
  return rc::gen::withSize([limits](int size) {
    const double scale = std::clamp(size, 0, 100) / 100.0;
    const Index max_length = std::max<Index>(2, static_cast<Index>(limits.max_length * scale));
    const Index max_dim = std::max<Index>(1, static_cast<Index>(limits.max_dim * scale));
    const Index max_chunk = std::max<Index>(1, std::min(limits.max_chunk, max_length + 1));
    // Mostly kernel-like chunk sizes (<= 64); one draw in four anywhere up to L + 1.
    auto chunk_size = rc::gen::weightedOneOf<Index>({{3, rc::gen::inRange<Index>(1, std::min<Index>(64, max_chunk) + 1)},
                                                     {1, rc::gen::inRange<Index>(1, max_chunk + 1)}});
    return rc::gen::mapcat(chunk_size, [=](Index chunk) {
      // L relative to C: the edge cases, and anything up to the cap (C from 1 to L+1 follows).
      auto length = rc::gen::oneOf(rc::gen::elementOf(boundary_lengths(chunk)), rc::gen::inRange<Index>(1, max_length + 1));
      return rc::gen::build<Shape>(rc::gen::set(&Shape::chunk_size, rc::gen::just(chunk)),
                                   rc::gen::set(&Shape::length, length),
                                   rc::gen::set(&Shape::key_dim, rc::gen::inRange<Index>(1, max_dim + 1)),
                                   rc::gen::set(&Shape::value_dim, rc::gen::inRange<Index>(1, max_dim + 1)),
                                   rc::gen::set(&Shape::with_initial_state, rc::gen::arbitrary<bool>()));
    });
  });
}

rc::Gen<Exact> gen_entry(Entries entries) {
  if (entries == Entries::fine) {
    static constexpr int scale = 1 << 22;
    return rc::gen::map(rc::gen::inRange(-scale + 1, scale), [](int n) { return Exact(n) / scale; });
  }
  return rc::gen::map(rc::gen::inRange(-8, 9), [](int n) { return Exact(n) / 4; });
}

rc::Gen<Matrix<Exact>> gen_matrix(Index rows, Index cols, Entries entries) {
  return rc::gen::map(rc::gen::container<std::vector<Exact>>(static_cast<size_t>(rows * cols), gen_entry(entries)),
                      [rows, cols](const std::vector<Exact>& values) {
                        Matrix<Exact> m(rows, cols);
                        for (Index i = 0; i < rows; ++i)
                          for (Index j = 0; j < cols; ++j) m(i, j) = values[static_cast<size_t>(i * cols + j)];
                        return m;
                      });
}

}  // namespace deltaproof::testing
