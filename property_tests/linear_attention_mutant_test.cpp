// Planted bugs: each broken chunkwise form must be caught by the properties that guard the real
// one. A test passes only when rapidcheck finds a counterexample (printed above its result).
#include "property_tests/linear_attention_properties.hpp"

#include <gtest/gtest.h>

namespace deltaproof::testing {
namespace {

// The diagonal left out of the causal mask: token t no longer sees its own key and value.
struct DiagonalLeftOutOfMask : la::Faithful {
  static bool in_causal_mask(Index i, Index j) { return j < i; }
};

// The last chunk dropped when it is partial (L % C != 0), a classic tail-handling bug.
struct PartialLastChunkDropped : la::Faithful {
  static bool keeps_chunk(const ref::Chunk& c, Index chunk_size) { return c.size == chunk_size; }
};

// S_0 ignored: the scan starts from zero whatever the caller passed.
struct InitialStateIgnored : la::Faithful {
  static constexpr bool reads_initial_state = false;
};

template <class Mutant>
bool forward_property_holds() {
  return rc::check("forward forms agree, with a planted bug", [] {
    check_forward_forms_agree<Mutant>(*gen_linear_attention_case({.max_length = 40, .max_dim = 8}));
  });
}

template <class Mutant>
bool backward_property_holds() {
  return rc::check("backward paths agree, with a planted bug", [] {
    check_backward_paths_agree<Mutant>(*gen_linear_attention_case({.max_length = 40, .max_dim = 8}));
  });
}

TEST(LinearAttentionPlantedBugs, DiagonalLeftOutOfMaskIsCaught) {
  EXPECT_FALSE(forward_property_holds<DiagonalLeftOutOfMask>());
  EXPECT_FALSE(backward_property_holds<DiagonalLeftOutOfMask>());
}

TEST(LinearAttentionPlantedBugs, PartialLastChunkDroppedIsCaught) {
  EXPECT_FALSE(forward_property_holds<PartialLastChunkDropped>());
  EXPECT_FALSE(backward_property_holds<PartialLastChunkDropped>());
}

TEST(LinearAttentionPlantedBugs, InitialStateIgnoredIsCaught) {
  EXPECT_FALSE(forward_property_holds<InitialStateIgnored>());
  EXPECT_FALSE(backward_property_holds<InitialStateIgnored>());
}

// The faithful form passes the same checks (so the failures above come from the bugs).
TEST(LinearAttentionPlantedBugs, FaithfulFormPasses) {
  EXPECT_TRUE(forward_property_holds<la::Faithful>());
  EXPECT_TRUE(backward_property_holds<la::Faithful>());
}

}  // namespace
}  // namespace deltaproof::testing
