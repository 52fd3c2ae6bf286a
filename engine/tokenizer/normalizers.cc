#include "engine/tokenizer/normalizers.h"

#include <nlohmann/json.hpp>

#include "engine/tokenizer/json_fields.h"

namespace pdserve::engine {
namespace {

using json_fields::Json;

// A pattern object: {"String": "..."} or {"Regex": "..."}.
StatusOr<Pattern> parse_pattern(const Json& node) {
  PD_ASSIGN_OR_RETURN(const Json* pattern, json_fields::member(node, "pattern"));
  if (pattern->is_object() && pattern->contains("String")) {
    PD_ASSIGN_OR_RETURN(const std::string text, json_fields::string_member(*pattern, "String"));
    return Pattern::compile(text, Pattern::Kind::kLiteral);
  }
  PD_ASSIGN_OR_RETURN(const std::string text, json_fields::string_member(*pattern, "Regex"));
  return Pattern::compile(text, Pattern::Kind::kRegex);
}

std::string strip_whitespace(std::string_view text, bool left, bool right) {
  const std::vector<unicode::CodePoint> cps = unicode::code_points(text);
  size_t first = 0;
  size_t last = cps.size();
  if (left) {
    while (first < last && unicode::is_whitespace(cps[first].value)) ++first;
  }
  if (right) {
    while (last > first && unicode::is_whitespace(cps[last - 1].value)) --last;
  }
  if (first == last) return std::string();
  const size_t begin = cps[first].begin;
  const size_t end = cps[last - 1].begin + cps[last - 1].length;
  return std::string(text.substr(begin, end - begin));
}

// Keeps the code points `keep` accepts.
template <typename Predicate>
std::string filter_code_points(std::string_view text, const Predicate& keep) {
  std::string out;
  out.reserve(text.size());
  for (const unicode::CodePoint& cp : unicode::code_points(text)) {
    if (keep(cp.value)) out.append(text.substr(cp.begin, cp.length));
  }
  return out;
}

// BertNormalizer, as tokenizers' bert.rs: clean (drop NUL, U+FFFD, controls; whitespace to
// ' '), spaces around CJK characters, strip accents (NFD, drop Mn), lowercase.
std::string bert_normalize(const NormalizerStep& step, std::string_view input) {
  std::string text(input);
  if (step.bert_clean_text) {
    std::string cleaned;
    for (const unicode::CodePoint& cp : unicode::code_points(text)) {
      if (cp.value == 0 || cp.value == 0xFFFD || unicode::is_control(cp.value)) continue;
      if (unicode::is_whitespace(cp.value)) {
        cleaned += ' ';
      } else {
        cleaned.append(text, cp.begin, cp.length);
      }
    }
    text = std::move(cleaned);
  }
  if (step.bert_handle_chinese_chars) {
    std::string spaced;
    for (const unicode::CodePoint& cp : unicode::code_points(text)) {
      const bool cjk = unicode::is_chinese_char(cp.value);
      if (cjk) spaced += ' ';
      spaced.append(text, cp.begin, cp.length);
      if (cjk) spaced += ' ';
    }
    text = std::move(spaced);
  }
  if (step.bert_strip_accents) {
    text = filter_code_points(unicode::normalize(text, unicode::NormalizationForm::kNfd),
                              [](char32_t c) { return !unicode::is_nonspacing_mark(c); });
  }
  if (step.bert_lowercase) text = unicode::lowercase(text);
  return text;
}

Status parse_into(const Json& node, std::vector<NormalizerStep>& steps) {
  if (node.is_null()) return absl::OkStatus();
  PD_ASSIGN_OR_RETURN(const std::string type, json_fields::type_of(node, "normalizer"));
  NormalizerStep step;
  if (type == "Sequence") {
    PD_ASSIGN_OR_RETURN(const Json* children, json_fields::array_member(node, "normalizers"));
    for (const Json& child : *children) PD_RETURN_IF_ERROR(parse_into(child, steps));
    return absl::OkStatus();
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = NormalizerStep::Kind::kUnicode;
    step.form = type == "NFC"    ? unicode::NormalizationForm::kNfc
                : type == "NFD"  ? unicode::NormalizationForm::kNfd
                : type == "NFKC" ? unicode::NormalizationForm::kNfkc
                                 : unicode::NormalizationForm::kNfkd;
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    PD_ASSIGN_OR_RETURN(step.pattern, parse_pattern(node));
    PD_ASSIGN_OR_RETURN(step.content, json_fields::string_member(node, "content"));
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    PD_ASSIGN_OR_RETURN(step.content, json_fields::string_member(node, "prepend"));
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::kStrip;
    PD_ASSIGN_OR_RETURN(step.strip_left, json_fields::bool_member(node, "strip_left", true));
    PD_ASSIGN_OR_RETURN(step.strip_right, json_fields::bool_member(node, "strip_right", true));
  } else if (type == "Lowercase") {
    step.kind = NormalizerStep::Kind::kLowercase;
  } else if (type == "StripAccents") {
    step.kind = NormalizerStep::Kind::kStripAccents;
  } else if (type == "BertNormalizer") {
    step.kind = NormalizerStep::Kind::kBert;
    PD_ASSIGN_OR_RETURN(step.bert_clean_text, json_fields::bool_member(node, "clean_text", true));
    PD_ASSIGN_OR_RETURN(step.bert_handle_chinese_chars,
                        json_fields::bool_member(node, "handle_chinese_chars", true));
    PD_ASSIGN_OR_RETURN(step.bert_lowercase, json_fields::bool_member(node, "lowercase", true));
    // strip_accents: null follows lowercase.
    PD_ASSIGN_OR_RETURN(step.bert_strip_accents,
                        json_fields::bool_member(node, "strip_accents", step.bert_lowercase));
  } else {
    return json_fields::unsupported("normalizer", type);
  }
  steps.push_back(std::move(step));
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::string> apply_normalizer_step(const NormalizerStep& step, std::string_view text) {
  switch (step.kind) {
    case NormalizerStep::Kind::kUnicode:
      return unicode::normalize(text, step.form);
    case NormalizerStep::Kind::kReplace:
      return step.pattern->replace_all(text, step.content);
    case NormalizerStep::Kind::kPrepend:
      return text.empty() ? std::string() : step.content + std::string(text);
    case NormalizerStep::Kind::kStrip:
      return strip_whitespace(text, step.strip_left, step.strip_right);
    case NormalizerStep::Kind::kLowercase:
      return unicode::lowercase(text);
    case NormalizerStep::Kind::kStripAccents:
      return filter_code_points(text, [](char32_t c) { return !unicode::is_mark(c); });
    case NormalizerStep::Kind::kBert:
      return bert_normalize(step, text);
  }
  return std::string(text);
}

StatusOr<Normalizer> Normalizer::from_json(const nlohmann::json& node) {
  Normalizer normalizer;
  PD_RETURN_IF_ERROR(parse_into(node, normalizer.steps_));
  return normalizer;
}

StatusOr<std::string> Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (const NormalizerStep& step : steps_) {
    PD_ASSIGN_OR_RETURN(out, apply_normalizer_step(step, out));
  }
  return out;
}

}  // namespace pdserve::engine
