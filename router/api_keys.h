// The API keys a router accepts from its clients (--api-key, --api-key-file, PDSERVE_API_KEY):
// when any is set, every generation and model call needs one — HTTP as `Authorization: Bearer
// KEY`, gRPC as `authorization: Bearer KEY` metadata — and is refused without (HTTP 401, gRPC
// UNAUTHENTICATED). Health checks stay open; /metrics too unless asked otherwise.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::router {

class ApiKeys {
 public:
  ApiKeys() = default;  // None: every request is allowed.
  // The keys given on the command line, those of `file` (if set; see common/secrets.h) and
  // `env_value` ($PDSERVE_API_KEY, if set and not empty); InvalidArgument for an unreadable or
  // empty file or an empty key.
  static StatusOr<ApiKeys> load(const std::vector<std::string>& keys, const std::string& file, const char* env_value);

  // Whether requests need a key.
  bool required() const { return !keys_.empty(); }
  // Whether an `authorization` value ("Bearer KEY", scheme case-insensitive) carries an
  // accepted key; always true when none is required.
  bool allows(std::string_view authorization) const { return client_of(authorization).has_value(); }
  // The tag of the client an `authorization` value identifies ("key<N>", N the key's index;
  // "" when no key is required); nullopt when it carries no accepted key.
  std::optional<std::string> client_of(std::string_view authorization) const;
  size_t size() const { return keys_.size(); }

 private:
  std::vector<std::string> keys_;
};

}  // namespace pdserve::router
