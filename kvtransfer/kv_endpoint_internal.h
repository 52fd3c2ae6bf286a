// What KvRankEndpoint's files (kv_endpoint*.cc, one concept each) share and nothing else uses:
// the arenas' region names in the handshake, and how a refusal of caller input is reported.
#pragma once

#include "common/logging.h"

namespace pdserve::kvtransfer {

inline constexpr const char* kArenaRegion = "kv_arena";
inline constexpr const char* kHostArenaRegion = "host_kv_arena";

}  // namespace pdserve::kvtransfer

// Refusals of caller input are logged here: a router bug must be visible in the worker's log.
#define PD_REFUSE_IF_ERROR(expr)                                                      \
  do {                                                                                \
    ::absl::Status pd_refused_ = (expr);                                              \
    if (!pd_refused_.ok()) {                                                          \
      ++counters_.refused;                                                            \
      PD_LOG_WARN("kvtransfer {}.{}: refused: {}", options_.name, options_.rank,      \
                  pd_refused_.ToString());                                            \
      return pd_refused_;                                                             \
    }                                                                                 \
  } while (0)
