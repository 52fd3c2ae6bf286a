#include "tests/tokenizer/tokenizer_match.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/utf8.h"

namespace pdserve::engine::testing {
namespace {

constexpr size_t kTextChars = 160;     // Of an escaped text in a mismatch report.
constexpr size_t kIdsBefore = 3;       // Ids shown before the first differing one...
constexpr size_t kIdsAfter = 6;        // ...and after it.
constexpr size_t kBytesBefore = 40;    // Decoded bytes shown before the first differing one.

const char* check_name(MatchCheck check) {
  switch (check) {
    case MatchCheck::kEncode: return "encode";
    case MatchCheck::kDecode: return "decode";
    case MatchCheck::kRoundTrip: return "round trip";
  }
  return "?";
}

// The ids of both sides from a little before `at` to a little after it, one row each.
std::string ids_side_by_side(const std::vector<int>& reference, const std::vector<int>& pdserve,
                             size_t at) {
  const size_t begin = at > kIdsBefore ? at - kIdsBefore : 0;
  const size_t end = std::min(std::max(reference.size(), pdserve.size()), at + kIdsAfter + 1);
  auto cell = [](const std::vector<int>& ids, size_t i) {
    return i < ids.size() ? absl::StrCat(ids[i]) : std::string("-");
  };
  std::string out = absl::StrFormat("      %6s %10s %10s\n", "index", "reference", "pdserve");
  for (size_t i = begin; i < end; ++i) {
    absl::StrAppendFormat(&out, "    %s %6d %10s %10s\n", i == at ? ">" : " ", i,
                          cell(reference, i), cell(pdserve, i));
  }
  return out;
}

// `bytes` escaped from a little before byte `at` (backed up to a character boundary), so the
// place where two long strings part is in view; "..." marks the cut.
std::string escape_around(std::string_view bytes, size_t at) {
  size_t start = at > kBytesBefore ? at - kBytesBefore : 0;
  while (start > 0 && (static_cast<unsigned char>(bytes[start]) & 0xC0) == 0x80) --start;
  return absl::StrCat(start > 0 ? "..." : "", escape_text(bytes.substr(start), kTextChars));
}

}  // namespace

bool MatchStats::all_match() const {
  return load_error.empty() && encode_matches == strings && decode_matches == strings &&
         round_trip_matches == strings;
}

std::optional<size_t> first_difference(const std::vector<int>& a, const std::vector<int>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  if (ia == a.end() && ib == b.end()) return std::nullopt;
  return static_cast<size_t>(ia - a.begin());
}

std::optional<size_t> first_difference(std::string_view a, std::string_view b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  if (ia == a.end() && ib == b.end()) return std::nullopt;
  return static_cast<size_t>(ia - a.begin());
}

MatchStats match_tokenizer(const Tokenizer& tokenizer, const std::vector<ReferenceCase>& cases,
                           size_t max_mismatches) {
  MatchStats stats;
  stats.strings = cases.size();
  size_t kept[3] = {0, 0, 0};  // Mismatches kept per check, so one failing check hides no other.
  auto keep = [&](MatchCheck check, Mismatch m) {
    size_t& n = kept[static_cast<int>(check)];
    if (n++ < max_mismatches) stats.mismatches.push_back(std::move(m));
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const ReferenceCase& c = cases[i];
    const StatusOr<std::vector<int>> encoded = tokenizer.encode(c.text, /*add_bos=*/true);
    const std::string encode_error = encoded.ok() ? "" : encoded.status().ToString();
    const std::vector<int> pdserve_ids = encoded.ok() ? *encoded : std::vector<int>();
    if (encoded.ok() && pdserve_ids == c.ids) {
      ++stats.encode_matches;
    } else {
      keep(MatchCheck::kEncode, {MatchCheck::kEncode, i, c.text, c.ids, pdserve_ids, encode_error, "", ""});
    }
    const std::string decoded = tokenizer.decode(c.ids);
    if (decoded == c.decoded) {
      ++stats.decode_matches;
    } else {
      keep(MatchCheck::kDecode, {MatchCheck::kDecode, i, c.text, c.ids, {}, "", c.decoded, decoded});
    }
    const std::string round_trip = encoded.ok() ? tokenizer.decode(pdserve_ids) : "";
    if (encoded.ok() && round_trip == c.decoded) {
      ++stats.round_trip_matches;
    } else {
      keep(MatchCheck::kRoundTrip,
           {MatchCheck::kRoundTrip, i, c.text, c.ids, pdserve_ids, encode_error, c.decoded, round_trip});
    }
  }
  return stats;
}

std::string escape_text(std::string_view bytes, size_t max_chars) {
  std::string out;
  size_t pos = 0;
  while (pos < bytes.size() && out.size() < max_chars) {
    const unsigned char b = static_cast<unsigned char>(bytes[pos]);
    if (b == '\n') { out += "\\n"; ++pos; continue; }
    if (b == '\r') { out += "\\r"; ++pos; continue; }
    if (b == '\t') { out += "\\t"; ++pos; continue; }
    if (b == '\\' || b == '"') { out += '\\'; out += static_cast<char>(b); ++pos; continue; }
    if (b >= 0x20 && b < 0x7f) { out += static_cast<char>(b); ++pos; continue; }
    const utf8::Sequence seq = utf8::next_sequence(bytes.substr(pos));
    if (seq.kind != utf8::SequenceKind::kComplete) {
      absl::StrAppendFormat(&out, "\\x%02X", b);
      ++pos;
      continue;
    }
    // Decode the complete sequence: the lead byte's payload bits, then six per continuation.
    static constexpr unsigned char kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    char32_t cp = b & kLeadMask[seq.length];
    for (size_t k = 1; k < seq.length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(bytes[pos + k]) & 0x3F);
    absl::StrAppendFormat(&out, "\\u{%X}", static_cast<uint32_t>(cp));
    pos += seq.length;
  }
  if (pos < bytes.size()) absl::StrAppend(&out, "... (", bytes.size(), " bytes)");
  return out;
}

std::string match_percent(size_t matches, size_t total) {
  if (total == 0 || matches == total) return "100.00";
  // Truncated, not rounded: a single mismatch never reads as 100.
  const uint64_t hundredths = static_cast<uint64_t>(matches) * 10000 / total;
  return absl::StrFormat("%d.%02d", hundredths / 100, hundredths % 100);
}

std::string format_table(const std::vector<MatchStats>& stats) {
  std::string out =
      "| tokenizer | strings | encode match % | decode match % | round-trip % | load s |\n"
      "|---|---:|---:|---:|---:|---:|\n";
  for (const MatchStats& s : stats) {
    if (!s.load_error.empty()) {
      absl::StrAppend(&out, "| ", s.name, " | ", s.strings, " | 0.00 | 0.00 | 0.00 | failed |\n");
      continue;
    }
    absl::StrAppendFormat(&out, "| %s | %d | %s | %s | %s | %.2f |\n", s.name, s.strings,
                          match_percent(s.encode_matches, s.strings),
                          match_percent(s.decode_matches, s.strings),
                          match_percent(s.round_trip_matches, s.strings), s.load_seconds);
  }
  return out;
}

std::string format_mismatch(const Mismatch& m) {
  std::string out = absl::StrCat("  case ", m.case_index, ", ", check_name(m.check), ": text \"",
                                 escape_text(m.text, kTextChars), "\"\n");
  if (!m.encode_error.empty()) {
    absl::StrAppend(&out, "    pdserve encode failed: ", m.encode_error, "\n");
    return out;
  }
  if (m.check == MatchCheck::kEncode) {
    const size_t at = first_difference(m.reference_ids, m.pdserve_ids).value_or(0);
    absl::StrAppend(&out, "    ids differ first at index ", at, " (reference ", m.reference_ids.size(),
                    " ids, pdserve ", m.pdserve_ids.size(), ")\n",
                    ids_side_by_side(m.reference_ids, m.pdserve_ids, at));
    return out;
  }
  const size_t at = first_difference(m.reference_decoded, m.pdserve_decoded).value_or(0);
  absl::StrAppend(&out, "    decoded text differs first at byte ", at, "\n",
                  "      reference \"", escape_around(m.reference_decoded, at), "\"\n",
                  "      pdserve   \"", escape_around(m.pdserve_decoded, at), "\"\n");
  if (m.check == MatchCheck::kRoundTrip) {
    if (const auto id_at = first_difference(m.reference_ids, m.pdserve_ids)) {
      absl::StrAppend(&out, "    (encode differs first at index ", *id_at, ")\n");
    }
  }
  return out;
}

nlohmann::json stats_to_json(const std::vector<MatchStats>& stats) {
  nlohmann::json rows = nlohmann::json::array();
  bool all = true;
  for (const MatchStats& s : stats) {
    all = all && s.all_match();
    nlohmann::json row = {
        {"tokenizer", s.name},
        {"strings", s.strings},
        {"encode_matches", s.encode_matches},
        {"decode_matches", s.decode_matches},
        {"round_trip_matches", s.round_trip_matches},
        {"encode_match_percent", std::stod(match_percent(s.encode_matches, s.strings))},
        {"decode_match_percent", std::stod(match_percent(s.decode_matches, s.strings))},
        {"round_trip_match_percent", std::stod(match_percent(s.round_trip_matches, s.strings))},
        {"load_seconds", s.load_seconds},
    };
    if (!s.load_error.empty()) row["load_error"] = s.load_error;
    rows.push_back(std::move(row));
  }
  return {{"tokenizers", std::move(rows)}, {"all_match", all}};
}

}  // namespace pdserve::engine::testing
