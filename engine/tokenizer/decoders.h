// tokenizer.json decoders: the bytes each token adds to the text, as the tokenizers library's
// decoder chain (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece, Sequence)
// turns token pieces into a string. The chain is applied token by token so that generated
// text can stream: a step that sees the whole joined string in the library (everything after
// ByteLevel or Fuse) acts on the first token where it acts on the string's start, and a step
// that would need to see across tokens there (Strip from the end, a Replace of more than one
// character) is refused at load rather than approximated.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "engine/tokenizer/regex.h"

namespace pdserve::engine {

struct DecoderStep {
  enum class Kind {
    kByteLevel,     // Alphabet characters back to bytes (joins the tokens).
    kMetaspace,     // `replacement` back to ' '; dropped in the first token unless never prepended.
    kByteFallback,  // "<0xNN>" pieces to their byte.
    kFuse,          // Joins the tokens.
    kStrip,         // Up to `strip_start` / `strip_stop` `strip_content` characters off each end.
    kReplace,       // `pattern` matches to `content`.
    kWordPiece,     // `prefix` removed from continuation pieces, a space before the others.
  };
  Kind kind = Kind::kFuse;
  std::optional<Pattern> pattern;
  std::string content;
  std::string replacement;
  bool prepend = true;  // kMetaspace: prepend_scheme is not "never".
  std::string strip_content;
  int strip_start = 0;
  int strip_stop = 0;
  std::string prefix;
  bool cleanup = false;
  bool after_join = false;  // Comes after ByteLevel or Fuse: it sees one joined string.
};

// One token's piece through a step. `first` says whether it is the first token of the
// decoded sequence; `added` whether it is an added token (which ByteLevel passes as text).
StatusOr<std::string> apply_decoder_step(const DecoderStep& step, std::string_view piece,
                                         bool first, bool added);

class Decoder {
 public:
  // From the tokenizer.json "decoder" value. Null: pieces are joined with spaces, as the
  // library does without a decoder.
  static StatusOr<Decoder> from_json(const nlohmann::json& node);
  // What `piece` adds to the decoded bytes.
  StatusOr<std::string> decode(std::string_view piece, bool first, bool added) const;

 private:
  std::vector<DecoderStep> steps_;
  bool join_with_spaces_ = false;
};

}  // namespace pdserve::engine
