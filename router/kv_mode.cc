#include "router/kv_mode.h"

#include <string>

namespace pdserve::router {

std::string_view kv_mode_name(KvMode mode) {
  switch (mode) {
    case KvMode::kPush: return "push";
    case KvMode::kPull: return "pull";
    case KvMode::kPullHost: return "pull-host";
    case KvMode::kAggregated: return "aggregated";
  }
  return "push";
}

StatusOr<KvMode> parse_kv_mode(std::string_view name) {
  for (KvMode m : {KvMode::kPush, KvMode::kPull, KvMode::kPullHost, KvMode::kAggregated})
    if (kv_mode_name(m) == name) return m;
  return absl::InvalidArgumentError(
      absl::StrCat("kv mode must be push, pull, pull-host or aggregated, not '", std::string(name), "'"));
}

}  // namespace pdserve::router
