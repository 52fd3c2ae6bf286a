#include "router/kv_routing.h"

#include <algorithm>

#include "common/logging.h"
#include "kvevents/wire.h"

namespace pdserve::router {

KvRouting::KvRouting(const Clock& clock, KvRoutingOptions options)
    : subscriber_(index_, options.subscriber), predicted_(clock, options.predicted_ttl) {}

void KvRouting::on_worker_info(const std::string& address, const worker::WorkerInfo& info) {
  Known k;
  k.worker_id = info.worker_id();
  k.pub_endpoint = info.kv_events_endpoint();
  k.replay_endpoint = info.kv_replay_endpoint();
  if (auto root = kvevents::key_from_bytes(info.kv_key_root())) k.key_root = *root;
  k.scheme = {std::string(kvevents::kKeySchemeV1) + kvevents::key_bytes(k.key_root), uint32_t(info.block_size()),
              info.compat_hash()};
  k.prefix_caching = info.prefix_caching() && info.kv_key_root().size() == k.key_root.bytes.size();
  std::optional<std::string> unsubscribe;
  {
    std::lock_guard lock(mu_);
    auto it = workers_.find(address);
    if (it != workers_.end() && it->second == k) return;
    if (it != workers_.end() && !it->second.pub_endpoint.empty()) unsubscribe = it->second.worker_id;
    workers_[address] = k;
  }
  // The subscriber's calls post to its thread; they never call back here.
  if (unsubscribe) subscriber_.remove_worker(*unsubscribe);
  predicted_.remove(address);
  if (k.pub_endpoint.empty()) return;
  const Status s = subscriber_.add_worker(k.worker_id, k.pub_endpoint, k.replay_endpoint, k.scheme);
  if (!s.ok()) {
    PD_LOG_WARN("KV events of {} ({}) not followed: {}", k.worker_id, address, std::string(s.message()));
  } else {
    PD_LOG_INFO("following the KV events of {} ({}) at {}", k.worker_id, address, k.pub_endpoint);
  }
}

void KvRouting::on_worker_removed(const std::string& address) {
  std::optional<std::string> unsubscribe;
  {
    std::lock_guard lock(mu_);
    auto it = workers_.find(address);
    if (it == workers_.end()) return;
    if (!it->second.pub_endpoint.empty()) unsubscribe = it->second.worker_id;
    workers_.erase(it);
  }
  if (unsubscribe) subscriber_.remove_worker(*unsubscribe);
  predicted_.remove(address);
}

std::optional<KvRouting::Known> KvRouting::known(const std::string& address) const {
  std::lock_guard lock(mu_);
  auto it = workers_.find(address);
  if (it == workers_.end()) return std::nullopt;
  return it->second;
}

std::vector<engine::BlockKey> KvRouting::keys_of(const Known& k, std::span<const int> tokens, std::string_view salt) {
  if (!k.prefix_caching || k.scheme.block_size == 0) return {};
  return engine::block_keys(engine::namespace_root(k.key_root, engine::canonical_namespace(salt)), tokens,
                            int(k.scheme.block_size));
}

std::vector<int> KvRouting::cached_blocks(const std::vector<std::string>& addresses, std::span<const int> tokens,
                                          std::string_view cache_salt) const {
  std::vector<int> out(addresses.size(), 0);
  // Workers of one deployment share a key space: the chain is computed once per distinct one.
  std::vector<std::pair<KvScheme, std::vector<engine::BlockKey>>> chains;
  for (size_t i = 0; i < addresses.size(); ++i) {
    const std::optional<Known> k = known(addresses[i]);
    if (!k || !k->prefix_caching) continue;
    auto c = std::find_if(chains.begin(), chains.end(), [&](const auto& x) { return x.first == k->scheme; });
    if (c == chains.end()) {
      chains.emplace_back(k->scheme, keys_of(*k, tokens, cache_salt));
      c = chains.end() - 1;
    }
    const std::vector<engine::BlockKey>& chain = c->second;
    size_t blocks = predicted_.match(addresses[i], chain);
    if (!k->pub_endpoint.empty() && index_.state(k->worker_id) == WorkerKvState::kExact) {
      for (const WorkerMatch& m : index_.match(chain))
        if (m.worker_id == k->worker_id) blocks = std::max(blocks, m.blocks);
    }
    out[i] = int(blocks);
  }
  return out;
}

void KvRouting::predict(const std::string& address, std::span<const int> tokens, std::string_view cache_salt) {
  const std::optional<Known> k = known(address);
  if (!k || !k->prefix_caching) return;
  predicted_.insert(address, keys_of(*k, tokens, cache_salt));
}

std::optional<KvRouting::WorkerView> KvRouting::view(const std::string& address) const {
  const std::optional<Known> k = known(address);
  if (!k) return std::nullopt;
  WorkerView v;
  v.worker_id = k->worker_id;
  if (!k->pub_endpoint.empty()) {
    v.state = index_.state(k->worker_id);
    v.keys = index_.keys(k->worker_id, engine::KvTier::kDevice);
  }
  return v;
}

}  // namespace pdserve::router
