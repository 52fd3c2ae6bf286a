// Helpers shared by the tokenizer tests: where the bundled model's files are, a fresh
// temporary directory per test, and whole-file reads and writes.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

namespace pdserve::engine::testing {

inline std::filesystem::path stories_dir() {
  const char* source = std::getenv("PDSERVE_SOURCE_DIR");
  return std::filesystem::path(source ? source : ".") / ".." / "shared" / "models" / "stories260K";
}

inline std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

inline void write_all(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A directory unique to the running test, emptied first.
inline std::filesystem::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("pdserve_tokenizer_test_" + std::to_string(::getpid())) /
                                    (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace pdserve::engine::testing
