// tokenizer.json post-processors: the special tokens put around an encoded single sequence
// when special tokens are added (the `add_special_tokens` of transformers). TemplateProcessing's
// "single" template, BertProcessing / RobertaProcessing ([CLS] A [SEP]), ByteLevel (offsets
// only: no ids) and Sequence reduce to the ids before and the ids after the sequence.
#pragma once

#include <optional>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace pdserve::engine {

struct PostProcessor {
  std::vector<int> before;  // Ids put before the sequence.
  std::vector<int> after;   // Ids put after it.

  // From the tokenizer.json "post_processor" value (null adds nothing).
  static StatusOr<PostProcessor> from_json(const nlohmann::json& node);
  // The processor transformers' Llama / Gemma fast tokenizers build from tokenizer_config.json
  // (update_post_processor): [bos] A [eos], each when asked for.
  static PostProcessor bos_eos(std::optional<int> bos, std::optional<int> eos);

  std::vector<int> apply(const std::vector<int>& ids) const;
};

}  // namespace pdserve::engine
