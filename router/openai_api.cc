#include "router/openai_api.h"

#include <chrono>
#include <cmath>

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

Status parse_prompt(const RequestJson& j, v1::GenerateRequest* r) {
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return field_error("prompt", "is required");
  const RequestJson& p = *it;
  if (p.is_string()) {
    r->set_text(p.get<std::string>());
    return absl::OkStatus();
  }
  if (!p.is_array()) return field_error("prompt", "must be a string, an array of token ids, or an array of one string");
  if (p.size() == 1 && p[0].is_string()) {
    r->set_text(p[0].get<std::string>());
    return absl::OkStatus();
  }
  if (!p.empty() && (p[0].is_array() || p[0].is_string()))
    return field_error("prompt", "may hold only one prompt (batches are not supported)");
  auto* ids = r->mutable_token_ids();
  for (const RequestJson& t : p) {
    if (!t.is_number_integer()) return field_error("prompt", "token ids must be integers");
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) return field_error("prompt", "has a token id out of range");
    ids->add_ids(int32_t(v));
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

}  // namespace

StatusOr<OpenAiRequest> parse_openai_request(const std::string& body, bool chat,
                                             const engine::ChatTemplate& chat_template) {
  RequestJson j = RequestJson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  OpenAiRequest out;
  out.chat = chat;
  v1::GenerateRequest& r = out.request;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return field_error("model", "must be a string");
    r.set_model(it->get<std::string>());
  }
  PD_RETURN_IF_ERROR(chat ? parse_messages(j, chat_template, &r) : parse_prompt(j, &r));

  v1::SamplingParams* s = r.mutable_sampling();
  int max_tokens = 16;
  PD_RETURN_IF_ERROR(read_number(j, "max_tokens", &max_tokens, &out.max_tokens_given));
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
  int64_t seed = 0;
  bool has_seed = false;
  PD_RETURN_IF_ERROR(read_number(j, "seed", &seed, &has_seed));
  if (has_seed) s->set_seed(seed);
  bool ignore_eos = false;
  PD_RETURN_IF_ERROR(read_bool(j, "ignore_eos", &ignore_eos));
  s->set_ignore_eos(ignore_eos);
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

  PD_RETURN_IF_ERROR(read_bool(j, "stream", &out.stream));
  if (auto it = j.find("stream_options"); it != j.end() && it->is_object())
    PD_RETURN_IF_ERROR(read_bool(*it, "include_usage", &out.include_usage));
  int n = 1;
  PD_RETURN_IF_ERROR(read_number(j, "n", &n));
  if (n != 1) return field_error("n", "must be 1 (one completion per request)");
  int best_of = 1;
  PD_RETURN_IF_ERROR(read_number(j, "best_of", &best_of));
  if (best_of != 1) return field_error("best_of", "is not supported");
  bool echo = false;
  PD_RETURN_IF_ERROR(read_bool(j, "echo", &echo));
  if (echo) return field_error("echo", "is not supported");
  if (auto it = j.find("logprobs"); it != j.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()))
    return field_error("logprobs", "is not supported");
  return out;
}

void apply_openai_defaults(const v1::SamplingDefaults& model, v1::SamplingParams* s) {
  apply_sampling_defaults(model, s);
  if (!s->has_temperature()) s->set_temperature(1.0f);  // OpenAI's default.
}

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

json usage_body(int prompt_tokens, int completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_body(const OpenAiRequest& req, const std::string& id, int64_t created, const std::string& model,
                     const std::string& text, const std::string& finish_reason, int prompt_tokens, int completion_tokens) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}, {"logprobs", nullptr}};
  if (req.chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  return {{"id", id},
          {"object", req.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage_body(prompt_tokens, completion_tokens)}};
}

json chunk_body(const OpenAiRequest& req, const std::string& id, int64_t created, const std::string& model,
                const std::string& text, const std::optional<std::string>& finish_reason, bool first) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}, {"logprobs", nullptr}};
  if (req.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !finish_reason) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace pdserve::router
