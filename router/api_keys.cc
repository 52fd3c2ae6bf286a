#include "router/api_keys.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/secrets.h"

namespace pdserve::router {

StatusOr<ApiKeys> ApiKeys::load(const std::vector<std::string>& keys, const std::string& file, const char* env_value) {
  ApiKeys out;
  for (const std::string& k : keys) {
    const absl::string_view key = absl::StripAsciiWhitespace(k);
    if (key.empty()) return absl::InvalidArgumentError("--api-key: an empty key");
    out.keys_.emplace_back(key.data(), key.size());
  }
  if (!file.empty()) {
    PD_ASSIGN_OR_RETURN(std::vector<std::string> from_file, read_secret_file(file));
    out.keys_.insert(out.keys_.end(), from_file.begin(), from_file.end());
  }
  if (env_value != nullptr) {
    const absl::string_view env = absl::StripAsciiWhitespace(env_value);
    if (!env.empty()) out.keys_.emplace_back(env.data(), env.size());
  }
  return out;
}

std::optional<std::string> ApiKeys::client_of(std::string_view authorization) const {
  if (keys_.empty()) return std::string();
  const absl::string_view value =
      absl::StripAsciiWhitespace(absl::string_view(authorization.data(), authorization.size()));
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() || !absl::StartsWithIgnoreCase(value, kScheme)) return std::nullopt;
  const absl::string_view key = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  int match = -1;
  for (size_t i = 0; i < keys_.size(); ++i)  // No early exit: every key is compared.
    if (secret_equal(std::string_view(key.data(), key.size()), keys_[i])) match = int(i);
  if (match < 0) return std::nullopt;
  return absl::StrCat("key", match);
}

}  // namespace pdserve::router
