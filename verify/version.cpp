#include "verify/version.hpp"

namespace deltaproof::verify {

// DELTAPROOF_VERSION is defined for this file alone (verify/CMakeLists.txt), so a new version recompiles one file.
const char* version() { return DELTAPROOF_VERSION; }

}  // namespace deltaproof::verify
