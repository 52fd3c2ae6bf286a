#include "router/openai_request.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>

#include "engine/sampling/sampler.h"
#include "kernels/cpu/sampling.h"
#include "proto/sampling_defaults.h"

namespace pdserve::router {
namespace {

using nlohmann::json;
// Requests keep their objects' key order: tool definitions reach the prompt through tojson,
// which writes them back in the order the client sent, as Python's json does.
using RequestJson = nlohmann::ordered_json;

Status field_error(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("'", field, "' ", what));
}

// Reads an optional number field into `out`; InvalidArgument when it is present but not a number.
template <typename T>
Status read_number(const RequestJson& j, const std::string& field, T* out, bool* present = nullptr) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return field_error(field, "must be a number");
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer() && !it->is_number_unsigned()) return field_error(field, "must be an integer");
    // An unsigned value past int64 would wrap to a negative one that may look in range.
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      return field_error(field, "is out of range");
    const int64_t v = it->get<int64_t>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) return field_error(field, "is out of range");
    *out = T(v);
  } else {
    const double v = it->get<double>();
    // Beyond the type's range the value would become infinite (or a huge integer inexact).
    if (!std::isfinite(v) || std::fabs(v) > double(std::numeric_limits<T>::max())) return field_error(field, "is out of range");
    *out = T(v);
  }
  if (present) *present = true;
  return absl::OkStatus();
}

Status read_bool(const RequestJson& j, const std::string& field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return field_error(field, "must be a boolean");
  *out = it->get<bool>();
  return absl::OkStatus();
}

// A token-id list; InvalidArgument naming `prompt` for anything else.
Status parse_ids(const RequestJson& p, v1::TokenIds* ids) {
  for (const RequestJson& t : p) {
    if (!t.is_number_integer()) return field_error("prompt", "token ids must be integers");
    if (t.is_number_unsigned() ? t.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max())
                               : t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return field_error("prompt", "has a token id out of range");
    ids->add_ids(int32_t(t.get<int64_t>()));
  }
  return absl::OkStatus();
}

// `prompt`: a string, a token-id list, or a batch (a list of strings or of token-id lists): one
// GenerateRequest holding just the prompt per entry, in order.
Status parse_prompts(const RequestJson& j, std::vector<v1::GenerateRequest>* out) {
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return field_error("prompt", "is required");
  const RequestJson& p = *it;
  if (p.is_string()) {
    out->emplace_back().set_text(p.get<std::string>());
    return absl::OkStatus();
  }
  constexpr const char* kShapes = "must be a string, an array of token ids, an array of strings, or an array of token-id arrays";
  if (!p.is_array() || p.empty()) return field_error("prompt", kShapes);
  if (p[0].is_number()) return parse_ids(p, out->emplace_back().mutable_token_ids());
  if (p.size() > size_t(kMaxBatchPrompts))
    return field_error("prompt", absl::StrCat("may batch at most ", kMaxBatchPrompts, " prompts (got ", p.size(), ")"));
  for (const RequestJson& x : p) {
    if (x.is_string() && p[0].is_string()) {
      out->emplace_back().set_text(x.get<std::string>());
    } else if (x.is_array() && p[0].is_array()) {
      PD_RETURN_IF_ERROR(parse_ids(x, out->emplace_back().mutable_token_ids()));
    } else {
      return field_error("prompt", kShapes);
    }
  }
  return absl::OkStatus();
}

// A message's content: a string, a list of text parts (kept as a list for the template), or
// null / absent.
Status parse_content(const RequestJson& m, engine::ChatMessage* msg) {
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) return absl::OkStatus();
  if (content->is_string()) {
    msg->content = content->get<std::string>();
    return absl::OkStatus();
  }
  if (!content->is_array()) return field_error("messages[].content", "must be a string or an array of text parts");
  std::vector<engine::ChatContentPart> parts;
  for (const RequestJson& part : *content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      return field_error("messages[].content", "parts must be {\"type\": \"text\", \"text\": ...}");
    parts.push_back({part["text"].get<std::string>()});
  }
  msg->content = std::move(parts);
  return absl::OkStatus();
}

Status read_optional_string(const RequestJson& j, const std::string& field, const std::string& name,
                            std::optional<std::string>* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return field_error(name, "must be a string");
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// An assistant message's tool_calls: [{id, type, function: {name, arguments}}]. Arguments sent
// as a JSON string reach the template parsed, as transformers and vLLM pass them.
Status parse_tool_calls(const RequestJson& m, engine::ChatMessage* msg) {
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return absl::OkStatus();
  if (!calls->is_array()) return field_error("messages[].tool_calls", "must be an array");
  for (const RequestJson& c : *calls) {
    if (!c.is_object()) return field_error("messages[].tool_calls", "must hold objects");
    engine::ChatToolCall call;
    std::optional<std::string> id, type;
    PD_RETURN_IF_ERROR(read_optional_string(c, "id", "messages[].tool_calls[].id", &id));
    PD_RETURN_IF_ERROR(read_optional_string(c, "type", "messages[].tool_calls[].type", &type));
    call.id = id.value_or("");
    call.type = type.value_or("function");
    auto function = c.find("function");
    if (function == c.end() || !function->is_object())
      return field_error("messages[].tool_calls[].function", "must be an object");
    auto name = function->find("name");
    if (name == function->end() || !name->is_string())
      return field_error("messages[].tool_calls[].function.name", "must be a string");
    call.name = name->get<std::string>();
    auto arguments = function->find("arguments");
    if (arguments != function->end() && arguments->is_string()) {
      const std::string text = arguments->get<std::string>();
      RequestJson parsed = RequestJson::parse(text, nullptr, /*allow_exceptions=*/false);
      call.arguments = parsed.is_discarded() ? RequestJson(text) : std::move(parsed);
    } else if (arguments != function->end() && arguments->is_object()) {
      call.arguments = *arguments;
    } else if (arguments != function->end() && !arguments->is_null()) {
      return field_error("messages[].tool_calls[].function.arguments", "must be a JSON string or an object");
    } else {
      call.arguments = RequestJson::object();
    }
    msg->tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

// The messages and the chat template's inputs (tools, add_generation_prompt,
// continue_final_message, chat_template_kwargs), rendered with the model's chat template.
Status parse_messages(const RequestJson& j, const engine::ChatTemplate& chat_template, v1::GenerateRequest* r) {
  auto it = j.find("messages");
  if (it == j.end() || !it->is_array() || it->empty()) return field_error("messages", "must be a non-empty array");
  engine::ChatRequest chat;
  for (const RequestJson& m : *it) {
    if (!m.is_object()) return field_error("messages", "must hold objects");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return field_error("messages[].role", "must be a string");
    engine::ChatMessage msg;
    msg.role = role->get<std::string>();
    PD_RETURN_IF_ERROR(parse_content(m, &msg));
    PD_RETURN_IF_ERROR(parse_tool_calls(m, &msg));
    PD_RETURN_IF_ERROR(read_optional_string(m, "tool_call_id", "messages[].tool_call_id", &msg.tool_call_id));
    PD_RETURN_IF_ERROR(read_optional_string(m, "name", "messages[].name", &msg.name));
    PD_RETURN_IF_ERROR(read_optional_string(m, "reasoning_content", "messages[].reasoning_content", &msg.reasoning_content));
    chat.messages.push_back(std::move(msg));
  }
  if (auto tools = j.find("tools"); tools != j.end() && !tools->is_null()) {
    if (!tools->is_array()) return field_error("tools", "must be an array of tool definitions");
    for (const RequestJson& t : *tools)
      if (!t.is_object()) return field_error("tools", "must hold objects");
    chat.tools = *tools;
  }
  PD_RETURN_IF_ERROR(read_bool(j, "add_generation_prompt", &chat.add_generation_prompt));
  PD_RETURN_IF_ERROR(read_bool(j, "continue_final_message", &chat.continue_final_message));
  if (auto kwargs = j.find("chat_template_kwargs"); kwargs != j.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) return field_error("chat_template_kwargs", "must be an object");
    chat.template_kwargs = *kwargs;
  }
  PD_ASSIGN_OR_RETURN(std::string prompt, chat_template.render(chat, std::chrono::system_clock::now()));
  r->set_text(std::move(prompt));
  return absl::OkStatus();
}

// Fields pdserve knows but cannot honour: refused with 400 naming them unless absent, null or
// the value that changes nothing (`neutral`), so a client never gets output computed without
// what it asked for.
struct UnsupportedField {
  const char* name;
  int endpoints;  // kCompletions | kChat.
  std::function<bool(const RequestJson&)> neutral;
  const char* why;
};
constexpr int kCompletions = 1, kChat = 2, kBoth = 3;

bool is_false(const RequestJson& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_true(const RequestJson& v) { return v.is_boolean() && v.get<bool>(); }
// (nlohmann's empty() is false for every string.)
bool is_empty(const RequestJson& v) {
  return v.is_string() ? v.get_ref<const std::string&>().empty() : (v.is_array() || v.is_object()) && v.empty();
}
bool is_number(const RequestJson& v, double x) { return v.is_number() && v.get<double>() == x; }
bool never(const RequestJson&) { return false; }

const std::vector<UnsupportedField>& unsupported_fields() {
  static const std::vector<UnsupportedField> table = {
      {"suffix", kCompletions, is_empty, "(no insertion: the model continues the prompt)"},
      {"bad_words", kBoth, is_empty, "(use logit_bias with -100 on their token ids)"},
      {"allowed_token_ids", kBoth, is_empty, "(use logit_bias)"},
      {"guided_json", kBoth, never, "(no guided decoding)"},
      {"guided_regex", kBoth, never, "(no guided decoding)"},
      {"guided_choice", kBoth, never, "(no guided decoding)"},
      {"guided_grammar", kBoth, never, "(no guided decoding)"},
      {"guided_decoding_backend", kBoth, never, "(no guided decoding)"},
      {"guided_whitespace_pattern", kBoth, never, "(no guided decoding)"},
      {"structured_outputs", kBoth, never, "(no guided decoding)"},
      {"response_format", kBoth, [](const RequestJson& v) { return v.is_object() && v.value("type", "") == "text"; },
       "(only {\"type\": \"text\"}: no JSON mode or schemas)"},
      {"use_beam_search", kBoth, is_false, "(no beam search)"},
      {"length_penalty", kBoth, [](const RequestJson& v) { return is_number(v, 1); }, "(beam search only)"},
      {"min_p", kBoth, [](const RequestJson& v) { return is_number(v, 0); }, "(no min_p sampling)"},
      {"prompt_logprobs", kBoth, never, "(completions: use echo with logprobs; gRPC: SamplingParams.prompt_logprobs)"},
      {"include_stop_str_in_output", kBoth, is_false, ""},
      {"spaces_between_special_tokens", kBoth, is_true, ""},
      {"truncate_prompt_tokens", kBoth, never, "(a prompt longer than the context is refused)"},
      {"return_tokens_as_token_ids", kBoth, is_false, ""},
      {"priority", kBoth, [](const RequestJson& v) { return is_number(v, 0); }, "(admission is first come, first served)"},
      // Prompts are always encoded with the tokenizer's special tokens (BOS).
      {"add_special_tokens", kCompletions, is_true, "(the prompt always gets the tokenizer's special tokens)"},
      {"add_special_tokens", kChat, never, "(the prompt always gets the tokenizer's special tokens)"},
      {"echo", kChat, is_false, "(chat: no echo of the last message)"},
      {"best_of", kChat, [](const RequestJson& v) { return is_number(v, 1); }, "(chat: use n)"},
      {"chat_template", kChat, never, "(the served model's template is used)"},
      {"documents", kChat, never, ""},
  };
  return table;
}

// Fields read by parse_openai_request.
const std::set<std::string>& known_fields(bool chat) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "stop_token_ids", "stream",
      "stream_options", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
      "min_tokens", "ignore_eos", "skip_special_tokens", "request_id", "logprobs", "cache_salt"};
  static const std::set<std::string> completions = [] {
    std::set<std::string> s = common;
    s.insert({"prompt", "best_of", "echo"});
    return s;
  }();
  static const std::set<std::string> chat_fields = [] {
    std::set<std::string> s = common;
    s.insert({"messages", "top_logprobs", "max_completion_tokens", "tools", "add_generation_prompt",
              "continue_final_message", "chat_template_kwargs"});
    return s;
  }();
  return chat ? chat_fields : completions;
}

// The refusal for a known but unsupported field, and the unknown fields (ignored).
Status check_fields(const RequestJson& j, bool chat, std::vector<std::string>* ignored) {
  const int endpoint = chat ? kChat : kCompletions;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    bool handled = false;
    for (const UnsupportedField& f : unsupported_fields()) {
      if (key != f.name || !(f.endpoints & endpoint)) continue;
      handled = true;
      if (!it->is_null() && !f.neutral(*it))
        return field_error(key, absl::StrCat("is not supported", *f.why ? " " : "", f.why));
    }
    if (!handled && !known_fields(chat).count(key)) ignored->push_back(key);
  }
  return absl::OkStatus();
}

// An integer field in [lo, hi]; `present` tells whether it was given.
Status read_int_in(const RequestJson& j, const std::string& field, int lo, int hi, int* out, bool* present = nullptr) {
  bool given = false;
  int v = *out;
  PD_RETURN_IF_ERROR(read_number(j, field, &v, &given));
  if (given && (v < lo || v > hi)) return field_error(field, absl::StrCat("must be in [", lo, ", ", hi, "] (got ", v, ")"));
  if (given) *out = v;
  if (present) *present = given;
  return absl::OkStatus();
}

Status read_penalty(const RequestJson& j, const std::string& field, float* out) {
  bool given = false;
  float v = 0;
  PD_RETURN_IF_ERROR(read_number(j, field, &v, &given));
  if (given && !(v >= -2.0f && v <= 2.0f)) return field_error(field, absl::StrCat("must be in [-2, 2] (got ", v, ")"));
  if (given) *out = v;
  return absl::OkStatus();
}

// logit_bias: {"<token id>": bias}; biases clamped to [-100, 100] as vLLM does.
Status read_logit_bias(const RequestJson& j, v1::SamplingParams* s) {
  auto it = j.find("logit_bias");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return field_error("logit_bias", "must be an object of token id -> bias");
  if (it->size() > size_t(engine::SamplingParams::kMaxLogitBias))
    return field_error("logit_bias", absl::StrCat("may hold at most ", engine::SamplingParams::kMaxLogitBias, " ids"));
  for (auto e = it->begin(); e != it->end(); ++e) {
    const std::string& key = e.key();
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0)
      return field_error("logit_bias", absl::StrCat("key '", key, "' is not a token id"));
    if (!e->is_number() || !std::isfinite(e->get<double>()))
      return field_error("logit_bias", absl::StrCat("bias of '", key, "' must be a finite number"));
    (*s->mutable_logit_bias())[id] = float(std::clamp(e->get<double>(), -100.0, 100.0));
  }
  return absl::OkStatus();
}

// logprobs (completions: the top-k, an integer; chat: a boolean with top_logprobs the top-k).
Status read_logprobs(const RequestJson& j, bool chat, int* logprobs) {
  const int max = kernels::kMaxLogprobs;
  if (!chat) return read_int_in(j, "logprobs", 0, max, logprobs);
  bool on = false;
  PD_RETURN_IF_ERROR(read_bool(j, "logprobs", &on));
  int top = 0;
  bool top_given = false;
  PD_RETURN_IF_ERROR(read_int_in(j, "top_logprobs", 0, max, &top, &top_given));
  if (top_given && !on) return field_error("top_logprobs", "needs 'logprobs': true");
  if (on) *logprobs = top;
  return absl::OkStatus();
}

}  // namespace

v1::GenerateRequest OpenAiRequest::prompt_request(int i) const {
  v1::GenerateRequest r = request;
  if (i == 0) return r;
  const v1::GenerateRequest& p = more_prompts[size_t(i - 1)];
  if (p.prompt_case() == v1::GenerateRequest::kText) r.set_text(p.text());
  else *r.mutable_token_ids() = p.token_ids();
  return r;
}

StatusOr<OpenAiRequest> parse_openai_request(const std::string& body, bool chat,
                                             const engine::ChatTemplate& chat_template) {
  RequestJson j = RequestJson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  OpenAiRequest out;
  out.chat = chat;
  PD_RETURN_IF_ERROR(check_fields(j, chat, &out.ignored_fields));
  v1::GenerateRequest& r = out.request;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return field_error("model", "must be a string");
    r.set_model(it->get<std::string>());
  }
  if (chat) {
    PD_RETURN_IF_ERROR(parse_messages(j, chat_template, &r));
  } else {
    std::vector<v1::GenerateRequest> prompts;
    PD_RETURN_IF_ERROR(parse_prompts(j, &prompts));
    if (prompts[0].prompt_case() == v1::GenerateRequest::kText) r.set_text(prompts[0].text());
    else *r.mutable_token_ids() = prompts[0].token_ids();
    out.more_prompts.assign(std::make_move_iterator(prompts.begin() + 1), std::make_move_iterator(prompts.end()));
  }

  v1::SamplingParams* s = r.mutable_sampling();
  int max_tokens = 16;
  PD_RETURN_IF_ERROR(read_number(j, "max_tokens", &max_tokens, &out.max_tokens_given));
  // The newer name wins over the deprecated one.
  if (chat) PD_RETURN_IF_ERROR(read_number(j, "max_completion_tokens", &max_tokens, &out.max_tokens_given));
  s->set_max_tokens(max_tokens);
  // Fields left out stay unset, for apply_openai_defaults.
  float temperature = 1.0f;
  bool has_temperature = false;
  PD_RETURN_IF_ERROR(read_number(j, "temperature", &temperature, &has_temperature));
  if (has_temperature) s->set_temperature(temperature);
  float top_p = 1.0f;
  bool has_top_p = false;
  PD_RETURN_IF_ERROR(read_number(j, "top_p", &top_p, &has_top_p));
  if (has_top_p) s->set_top_p(top_p);
  int top_k = 0;
  bool has_top_k = false;
  PD_RETURN_IF_ERROR(read_number(j, "top_k", &top_k, &has_top_k));
  if (has_top_k) s->set_top_k(top_k == -1 ? 0 : top_k);  // vLLM spells "off" as -1.
  float repetition_penalty = 1.0f;  // vLLM's extension.
  bool has_repetition_penalty = false;
  PD_RETURN_IF_ERROR(read_number(j, "repetition_penalty", &repetition_penalty, &has_repetition_penalty));
  if (has_repetition_penalty) s->set_repetition_penalty(repetition_penalty);
  float frequency_penalty = 0, presence_penalty = 0;
  PD_RETURN_IF_ERROR(read_penalty(j, "frequency_penalty", &frequency_penalty));
  PD_RETURN_IF_ERROR(read_penalty(j, "presence_penalty", &presence_penalty));
  s->set_frequency_penalty(frequency_penalty);
  s->set_presence_penalty(presence_penalty);
  PD_RETURN_IF_ERROR(read_logit_bias(j, s));
  int min_tokens = 0;
  PD_RETURN_IF_ERROR(read_int_in(j, "min_tokens", 0, std::numeric_limits<int>::max(), &min_tokens));
  if (out.max_tokens_given && min_tokens > max_tokens)
    return field_error("min_tokens", absl::StrCat("must be <= max_tokens (", min_tokens, " > ", max_tokens, ")"));
  s->set_min_tokens(min_tokens);
  int64_t seed = 0;
  bool has_seed = false;
  PD_RETURN_IF_ERROR(read_number(j, "seed", &seed, &has_seed));
  if (has_seed) s->set_seed(seed);
  bool ignore_eos = false;
  PD_RETURN_IF_ERROR(read_bool(j, "ignore_eos", &ignore_eos));
  s->set_ignore_eos(ignore_eos);
  if (auto it = j.find("skip_special_tokens"); it != j.end() && !it->is_null()) {
    bool skip = true;
    PD_RETURN_IF_ERROR(read_bool(j, "skip_special_tokens", &skip));
    s->set_skip_special_tokens(skip);
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      s->add_stop(it->get<std::string>());
    } else if (it->is_array()) {
      for (const RequestJson& x : *it) {
        if (!x.is_string()) return field_error("stop", "must be a string or an array of strings");
        s->add_stop(x.get<std::string>());
      }
    } else {
      return field_error("stop", "must be a string or an array of strings");
    }
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return field_error("stop_token_ids", "must be an array of integers");
    for (const RequestJson& x : *it) {
      if (!x.is_number_integer()) return field_error("stop_token_ids", "must be an array of integers");
      if (x.is_number_unsigned() ? x.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max())
                                 : x.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
                                       x.get<int64_t>() > std::numeric_limits<int32_t>::max())
        return field_error("stop_token_ids", "holds an id out of range");
      s->add_stop_token_ids(int32_t(x.get<int64_t>()));
    }
  }
  if (auto it = j.find("request_id"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return field_error("request_id", "must be a string");
    r.set_request_id(it->get<std::string>());
  }
  // vLLM's name: the prefix-cache namespace (Router::validate checks its length).
  if (auto it = j.find("cache_salt"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return field_error("cache_salt", "must be a string");
    r.set_cache_salt(it->get<std::string>());
  }

  PD_RETURN_IF_ERROR(read_bool(j, "stream", &out.stream));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return field_error("stream_options", "must be an object");
    if (!out.stream) return field_error("stream_options", "is only allowed with 'stream': true");
    for (auto o = it->begin(); o != it->end(); ++o)
      if (o.key() != "include_usage" && !o->is_null() && !is_false(*o))
        return field_error("stream_options." + o.key(), "is not supported");
    PD_RETURN_IF_ERROR(read_bool(*it, "include_usage", &out.include_usage));
  }
  PD_RETURN_IF_ERROR(read_int_in(j, "n", 1, kMaxSamples, &out.n));
  out.best_of = out.n;
  if (!chat) {
    bool has_best_of = false;
    PD_RETURN_IF_ERROR(read_int_in(j, "best_of", 1, kMaxSamples, &out.best_of, &has_best_of));
    if (has_best_of && out.best_of < out.n)
      return field_error("best_of", absl::StrCat("must be >= n (", out.best_of, " < ", out.n, ")"));
    if (out.stream && out.best_of != out.n) return field_error("best_of", "must equal n when streaming");
    PD_RETURN_IF_ERROR(read_bool(j, "echo", &out.echo));
  }
  if (out.num_prompts() * out.best_of > kMaxChoices)
    return field_error(out.best_of > 1 ? "best_of" : "n",
                       absl::StrCat("prompts x samples must be <= ", kMaxChoices, " (got ", out.num_prompts(), " x ",
                                    out.best_of, ")"));
  PD_RETURN_IF_ERROR(read_logprobs(j, chat, &out.logprobs));
  // What the engine computes for the response: best_of ranks samples by their logprobs even
  // when the client did not ask for them (they are left out of its response then).
  const int engine_logprobs = out.best_of > out.n ? std::max(out.logprobs, 0) : out.logprobs;
  if (engine_logprobs >= 0) s->set_logprobs(engine_logprobs);
  if (out.echo && out.logprobs >= 0) s->set_prompt_logprobs(out.logprobs);
  return out;
}

StatusOr<TokenizeRequest> parse_tokenize_request(const std::string& body, const engine::ChatTemplate& chat_template) {
  RequestJson j = RequestJson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  TokenizeRequest out;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return field_error("model", "must be a string");
    out.model = it->get<std::string>();
  }
  const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
  const bool has_messages = j.contains("messages") && !j["messages"].is_null();
  if (has_prompt == has_messages) return absl::InvalidArgumentError("give exactly one of 'prompt' and 'messages'");
  if (has_prompt) {
    if (!j["prompt"].is_string()) return field_error("prompt", "must be a string");
    out.text = j["prompt"].get<std::string>();
  } else {
    v1::GenerateRequest r;
    PD_RETURN_IF_ERROR(parse_messages(j, chat_template, &r));
    out.text = r.text();
    out.add_special_tokens = false;  // vLLM's default for messages: the template has them.
  }
  PD_RETURN_IF_ERROR(read_bool(j, "add_special_tokens", &out.add_special_tokens));
  return out;
}

StatusOr<DetokenizeRequest> parse_detokenize_request(const std::string& body) {
  RequestJson j = RequestJson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  DetokenizeRequest out;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return field_error("model", "must be a string");
    out.model = it->get<std::string>();
  }
  auto it = j.find("tokens");
  if (it == j.end() || !it->is_array()) return field_error("tokens", "must be an array of token ids");
  v1::TokenIds ids;
  if (Status st = parse_ids(*it, &ids); !st.ok()) return field_error("tokens", "must be an array of token ids");
  out.tokens.assign(ids.ids().begin(), ids.ids().end());
  return out;
}
void apply_openai_defaults(const v1::SamplingDefaults& model, v1::SamplingParams* s) {
  apply_sampling_defaults(model, s);
  if (!s->has_temperature()) s->set_temperature(1.0f);  // OpenAI's default.
}

}  // namespace pdserve::router
