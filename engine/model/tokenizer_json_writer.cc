#include "engine/model/tokenizer_json_writer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

using ojson = nlohmann::ordered_json;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others are shifted to
// code points from 256 up, so every byte is a visible character in the vocabulary.
std::string byte_token(int b) {
  bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xc0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3f));
  }
  return s;
}

ojson special(int id, const char* content) {
  return {{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},  {"normalized", false}, {"special", true}};
}

Status write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

}  // namespace

Status write_byte_level_tokenizer(const std::string& dir) {
  ojson vocab = ojson::object();
  for (int b = 0; b < 256; ++b) vocab[byte_token(b)] = b;
  ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                      {"trim_offsets", true}, {"use_regex", true}};
  ojson tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = {special(kByteTokenizerBos, "<s>"), special(kByteTokenizerEos, "</s>")};
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = byte_level;
  // BOS before the text when special tokens are added, as transformers' TemplateProcessing.
  ojson bos_item = ojson::object();
  bos_item["SpecialToken"] = {{"id", "<s>"}, {"type_id", 0}};
  ojson text_item = ojson::object();
  text_item["Sequence"] = {{"id", "A"}, {"type_id", 0}};
  ojson bos_entry = {{"id", "<s>"}};
  bos_entry["ids"] = ojson::array({kByteTokenizerBos});
  bos_entry["tokens"] = ojson::array({"<s>"});
  ojson template_processing = {{"type", "TemplateProcessing"}};
  template_processing["single"] = ojson::array({bos_item, text_item});
  template_processing["pair"] = ojson::array();
  template_processing["special_tokens"] = {{"<s>", bos_entry}};
  tok["post_processor"] = template_processing;
  tok["decoder"] = byte_level;
  tok["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"vocab", vocab},
                  {"merges", ojson::array()}};
  ojson config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                  {"bos_token", "<s>"},
                  {"eos_token", "</s>"},
                  {"add_bos_token", true},
                  {"add_eos_token", false}};
  const std::filesystem::path root(dir);
  PD_RETURN_IF_ERROR(write_file(root / "tokenizer.json", tok.dump(2) + "\n"));
  return write_file(root / "tokenizer_config.json", config.dump(2) + "\n");
}

}  // namespace pdserve::engine
