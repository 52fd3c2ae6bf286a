// The OpenAI-compatible HTTP API's answers as pure functions: router results (one list of
// GenerateResponses per choice) to OpenAI response and stream chunk bodies with their logprobs
// objects, and errors to OpenAI-style error bodies with their HTTP status
// (router/openai_request.h parses the requests).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tokenizer.h"
#include "proto/pdserve.pb.h"
#include "router/openai_request.h"

namespace pdserve::router {

// An HTTP status and OpenAI error body for a failed request.
struct HttpError {
  int status = 500;
  nlohmann::json body;
};
HttpError http_error(const Status& status);

// Everything the router streamed for one choice, in order (its first message carries the
// prompt token ids, its last the finish reason).
struct ChoiceOutput {
  int index = 0;
  std::string prompt_text;             // Echo: the prompt as text.
  std::vector<int> prompt_ids;
  std::vector<v1::TokenLogprob> prompt_logprobs;  // From the second prompt token on.
  std::string text;
  std::vector<int> token_ids;
  std::vector<v1::TokenLogprob> logprobs;         // One per token_ids entry when asked.
  std::string finish_reason;
  int cached_tokens = 0;
  // Adds one router message.
  void add(const v1::GenerateResponse& r);
  // The sum of the sampled tokens' logprobs (best_of's ranking).
  double cumulative_logprob() const;
};

// best_of: the indices of the `n` outputs with the highest cumulative logprob, most likely
// first (ties: the lower index).
std::vector<int> best_samples(const std::vector<ChoiceOutput>& outputs, int n);

// The non-streaming response body: `choices` in order (each with its index). Token texts for
// logprobs come from `tokenizer` (each token decoded after the one before it).
nlohmann::json completion_body(const OpenAiRequest& req, const std::string& id, int64_t created,
                               const std::string& model, const std::vector<ChoiceOutput>& choices,
                               const engine::Tokenizer& tokenizer, int prompt_tokens, int cached_tokens);

// A choice's streaming state: whether its first chunk went out, the token before the next one.
struct StreamChoice {
  bool started = false;
  int prev_token = -1;
  int text_offset = 0;                 // Completions logprobs' text_offset so far.
};
// One streaming chunk for router message `r` of choice `r.index()`: the text delta (after the
// prompt when echoing), its logprobs, and on the last one the finish reason. Chat streams open
// each choice with a chunk carrying the assistant role. nullopt when there is nothing to send.
std::optional<nlohmann::json> chunk_body(const OpenAiRequest& req, const std::string& id, int64_t created,
                                         const std::string& model, const v1::GenerateResponse& r,
                                         const std::string& echo_text, const engine::Tokenizer& tokenizer,
                                         StreamChoice* state);
// The final usage chunk (stream_options.include_usage).
nlohmann::json usage_chunk(const OpenAiRequest& req, const std::string& id, int64_t created, const std::string& model,
                           int prompt_tokens, int completion_tokens, int cached_tokens);
// The usage object: completion tokens summed over the choices, prompt tokens once per prompt.
nlohmann::json usage_body(int prompt_tokens, int completion_tokens, int cached_tokens = 0);
// An SSE event line pair for `json` ("data: ...\n\n").
std::string sse(const nlohmann::json& json);

}  // namespace pdserve::router
