// Where tests find the bundled model: ../shared/models/stories260K beside the checkout.
#pragma once

#include <cstdlib>
#include <string>

namespace pdserve::testing {

inline std::string source_dir() {
  const char* d = std::getenv("PDSERVE_SOURCE_DIR");
  return d ? d : ".";
}
inline std::string stories_dir() { return source_dir() + "/../shared/models/stories260K"; }
inline std::string stories_bin() { return stories_dir() + "/stories260K.bin"; }

}  // namespace pdserve::testing
