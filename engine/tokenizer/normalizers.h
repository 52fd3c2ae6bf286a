// tokenizer.json normalizers: what the text of each non-added-token segment becomes before
// pre-tokenization, one step per normalizer, a Sequence flattened into its steps. Each step
// is what the Hugging Face tokenizers library's normalizer of that name does to the string.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/unicode.h"

namespace pdserve::engine {

struct NormalizerStep {
  enum class Kind {
    kUnicode,       // NFC / NFD / NFKC / NFKD (`form`).
    kReplace,       // Every match of `pattern` becomes `content`.
    kPrepend,       // `content` before non-empty text.
    kStrip,         // Whitespace off the left and/or right.
    kLowercase,
    kStripAccents,  // Combining marks removed.
    kBert,          // BertNormalizer: the `bert_*` options.
  };
  Kind kind = Kind::kUnicode;
  unicode::NormalizationForm form = unicode::NormalizationForm::kNfc;
  std::optional<Pattern> pattern;
  std::string content;
  bool strip_left = false;
  bool strip_right = false;
  bool bert_clean_text = false;
  bool bert_handle_chinese_chars = false;
  bool bert_strip_accents = false;
  bool bert_lowercase = false;
};

// One step on `text` (valid UTF-8).
StatusOr<std::string> apply_normalizer_step(const NormalizerStep& step, std::string_view text);

class Normalizer {
 public:
  // From the tokenizer.json "normalizer" value (null: the identity). Unimplemented naming the
  // normalizer for types this does not implement (e.g. Precompiled).
  static StatusOr<Normalizer> from_json(const nlohmann::json& node);
  StatusOr<std::string> apply(std::string_view text) const;
  bool empty() const { return steps_.empty(); }

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace pdserve::engine
