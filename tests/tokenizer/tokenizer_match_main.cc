// tokenizer_match: pdserve's tokenizers against the reference encoder on real tokenizer files.
//
//   tokenizer_match CASES_DIR [NAME...] [--json FILE] [--mismatches N]
//
// CASES_DIR is what tests/reference/tokenizer_cases.mjs wrote: CASES_DIR/NAME/{manifest.json,
// cases.jsonl}. For each NAME (default: every subdirectory with a manifest, sorted) loads
// MODELS_DIR/tokenizer.json with engine::load_tokenizer, checks every case's encode, decode and
// round trip (tokenizer_match.h), and prints the markdown match-rate table and the first
// mismatches of each check. Exits 0 when every rate is 100 %, 1 when any is not, 2 when the
// cases cannot be read.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/tokenizer.h"
#include "tests/tokenizer/reference_cases.h"
#include "tests/tokenizer/tokenizer_match.h"

namespace {

using pdserve::engine::testing::MatchStats;

std::vector<std::string> names_in(const std::string& cases_dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(cases_dir, error)) {
    if (std::filesystem::exists(entry.path() / "manifest.json")) names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Loads and checks one tokenizer; a load failure is a row of the table, not an abort.
pdserve::StatusOr<MatchStats> run_one(const std::string& cases_dir, const std::string& name,
                                      size_t max_mismatches) {
  namespace t = pdserve::engine::testing;
  const std::string dir = cases_dir + "/" + name;
  PD_ASSIGN_OR_RETURN(const t::ReferenceManifest manifest, t::read_reference_manifest(dir));
  PD_ASSIGN_OR_RETURN(const std::vector<t::ReferenceCase> cases, t::read_reference_cases(dir));
  const auto started = std::chrono::steady_clock::now();
  auto tokenizer = pdserve::engine::load_tokenizer(manifest.models_dir + "/tokenizer.json");
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  MatchStats stats;
  if (tokenizer.ok()) {
    stats = t::match_tokenizer(**tokenizer, cases, max_mismatches);
  } else {
    stats.strings = cases.size();
    stats.load_error = tokenizer.status().ToString();
  }
  stats.name = name;
  stats.load_seconds = load_seconds;
  return stats;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Compares pdserve's tokenizers with the reference encoder's recorded cases"};
  std::string cases_dir;
  std::vector<std::string> names;
  std::string json_path;
  size_t max_mismatches = 5;
  app.add_option("cases_dir", cases_dir, "Directory written by tests/reference/tokenizer_cases.mjs")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("names", names, "Tokenizers to check (default: every subdirectory with a manifest)");
  app.add_option("--json", json_path, "Also write the numbers to this file");
  app.add_option("--mismatches", max_mismatches, "Mismatches shown per tokenizer and check");
  CLI11_PARSE(app, argc, argv);
  if (names.empty()) names = names_in(cases_dir);
  if (names.empty()) {
    std::fprintf(stderr, "tokenizer_match: no NAME/manifest.json under %s\n", cases_dir.c_str());
    return 2;
  }

  std::vector<MatchStats> all;
  for (const std::string& name : names) {
    pdserve::StatusOr<MatchStats> stats = run_one(cases_dir, name, max_mismatches);
    if (!stats.ok()) {
      std::fprintf(stderr, "tokenizer_match: %s: %s\n", name.c_str(), stats.status().ToString().c_str());
      return 2;
    }
    all.push_back(*std::move(stats));
  }

  std::printf("%s", pdserve::engine::testing::format_table(all).c_str());
  bool all_match = true;
  for (const MatchStats& s : all) {
    all_match = all_match && s.all_match();
    if (s.all_match()) continue;
    std::printf("\n%s mismatches (first %zu per check):\n", s.name.c_str(), max_mismatches);
    if (!s.load_error.empty()) std::printf("  load failed: %s\n", s.load_error.c_str());
    for (const auto& m : s.mismatches) std::printf("%s", pdserve::engine::testing::format_mismatch(m).c_str());
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::trunc);
    out << pdserve::engine::testing::stats_to_json(all).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "tokenizer_match: cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  return all_match ? 0 : 1;
}
