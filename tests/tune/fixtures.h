// Where the tuner's tests find their fixture files (tests/tune/fixtures): the synthetic profiles
// that plan offline without a GPU. ctest sets PDSERVE_SOURCE_DIR for every test.
#pragma once

#include <cstdlib>
#include <string>

namespace pdserve::tune::testing {

inline std::string fixture_path(const std::string& name) {
  const char* source = std::getenv("PDSERVE_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/tune/fixtures/" + name;
}

}  // namespace pdserve::tune::testing
