#include "engine/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/sentencepiece_bpe.h"
#include "engine/tokenizer/utf8.h"

namespace pdserve::engine {
namespace {

StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading tokenizer file ", path));
  return contents.str();
}

// JSON starts with '{' (after whitespace). A llama2.c file starts with its int32
// max_token_length, whose high bytes are zero; JSON text never contains a NUL byte.
bool looks_like_json(std::string_view bytes) {
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || bytes[first] != '{') return false;
  return bytes.substr(0, 4).find('\0') == std::string_view::npos;
}

StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path,
                                                         std::string_view contents) {
  std::string config;
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (std::filesystem::exists(config_path, error)) {
    PD_ASSIGN_OR_RETURN(config, read_file(config_path.string()));
  }
  StatusOr<std::unique_ptr<HfTokenizer>> tok = HfTokenizer::from_json(contents, config);
  if (!tok.ok()) {
    return Status(tok.status().code(), absl::StrCat(path, ": ", tok.status().message()));
  }
  return std::unique_ptr<Tokenizer>(std::move(tok).value());
}

}  // namespace

std::string Tokenizer::decode(const std::vector<int>& tokens) const {
  std::string out;
  int prev = -1;
  for (int token : tokens) {
    out += decode_token(prev, token);
    prev = token;
  }
  return out;
}

StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  PD_ASSIGN_OR_RETURN(const std::string contents, read_file(path));
  if (looks_like_json(contents)) return load_tokenizer_json(path, contents);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceBpe> tok,
                      SentencePieceBpe::from_llama2c(contents, path));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

std::string Utf8StreamDecoder::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const utf8::Sequence seq = utf8::next_sequence(std::string_view(pending_).substr(pos));
    if (seq.kind == utf8::SequenceKind::kIncomplete) break;  // The rest may still arrive.
    if (seq.kind == utf8::SequenceKind::kComplete) {
      out.append(pending_, pos, seq.length);
    } else {
      out += utf8::kReplacementCharacter;
    }
    pos += seq.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string Utf8StreamDecoder::flush() {
  std::string out = push("");
  // Whatever is still pending is one truncated character.
  if (!pending_.empty()) out += utf8::kReplacementCharacter;
  pending_.clear();
  return out;
}

}  // namespace pdserve::engine
