#include "engine/tokenizer/hf_tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/unigram_model.h"
#include "engine/tokenizer/utf8.h"
#include "engine/tokenizer/wordpiece_model.h"

namespace pdserve::engine {
namespace {

using json_fields::Json;

// The tokenizer classes whose transformers fast tokenizer rebuilds the post-processor from
// add_bos_token / add_eos_token (update_post_processor), slow and fast names alike.
bool rebuilds_post_processor(std::string_view tokenizer_class) {
  for (std::string_view name : {"LlamaTokenizer", "GemmaTokenizer", "CodeLlamaTokenizer"}) {
    if (tokenizer_class == name || tokenizer_class == std::string(name) + "Fast") return true;
  }
  return false;
}

StatusOr<std::unique_ptr<TokenizerModel>> parse_model(const Json& model) {
  std::string type;
  if (model.is_object() && !model.contains("type") && model.contains("merges")) {
    type = "BPE";  // Files from before the model carried its type.
  } else {
    PD_ASSIGN_OR_RETURN(type, json_fields::type_of(model, "model"));
  }
  if (type == "BPE") {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<BpeModel> bpe, BpeModel::from_json(model));
    return std::unique_ptr<TokenizerModel>(std::move(bpe));
  }
  if (type == "Unigram") {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<UnigramModel> unigram, UnigramModel::from_json(model));
    return std::unique_ptr<TokenizerModel>(std::move(unigram));
  }
  if (type == "WordPiece") {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<WordPieceModel> wordpiece, WordPieceModel::from_json(model));
    return std::unique_ptr<TokenizerModel>(std::move(wordpiece));
  }
  return json_fields::unsupported("model", type);
}

// A special token named in tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> config_token(const Json& config, std::string_view key) {
  if (!config.is_object()) return std::nullopt;
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && it->at("content").is_string()) {
    return it->at("content").get<std::string>();
  }
  return std::nullopt;
}

const Json& member_or_null(const Json& node, std::string_view key) {
  static const Json null_value;
  const auto it = node.find(key);
  return it == node.end() ? null_value : *it;
}

}  // namespace

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::from_json(std::string_view tokenizer_json,
                                                              std::string_view config_json) {
  const Json root = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("not a valid JSON object");
  }
  Json config = Json::object();
  if (!config_json.empty()) {
    config = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("the tokenizer_config.json beside it is not a JSON object");
    }
  }
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer());
  PD_ASSIGN_OR_RETURN(tok->normalizer_, Normalizer::from_json(member_or_null(root, "normalizer")));
  PD_ASSIGN_OR_RETURN(tok->pre_tokenizer_,
                      PreTokenizer::from_json(member_or_null(root, "pre_tokenizer")));
  PD_ASSIGN_OR_RETURN(const Json* model, json_fields::member(root, "model"));
  PD_ASSIGN_OR_RETURN(tok->model_, parse_model(*model));
  PD_ASSIGN_OR_RETURN(tok->post_processor_,
                      PostProcessor::from_json(member_or_null(root, "post_processor")));
  PD_ASSIGN_OR_RETURN(tok->decoder_, Decoder::from_json(member_or_null(root, "decoder")));

  // Added tokens; a later entry for the same content or id replaces an earlier one.
  const Json& added = member_or_null(root, "added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return absl::InvalidArgumentError("\"added_tokens\" must be an array");
  }
  tok->vocab_size_ = tok->model_->vocab_size();
  for (const Json& entry : added) {  // null iterates as empty.
    PD_ASSIGN_OR_RETURN(AddedToken token, parse_added_token(entry));
    tok->vocab_size_ = std::max(tok->vocab_size_, token.id + 1);
    tok->added_tokens_.push_back(std::move(token));
  }
  tok->added_index_.assign(size_t(tok->vocab_size_), -1);
  tok->special_.assign(size_t(tok->vocab_size_), false);
  std::vector<AddedToken> raw;
  std::vector<std::string> raw_contents;
  std::vector<AddedToken> normalized;
  std::vector<std::string> normalized_contents;
  for (size_t i = 0; i < tok->added_tokens_.size(); ++i) {
    const AddedToken& token = tok->added_tokens_[i];
    tok->added_index_[size_t(token.id)] = static_cast<int>(i);
    tok->special_[size_t(token.id)] = token.special;
    if (token.normalized) {
      // Matched on normalized text, so its content is matched in normalized form.
      PD_ASSIGN_OR_RETURN(std::string content, tok->normalizer_.apply(token.content));
      normalized.push_back(token);
      normalized_contents.push_back(std::move(content));
    } else {
      raw.push_back(token);
      raw_contents.push_back(token.content);
    }
  }
  if (!raw.empty()) tok->raw_added_.emplace(std::move(raw), raw_contents);
  if (!normalized.empty()) tok->normalized_added_.emplace(std::move(normalized), normalized_contents);

  // tokenizer_config.json's additional_special_tokens are special too (transformers registers
  // them so, and skips them when decoding).
  if (const auto it = config.find("additional_special_tokens");
      it != config.end() && it->is_array()) {
    for (const Json& entry : *it) {
      std::optional<std::string> content;
      if (entry.is_string()) content = entry.get<std::string>();
      if (entry.is_object() && entry.contains("content") && entry.at("content").is_string()) {
        content = entry.at("content").get<std::string>();
      }
      if (!content) continue;
      if (const std::optional<int> id = tok->token_id(*content)) tok->special_[size_t(*id)] = true;
    }
  }

  // BOS and EOS: tokenizer_config.json names them; without one, the post-processor's first
  // token is the BOS and the common families' names give the EOS.
  const auto first_known = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (const std::optional<int> id = tok->token_id(name)) return *id;
    }
    return -1;
  };
  if (config.contains("bos_token")) {
    const std::optional<std::string> bos = config_token(config, "bos_token");
    tok->bos_id_ = bos ? tok->token_id(*bos).value_or(-1) : -1;
  } else if (!tok->post_processor_.before.empty()) {
    tok->bos_id_ = tok->post_processor_.before.front();
  } else {
    tok->bos_id_ = first_known({"<|begin_of_text|>", "<s>", "<bos>"});
  }
  if (config.contains("eos_token")) {
    const std::optional<std::string> eos = config_token(config, "eos_token");
    tok->eos_id_ = eos ? tok->token_id(*eos).value_or(-1) : -1;
  } else {
    tok->eos_id_ = first_known({"<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>"});
  }

  const std::optional<std::string> tokenizer_class = config_token(config, "tokenizer_class");
  if (tokenizer_class && rebuilds_post_processor(*tokenizer_class)) {
    PD_ASSIGN_OR_RETURN(const bool add_bos, json_fields::bool_member(config, "add_bos_token", true));
    PD_ASSIGN_OR_RETURN(const bool add_eos, json_fields::bool_member(config, "add_eos_token", false));
    if ((add_bos && tok->bos_id_ < 0) || (add_eos && tok->eos_id_ < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          *tokenizer_class, ": add_bos_token / add_eos_token is set but that token is not in the vocab"));
    }
    tok->post_processor_ =
        PostProcessor::bos_eos(add_bos ? std::optional<int>(tok->bos_id_) : std::nullopt,
                               add_eos ? std::optional<int>(tok->eos_id_) : std::nullopt);
  }
  for (const std::vector<int>* ids : {&tok->post_processor_.before, &tok->post_processor_.after}) {
    for (int id : *ids) {
      if (id >= tok->vocab_size_) {
        return absl::InvalidArgumentError(absl::StrCat("post_processor token id ", id, " is outside the vocab"));
      }
    }
  }
  return tok;
}

std::optional<int> HfTokenizer::token_id(std::string_view content) const {
  // Added tokens take precedence over the model's vocabulary, as in the library.
  for (auto it = added_tokens_.rbegin(); it != added_tokens_.rend(); ++it) {
    if (it->content == content) return it->id;
  }
  return model_->token_to_id(content);
}

Status HfTokenizer::encode_segment(std::string_view text, bool at_text_start,
                                   std::vector<int>& ids) const {
  PD_ASSIGN_OR_RETURN(const std::string normalized, normalizer_.apply(text));
  std::vector<AddedTokenSplit> splits;
  if (normalized_added_) {
    splits = normalized_added_->split(normalized);
  } else if (!normalized.empty()) {
    splits.push_back({0, normalized.size(), -1});
  }
  for (const AddedTokenSplit& split : splits) {
    if (split.added_id >= 0) {
      ids.push_back(split.added_id);
      continue;
    }
    PD_ASSIGN_OR_RETURN(
        const std::vector<std::string> words,
        pre_tokenizer_.apply(std::string_view(normalized).substr(split.begin, split.end - split.begin),
                             at_text_start && split.begin == 0));
    for (const std::string& word : words) PD_RETURN_IF_ERROR(model_->encode_word(word, ids));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<int>> HfTokenizer::encode(std::string_view text, bool add_bos) const {
  if (const size_t bad = utf8::first_invalid(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 (at byte ", bad, ")"));
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_added_) {
    for (const AddedTokenSplit& split : raw_added_->split(text)) {
      if (split.added_id >= 0) {
        ids.push_back(split.added_id);
      } else {
        PD_RETURN_IF_ERROR(encode_segment(text.substr(split.begin, split.end - split.begin),
                                          split.begin == 0, ids));
      }
    }
  } else {
    PD_RETURN_IF_ERROR(encode_segment(text, true, ids));
  }
  return add_bos ? post_processor_.apply(ids) : ids;
}

bool HfTokenizer::skipped(int token) const {
  return token < 0 || token >= vocab_size_ || special_[size_t(token)];
}

std::string HfTokenizer::decode_piece(int token, bool first) const {
  if (skipped(token)) return std::string();
  const int added = added_index_[size_t(token)];
  const std::string* piece =
      added >= 0 ? &added_tokens_[size_t(added)].content : model_->id_to_token(token);
  if (piece == nullptr) return std::string();
  // The decoder fails only if a Replace regex hits PCRE2's match limit on a token piece.
  return decoder_.decode(*piece, first, added >= 0).value_or(std::string());
}

std::string HfTokenizer::special_token_text(int token) const {
  if (token < 0 || token >= vocab_size_ || !special_[size_t(token)]) return std::string();
  const int added = added_index_[size_t(token)];
  if (added >= 0) return added_tokens_[size_t(added)].content;
  const std::string* piece = model_->id_to_token(token);
  return piece ? *piece : std::string();
}

std::string HfTokenizer::decode_token(int prev, int token) const {
  return decode_piece(token, skipped(prev));
}

std::string HfTokenizer::decode(const std::vector<int>& tokens) const {
  std::string out;
  bool first = true;
  for (int token : tokens) {
    if (skipped(token)) continue;
    out += decode_piece(token, first);
    first = false;
  }
  return out;
}

}  // namespace pdserve::engine
