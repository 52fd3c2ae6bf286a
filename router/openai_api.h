// The OpenAI-compatible HTTP API as pure functions: request bodies of /v1/completions,
// /v1/chat/completions, /v1/tokenize and /v1/detokenize to what the router runs, router results
// (one list of GenerateResponses per choice) to OpenAI response and stream chunk bodies with
// their logprobs objects, errors to OpenAI-style error bodies with their HTTP status. Kept apart
// from the HTTP server so every field rule is table-tested without sockets.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "proto/pdserve.pb.h"
#include "router/parallel_samples.h"

namespace pdserve::router {

// Limits on what one HTTP request may ask for besides kMaxSamples per prompt (n, best_of):
// prompts per batch, and choices in all (each is a concurrent router request).
inline constexpr int kMaxBatchPrompts = 64;
inline constexpr int kMaxChoices = 128;

// A parsed completion or chat request.
struct OpenAiRequest {
  // The first prompt's request; a batch's other prompts are in `more_prompts`. sampling.n is
  // left 0: the front end fans the samples out itself (router/parallel_samples.h).
  v1::GenerateRequest request;
  // Completions' batched prompts after the first (each a GenerateRequest holding only the prompt).
  std::vector<v1::GenerateRequest> more_prompts;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage.
  bool max_tokens_given = false;       // Else: completions 16 (OpenAI's default), chat the rest of the context.
  int n = 1;                           // Choices per prompt.
  int best_of = 1;                     // Completions: samples run per prompt, the n most likely returned.
  // Completions: the top-k asked for (0..20), chat: top_logprobs (0 when only `logprobs: true`);
  // -1: no logprobs in the response.
  int logprobs = -1;
  bool echo = false;                   // Completions: the prompt (and its logprobs) before the output.
  // Top-level fields this API does not know: accepted, and logged (vLLM's behaviour).
  std::vector<std::string> ignored_fields;

  int num_prompts() const { return 1 + int(more_prompts.size()); }
  // Prompt `i`'s request: `request` with that prompt.
  v1::GenerateRequest prompt_request(int i) const;
};

// Parses a request body; chat messages (with tools, add_generation_prompt,
// continue_final_message, chat_template_kwargs) become the prompt text rendered by the served
// model's `chat_template` (engine/tokenizer/chat_template.h). InvalidArgument naming the field
// for malformed JSON, wrong types, values out of range, a known field pdserve cannot honour
// (the table in openai_api.cc: suffix, guided decoding, beam search, ...) and a template that
// fails to render (its message, e.g. a raise_exception's). The GenerateRequest asks the
// engine for what the response needs: logprobs (best_of: at least 0, to rank the samples),
// prompt_logprobs for echo with logprobs.
StatusOr<OpenAiRequest> parse_openai_request(
    const std::string& body, bool chat,
    const engine::ChatTemplate& chat_template = engine::ChatTemplate::plain("no chat template given"));

// The sampling a parsed request gets for the fields it left out: the model's defaults
// (apply_sampling_defaults), then OpenAI's temperature 1 — vLLM's order.
void apply_openai_defaults(const v1::SamplingDefaults& model, v1::SamplingParams* sampling);

// vLLM's /v1/tokenize body: `prompt` (add_special_tokens default true) or chat `messages`
// (rendered with the template; add_special_tokens default false, vLLM's), and `model`.
struct TokenizeRequest {
  std::string model;
  std::string text;
  bool add_special_tokens = true;
};
StatusOr<TokenizeRequest> parse_tokenize_request(const std::string& body, const engine::ChatTemplate& chat_template);
// vLLM's /v1/detokenize body: `tokens` (ids) and `model`.
struct DetokenizeRequest {
  std::string model;
  std::vector<int> tokens;
};
StatusOr<DetokenizeRequest> parse_detokenize_request(const std::string& body);

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
