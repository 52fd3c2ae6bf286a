#include "engine/tokenizer/hf_tokenizer_json.h"

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

using nlohmann::json;

// The pattern GPT-2's ByteLevel pre-tokenizer splits with when use_regex is on.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A token id: an integer JSON number in [0, INT_MAX]. (nlohmann's get<int>() converts any number,
// and a float beyond int's range is undefined behaviour: the fuzzer found 5e102.)
StatusOr<int> token_id(const json& value, const std::string& name, const std::string& what) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() <= uint64_t(INT32_MAX)) return int(value.get<uint64_t>());
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0 && v <= INT32_MAX) return int(v);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": ", what, " must be an integer in [0, 2^31), not ", value.dump()));
}

Status unsupported(const std::string& name, const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(name, ": unsupported tokenizer.json feature: ", what));
}

// True if any object in `node` (recursively) has "type": `type`.
bool contains_type(const json& node, const std::string& type) {
  if (node.is_object()) {
    auto it = node.find("type");
    if (it != node.end() && it->is_string() && it->get<std::string>() == type) return true;
  }
  if (node.is_structured()) {
    for (const json& child : node) {
      if (contains_type(child, type)) return true;
    }
  }
  return false;
}

StatusOr<SplitBehavior> parse_behavior(const std::string& behavior, const std::string& name) {
  if (behavior == "Isolated") return SplitBehavior::kIsolated;
  if (behavior == "Removed") return SplitBehavior::kRemoved;
  if (behavior == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (behavior == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (behavior == "Contiguous") return SplitBehavior::kContiguous;
  return unsupported(name, absl::StrCat("Split behavior ", behavior));
}

Status parse_pre_tokenizer(const json& node, const std::string& name,
                           std::vector<PreTokenizerStep>& steps) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = node.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const json& child : node.at("pretokenizers")) {
      PD_RETURN_IF_ERROR(parse_pre_tokenizer(child, name, steps));
    }
  } else if (type == "Split") {
    PreTokenizerStep step;
    const json& pattern = node.at("pattern");
    if (pattern.contains("Regex")) {
      step.pattern = pattern.at("Regex").get<std::string>();
    } else {
      step.pattern = pattern.at("String").get<std::string>();
      step.literal = true;
    }
    PD_ASSIGN_OR_RETURN(step.behavior,
                        parse_behavior(node.value("behavior", std::string("Isolated")), name));
    step.invert = node.value("invert", false);
    steps.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    if (node.value("add_prefix_space", false)) {
      steps.push_back({PreTokenizerStep::Kind::kPrependSpace});
    }
    if (node.value("use_regex", true)) {
      PreTokenizerStep step;
      step.pattern = std::string(kGpt2Pattern);
      steps.push_back(std::move(step));
    }
  } else if (type == "Digits") {
    PreTokenizerStep step;
    step.pattern = node.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)";
    steps.push_back(std::move(step));
  } else if (type == "Metaspace") {
    // SentencePiece-style files: spaces are handled by the SentencePiece tokenizer itself.
  } else {
    return unsupported(name, absl::StrCat("pre_tokenizer ", type));
  }
  return absl::OkStatus();
}

// Normalizers that leave byte-level text alone as far as this implementation goes. NFC is
// accepted as the identity: text that arrives already NFC-composed (nearly all) is unchanged.
Status check_normalizer(const json& node, bool sentencepiece_style, const std::string& name) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = node.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const json& child : node.at("normalizers")) {
      PD_RETURN_IF_ERROR(check_normalizer(child, sentencepiece_style, name));
    }
    return absl::OkStatus();
  }
  if (type == "NFC") return absl::OkStatus();
  // The SentencePiece tokenizer does its own "▁" prefixing and space replacement.
  if (sentencepiece_style && (type == "Prepend" || type == "Replace")) return absl::OkStatus();
  return unsupported(name, absl::StrCat("normalizer ", type));
}

// A special token named in tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> config_token(const json& node) {
  if (node.is_string()) return node.get<std::string>();
  if (node.is_object() && node.contains("content")) return node.at("content").get<std::string>();
  return std::nullopt;
}

// The BOS a TemplateProcessing post-processor puts before a single sequence: the template's
// first item when it is a SpecialToken. Empty when the template starts with the text.
std::optional<std::string> template_bos(const json& node) {
  if (!node.is_object()) return std::nullopt;
  const std::string type = node.value("type", std::string());
  if (type == "Sequence" && node.contains("processors")) {
    for (const json& child : node.at("processors")) {
      if (auto bos = template_bos(child)) return bos;
    }
  }
  if (type == "TemplateProcessing" && node.contains("single") && !node.at("single").empty()) {
    const json& first = node.at("single").at(0);
    if (first.contains("SpecialToken")) return first.at("SpecialToken").at("id").get<std::string>();
    return std::string();
  }
  return std::nullopt;
}

StatusOr<HfTokenizerJson> parse(const json& root, const json& config, const std::string& name) {
  HfTokenizerJson out;
  const json& model = root.at("model");
  const std::string model_type = model.value("type", std::string("BPE"));
  if (model_type != "BPE") return unsupported(name, absl::StrCat("model type ", model_type));
  const json null_node;
  const json& normalizer = root.contains("normalizer") ? root.at("normalizer") : null_node;
  const json& pre_tokenizer = root.contains("pre_tokenizer") ? root.at("pre_tokenizer") : null_node;
  out.sentencepiece_style = model.value("byte_fallback", false) ||
                            contains_type(normalizer, "Prepend") ||
                            contains_type(pre_tokenizer, "Metaspace");
  PD_RETURN_IF_ERROR(check_normalizer(normalizer, out.sentencepiece_style, name));
  PD_RETURN_IF_ERROR(parse_pre_tokenizer(pre_tokenizer, name, out.pre_tokenizer));
  out.ignore_merges = model.value("ignore_merges", false);

  for (const auto& [piece, id] : model.at("vocab").items()) {
    PD_ASSIGN_OR_RETURN(const int value, token_id(id, name, absl::StrCat("the token id of \"", piece, "\"")));
    out.vocab.emplace(piece, value);
  }
  const json no_merges = json::array();
  for (const json& merge : model.contains("merges") ? model.at("merges") : no_merges) {
    if (merge.is_array() && merge.size() == 2) {
      out.merges.emplace_back(merge.at(0).get<std::string>(), merge.at(1).get<std::string>());
      continue;
    }
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": malformed merge \"", text, "\""));
    }
    out.merges.emplace_back(text.substr(0, space), text.substr(space + 1));
  }
  if (root.contains("added_tokens")) {
    for (const json& token : root.at("added_tokens")) {
      AddedToken added;
      PD_ASSIGN_OR_RETURN(added.id, token_id(token.at("id"), name, "an added token's id"));
      added.content = token.at("content").get<std::string>();
      added.special = token.value("special", false);
      out.added_tokens.push_back(std::move(added));
    }
  }
  const auto id_of = [&](const std::string& content) -> int {
    for (const AddedToken& token : out.added_tokens) {
      if (token.content == content) return token.id;
    }
    auto it = out.vocab.find(content);
    return it == out.vocab.end() ? -1 : it->second;
  };
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    out.unk_id = id_of(model.at("unk_token").get<std::string>());
  }

  // BOS and EOS: tokenizer_config.json is authoritative; without it, the post-processor's
  // template, then the names the common model families use.
  const auto first_known = [&](std::initializer_list<const char*> names) {
    for (const char* candidate : names) {
      if (int id = id_of(candidate); id >= 0) return id;
    }
    return -1;
  };
  const json& post_processor =
      root.contains("post_processor") ? root.at("post_processor") : null_node;
  const std::optional<std::string> template_first = template_bos(post_processor);
  if (config.is_object() && config.contains("bos_token")) {
    if (auto bos = config_token(config.at("bos_token"))) out.bos_id = id_of(*bos);
  } else if (template_first) {
    out.bos_id = template_first->empty() ? -1 : id_of(*template_first);
  } else {
    out.bos_id = first_known({"<|begin_of_text|>", "<s>", "<bos>"});
  }
  if (config.is_object() && config.contains("eos_token")) {
    if (auto eos = config_token(config.at("eos_token"))) out.eos_id = id_of(*eos);
  } else {
    out.eos_id = first_known({"<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>"});
  }
  // Whether encoding starts with BOS: the config's add_bos_token, else the template's choice.
  // A post-processor without a template (GPT-2's ByteLevel) adds nothing; with none at all,
  // a BOS that exists is used.
  if (config.is_object() && config.contains("add_bos_token") &&
      config.at("add_bos_token").is_boolean()) {
    out.add_bos = config.at("add_bos_token").get<bool>();
  } else if (template_first) {
    out.add_bos = !template_first->empty();
  } else {
    out.add_bos = post_processor.is_null();
  }
  return out;
}

}  // namespace

StatusOr<HfTokenizerJson> parse_hf_tokenizer_json(std::string_view tokenizer_json,
                                                  std::string_view config_json,
                                                  const std::string& name) {
  const json root = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a valid JSON object"));
  }
  json config;
  if (!config_json.empty()) {
    config = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": the tokenizer_config.json beside it is not valid JSON"));
    }
  }
  try {
    return parse(root, config, name);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": malformed tokenizer.json: ", e.what()));
  }
}

}  // namespace pdserve::engine
