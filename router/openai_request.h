// The OpenAI-compatible HTTP API's requests as pure functions: bodies of /v1/completions,
// /v1/chat/completions, /v1/tokenize and /v1/detokenize to what the router runs, with every
// field's rule (router/openai_response.h writes the answers). Kept apart from the HTTP server
// so every field rule is table-tested without sockets.
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
// (the table in openai_request.cc: suffix, guided decoding, beam search, ...) and a template that
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

}  // namespace pdserve::router
