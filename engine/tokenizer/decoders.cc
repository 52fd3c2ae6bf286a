#include "engine/tokenizer/decoders.h"

#include <nlohmann/json.hpp>

#include "engine/tokenizer/byte_level_alphabet.h"
#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/unicode.h"

namespace pdserve::engine {
namespace {

using json_fields::Json;

// "<0xNN>": the byte; else -1. Hex digits of either case, as the library's from_str_radix.
int byte_piece_value(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') {
      value += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

// The WordPiece decoder's cleanup of English tokenization artifacts: the library's
// replacements, one after another.
std::string cleanup(std::string_view text) {
  static constexpr std::pair<std::string_view, std::string_view> kReplacements[] = {
      {" .", "."},   {" ?", "?"},   {" !", "!"},         {" ,", ","},   {" ' ", "'"},   {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  std::string out(text);
  for (const auto& [from, to] : kReplacements) {
    std::string replaced;
    size_t last = 0;
    for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, last)) {
      replaced.append(out, last, at - last);
      replaced.append(to);
      last = at + from.size();
    }
    replaced.append(out, last, std::string::npos);
    out = std::move(replaced);
  }
  return out;
}

std::string strip(const DecoderStep& step, std::string_view piece, bool first) {
  const std::vector<unicode::CodePoint> cps = unicode::code_points(piece);
  const std::vector<unicode::CodePoint> content = unicode::code_points(step.strip_content);
  const char32_t target = content.empty() ? 0 : content[0].value;
  size_t begin = 0;
  size_t end = cps.size();
  // Before the tokens are joined every token is stripped; after, only the string's start.
  if (first || !step.after_join) {
    while (begin < end && begin < size_t(step.strip_start) && cps[begin].value == target) ++begin;
  }
  for (int i = 0; i < step.strip_stop && end > begin && cps[end - 1].value == target; ++i) --end;
  if (begin == end) return std::string();
  return std::string(piece.substr(cps[begin].begin, cps[end - 1].begin + cps[end - 1].length - cps[begin].begin));
}

Status parse_into(const Json& node, std::vector<DecoderStep>& steps, bool& joined) {
  PD_ASSIGN_OR_RETURN(const std::string type, json_fields::type_of(node, "decoder"));
  if (type == "Sequence") {
    PD_ASSIGN_OR_RETURN(const Json* children, json_fields::array_member(node, "decoders"));
    for (const Json& child : *children) PD_RETURN_IF_ERROR(parse_into(child, steps, joined));
    return absl::OkStatus();
  }
  DecoderStep step;
  step.after_join = joined;
  // Steps after the tokens are joined see one string; only those that act the same on each
  // token's share of it are accepted there.
  const auto refuse_after_join = [&](std::string_view why) -> Status {
    if (!joined) return absl::OkStatus();
    return absl::UnimplementedError(
        absl::StrCat("unsupported decoder ", type, " after the tokens are joined (", std::string(why), ")"));
  };
  if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
    joined = true;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
    joined = true;
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
    PD_RETURN_IF_ERROR(refuse_after_join("byte pieces are no longer tokens"));
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    PD_RETURN_IF_ERROR(refuse_after_join("it would drop every replacement character"));
    PD_ASSIGN_OR_RETURN(step.replacement, json_fields::string_member(node, "replacement"));
    PD_ASSIGN_OR_RETURN(const std::optional<std::string> scheme,
                        json_fields::optional_string(node, "prepend_scheme"));
    if (scheme) {
      if (*scheme != "always" && *scheme != "first" && *scheme != "never") {
        return json_fields::unsupported("Metaspace prepend_scheme", *scheme);
      }
      step.prepend = *scheme != "never";
    } else {
      PD_ASSIGN_OR_RETURN(step.prepend, json_fields::bool_member(node, "add_prefix_space", true));
    }
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    PD_ASSIGN_OR_RETURN(step.strip_content, json_fields::string_member(node, "content"));
    if (unicode::code_points(step.strip_content).size() != 1) {
      return absl::InvalidArgumentError("Strip decoder content must be one character");
    }
    PD_ASSIGN_OR_RETURN(step.strip_start, json_fields::int_member(node, "start", 0));
    PD_ASSIGN_OR_RETURN(step.strip_stop, json_fields::int_member(node, "stop", 0));
    if (step.strip_start < 0 || step.strip_stop < 0) {
      return absl::InvalidArgumentError("Strip decoder start and stop must be >= 0");
    }
    if (step.strip_stop > 0) {
      PD_RETURN_IF_ERROR(refuse_after_join("stripping the end needs the last token"));
    }
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    PD_ASSIGN_OR_RETURN(const Json* pattern, json_fields::member(node, "pattern"));
    PD_ASSIGN_OR_RETURN(step.content, json_fields::string_member(node, "content"));
    if (pattern->is_object() && pattern->contains("String")) {
      PD_ASSIGN_OR_RETURN(const std::string text, json_fields::string_member(*pattern, "String"));
      if (unicode::code_points(text).size() != 1) {
        PD_RETURN_IF_ERROR(refuse_after_join("a match could span two tokens"));
      }
      PD_ASSIGN_OR_RETURN(step.pattern, Pattern::compile(text, Pattern::Kind::kLiteral));
    } else {
      PD_ASSIGN_OR_RETURN(const std::string text, json_fields::string_member(*pattern, "Regex"));
      PD_RETURN_IF_ERROR(refuse_after_join("a match could span two tokens"));
      PD_ASSIGN_OR_RETURN(step.pattern, Pattern::compile(text, Pattern::Kind::kRegex));
    }
  } else if (type == "WordPiece") {
    step.kind = DecoderStep::Kind::kWordPiece;
    PD_RETURN_IF_ERROR(refuse_after_join("it acts on each token"));
    PD_ASSIGN_OR_RETURN(const std::optional<std::string> prefix,
                        json_fields::optional_string(node, "prefix"));
    step.prefix = prefix.value_or("##");
    PD_ASSIGN_OR_RETURN(step.cleanup, json_fields::bool_member(node, "cleanup", true));
  } else {
    return json_fields::unsupported("decoder", type);
  }
  steps.push_back(std::move(step));
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::string> apply_decoder_step(const DecoderStep& step, std::string_view piece,
                                         bool first, bool added) {
  switch (step.kind) {
    case DecoderStep::Kind::kByteLevel: {
      std::string bytes;
      // A piece with characters outside the alphabet (an added token) is its own text.
      if (added || !byte_level::decode(piece, bytes)) return std::string(piece);
      return bytes;
    }
    case DecoderStep::Kind::kMetaspace: {
      std::string out;
      size_t pos = 0;
      while (pos < piece.size()) {
        if (piece.substr(pos, step.replacement.size()) == step.replacement) {
          // The library drops every replacement character of the first token.
          if (!(first && step.prepend)) out += ' ';
          pos += step.replacement.size();
        } else {
          out += piece[pos++];
        }
      }
      return out;
    }
    case DecoderStep::Kind::kByteFallback: {
      const int byte = byte_piece_value(piece);
      return byte >= 0 ? std::string(1, static_cast<char>(byte)) : std::string(piece);
    }
    case DecoderStep::Kind::kFuse:
      return std::string(piece);
    case DecoderStep::Kind::kStrip:
      return strip(step, piece, first);
    case DecoderStep::Kind::kReplace:
      return step.pattern->replace_all(piece, step.content);
    case DecoderStep::Kind::kWordPiece: {
      std::string out(piece);
      if (!first) {
        if (out.rfind(step.prefix, 0) == 0) {
          out.erase(0, step.prefix.size());
        } else {
          out.insert(0, 1, ' ');
        }
      }
      return step.cleanup ? cleanup(out) : out;
    }
  }
  return std::string(piece);
}

StatusOr<Decoder> Decoder::from_json(const Json& node) {
  Decoder decoder;
  if (node.is_null()) {
    decoder.join_with_spaces_ = true;
    return decoder;
  }
  bool joined = false;
  PD_RETURN_IF_ERROR(parse_into(node, decoder.steps_, joined));
  return decoder;
}

StatusOr<std::string> Decoder::decode(std::string_view piece, bool first, bool added) const {
  if (join_with_spaces_) return first ? std::string(piece) : " " + std::string(piece);
  std::string out(piece);
  for (const DecoderStep& step : steps_) {
    PD_ASSIGN_OR_RETURN(out, apply_decoder_step(step, out, first, added));
  }
  return out;
}

}  // namespace pdserve::engine
