#include "engine/tokenizer/wordpiece_model.h"

#include <nlohmann/json.hpp>

#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/unicode.h"

namespace pdserve::engine {

StatusOr<std::unique_ptr<WordPieceModel>> WordPieceModel::from_json(const nlohmann::json& model) {
  std::unique_ptr<WordPieceModel> wordpiece(new WordPieceModel());
  PD_ASSIGN_OR_RETURN(const json_fields::Json* vocab, json_fields::member(model, "vocab"));
  if (!vocab->is_object()) return absl::InvalidArgumentError("WordPiece \"vocab\" must be an object");
  int size = 0;
  for (const auto& [piece, id_value] : vocab->items()) {
    PD_ASSIGN_OR_RETURN(const int id,
                        json_fields::token_id(id_value, absl::StrCat("the id of \"", piece, "\"")));
    wordpiece->vocab_.emplace(piece, id);
    size = std::max(size, id + 1);
  }
  wordpiece->pieces_.assign(size, std::string());
  wordpiece->has_piece_.assign(size, false);
  for (const auto& [piece, id] : wordpiece->vocab_) {
    wordpiece->pieces_[id] = piece;
    wordpiece->has_piece_[id] = true;
  }
  PD_ASSIGN_OR_RETURN(const std::string unk, json_fields::string_member(model, "unk_token"));
  const auto unk_it = wordpiece->vocab_.find(unk);
  if (unk_it == wordpiece->vocab_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("WordPiece unk_token \"", unk, "\" is not in the vocab"));
  }
  wordpiece->unk_id_ = unk_it->second;
  PD_ASSIGN_OR_RETURN(const std::optional<std::string> prefix,
                      json_fields::optional_string(model, "continuing_subword_prefix"));
  wordpiece->continuing_subword_prefix_ = prefix.value_or("##");
  PD_ASSIGN_OR_RETURN(wordpiece->max_input_chars_per_word_,
                      json_fields::int_member(model, "max_input_chars_per_word", 100));
  return wordpiece;
}

Status WordPieceModel::encode_word(std::string_view word, std::vector<int>& ids) const {
  if (word.empty()) return absl::OkStatus();
  const std::vector<unicode::CodePoint> cps = unicode::code_points(word);
  if (cps.size() > size_t(std::max(0, max_input_chars_per_word_))) {
    ids.push_back(unk_id_);
    return absl::OkStatus();
  }
  // Character boundaries: the longest match from `start` ends at one of them.
  std::vector<size_t> ends;
  ends.reserve(cps.size());
  for (const unicode::CodePoint& cp : cps) ends.push_back(cp.begin + cp.length);
  std::vector<int> pieces;
  size_t start = 0;
  std::string candidate;
  while (start < word.size()) {
    int found = -1;
    size_t found_end = 0;
    for (size_t e = ends.size(); e-- > 0 && ends[e] > start;) {
      candidate.clear();
      if (start > 0) candidate += continuing_subword_prefix_;
      candidate.append(word.substr(start, ends[e] - start));
      if (const auto it = vocab_.find(candidate); it != vocab_.end()) {
        found = it->second;
        found_end = ends[e];
        break;
      }
    }
    if (found < 0) {  // Some part matches nothing: the whole word is unknown.
      ids.push_back(unk_id_);
      return absl::OkStatus();
    }
    pieces.push_back(found);
    start = found_end;
  }
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  return absl::OkStatus();
}

std::optional<int> WordPieceModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* WordPieceModel::id_to_token(int id) const {
  if (id < 0 || id >= vocab_size() || !has_piece_[id]) return nullptr;
  return &pieces_[id];
}

}  // namespace pdserve::engine
