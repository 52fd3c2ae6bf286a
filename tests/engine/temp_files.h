// Scratch directories for the filesystem-tier tests (fs_kv_tier_test.cc, fs_tier_test.cc): a
// fresh one per test and process, and what a tier left in it (its chunk files, temporary files).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace pdserve::testing {

// An empty directory `<test temp dir>/pdserve-<name>-<pid>` (removed first if it exists).
inline std::string fresh_dir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("pdserve-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The regular files under `dir` whose path ends with `suffix`.
inline std::vector<std::filesystem::path> files_in(const std::string& dir, const std::string& suffix) {
  std::vector<std::filesystem::path> out;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
    if (f.is_regular_file() && f.path().string().ends_with(suffix)) out.push_back(f.path());
  return out;
}

// Whether a writer's temporary file (`<final>.tmp.<pid>.<random>`) is under `dir`.
inline bool has_temp_files(const std::string& dir) {
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
    if (f.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

}  // namespace pdserve::testing
