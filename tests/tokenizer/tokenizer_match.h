// Compares a pdserve tokenizer with the reference encoder's cases (reference_cases.h) and
// reports the match rates: encode(text) against the reference ids, decode(ids) against the
// reference decode, and the round trip decode(encode(text)) against the reference's. Pure
// functions over a Tokenizer and the cases, so the report's logic is table-tested; the program
// around them is tokenizer_match_main.cc.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer.h"
#include "tests/tokenizer/reference_cases.h"

namespace pdserve::engine::testing {

// What one comparison checks.
enum class MatchCheck { kEncode, kDecode, kRoundTrip };

// One case that failed one check, with both sides for the report.
struct Mismatch {
  MatchCheck check;
  size_t case_index;  // 0-based line of cases.jsonl.
  std::string text;
  std::vector<int> reference_ids;
  std::vector<int> pdserve_ids;     // kEncode, kRoundTrip: what encode gave.
  std::string encode_error;         // Non-empty when encode returned an error.
  std::string reference_decoded;    // kDecode, kRoundTrip.
  std::string pdserve_decoded;
};

// One tokenizer's tally.
struct MatchStats {
  std::string name;
  size_t strings = 0;
  size_t encode_matches = 0;
  size_t decode_matches = 0;
  size_t round_trip_matches = 0;
  double load_seconds = 0;
  std::string load_error;  // Non-empty: the tokenizer did not load; every check failed.
  std::vector<Mismatch> mismatches;  // The first few, in case order.

  bool all_match() const;
};

// Runs the three checks on every case, keeping the first `max_mismatches` mismatches.
MatchStats match_tokenizer(const Tokenizer& tokenizer, const std::vector<ReferenceCase>& cases,
                           size_t max_mismatches);

// The index of the first element where `a` and `b` differ (the shorter length when one is a
// prefix of the other); nullopt when they are equal.
std::optional<size_t> first_difference(const std::vector<int>& a, const std::vector<int>& b);
std::optional<size_t> first_difference(std::string_view a, std::string_view b);

// `bytes` as one readable line: printable ASCII kept, \n \r \t \\ \" escaped, every other code
// point as \u{HEX} (so a decomposed accent or a NBSP is visible), invalid bytes as \xHH; cut
// after `max_chars` output characters with the total size noted.
std::string escape_text(std::string_view bytes, size_t max_chars);

// A percentage that reads 100 only when every case matched (99.996 % prints as 99.99).
std::string match_percent(size_t matches, size_t total);

// The markdown table: tokenizer | strings | encode match % | decode match % | round-trip % | load s.
std::string format_table(const std::vector<MatchStats>& stats);

// One mismatch as a few lines: the check, the escaped text, the first differing index and the
// ids (or strings) of both sides around it.
std::string format_mismatch(const Mismatch& mismatch);

// The numbers of format_table, for --json.
nlohmann::json stats_to_json(const std::vector<MatchStats>& stats);

}  // namespace pdserve::engine::testing
