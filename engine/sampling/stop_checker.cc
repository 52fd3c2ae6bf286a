#include "engine/sampling/stop_checker.h"

#include <algorithm>

namespace pdserve::engine {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, std::vector<int> eos_ids)
    : stop_token_ids_(params.stop_token_ids),
      stop_strings_(params.stop_strings),
      max_tokens_(params.max_tokens),
      min_tokens_(params.min_tokens) {
  if (!params.ignore_eos) {
    stop_token_ids_.insert(stop_token_ids_.end(), eos_ids.begin(), eos_ids.end());
  }
}

bool StopChecker::is_stop_token(int token) const {
  return std::find(stop_token_ids_.begin(), stop_token_ids_.end(), token) != stop_token_ids_.end();
}

size_t StopChecker::find_stop_string(size_t added) const {
  size_t earliest = std::string::npos;
  for (const std::string& stop : stop_strings_) {
    // Earlier text was already searched; a new match must end inside the added bytes.
    const size_t old_size = text_.size() - added;
    const size_t from = old_size >= stop.size() - 1 ? old_size - (stop.size() - 1) : 0;
    const size_t at = text_.find(stop, from);
    if (at != std::string::npos) earliest = std::min(earliest, at);
  }
  return earliest;
}

size_t StopChecker::held_back_length() const {
  size_t held = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t length = std::min(stop.size() - 1, text_.size()); length > held; --length) {
      if (std::string_view(text_).substr(text_.size() - length) ==
          std::string_view(stop).substr(0, length)) {
        held = length;
        break;
      }
    }
  }
  return held;
}

StopStep StopChecker::finish(FinishReason reason) {
  finish_ = reason;
  StopStep step{reason, utf8_.push(std::string_view(text_).substr(streamed_))};
  streamed_ = text_.size();
  step.delta += utf8_.flush();
  return step;
}

StopStep StopChecker::push(int token, std::string_view bytes) {
  if (finished()) return {finish_, std::string()};
  ++num_tokens_;
  // vLLM's min_tokens: the first min_tokens tokens neither stop nor match a stop string (the
  // sampler bans the stop tokens meanwhile; one that still arrives is plain output).
  const bool may_stop = num_tokens_ > min_tokens_;
  if (may_stop && is_stop_token(token)) {
    StopStep step = finish(FinishReason::kStop);
    step.stop_token = true;
    return step;
  }
  text_.append(bytes);
  if (may_stop && !stop_strings_.empty()) {
    const size_t at = find_stop_string(bytes.size());
    if (at != std::string::npos) {
      // Text already streamed cannot contain the match: it was held back as a possible prefix.
      text_.resize(at);
      return finish(FinishReason::kStop);
    }
  }
  if (num_tokens_ >= max_tokens_) return finish(FinishReason::kLength);
  const size_t safe = text_.size() - held_back_length();
  StopStep step;
  if (safe > streamed_) {
    step.delta = utf8_.push(std::string_view(text_).substr(streamed_, safe - streamed_));
    streamed_ = safe;
  }
  return step;
}

}  // namespace pdserve::engine
