// KvRouting: the router's view of its workers' prefix caches, for placement (docs/router.md,
// "Placement"). One KvIndex, fed by a KvEventSubscriber connection per worker that advertises
// KV-event endpoints: added when the registry first learns them (an Info poll; a registration
// triggers one at once), replaced when they or the worker's key space change (a restart), and
// dropped with the worker. Beside it, PredictedBlocks for the race before a dispatch's events.
// It computes a prompt's block keys as the engine does (engine/prefix/block_key.h), from each
// worker's advertised key root and the request's cache salt, and says how many leading blocks
// each worker holds.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "router/approximate_blocks.h"
#include "router/kv_event_subscriber.h"
#include "router/kv_index.h"
#include "router/kv_index_metrics.h"
#include "router/predicted_blocks.h"
#include "router/worker_registry.h"

namespace pdserve::router {

struct KvRoutingOptions {
  Duration predicted_ttl = std::chrono::seconds(2);  // llm-d's default.
  KvEventSubscriberOptions subscriber;
};

class KvRouting final : public WorkerInfoListener {
 public:
  explicit KvRouting(const Clock& clock, KvRoutingOptions options = {});

  void on_worker_info(const std::string& address, const worker::WorkerInfo& info) override;
  void on_worker_removed(const std::string& address) override;

  // One placement's prompt tokens in a cache-salt namespace, with their block keys computed at
  // most once per key space asked about: a placement looks up prefill and decode workers and
  // predicts on both from one hashing of the prompt.
  class PromptKeys {
   public:
    PromptKeys(std::span<const int> tokens, std::string_view cache_salt) : tokens_(tokens), salt_(cache_salt) {}

   private:
    friend class KvRouting;
    std::span<const int> tokens_;  // The caller's, alive as long as this.
    std::string_view salt_;
    mutable std::vector<std::pair<KvScheme, std::vector<engine::BlockKey>>> chains_;
  };

  // For each of `addresses`, the leading full blocks of the prompt that its prefix cache holds:
  // the events' count while the worker's index state is EXACT, or the predicted one, whichever
  // is more; for a worker with KV events whose index is not EXACT (recovering, degraded), the
  // approximate overlay's count instead of the events'; 0 for a worker without a prefix cache
  // or Info.
  std::vector<int> cached_blocks(const std::vector<std::string>& addresses, const PromptKeys& prompt) const;
  // Peer tier (docs/kv_offload.md): the worker among `addresses` that serves one
  // (WorkerInfo.peer_tier) whose host tier holds the most leading full blocks of the prompt, by
  // its KV events while its index is EXACT (no guesses: a named source that holds less costs
  // the prefill a round trip); nullopt when none holds any.
  struct HostHolder {
    std::string address;
    int blocks = 0;
  };
  std::optional<HostHolder> host_holder(const std::vector<std::string>& addresses, const PromptKeys& prompt) const;
  // Leading full blocks of the prompt that the worker at `address` holds in any of its device
  // and host tiers (the device's as cached_blocks counts them).
  int held_blocks(const std::string& address, const PromptKeys& prompt) const;
  // A request with the prompt was sent to `address`: its full blocks are predicted there, and
  // recorded in the approximate overlay.
  void predict(const std::string& address, const PromptKeys& prompt);

  // What the index holds for the worker at `address` (the debug endpoint); nullopt: unknown.
  struct WorkerView {
    std::string worker_id;
    std::optional<WorkerKvState> state;      // nullopt: it advertises no KV events.
    std::vector<engine::BlockKey> keys;      // Device tier, sorted.
  };
  std::optional<WorkerView> view(const std::string& address) const;
  // The index's state and device-tier key count for `address` (the metrics); nullopt state:
  // unknown, or no KV events.
  KvIndexWorkerGauge gauge(const std::string& address) const;
  KvIndexStats stats() const { return index_.stats(); }

 private:
  // What the worker's last Info said of its cache and events.
  struct Known {
    std::string worker_id;
    std::string pub_endpoint, replay_endpoint;
    engine::BlockKey key_root;
    KvScheme scheme;
    bool prefix_caching = false;
    size_t num_blocks = 0;  // The worker's KV capacity: the overlay's bound.
    bool peer_tier = false;  // It serves its host tier to other workers.
    bool operator==(const Known&) const = default;
  };
  std::optional<Known> known(const std::string& address) const;
  // The prompt's chain in `k`'s key space (empty without a prefix cache), hashed on first use.
  static const std::vector<engine::BlockKey>& keys_of(const Known& k, const PromptKeys& prompt);
  // Leading blocks of `chain` the worker's host tier holds, by its KV events (0 unless EXACT).
  size_t host_match(const Known& k, const std::vector<engine::BlockKey>& chain) const;

  KvIndex index_;
  KvEventSubscriber subscriber_;  // Feeds index_: declared after it, destroyed before it.
  PredictedBlocks predicted_;
  ApproximateBlocks overlay_;
  mutable std::mutex mu_;
  std::map<std::string, Known> workers_;  // By address; guarded by mu_.
};

}  // namespace pdserve::router
