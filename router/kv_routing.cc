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
  k.num_blocks = size_t(std::max(info.num_blocks(), 0));
  k.peer_tier = info.has_peer_tier();
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
  overlay_.remove(address);
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
  overlay_.remove(address);
}

std::optional<KvRouting::Known> KvRouting::known(const std::string& address) const {
  std::lock_guard lock(mu_);
  auto it = workers_.find(address);
  if (it == workers_.end()) return std::nullopt;
  return it->second;
}

const std::vector<engine::BlockKey>& KvRouting::keys_of(const Known& k, const PromptKeys& prompt) {
  static const std::vector<engine::BlockKey> kNone;
  if (!k.prefix_caching || k.scheme.block_size == 0) return kNone;
  // Workers of one deployment share a key space: the chain is computed once per distinct one.
  auto& chains = prompt.chains_;
  auto c = std::find_if(chains.begin(), chains.end(), [&](const auto& x) { return x.first == k.scheme; });
  if (c != chains.end()) return c->second;
  chains.emplace_back(k.scheme,
                      engine::block_keys(engine::namespace_root(k.key_root, engine::canonical_namespace(prompt.salt_)),
                                         prompt.tokens_, int(k.scheme.block_size)));
  return chains.back().second;
}

std::vector<int> KvRouting::cached_blocks(const std::vector<std::string>& addresses, const PromptKeys& prompt) const {
  std::vector<int> out(addresses.size(), 0);
  for (size_t i = 0; i < addresses.size(); ++i) {
    const std::optional<Known> k = known(addresses[i]);
    if (!k || !k->prefix_caching) continue;
    const std::vector<engine::BlockKey>& chain = keys_of(*k, prompt);
    size_t blocks = predicted_.match(addresses[i], chain);
    if (!k->pub_endpoint.empty()) {
      if (index_.state(k->worker_id) == WorkerKvState::kExact) {
        for (const WorkerMatch& m : index_.match(chain))
          if (m.worker_id == k->worker_id) blocks = std::max(blocks, m.blocks);
      } else {
        blocks = std::max(blocks, overlay_.match(addresses[i], chain));
      }
    }
    out[i] = int(blocks);
  }
  return out;
}

size_t KvRouting::host_match(const Known& k, const std::vector<engine::BlockKey>& chain) const {
  if (k.pub_endpoint.empty() || index_.state(k.worker_id) != WorkerKvState::kExact) return 0;
  for (const WorkerMatch& m : index_.match(chain, engine::KvTier::kHost))
    if (m.worker_id == k.worker_id) return m.blocks;
  return 0;
}

std::optional<KvRouting::HostHolder> KvRouting::host_holder(const std::vector<std::string>& addresses,
                                                            const PromptKeys& prompt) const {
  std::optional<HostHolder> best;
  for (const std::string& address : addresses) {
    const std::optional<Known> k = known(address);
    if (!k || !k->prefix_caching || !k->peer_tier) continue;
    const int blocks = int(host_match(*k, keys_of(*k, prompt)));
    if (blocks > 0 && (!best || blocks > best->blocks)) best = HostHolder{address, blocks};
  }
  return best;
}

int KvRouting::held_blocks(const std::string& address, const PromptKeys& prompt) const {
  const std::optional<Known> k = known(address);
  if (!k || !k->prefix_caching) return 0;
  return std::max(cached_blocks({address}, prompt).front(), int(host_match(*k, keys_of(*k, prompt))));
}

void KvRouting::predict(const std::string& address, const PromptKeys& prompt) {
  const std::optional<Known> k = known(address);
  if (!k || !k->prefix_caching) return;
  const std::vector<engine::BlockKey>& chain = keys_of(*k, prompt);
  predicted_.insert(address, chain);
  // Kept while the index is EXACT too, so it is warm the moment the index degrades.
  if (!k->pub_endpoint.empty()) overlay_.insert(address, chain, k->num_blocks);
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

KvIndexWorkerGauge KvRouting::gauge(const std::string& address) const {
  KvIndexWorkerGauge g;
  g.worker = address;
  const std::optional<Known> k = known(address);
  if (!k || k->pub_endpoint.empty()) return g;
  g.state = index_.state(k->worker_id);
  g.keys = index_.num_keys(k->worker_id, engine::KvTier::kDevice);
  return g;
}

}  // namespace pdserve::router
