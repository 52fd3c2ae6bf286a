// A byte-level simulation of one request's KV transfer between a producer TP group and a
// consumer TP group, used as the correctness oracle for rank map + geometry + plan. Producer
// arenas are filled with values that encode (layer, global head, token position, part,
// element); every pair's plan is applied with memcpy; each consumer element is then checked
// against the value it must hold, read through the consumer's own KvCacheLayout::offset, and
// every consumer byte must be written exactly once if it belongs to the request and never
// otherwise. Hooks corrupt the planning inputs so that tests can show the oracle catches
// wrong geometry or a wrong rank map.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/kv_spec.h"
#include "kvtransfer/rank_map.h"
#include "kvtransfer/transfer_plan.h"

namespace pdserve::kvtransfer::testing {

struct SimRequest {
  int producer_tp = 1;
  int consumer_tp = 1;
  int producer_num_blocks = 0;
  int consumer_num_blocks = 0;
  std::vector<int> producer_blocks;
  std::vector<int> consumer_blocks;
};

// Ways to plan wrongly; all unset plans correctly.
struct SimFaults {
  // Plan with layouts (and a rank map) of this spec instead of the true one.
  std::optional<engine::KvCacheSpec> planning_spec;
  // Applied to the rank map before planning.
  std::function<void(RankMap&)> mutate_map;
  // Applied to each pair's plan before it is executed.
  std::function<void(TransferPlan&)> mutate_plan;
  // producer_arena_of[p]: the arena the ops planned for producer rank p read from (a
  // transport connected to the wrong peer). Empty means identity.
  std::vector<int> producer_arena_of;
};

struct SimReport {
  Status plan_status;  // First planning failure, if any.
  int64_t out_of_bounds_ops = 0;
  int64_t wrong_elements = 0;
  int64_t unwritten_bytes = 0;
  int64_t rewritten_bytes = 0;  // Request bytes written more than once.
  int64_t stray_bytes = 0;      // Bytes outside the request's blocks that were written.
  uint64_t ops = 0;
  uint64_t bytes = 0;

  bool ok() const {
    return plan_status.ok() && out_of_bounds_ops == 0 && wrong_elements == 0 && unwritten_bytes == 0 &&
           rewritten_bytes == 0 && stray_bytes == 0;
  }
  std::string describe() const;
};

SimReport simulate(const engine::KvCacheSpec& spec, const SimRequest& request, const SimFaults& faults = {});

// A spec that mixes every layout feature kvtransfer must handle: separate and interleaved
// layouts, key-only layers, token- and head-major orders, 8/4/2/1 KV heads, different K and V
// head dims, f32 and bf16, and replicated layers. Valid for every TP in {1, 2, 4, 8}.
engine::KvCacheSpec mixed_spec();

}  // namespace pdserve::kvtransfer::testing
