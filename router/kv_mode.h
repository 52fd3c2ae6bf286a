// How a router serves requests: on aggregated workers, or split between prefill and decode
// workers with the KV pushed by the prefill side or pulled by the decode side — from the prefill
// worker's device blocks, or (pull-host) from a copy in its host tier, its device blocks freed at
// once. Parsed once from the flag, then compared as an enum.
#pragma once

#include <string_view>

#include "common/status.h"

namespace pdserve::router {

enum class KvMode { kPush, kPull, kPullHost, kAggregated };

// "push", "pull", "pull-host" or "aggregated" (the --kv-mode values, and what Worker requests carry).
std::string_view kv_mode_name(KvMode mode);
// The mode a --kv-mode value names; InvalidArgument for any other string.
StatusOr<KvMode> parse_kv_mode(std::string_view name);

}  // namespace pdserve::router
