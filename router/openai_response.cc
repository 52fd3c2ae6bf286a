#include "router/openai_response.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pdserve::router {

using nlohmann::json;

HttpError http_error(const Status& status) {
  HttpError e;
  std::string type = "invalid_request_error";
  std::string code;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      e.status = 400;
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      code = "model_not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      type = "overloaded_error";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      type = "timeout_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      type = "service_unavailable_error";
      break;
    case absl::StatusCode::kCancelled:
      e.status = 499;
      type = "cancelled";
      break;
    default:
      e.status = 500;
      type = "internal_error";
  }
  e.body = {{"error",
             {{"message", std::string(status.message())},
              {"type", type},
              {"param", nullptr},
              {"code", code.empty() ? json(nullptr) : json(code)}}}};
  return e;
}

void ChoiceOutput::add(const v1::GenerateResponse& r) {
  if (prompt_ids.empty()) prompt_ids.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  if (prompt_logprobs.empty()) prompt_logprobs.assign(r.prompt_logprobs().begin(), r.prompt_logprobs().end());
  text += r.text();
  token_ids.insert(token_ids.end(), r.token_ids().begin(), r.token_ids().end());
  logprobs.insert(logprobs.end(), r.logprobs().begin(), r.logprobs().end());
  if (r.finished()) {
    finish_reason = r.finish_reason();
    cached_tokens = r.cached_tokens();
  }
}

double ChoiceOutput::cumulative_logprob() const {
  double sum = 0;
  for (const v1::TokenLogprob& l : logprobs) sum += l.logprob();
  return sum;
}

std::vector<int> best_samples(const std::vector<ChoiceOutput>& outputs, int n) {
  std::vector<int> order(outputs.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> score(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) score[i] = outputs[i].cumulative_logprob();
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
  order.resize(std::min(order.size(), size_t(std::max(n, 0))));
  return order;
}

namespace {

// JSON has no infinities: a -inf logprob (a token no sampling could pick) is written as vLLM
// writes it.
double finite_logprob(float v) { return std::isfinite(v) ? double(v) : -9999.0; }

// UTF-8 characters in `bytes` (each non-continuation byte starts one): text_offset counts
// characters, as vLLM's Python strings do.
int utf8_chars(const std::string& bytes) {
  int n = 0;
  for (unsigned char c : bytes) n += (c & 0xC0) != 0x80;
  return n;
}

// Token strings of logprobs objects, as the streamed text shows them (special tokens' text only
// when the request keeps special tokens).
struct TokenText {
  const engine::Tokenizer& tokenizer;
  bool skip_special_tokens = true;
  std::string operator()(int prev, int token) const { return tokenizer.token_text(prev, token, skip_special_tokens); }
};
TokenText token_text_of(const OpenAiRequest& req, const engine::Tokenizer& tokenizer) {
  const v1::SamplingParams& s = req.request.sampling();
  return {tokenizer, !s.has_skip_special_tokens() || s.skip_special_tokens()};
}

// The legacy completions logprobs object, built token by token.
struct LegacyLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  // Token `token` after `prev`; `lp` null: no logprob (the first prompt token).
  void add(const TokenText& tok, int prev, int token, const v1::TokenLogprob* lp, int* offset) {
    const std::string text = tok(prev, token);
    tokens.push_back(text);
    text_offset.push_back(*offset);
    *offset += utf8_chars(text);
    if (lp == nullptr) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      return;
    }
    token_logprobs.push_back(finite_logprob(lp->logprob()));
    json top = json::object();
    for (int k = 0; k < lp->top_ids_size() && k < lp->top_logprobs_size(); ++k) {
      const std::string alt = tok(prev, lp->top_ids(k));
      if (!top.contains(alt)) top[alt] = finite_logprob(lp->top_logprobs(k));  // Most likely first wins.
    }
    top_logprobs.push_back(std::move(top));
  }
  json body() const {
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", text_offset}};
  }
};

json bytes_of(const std::string& text) {
  json b = json::array();
  for (unsigned char c : text) b.push_back(int(c));
  return b;
}

// Chat logprobs' content entries for `ids` (after `prev`).
json chat_logprob_content(const TokenText& tok, int prev, const std::vector<int>& ids,
                          const std::vector<v1::TokenLogprob>& lps) {
  json content = json::array();
  for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
    const v1::TokenLogprob& lp = lps[i];
    const std::string text = tok(prev, ids[i]);
    json top = json::array();
    for (int k = 0; k < lp.top_ids_size() && k < lp.top_logprobs_size(); ++k) {
      const std::string alt = tok(prev, lp.top_ids(k));
      top.push_back({{"token", alt}, {"logprob", finite_logprob(lp.top_logprobs(k))}, {"bytes", bytes_of(alt)}});
    }
    content.push_back({{"token", text}, {"logprob", finite_logprob(lp.logprob())}, {"bytes", bytes_of(text)}, {"top_logprobs", top}});
    prev = ids[i];
  }
  return content;
}

// Completions logprobs for the echoed prompt (when `echo`) and the output tokens `ids`
// after `prev`; `offset` is the text offset so far.
json completion_logprobs(const TokenText& tok, bool echo, const std::vector<int>& prompt_ids,
                         const std::vector<v1::TokenLogprob>& prompt_lps, int prev, const std::vector<int>& ids,
                         const std::vector<v1::TokenLogprob>& lps, int* offset) {
  LegacyLogprobs out;
  if (echo) {
    for (size_t i = 0; i < prompt_ids.size(); ++i) {
      const v1::TokenLogprob* lp = i >= 1 && i - 1 < prompt_lps.size() ? &prompt_lps[i - 1] : nullptr;
      out.add(tok, i == 0 ? -1 : prompt_ids[i - 1], prompt_ids[i], lp, offset);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    out.add(tok, prev, ids[i], i < lps.size() ? &lps[i] : nullptr, offset);
    prev = ids[i];
  }
  return out.body();
}

json nullable(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

}  // namespace

json usage_body(int prompt_tokens, int completion_tokens, int cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json completion_body(const OpenAiRequest& req, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<ChoiceOutput>& choices, const engine::Tokenizer& tokenizer, int prompt_tokens,
                     int cached_tokens) {
  const TokenText text_of = token_text_of(req, tokenizer);
  json out_choices = json::array();
  int completion_tokens = 0;
  for (const ChoiceOutput& c : choices) {
    completion_tokens += int(c.token_ids.size());
    const int prev = c.prompt_ids.empty() ? -1 : c.prompt_ids.back();
    json choice = {{"index", c.index}, {"finish_reason", nullable(c.finish_reason)}, {"logprobs", nullptr}};
    if (req.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (req.logprobs >= 0)
        choice["logprobs"] = {{"content", chat_logprob_content(text_of, prev, c.token_ids, c.logprobs)}, {"refusal", nullptr}};
    } else {
      choice["text"] = req.echo ? c.prompt_text + c.text : c.text;
      int offset = 0;
      if (req.logprobs >= 0)
        choice["logprobs"] = completion_logprobs(text_of, req.echo, c.prompt_ids, c.prompt_logprobs, prev, c.token_ids,
                                                 c.logprobs, &offset);
    }
    out_choices.push_back(std::move(choice));
  }
  return {{"id", id},
          {"object", req.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", std::move(out_choices)},
          {"usage", usage_body(prompt_tokens, completion_tokens, cached_tokens)}};
}

std::optional<json> chunk_body(const OpenAiRequest& req, const std::string& id, int64_t created, const std::string& model,
                               const v1::GenerateResponse& r, const std::string& echo_text,
                               const engine::Tokenizer& tokenizer, StreamChoice* state) {
  const TokenText text_of = token_text_of(req, tokenizer);
  const bool first = !state->started;
  const std::vector<int> prompt_ids(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  if (first && !prompt_ids.empty()) state->prev_token = prompt_ids.back();
  const std::vector<int> ids(r.token_ids().begin(), r.token_ids().end());
  const std::vector<v1::TokenLogprob> lps(r.logprobs().begin(), r.logprobs().end());
  const bool echo_now = first && req.echo;
  const bool has_logprobs = req.logprobs >= 0 && (!ids.empty() || (echo_now && !prompt_ids.empty()));
  std::optional<std::string> finish;
  if (r.finished()) finish = r.finish_reason();
  if (r.text().empty() && !finish && !(first && (req.chat || req.echo)) && !has_logprobs) return std::nullopt;
  state->started = true;

  json choice = {{"index", r.index()}, {"finish_reason", finish ? json(*finish) : json(nullptr)}, {"logprobs", nullptr}};
  if (req.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!r.text().empty() || !finish) delta["content"] = r.text();
    choice["delta"] = delta;
    if (req.logprobs >= 0)
      choice["logprobs"] = {{"content", chat_logprob_content(text_of, state->prev_token, ids, lps)}, {"refusal", nullptr}};
  } else {
    choice["text"] = echo_now ? echo_text + r.text() : r.text();
    if (req.logprobs >= 0) {
      const std::vector<v1::TokenLogprob> prompt_lps(r.prompt_logprobs().begin(), r.prompt_logprobs().end());
      choice["logprobs"] = completion_logprobs(text_of, echo_now, prompt_ids, prompt_lps, state->prev_token, ids, lps,
                                               &state->text_offset);
    }
  }
  if (!ids.empty()) state->prev_token = ids.back();
  return json{{"id", id},
              {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({std::move(choice)})}};
}

json usage_chunk(const OpenAiRequest& req, const std::string& id, int64_t created, const std::string& model,
                 int prompt_tokens, int completion_tokens, int cached_tokens) {
  return {{"id", id},
          {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage_body(prompt_tokens, completion_tokens, cached_tokens)}};
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace pdserve::router
