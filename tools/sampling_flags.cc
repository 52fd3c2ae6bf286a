#include "tools/sampling_flags.h"

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pdserve::tools {

StatusOr<std::vector<std::pair<int, float>>> parse_logit_bias(absl::string_view spec) {
  std::vector<std::pair<int, float>> out;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t colon = entry.find(':');
    int id = 0;
    float bias = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(entry.substr(0, colon), &id) ||
        !absl::SimpleAtof(entry.substr(colon + 1), &bias))
      return absl::InvalidArgumentError(absl::StrCat("'", entry, "' is not ID:BIAS"));
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is negative"));
    out.emplace_back(id, bias);
  }
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first)
      return absl::InvalidArgumentError(absl::StrCat("token id ", out[i].first, " is given twice"));
  return out;
}

void add_output_sampling_flags(CLI::App* cmd, engine::SamplingParams* p) {
  cmd->add_option("--frequency-penalty", p->frequency_penalty,
                  "In [-2, 2], 0 = off: each token's logit less this times its count in the output so far")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", p->presence_penalty,
                  "In [-2, 2], 0 = off: each token's logit less this once it occurs in the output so far")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--logit-bias",
         [p](const std::string& spec) {
           // The check below already refused a bad spec.
           if (auto parsed = parse_logit_bias(spec); parsed.ok()) p->logit_bias = std::move(*parsed);
         },
         "ID:BIAS[,ID:BIAS...]: added to those tokens' logits, each in [-100, 100]")
      ->check([](const std::string& spec) {
        StatusOr<std::vector<std::pair<int, float>>> parsed = parse_logit_bias(spec);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      });
  cmd->add_option("--min-tokens", p->min_tokens,
                  "EOS and stop tokens are not sampled, and stop strings do not stop, before this many tokens")
      ->capture_default_str();
  cmd->add_option("--logprobs", p->logprobs,
                  "Report each generated token's log-probability and its N most likely alternatives (0..20; -1: none)")
      ->capture_default_str();
  cmd->add_option("--prompt-logprobs", p->prompt_logprobs,
                  "The same for each prompt token after the first (0..20; -1: none)")
      ->capture_default_str();
  cmd->add_flag_callback("--no-skip-special-tokens", [p] { p->skip_special_tokens = false; },
                         "Keep special tokens' text in the output");
}

}  // namespace pdserve::tools
