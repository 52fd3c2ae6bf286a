#include "engine/tokenizer/pre_tokenizers.h"

#include <nlohmann/json.hpp>

#include "engine/tokenizer/byte_level_alphabet.h"
#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/unicode.h"

namespace pdserve::engine {
namespace {

using json_fields::Json;

// The pattern GPT-2's ByteLevel pre-tokenizer splits with when use_regex is on.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Whitespace pre-tokenizer's words.
constexpr std::string_view kWhitespacePattern = R"(\w+|[^\w\s]+)";

struct MarkedSpan {
  TextSpan span;
  bool delimiter;
};

StatusOr<SplitBehavior> parse_behavior(const Json& node) {
  PD_ASSIGN_OR_RETURN(const std::string behavior, json_fields::string_member(node, "behavior"));
  if (behavior == "Removed") return SplitBehavior::kRemoved;
  if (behavior == "Isolated") return SplitBehavior::kIsolated;
  if (behavior == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (behavior == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (behavior == "Contiguous") return SplitBehavior::kContiguous;
  return json_fields::unsupported("Split behavior", behavior);
}

// Each code point `matches` accepts is a delimiter of its own (the tokenizers library's
// char-predicate patterns).
template <typename Predicate>
std::vector<TextSpan> char_matches(std::string_view text, const Predicate& matches) {
  std::vector<TextSpan> spans;
  for (const unicode::CodePoint& cp : unicode::code_points(text)) {
    if (matches(cp.value)) spans.push_back({cp.begin, cp.begin + cp.length});
  }
  return spans;
}

// Replaces every piece with the pieces `split_one` cuts it into (spans of its text).
template <typename SplitOne>
StatusOr<std::vector<PreToken>> split_each(std::vector<PreToken> pieces, const SplitOne& split_one) {
  std::vector<PreToken> out;
  for (PreToken& piece : pieces) {
    PD_ASSIGN_OR_RETURN(const std::vector<TextSpan> spans, split_one(piece.text));
    for (const TextSpan& span : spans) {
      if (span.end == span.begin) continue;  // Empty pieces are dropped.
      out.push_back({piece.text.substr(span.begin, span.end - span.begin),
                     piece.at_text_start && span.begin == 0});
    }
  }
  return out;
}

Status parse_into(const Json& node, std::vector<PreTokenizerStep>& steps) {
  if (node.is_null()) return absl::OkStatus();
  PD_ASSIGN_OR_RETURN(const std::string type, json_fields::type_of(node, "pre_tokenizer"));
  PreTokenizerStep step;
  if (type == "Sequence") {
    PD_ASSIGN_OR_RETURN(const Json* children, json_fields::array_member(node, "pretokenizers"));
    for (const Json& child : *children) PD_RETURN_IF_ERROR(parse_into(child, steps));
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    PD_ASSIGN_OR_RETURN(step.add_prefix_space,
                        json_fields::bool_member(node, "add_prefix_space", true));
    PD_ASSIGN_OR_RETURN(const bool use_regex, json_fields::bool_member(node, "use_regex", true));
    if (use_regex) {
      PD_ASSIGN_OR_RETURN(step.pattern, Pattern::compile(kGpt2Pattern, Pattern::Kind::kRegex));
    }
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    PD_ASSIGN_OR_RETURN(const Json* pattern, json_fields::member(node, "pattern"));
    if (pattern->is_object() && pattern->contains("String")) {
      PD_ASSIGN_OR_RETURN(const std::string text, json_fields::string_member(*pattern, "String"));
      PD_ASSIGN_OR_RETURN(step.pattern, Pattern::compile(text, Pattern::Kind::kLiteral));
    } else {
      PD_ASSIGN_OR_RETURN(const std::string text, json_fields::string_member(*pattern, "Regex"));
      PD_ASSIGN_OR_RETURN(step.pattern, Pattern::compile(text, Pattern::Kind::kRegex));
    }
    PD_ASSIGN_OR_RETURN(step.behavior, parse_behavior(node));
    PD_ASSIGN_OR_RETURN(step.invert, json_fields::bool_member(node, "invert", false));
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    PD_ASSIGN_OR_RETURN(step.replacement, json_fields::string_member(node, "replacement"));
    if (unicode::code_points(step.replacement).size() != 1) {
      return absl::InvalidArgumentError("Metaspace replacement must be one character");
    }
    PD_ASSIGN_OR_RETURN(const std::optional<std::string> scheme,
                        json_fields::optional_string(node, "prepend_scheme"));
    if (!scheme) {  // Files from before prepend_scheme: add_prefix_space decides.
      PD_ASSIGN_OR_RETURN(const bool add, json_fields::bool_member(node, "add_prefix_space", true));
      step.prepend_scheme = add ? PrependScheme::kAlways : PrependScheme::kNever;
    } else if (*scheme == "always") {
      step.prepend_scheme = PrependScheme::kAlways;
    } else if (*scheme == "first") {
      step.prepend_scheme = PrependScheme::kFirst;
    } else if (*scheme == "never") {
      step.prepend_scheme = PrependScheme::kNever;
    } else {
      return json_fields::unsupported("Metaspace prepend_scheme", *scheme);
    }
    PD_ASSIGN_OR_RETURN(step.split, json_fields::bool_member(node, "split", true));
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    PD_ASSIGN_OR_RETURN(step.individual_digits,
                        json_fields::bool_member(node, "individual_digits", false));
  } else if (type == "Punctuation") {
    step.kind = PreTokenizerStep::Kind::kPunctuation;
    if (node.contains("behavior")) {
      PD_ASSIGN_OR_RETURN(step.behavior, parse_behavior(node));
    }
  } else if (type == "Whitespace") {
    step.kind = PreTokenizerStep::Kind::kWhitespace;
    PD_ASSIGN_OR_RETURN(step.pattern, Pattern::compile(kWhitespacePattern, Pattern::Kind::kRegex));
  } else if (type == "WhitespaceSplit") {
    step.kind = PreTokenizerStep::Kind::kWhitespaceSplit;
  } else if (type == "BertPreTokenizer") {
    step.kind = PreTokenizerStep::Kind::kBert;
  } else {
    return json_fields::unsupported("pre_tokenizer", type);
  }
  steps.push_back(std::move(step));
  return absl::OkStatus();
}

StatusOr<std::vector<TextSpan>> no_error(std::vector<TextSpan> spans) { return spans; }

}  // namespace

std::vector<TextSpan> split_spans(size_t length, const std::vector<TextSpan>& matches,
                                  SplitBehavior behavior, bool invert) {
  // The text as alternating delimiter and non-delimiter spans (invert swaps the roles).
  std::vector<MarkedSpan> marked;
  size_t last = 0;
  for (const TextSpan& match : matches) {
    if (match.begin > last) marked.push_back({{last, match.begin}, invert});
    marked.push_back({match, !invert});
    last = match.end;
  }
  if (last < length) marked.push_back({{last, length}, invert});

  std::vector<MarkedSpan> kept;
  bool previous_delimiter = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const MarkedSpan& m : marked) {
        if (!m.delimiter) kept.push_back(m);
      }
      break;
    case SplitBehavior::kIsolated:
      kept = marked;
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const MarkedSpan& m : marked) {
        if (m.delimiter && !previous_delimiter && !kept.empty()) {
          kept.back().span.end = m.span.end;
        } else {
          kept.push_back(m);
        }
        previous_delimiter = m.delimiter;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = marked.rbegin(); it != marked.rend(); ++it) {
        if (it->delimiter && !previous_delimiter && !kept.empty()) {
          kept.back().span.begin = it->span.begin;
        } else {
          kept.push_back(*it);
        }
        previous_delimiter = it->delimiter;
      }
      kept = std::vector<MarkedSpan>(kept.rbegin(), kept.rend());
      break;
    case SplitBehavior::kContiguous:
      for (const MarkedSpan& m : marked) {
        if (m.delimiter == previous_delimiter && !kept.empty()) {
          kept.back().span.end = m.span.end;
        } else {
          kept.push_back(m);
        }
        previous_delimiter = m.delimiter;
      }
      break;
  }
  std::vector<TextSpan> spans;
  spans.reserve(kept.size());
  for (const MarkedSpan& m : kept) spans.push_back(m.span);
  return spans;
}

StatusOr<std::vector<PreToken>> apply_pre_tokenizer_step(const PreTokenizerStep& step,
                                                         std::vector<PreToken> pieces) {
  using Kind = PreTokenizerStep::Kind;
  const auto by_pattern = [&](SplitBehavior behavior, bool invert) {
    return [&step, behavior, invert](std::string_view text) -> StatusOr<std::vector<TextSpan>> {
      PD_ASSIGN_OR_RETURN(const std::vector<TextSpan> matches, step.pattern->find_all(text));
      return split_spans(text.size(), matches, behavior, invert);
    };
  };
  switch (step.kind) {
    case Kind::kByteLevel: {
      if (step.add_prefix_space) {
        for (PreToken& piece : pieces) {
          if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(0, 1, ' ');
        }
      }
      if (step.pattern) {
        PD_ASSIGN_OR_RETURN(pieces, split_each(std::move(pieces),
                                               by_pattern(SplitBehavior::kIsolated, false)));
      }
      for (PreToken& piece : pieces) piece.text = byte_level::encode(piece.text);
      return pieces;
    }
    case Kind::kSplit:
      return split_each(std::move(pieces), by_pattern(step.behavior, step.invert));
    case Kind::kMetaspace: {
      for (PreToken& piece : pieces) {
        std::string replaced;
        for (char c : piece.text) {
          if (c == ' ') {
            replaced += step.replacement;
          } else {
            replaced += c;
          }
        }
        const bool starts_with_replacement = replaced.rfind(step.replacement, 0) == 0;
        const bool prepend =
            !starts_with_replacement &&
            (step.prepend_scheme == PrependScheme::kAlways ||
             (step.prepend_scheme == PrependScheme::kFirst && piece.at_text_start));
        piece.text = prepend ? step.replacement + replaced : std::move(replaced);
      }
      if (!step.split) return pieces;
      const std::string& replacement = step.replacement;
      return split_each(std::move(pieces), [&replacement](std::string_view text) {
        std::vector<TextSpan> matches;
        for (size_t at = text.find(replacement); at != std::string_view::npos;
             at = text.find(replacement, at + replacement.size())) {
          matches.push_back({at, at + replacement.size()});
        }
        return no_error(split_spans(text.size(), matches, SplitBehavior::kMergedWithNext, false));
      });
    }
    case Kind::kDigits: {
      const SplitBehavior behavior =
          step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
      return split_each(std::move(pieces), [behavior](std::string_view text) {
        return no_error(split_spans(text.size(), char_matches(text, unicode::is_numeric),
                                    behavior, false));
      });
    }
    case Kind::kPunctuation: {
      const SplitBehavior behavior = step.behavior;
      return split_each(std::move(pieces), [behavior](std::string_view text) {
        return no_error(split_spans(text.size(), char_matches(text, unicode::is_punctuation),
                                    behavior, false));
      });
    }
    case Kind::kWhitespace:
      return split_each(std::move(pieces), by_pattern(SplitBehavior::kRemoved, true));
    case Kind::kWhitespaceSplit:
    case Kind::kBert: {
      PD_ASSIGN_OR_RETURN(pieces, split_each(std::move(pieces), [](std::string_view text) {
        return no_error(split_spans(text.size(), char_matches(text, unicode::is_whitespace),
                                    SplitBehavior::kRemoved, false));
      }));
      if (step.kind == Kind::kWhitespaceSplit) return pieces;
      return split_each(std::move(pieces), [](std::string_view text) {
        return no_error(split_spans(text.size(), char_matches(text, unicode::is_punctuation),
                                    SplitBehavior::kIsolated, false));
      });
    }
  }
  return pieces;
}

StatusOr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& node) {
  PreTokenizer pre_tokenizer;
  PD_RETURN_IF_ERROR(parse_into(node, pre_tokenizer.steps_));
  return pre_tokenizer;
}

StatusOr<std::vector<std::string>> PreTokenizer::apply(std::string_view text,
                                                       bool at_text_start) const {
  std::vector<PreToken> pieces{{std::string(text), at_text_start}};
  for (const PreTokenizerStep& step : steps_) {
    PD_ASSIGN_OR_RETURN(pieces, apply_pre_tokenizer_step(step, std::move(pieces)));
  }
  std::vector<std::string> words;
  words.reserve(pieces.size());
  for (PreToken& piece : pieces) {
    if (!piece.text.empty()) words.push_back(std::move(piece.text));
  }
  return words;
}

}  // namespace pdserve::engine
