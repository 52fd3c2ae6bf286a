// The OpenAI-compatible HTTP API as pure functions: request bodies of /v1/completions and
// /v1/chat/completions to a GenerateRequest, router results to OpenAI response and stream
// chunk bodies, errors to OpenAI-style error bodies with their HTTP status. Kept apart from
// the HTTP server so every field rule is table-tested without sockets.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tokenizer/chat_template.h"
#include "proto/pdserve.pb.h"

namespace pdserve::router {

// A parsed completion or chat request.
struct OpenAiRequest {
  v1::GenerateRequest request;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage.
  bool max_tokens_given = false;       // Else: completions 16 (OpenAI's default), chat the rest of the context.
};

// Parses a request body; chat messages (with tools, add_generation_prompt,
// continue_final_message, chat_template_kwargs) become the prompt text rendered by the served
// model's `chat_template` (engine/tokenizer/chat_template.h). InvalidArgument (naming the
// field) for malformed JSON, wrong types, unsupported options (n != 1, logprobs, echo,
// best_of) and a template that fails to render (its message, e.g. a raise_exception's).
StatusOr<OpenAiRequest> parse_openai_request(
    const std::string& body, bool chat,
    const engine::ChatTemplate& chat_template = engine::ChatTemplate::plain("no chat template given"));

// The sampling a parsed request gets for the fields it left out: the model's defaults
// (apply_sampling_defaults), then OpenAI's temperature 1 — vLLM's order.
void apply_openai_defaults(const v1::SamplingDefaults& model, v1::SamplingParams* sampling);

// An HTTP status and OpenAI error body for a failed request.
struct HttpError {
  int status = 500;
  nlohmann::json body;
};
HttpError http_error(const Status& status);

// The non-streaming response body.
nlohmann::json completion_body(const OpenAiRequest& req, const std::string& id, int64_t created,
                               const std::string& model, const std::string& text, const std::string& finish_reason,
                               int prompt_tokens, int completion_tokens);
// One streaming chunk: a text delta, and on the last one the finish reason. Chat streams open
// with a chunk carrying the assistant role (`first`).
nlohmann::json chunk_body(const OpenAiRequest& req, const std::string& id, int64_t created, const std::string& model,
                          const std::string& text, const std::optional<std::string>& finish_reason, bool first);
// The usage object.
nlohmann::json usage_body(int prompt_tokens, int completion_tokens);
// An SSE event line pair for `json` ("data: ...\n\n").
std::string sse(const nlohmann::json& json);

}  // namespace pdserve::router
