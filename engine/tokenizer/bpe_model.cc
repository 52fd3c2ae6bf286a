#include "engine/tokenizer/bpe_model.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/unicode.h"

namespace pdserve::engine {
namespace {

using json_fields::Json;

uint64_t pair_key(int left, int right) {
  return (static_cast<uint64_t>(uint32_t(left)) << 32) | uint32_t(right);
}

// The tokenizers library spells byte pieces "<0x0A>": two upper-case hex digits.
std::string byte_piece(int byte) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "<0x%02X>", byte);
  return buffer;
}

// A merge: ["a", "b"] (tokenizers >= 0.20) or "a b". Views into the JSON's strings.
StatusOr<std::pair<absl::string_view, absl::string_view>> parse_merge(const Json& merge) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::make_pair(absl::string_view(merge[0].get_ref<const std::string&>()),
                          absl::string_view(merge[1].get_ref<const std::string&>()));
  }
  if (merge.is_string()) {
    const absl::string_view text = merge.get_ref<const std::string&>();
    const size_t space = text.find(' ');
    if (space != absl::string_view::npos && text.find(' ', space + 1) == absl::string_view::npos) {
      return std::make_pair(text.substr(0, space), text.substr(space + 1));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("malformed merge ", merge.dump()));
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::from_json(const Json& model) {
  std::unique_ptr<BpeModel> bpe(new BpeModel());
  if (model.contains("dropout") && !model.at("dropout").is_null()) {
    PD_ASSIGN_OR_RETURN(const double dropout, json_fields::number(model.at("dropout"), "dropout"));
    if (dropout > 0) {
      return absl::UnimplementedError("unsupported BPE dropout > 0 (random merges)");
    }
  }
  PD_ASSIGN_OR_RETURN(const Json* vocab, json_fields::member(model, "vocab"));
  if (!vocab->is_object()) return absl::InvalidArgumentError("BPE \"vocab\" must be an object");
  int size = 0;
  bpe->vocab_.reserve(vocab->size());
  for (const auto& [piece, id_value] : vocab->items()) {
    PD_ASSIGN_OR_RETURN(const int id,
                        json_fields::token_id(id_value, absl::StrCat("the id of \"", piece, "\"")));
    bpe->vocab_.emplace(piece, id);
    size = std::max(size, id + 1);
  }
  bpe->pieces_.assign(size, std::string());
  bpe->has_piece_.assign(size, false);
  for (const auto& [piece, id] : bpe->vocab_) {
    bpe->pieces_[id] = piece;
    bpe->has_piece_[id] = true;
  }
  PD_ASSIGN_OR_RETURN(const std::optional<std::string> prefix,
                      json_fields::optional_string(model, "continuing_subword_prefix"));
  PD_ASSIGN_OR_RETURN(const std::optional<std::string> suffix,
                      json_fields::optional_string(model, "end_of_word_suffix"));
  bpe->continuing_subword_prefix_ = prefix.value_or("");
  bpe->end_of_word_suffix_ = suffix.value_or("");
  PD_ASSIGN_OR_RETURN(bpe->byte_fallback_, json_fields::bool_member(model, "byte_fallback", false));
  PD_ASSIGN_OR_RETURN(bpe->fuse_unk_, json_fields::bool_member(model, "fuse_unk", false));
  PD_ASSIGN_OR_RETURN(bpe->ignore_merges_, json_fields::bool_member(model, "ignore_merges", false));
  PD_ASSIGN_OR_RETURN(const std::optional<std::string> unk,
                      json_fields::optional_string(model, "unk_token"));
  if (unk) {
    const auto it = bpe->vocab_.find(*unk);
    if (it == bpe->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("BPE unk_token \"", *unk, "\" is not in the vocab"));
    }
    bpe->unk_id_ = it->second;
  }
  bpe->byte_ids_.fill(-1);
  for (int byte = 0; byte < 256; ++byte) {
    if (const auto it = bpe->vocab_.find(byte_piece(byte)); it != bpe->vocab_.end()) {
      bpe->byte_ids_[byte] = it->second;
    }
  }

  // Merge ranks, resolved to ids. The merged piece drops the right side's continuing prefix;
  // a later duplicate of a pair replaces the earlier one (the library builds a map in order).
  const Json empty = Json::array();
  const Json& merges = model.contains("merges") ? model.at("merges") : empty;
  if (!merges.is_array()) return absl::InvalidArgumentError("BPE \"merges\" must be an array");
  bpe->merges_.reserve(merges.size());
  const size_t prefix_length = bpe->continuing_subword_prefix_.size();
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    PD_ASSIGN_OR_RETURN(const auto merge, parse_merge(merges[rank]));
    const auto& [left, right] = merge;
    const auto left_it = bpe->vocab_.find(left);
    const auto right_it = bpe->vocab_.find(right);
    merged.assign(left.data(), left.size());
    const absl::string_view right_rest = right.size() >= prefix_length ? right.substr(prefix_length) : right;
    merged.append(right_rest.data(), right_rest.size());
    const auto merged_it = bpe->vocab_.find(merged);
    if (left_it == bpe->vocab_.end() || right_it == bpe->vocab_.end() ||
        merged_it == bpe->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " (", left, " ", right, ") uses pieces not in the vocab"));
    }
    bpe->merges_[pair_key(left_it->second, right_it->second)] =
        MergeCandidate{-static_cast<double>(rank), merged_it->second};
  }
  return bpe;
}

std::optional<MergeCandidate> BpeModel::merge_of(int left, int right) const {
  const auto it = merges_.find(pair_key(left, right));
  if (it == merges_.end()) return std::nullopt;
  return it->second;
}

Status BpeModel::encode_word(std::string_view word, std::vector<int>& ids) const {
  if (word.empty()) return absl::OkStatus();
  if (ignore_merges_) {
    if (const auto it = vocab_.find(absl::string_view(word.data(), word.size())); it != vocab_.end()) {
      ids.push_back(it->second);
      return absl::OkStatus();
    }
  }
  // The initial symbols, as the library's merge_word. A run of unknown characters is held in
  // `pending_unk` so that fuse_unk can make it one token; note that, as in the library, a
  // byte-fallback character does not flush it.
  std::vector<int> symbols;
  symbols.reserve(word.size());
  std::optional<int> pending_unk;
  const std::vector<unicode::CodePoint> cps = unicode::code_points(word);
  std::string unit;
  for (size_t i = 0; i < cps.size(); ++i) {
    unit.clear();
    if (i > 0) unit += continuing_subword_prefix_;
    unit.append(word.substr(cps[i].begin, cps[i].length));
    if (i + 1 == cps.size()) unit += end_of_word_suffix_;
    if (const auto it = vocab_.find(unit); it != vocab_.end()) {
      if (pending_unk) symbols.push_back(*pending_unk);
      pending_unk.reset();
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (unsigned char byte : unit) all_bytes = all_bytes && byte_ids_[byte] >= 0;
      if (all_bytes) {
        for (unsigned char byte : unit) symbols.push_back(byte_ids_[byte]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  const std::vector<int> merged =
      merge_symbols(symbols, [this](int left, int right) { return merge_of(left, right); });
  ids.insert(ids.end(), merged.begin(), merged.end());
  return absl::OkStatus();
}

std::optional<int> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int id) const {
  if (id < 0 || id >= vocab_size() || !has_piece_[id]) return nullptr;
  return &pieces_[id];
}

}  // namespace pdserve::engine
