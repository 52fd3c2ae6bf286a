// What a client sees of a request, event by event, for tests that compare two engines' outputs
// whole: tokens, text, log-probabilities, prompt log-probabilities, finish reason, event count.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace pdserve::testing {

struct Seen {
  std::vector<int> tokens;
  std::string text;
  std::vector<std::pair<int, float>> logprobs;
  std::vector<std::pair<int, float>> prompt_logprobs;
  engine::FinishReason reason = engine::FinishReason::kNone;
  int events = 0;
  bool operator==(const Seen&) const = default;
};

// A request's prompt and parameters, to submit to several engines alike.
struct Request {
  std::vector<int> prompt;
  engine::SamplingParams params;
};

// A token callback that records every event into `seen` (which must outlive the request).
inline engine::TokenCallback record_into(Seen* seen) {
  return [seen](const engine::TokenEvent& ev) {
    ++seen->events;
    if (ev.token >= 0) seen->tokens.push_back(ev.token);
    seen->text += ev.text;
    if (ev.logprob) seen->logprobs.push_back({ev.logprob->token, ev.logprob->logprob});
    for (const engine::TokenLogprob& p : ev.prompt_logprobs) seen->prompt_logprobs.push_back({p.token, p.logprob});
    if (ev.finished) seen->reason = ev.reason;
  };
}

}  // namespace pdserve::testing
