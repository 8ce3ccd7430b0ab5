// deltaproof's version (the repository's VERSION file), as the command line and every JSON it writes state it.
#pragma once

namespace deltaproof::verify {

const char* version();

}  // namespace deltaproof::verify
