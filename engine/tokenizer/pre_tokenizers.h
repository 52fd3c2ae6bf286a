// tokenizer.json pre-tokenizers: how a normalized segment is cut into the words the model
// encodes one by one. Each step maps every piece the previous step made to zero or more
// pieces, as the Hugging Face tokenizers library's pre-tokenizer of that name splits a
// PreTokenizedString; a Sequence is flattened into its steps.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "engine/tokenizer/regex.h"

namespace pdserve::engine {

// What a split keeps of the delimiters (the matches) and the text between them.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The tokenizers library's SplitDelimiterBehavior over the delimiters `matches` (sorted,
// non-overlapping, non-empty) of a text of `length` bytes: the spans that become pieces.
std::vector<TextSpan> split_spans(size_t length, const std::vector<TextSpan>& matches,
                                  SplitBehavior behavior, bool invert);

// Metaspace's prepend_scheme: when the replacement character goes before a piece.
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind {
    kByteLevel,        // Optional " " prefix, optional GPT-2 regex split, bytes to the alphabet.
    kSplit,            // `pattern` with `behavior`, `invert`.
    kMetaspace,        // ' ' -> `replacement`, prepend per `prepend_scheme`, split before it.
    kDigits,           // Numeric characters split off (each alone when `individual_digits`).
    kPunctuation,      // Punctuation split off with `behavior`.
    kWhitespace,       // \w+|[^\w\s]+ words, whitespace dropped.
    kWhitespaceSplit,  // Split at whitespace, which is dropped.
    kBert,             // BertPreTokenizer: WhitespaceSplit, then punctuation isolated.
  };
  Kind kind = Kind::kSplit;
  std::optional<Pattern> pattern;  // kSplit, and kByteLevel when it uses the regex.
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel.
  std::string replacement;        // kMetaspace.
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;              // kMetaspace.
  bool individual_digits = false;
};

// A piece of text on its way through the pre-tokenizer.
struct PreToken {
  std::string text;
  bool at_text_start;  // It begins at offset 0 of the whole input (Metaspace's "first").
};

// One step on `pieces`.
StatusOr<std::vector<PreToken>> apply_pre_tokenizer_step(const PreTokenizerStep& step,
                                                         std::vector<PreToken> pieces);

class PreTokenizer {
 public:
  // From the tokenizer.json "pre_tokenizer" value (null: the whole segment is one word).
  static StatusOr<PreTokenizer> from_json(const nlohmann::json& node);
  // The words of `text`, a segment that begins the input when `at_text_start`.
  StatusOr<std::vector<std::string>> apply(std::string_view text, bool at_text_start) const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace pdserve::engine
