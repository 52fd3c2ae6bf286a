#include "engine/model/generation_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"

namespace pdserve::engine {
namespace {

using json = nlohmann::json;

// The number at `key`; nullopt when absent or null, InvalidArgument when not a finite number.
StatusOr<std::optional<double>> number_at(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number() || !std::isfinite(it->get<double>()))
    return absl::InvalidArgumentError(absl::StrCat(key, " must be a finite number, got ", it->dump()));
  return std::optional<double>(it->get<double>());
}

Status out_of_range(const char* key, double value, const char* range) {
  return absl::InvalidArgumentError(absl::StrCat(key, " must be ", range, ", got ", value));
}

StatusOr<GenerationDefaults> parse(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  GenerationDefaults d;
  PD_ASSIGN_OR_RETURN(const std::optional<double> temperature, number_at(j, "temperature"));
  PD_ASSIGN_OR_RETURN(const std::optional<double> top_p, number_at(j, "top_p"));
  PD_ASSIGN_OR_RETURN(const std::optional<double> top_k, number_at(j, "top_k"));
  PD_ASSIGN_OR_RETURN(const std::optional<double> penalty, number_at(j, "repetition_penalty"));
  PD_ASSIGN_OR_RETURN(const std::optional<double> min_p, number_at(j, "min_p"));
  PD_ASSIGN_OR_RETURN(const std::optional<double> max_new_tokens, number_at(j, "max_new_tokens"));
  if (temperature && *temperature < 0) return out_of_range("temperature", *temperature, ">= 0 (0: greedy)");
  if (top_p && !(*top_p > 0 && *top_p <= 1)) return out_of_range("top_p", *top_p, "in (0, 1]");
  if (top_k && (*top_k < 0 || *top_k != std::floor(*top_k) || *top_k > INT32_MAX))
    return out_of_range("top_k", *top_k, "an integer >= 0 (0: off)");
  if (penalty && *penalty <= 0) return out_of_range("repetition_penalty", *penalty, "> 0 (1: off)");
  if (min_p && !(*min_p >= 0 && *min_p <= 1)) return out_of_range("min_p", *min_p, "in [0, 1]");
  if (max_new_tokens && (*max_new_tokens <= 0 || *max_new_tokens != std::floor(*max_new_tokens)))
    return out_of_range("max_new_tokens", *max_new_tokens, "an integer > 0");

  bool do_sample = true;
  if (const auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return absl::InvalidArgumentError(absl::StrCat("do_sample must be a boolean, got ", it->dump()));
    do_sample = it->get<bool>();
  }
  if (do_sample) {
    if (temperature) d.temperature = float(*temperature);
    if (top_k) d.top_k = int(*top_k);
    if (top_p) d.top_p = float(*top_p);
  } else {
    d.temperature = 0.0f;
    const auto greedy = [&d](const char* key, double value) {
      d.not_applied.push_back(absl::StrCat(key, " ", value, ": do_sample is false, so the default is greedy"));
    };
    if (temperature) greedy("temperature", *temperature);
    if (top_k) greedy("top_k", *top_k);
    if (top_p) greedy("top_p", *top_p);
  }
  // Greedy decoding in transformers applies the repetition penalty too.
  if (penalty) d.repetition_penalty = float(*penalty);
  if (min_p && *min_p > 0) d.not_applied.push_back(absl::StrCat("min_p ", *min_p, ": pdserve has no min_p sampling"));
  if (max_new_tokens)
    d.not_applied.push_back(absl::StrCat("max_new_tokens ", *max_new_tokens,
                                         ": requests do not take their max_tokens from it"));
  return d;
}

}  // namespace

StatusOr<GenerationDefaults> parse_generation_defaults(const std::string& text, const std::string& source) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, " is not valid JSON"));
  auto d = parse(j);
  if (!d.ok()) return Status(d.status().code(), absl::StrCat(source, ": ", d.status().message()));
  return d;
}

std::string describe_generation_defaults(const GenerationDefaults& d) {
  std::vector<std::string> set;
  if (d.temperature) set.push_back(absl::StrCat("temperature ", *d.temperature));
  if (d.top_k) set.push_back(absl::StrCat("top_k ", *d.top_k));
  if (d.top_p) set.push_back(absl::StrCat("top_p ", *d.top_p));
  if (d.repetition_penalty) set.push_back(absl::StrCat("repetition_penalty ", *d.repetition_penalty));
  std::string out;
  if (!set.empty()) absl::StrAppend(&out, "sampling defaults for requests that leave them unset: ", absl::StrJoin(set, ", "));
  if (!d.not_applied.empty())
    absl::StrAppend(&out, out.empty() ? "" : "; ", "not applied: ", absl::StrJoin(d.not_applied, "; "));
  return out;
}

}  // namespace pdserve::engine
