#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer/byte_level_bpe.h"

#include <pcre2.h>

#include "engine/tokenizer/utf8.h"

namespace pdserve::engine {
namespace {

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

// Inverse of byte_chars(): code point -> byte, -1 where no byte maps there.
const std::vector<int>& char_bytes() {
  static const std::vector<int> table = [] {
    std::vector<int> inverse(324, -1);
    const auto& chars = ByteLevelBpe::byte_chars();
    for (int byte = 0; byte < 256; ++byte) {
      const std::string& c = chars[byte];
      char32_t cp = static_cast<unsigned char>(c[0]);
      if (c.size() == 2) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(c[1]) & 0x3F);
      inverse[cp] = byte;
    }
    return inverse;
  }();
  return table;
}

// One piece of a split: a span of the input and whether the pattern matched it.
struct Span {
  size_t begin;
  size_t end;
  bool matched;
};

// Hugging Face's rules for what a Split keeps of the matches and the text between them.
std::vector<Span> apply_behavior(const std::vector<Span>& spans, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_matched = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return spans;
    case SplitBehavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.matched) out.push_back(span);
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& span : spans) {
        if (span.matched && !previous_matched && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back(span);
        }
        previous_matched = span.matched;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->matched && !previous_matched && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_matched = it->matched;
      }
      return {out.rbegin(), out.rend()};
    case SplitBehavior::kContiguous:
      for (const Span& span : spans) {
        if (span.matched == previous_matched && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back(span);
        }
        previous_matched = span.matched;
      }
      return out;
  }
  return spans;
}

}  // namespace

class ByteLevelBpe::CompiledPattern {
 public:
  static StatusOr<std::unique_ptr<CompiledPattern>> compile(const PreTokenizerStep& step,
                                                            const std::string& name) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    // PCRE2_LITERAL admits few other options (not UCP, which only matters to regexes).
    const uint32_t options = step.literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(step.pattern.data()),
                                     step.pattern.size(), options, &error, &error_offset, nullptr);
    if (code == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": pre-tokenizer pattern \"", step.pattern,
                                                     "\" does not compile at offset ", error_offset,
                                                     ": ", pcre2_error_text(error)));
    }
    // JIT is only a speed-up; the interpreter gives the same matches if it is unavailable.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return std::unique_ptr<CompiledPattern>(new CompiledPattern(code));
  }
  ~CompiledPattern() { pcre2_code_free(code_); }

  // The matches and the gaps between them, in order, covering all of `text` (valid UTF-8).
  StatusOr<std::vector<Span>> split(std::string_view text) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
    std::vector<Span> spans;
    size_t last_end = 0;
    size_t offset = 0;
    while (offset < text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                                 offset, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        return absl::InternalError(absl::StrCat("pre-tokenizer regex failed: ", pcre2_error_text(rc)));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      const size_t begin = ovector[0];
      const size_t end = ovector[1];
      if (end == begin) {  // An empty match splits nothing; move on one character.
        if (begin >= text.size()) break;
        offset = begin + utf8::next_sequence(text.substr(begin)).length;
        continue;
      }
      if (begin > last_end) spans.push_back({last_end, begin, false});
      spans.push_back({begin, end, true});
      last_end = offset = end;
    }
    if (last_end < text.size()) spans.push_back({last_end, text.size(), false});
    return spans;
  }

 private:
  explicit CompiledPattern(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

ByteLevelBpe::~ByteLevelBpe() = default;

const std::array<std::string, 256>& ByteLevelBpe::byte_chars() {
  // Printable Latin-1 bytes stand for themselves; the rest (controls, space, etc.) are
  // shifted, in byte order, to U+0100 onwards so that every piece is visible text.
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> chars;
    int shifted = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                             (byte >= 0xAE && byte <= 0xFF);
      utf8::append_code_point(chars[byte], printable ? byte : 256 + shifted++);
    }
    return chars;
  }();
  return table;
}

StatusOr<std::unique_ptr<ByteLevelBpe>> ByteLevelBpe::from_hf(const HfTokenizerJson& spec,
                                                             const std::string& name) {
  std::unique_ptr<ByteLevelBpe> tok(new ByteLevelBpe());
  for (const PreTokenizerStep& step : spec.pre_tokenizer) {
    Step compiled{step, nullptr};
    if (step.kind == PreTokenizerStep::Kind::kSplit) {
      PD_ASSIGN_OR_RETURN(compiled.pattern, CompiledPattern::compile(step, name));
    }
    tok->steps_.push_back(std::move(compiled));
  }
  int size = 0;
  for (const auto& [piece, id] : spec.vocab) size = std::max(size, id + 1);
  for (const AddedToken& added : spec.added_tokens) size = std::max(size, added.id + 1);
  tok->pieces_.assign(size, std::string());
  tok->added_index_.assign(size, -1);
  for (const auto& [piece, id] : spec.vocab) tok->pieces_[id] = piece;
  tok->piece_ids_ = spec.vocab;
  tok->added_list_ = spec.added_tokens;
  for (size_t i = 0; i < tok->added_list_.size(); ++i) {
    tok->added_index_[tok->added_list_[i].id] = static_cast<int>(i);
  }
  if (!tok->added_list_.empty()) tok->added_tokens_.emplace(tok->added_list_);
  for (int byte = 0; byte < 256; ++byte) {
    const auto it = spec.vocab.find(byte_chars()[byte]);
    if (it == spec.vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": byte-level vocab has no piece for byte ", byte, " (\"", byte_chars()[byte], "\")"));
    }
    tok->byte_ids_[byte] = it->second;
  }
  PD_ASSIGN_OR_RETURN(tok->merges_, ranked_merge_table(name, spec.vocab, spec.merges));
  tok->ignore_merges_ = spec.ignore_merges;
  tok->bos_id_ = spec.bos_id;
  tok->eos_id_ = spec.eos_id;
  tok->config_adds_bos_ = spec.add_bos;
  return tok;
}

StatusOr<std::vector<std::string>> ByteLevelBpe::pre_tokenize(std::string_view text) const {
  std::vector<std::string> words{std::string(text)};
  for (const Step& step : steps_) {
    std::vector<std::string> next;
    for (std::string& word : words) {
      if (step.spec.kind == PreTokenizerStep::Kind::kPrependSpace) {
        if (word.empty() || word[0] != ' ') word.insert(word.begin(), ' ');
        next.push_back(std::move(word));
        continue;
      }
      PD_ASSIGN_OR_RETURN(std::vector<Span> spans, step.pattern->split(word));
      if (step.spec.invert) {
        for (Span& span : spans) span.matched = !span.matched;
      }
      for (const Span& span : apply_behavior(spans, step.spec.behavior)) {
        if (span.end > span.begin) next.push_back(word.substr(span.begin, span.end - span.begin));
      }
    }
    words = std::move(next);
  }
  return words;
}

void ByteLevelBpe::encode_word(std::string_view word, std::vector<int>& ids) const {
  if (ignore_merges_) {
    std::string spelled;
    for (unsigned char byte : word) spelled += byte_chars()[byte];
    if (const auto it = piece_ids_.find(spelled); it != piece_ids_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<int> symbols;
  symbols.reserve(word.size());
  for (unsigned char byte : word) symbols.push_back(byte_ids_[byte]);
  const std::vector<int> merged =
      merge_symbols(symbols, [this](int left, int right) -> std::optional<MergeCandidate> {
        const auto it = merges_.find((static_cast<uint64_t>(left) << 32) | right);
        if (it == merges_.end()) return std::nullopt;
        return it->second;
      });
  ids.insert(ids.end(), merged.begin(), merged.end());
}

StatusOr<std::vector<int>> ByteLevelBpe::encode(std::string_view text, bool add_bos) const {
  if (const size_t bad = utf8::first_invalid(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 (at byte ", bad, ")"));
  }
  std::vector<int> ids;
  if (add_bos && config_adds_bos_ && bos_id_ >= 0) ids.push_back(bos_id_);
  const std::vector<TextSegment> segments =
      added_tokens_ ? added_tokens_->split(text) : std::vector<TextSegment>{{text, -1}};
  for (const TextSegment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    if (segment.text.empty()) continue;
    PD_ASSIGN_OR_RETURN(std::vector<std::string> words, pre_tokenize(segment.text));
    for (const std::string& word : words) encode_word(word, ids);
  }
  return ids;
}

std::string ByteLevelBpe::decode_token(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return std::string();
  if (const int added = added_index_[token]; added >= 0) {
    return added_list_[added].special ? std::string() : added_list_[added].content;
  }
  const std::string& piece = pieces_[token];
  const std::vector<int>& bytes_of = char_bytes();
  std::string out;
  size_t pos = 0;
  while (pos < piece.size()) {
    const utf8::Sequence seq = utf8::next_sequence(std::string_view(piece).substr(pos));
    const size_t length = seq.kind == utf8::SequenceKind::kComplete ? seq.length : 1;
    char32_t cp = static_cast<unsigned char>(piece[pos]);
    if (length == 2) {
      cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(piece[pos + 1]) & 0x3F);
    }
    if (length <= 2 && cp < bytes_of.size() && bytes_of[cp] >= 0) {
      out += static_cast<char>(bytes_of[cp]);
    } else {  // Not a byte-level character: a piece spelled in plain text.
      out.append(piece, pos, length);
    }
    pos += length;
  }
  return out;
}

}  // namespace pdserve::engine
