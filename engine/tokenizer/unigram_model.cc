#include "engine/tokenizer/unigram_model.h"

#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/utf8.h"

namespace pdserve::engine {
namespace {

using json_fields::Json;

// The library's K_UNK_PENALTY: an unknown character scores this far below the worst piece.
constexpr double kUnknownPenalty = 10.0;

}  // namespace

StatusOr<std::unique_ptr<UnigramModel>> UnigramModel::from_json(const Json& model) {
  std::unique_ptr<UnigramModel> unigram(new UnigramModel());
  PD_ASSIGN_OR_RETURN(const Json* vocab, json_fields::array_member(model, "vocab"));
  double min_score = std::numeric_limits<double>::infinity();
  for (const Json& entry : *vocab) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string()) {
      return absl::InvalidArgumentError("Unigram vocab entries must be [piece, score]");
    }
    PD_ASSIGN_OR_RETURN(const double score, json_fields::number(entry[1], "a Unigram score"));
    const int id = static_cast<int>(unigram->pieces_.size());
    unigram->pieces_.push_back(entry[0].get<std::string>());
    unigram->scores_.push_back(score);
    unigram->vocab_.emplace(unigram->pieces_.back(), id);
    unigram->trie_.insert(unigram->pieces_.back(), id);
    min_score = std::min(min_score, score);
  }
  unigram->unk_score_ = min_score - kUnknownPenalty;
  if (model.contains("unk_id") && !model.at("unk_id").is_null()) {
    PD_ASSIGN_OR_RETURN(const int unk, json_fields::token_id(model.at("unk_id"), "unk_id"));
    if (unk >= unigram->vocab_size()) {
      return absl::InvalidArgumentError("Unigram unk_id is outside the vocab");
    }
    unigram->unk_id_ = unk;
  }
  PD_ASSIGN_OR_RETURN(unigram->byte_fallback_,
                      json_fields::bool_member(model, "byte_fallback", false));
  unigram->byte_ids_.fill(-1);
  for (int byte = 0; byte < 256; ++byte) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", byte);
    if (const auto it = unigram->vocab_.find(piece); it != unigram->vocab_.end()) {
      unigram->byte_ids_[byte] = it->second;
    }
  }
  return unigram;
}

Status UnigramModel::encode_word(std::string_view word, std::vector<int>& ids) const {
  if (word.empty()) return absl::OkStatus();
  // best[end]: the best segmentation of word[0, end): its score, where its last piece starts,
  // and that piece's id (or -1 for the unknown token). The first candidate to reach a node
  // wins ties, as in the library (pieces in trie order, shortest first).
  struct Node {
    double score = 0;
    size_t start = 0;
    int id = -1;
    bool reached = false;
  };
  std::vector<Node> best(word.size() + 1);
  best[0].reached = true;
  size_t start = 0;
  while (start < word.size()) {
    const size_t char_length = utf8::next_sequence(word.substr(start)).length;
    const double base = best[start].score;
    bool single_char_piece = false;
    trie_.for_each_prefix(word.substr(start), [&](size_t length, int id) {
      Node& target = best[start + length];
      const double candidate = base + scores_[id];
      if (!target.reached || candidate > target.score) target = {candidate, start, id, true};
      if (length == char_length) single_char_piece = true;
    });
    if (!single_char_piece) {
      if (!unk_id_) {
        return absl::InvalidArgumentError(
            "Unigram model has no unk_id for a character outside its vocab");
      }
      Node& target = best[start + char_length];
      const double candidate = base + unk_score_;
      if (!target.reached || candidate > target.score) target = {candidate, start, *unk_id_, true};
    }
    start += char_length;
  }
  // Walk back; runs of unknown pieces fuse into one.
  std::vector<std::pair<size_t, size_t>> spans;  // Reversed order.
  std::vector<int> span_ids;
  size_t end = word.size();
  while (end > 0) {
    const Node& node = best[end];
    const bool unknown = unk_id_ && node.id == *unk_id_;
    if (unknown && !span_ids.empty() && span_ids.back() == *unk_id_ &&
        spans.back().first == end) {
      spans.back().first = node.start;  // Extend the fused unknown run leftwards.
    } else {
      spans.push_back({node.start, end});
      span_ids.push_back(node.id);
    }
    end = node.start;
  }
  for (size_t i = spans.size(); i-- > 0;) {
    const std::string_view text = word.substr(spans[i].first, spans[i].second - spans[i].first);
    // A fused run is looked up as a piece; failing that, bytes or the unknown token.
    if (const auto it = vocab_.find(absl::string_view(text.data(), text.size())); it != vocab_.end()) {
      ids.push_back(it->second);
      continue;
    }
    bool all_bytes = byte_fallback_;
    for (unsigned char byte : text) all_bytes = all_bytes && byte_ids_[byte] >= 0;
    if (all_bytes) {
      for (unsigned char byte : text) ids.push_back(byte_ids_[byte]);
      continue;
    }
    ids.push_back(span_ids[i]);
  }
  return absl::OkStatus();
}

std::optional<int> UnigramModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* UnigramModel::id_to_token(int id) const {
  if (id < 0 || id >= vocab_size()) return nullptr;
  return &pieces_[id];
}

}  // namespace pdserve::engine
