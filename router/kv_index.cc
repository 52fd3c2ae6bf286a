#include "router/kv_index.h"

#include <algorithm>
#include <bit>
#include <chrono>

#include "common/logging.h"
#include "kvevents/wire.h"

namespace pdserve::router {

namespace kv = pdserve::kvevents;

namespace {

constexpr ReplayRequest kSnapshot{0, 0};

bool is_heartbeat(const kv::KvEventBatch& b) { return b.events_size() == 1 && b.events(0).has_heartbeat(); }

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::optional<size_t> tier_index(kv::Tier tier) {
  const auto t = kv::from_proto(tier);
  if (!t) return std::nullopt;
  return size_t(*t) - 1;
}

// Stored and Removed events carry the same (tier, keys): calls `f(tier, key)` for each key that
// decodes, and returns the keys the event listed (0 for a tier this index does not keep).
template <typename KeysEvent, typename F>
uint64_t for_each_key(const KeysEvent& e, F&& f) {
  const std::optional<size_t> t = tier_index(e.tier());
  if (!t) return 0;
  for (const std::string& k : e.keys())
    if (auto key = kv::key_from_bytes(k)) f(*t, *key);
  return uint64_t(e.keys_size());
}

}  // namespace

const char* to_string(WorkerKvState state) {
  switch (state) {
    case WorkerKvState::kExact: return "exact";
    case WorkerKvState::kRecovering: return "recovering";
    case WorkerKvState::kDegraded: return "degraded";
  }
  return "unknown";
}

KvIndex::Worker* KvIndex::find(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

const KvIndex::Worker* KvIndex::find(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

StatusOr<ReplayRequest> KvIndex::add_worker(const std::string& worker_id, std::optional<KvScheme> scheme) {
  std::lock_guard lock(mu_);
  if (Worker* w = find(worker_id)) {
    clear_worker(*w, std::nullopt);
    const int slot = w->slot;
    *w = Worker{};
    w->slot = slot;
  } else {
    if (used_slots_ == ~uint64_t(0)) {
      return absl::ResourceExhaustedError(absl::StrCat("KV index tracks at most ", kMaxWorkers, " workers"));
    }
    Worker fresh;
    fresh.slot = std::countr_one(used_slots_);
    used_slots_ |= uint64_t(1) << fresh.slot;
    workers_.emplace(worker_id, std::move(fresh));
  }
  Worker& w = *find(worker_id);
  w.scheme = std::move(scheme);
  w.wanted = kSnapshot;
  ++stats_.replays_requested;
  return kSnapshot;
}

void KvIndex::remove_worker(const std::string& worker_id) {
  std::lock_guard lock(mu_);
  Worker* w = find(worker_id);
  if (!w) return;
  clear_worker(*w, std::nullopt);
  used_slots_ &= ~(uint64_t(1) << w->slot);
  workers_.erase(worker_id);
}

std::optional<ReplayRequest> KvIndex::start_recovery(Worker& w, ReplayRequest request) {
  w.state = WorkerKvState::kRecovering;
  w.wanted = request;
  ++stats_.replays_requested;
  return request;
}

bool KvIndex::accepts(const std::string& worker_id, Worker& w, const kv::KvEventBatch& batch) {
  if (!w.scheme || (batch.key_scheme() == w.scheme->key_scheme && batch.block_size() == w.scheme->block_size &&
                    batch.compat_hash() == w.scheme->compat_hash))
    return true;
  ++stats_.rejected;
  if (!w.warned) {
    w.warned = true;
    PD_LOG_WARN("KV events of {} rejected: block size {} and compat hash {:x} (its Info says {} and {:x}), or "
                "another key scheme",
                worker_id, batch.block_size(), batch.compat_hash(), w.scheme->block_size, w.scheme->compat_hash);
  }
  return false;
}

void KvIndex::buffer(Worker& w, const kv::KvEventBatch& batch) {
  // A batch of another epoch than those buffered means the publisher restarted: the newest wins.
  if (!w.buffered.empty() && w.buffered.begin()->second.epoch() != batch.epoch()) w.buffered.clear();
  if (w.buffered.size() >= options_.max_buffered_batches) w.buffered.erase(w.buffered.begin());
  w.buffered.emplace(batch.seq(), batch);
}

std::optional<ReplayRequest> KvIndex::on_live(const std::string& worker_id, const kv::KvEventBatch& batch) {
  std::lock_guard lock(mu_);
  Worker* w = find(worker_id);
  if (!w || batch.snapshot() || !accepts(worker_id, *w, batch)) return std::nullopt;
  if (w->state != WorkerKvState::kExact) {
    // The pending replay (or the next retry) decides; data batches wait for it.
    if (!is_heartbeat(batch)) buffer(*w, batch);
    return std::nullopt;
  }
  if (batch.epoch() != w->epoch) {
    ++stats_.epochs;
    clear_worker(*w, std::nullopt);
    w->epoch = 0;
    w->last_seq = 0;
    if (!is_heartbeat(batch)) buffer(*w, batch);
    return start_recovery(*w, kSnapshot);
  }
  if (is_heartbeat(batch)) {
    const auto& hb = batch.events(0).heartbeat();
    if (hb.last_seq() > w->last_seq) {
      ++stats_.gaps;
      return start_recovery(*w, ReplayRequest{w->epoch, w->last_seq + 1});
    }
    const std::array<uint64_t, kTiers> counts = {hb.num_keys_device(), hb.num_keys_host(), hb.num_keys_disk()};
    if (hb.last_seq() == w->last_seq && counts != w->num_keys) {
      ++stats_.drifts;
      return start_recovery(*w, kSnapshot);
    }
    return std::nullopt;
  }
  if (batch.seq() <= w->last_seq) return std::nullopt;  // Already applied (a replay overlapped it).
  if (batch.seq() > w->last_seq + 1) {
    ++stats_.gaps;
    buffer(*w, batch);
    return start_recovery(*w, ReplayRequest{w->epoch, w->last_seq + 1});
  }
  apply(*w, batch);
  w->last_seq = batch.seq();
  const double lag = unix_now() - batch.ts_unix();
  stats_.last_lag_seconds = lag;
  stats_.max_lag_seconds = std::max(stats_.max_lag_seconds, lag);
  return std::nullopt;
}

void KvIndex::on_replay_batch(const std::string& worker_id, const kv::KvEventBatch& batch) {
  std::lock_guard lock(mu_);
  Worker* w = find(worker_id);
  if (!w || w->state == WorkerKvState::kExact) return;  // Not asked for.
  if (!accepts(worker_id, *w, batch)) {
    w->rejected_reply = true;
    return;
  }
  if (batch.snapshot()) {
    if (!w->snapshot_started) {
      clear_worker(*w, std::nullopt);
      w->snapshot_started = true;
      w->epoch = batch.epoch();
      w->last_seq = batch.snapshot_seq();
    }
    if (batch.epoch() == w->epoch) apply(*w, batch);
    return;
  }
  if (batch.epoch() == w->epoch && batch.seq() == w->last_seq + 1) {
    apply(*w, batch);
    w->last_seq = batch.seq();
  }
}

std::optional<ReplayRequest> KvIndex::on_replay_end(const std::string& worker_id) {
  std::lock_guard lock(mu_);
  Worker* w = find(worker_id);
  if (!w || w->state == WorkerKvState::kExact) return std::nullopt;
  if (w->rejected_reply) {
    w->rejected_reply = false;
    w->snapshot_started = false;
    w->state = WorkerKvState::kDegraded;
    return std::nullopt;
  }
  if (w->snapshot_started) ++stats_.snapshots;
  w->snapshot_started = false;
  if (w->epoch == 0) return start_recovery(*w, kSnapshot);  // The reply carried no snapshot.
  // The live batches that arrived meanwhile: those the reply covered are dropped.
  while (!w->buffered.empty()) {
    auto it = w->buffered.begin();
    const kv::KvEventBatch& b = it->second;
    // Another epoch's batch is stale (from before the snapshot) or from a restart since the
    // reply, which the restarted publisher's next heartbeat reveals in EXACT.
    if (b.epoch() == w->epoch && b.seq() > w->last_seq + 1) break;
    if (b.epoch() == w->epoch && b.seq() == w->last_seq + 1) {
      apply(*w, b);
      w->last_seq = b.seq();
    }
    w->buffered.erase(it);
  }
  ++stats_.replays_succeeded;
  if (!w->buffered.empty()) {
    ++stats_.gaps;
    return start_recovery(*w, ReplayRequest{w->epoch, w->last_seq + 1});
  }
  w->state = WorkerKvState::kExact;
  w->failures = 0;
  return std::nullopt;
}

std::optional<ReplayRequest> KvIndex::on_replay_failed(const std::string& worker_id) {
  std::lock_guard lock(mu_);
  Worker* w = find(worker_id);
  if (!w || w->state == WorkerKvState::kExact) return std::nullopt;
  ++stats_.replays_failed;
  if (w->snapshot_started) {  // A partial snapshot: only a whole new one can make it exact.
    w->snapshot_started = false;
    w->epoch = 0;
    w->wanted = kSnapshot;
  }
  if (++w->failures >= options_.max_failed_replays) w->state = WorkerKvState::kDegraded;
  ++stats_.replays_requested;
  return w->wanted;
}

void KvIndex::apply(Worker& w, const kv::KvEventBatch& batch) {
  ++stats_.applied_batches;
  for (const kv::KvEvent& e : batch.events()) {
    switch (e.kind_case()) {
      case kv::KvEvent::kStored:
        stats_.applied_stored += for_each_key(e.stored(), [&](size_t t, const engine::BlockKey& k) { set_present(w, t, k); });
        break;
      case kv::KvEvent::kRemoved:
        stats_.applied_removed +=
            for_each_key(e.removed(), [&](size_t t, const engine::BlockKey& k) { clear_present(w, t, k); });
        break;
      case kv::KvEvent::kCleared:
        clear_worker(w, tier_index(e.cleared().tier()));
        ++stats_.applied_cleared;
        break;
      default: break;
    }
  }
}

void KvIndex::set_present(Worker& w, size_t tier, const engine::BlockKey& key) {
  uint64_t& mask = entries_[key].masks[tier];
  const uint64_t bit = uint64_t(1) << w.slot;
  if (mask & bit) return;  // Set semantics: overlapping replays are idempotent.
  if (mask == 0) ++distinct_keys_[tier];
  mask |= bit;
  ++w.num_keys[tier];
}

void KvIndex::clear_present(Worker& w, size_t tier, const engine::BlockKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  uint64_t& mask = it->second.masks[tier];
  const uint64_t bit = uint64_t(1) << w.slot;
  if (!(mask & bit)) return;
  mask &= ~bit;
  if (mask == 0) --distinct_keys_[tier];
  --w.num_keys[tier];
  const auto& m = it->second.masks;
  if (std::all_of(m.begin(), m.end(), [](uint64_t x) { return x == 0; })) entries_.erase(it);
}

void KvIndex::clear_worker(Worker& w, std::optional<size_t> tier) {
  const uint64_t bit = uint64_t(1) << w.slot;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& m = it->second.masks;
    for (size_t t = 0; t < kTiers; ++t) {
      if ((tier && t != *tier) || !(m[t] & bit)) continue;
      m[t] &= ~bit;
      if (m[t] == 0) --distinct_keys_[t];
    }
    if (std::all_of(m.begin(), m.end(), [](uint64_t x) { return x == 0; })) {
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
  for (size_t t = 0; t < kTiers; ++t) {
    if (!tier || t == *tier) w.num_keys[t] = 0;
  }
}

std::optional<WorkerKvState> KvIndex::state(const std::string& worker_id) const {
  std::lock_guard lock(mu_);
  const Worker* w = find(worker_id);
  if (!w) return std::nullopt;
  return w->state;
}

std::optional<uint64_t> KvIndex::epoch(const std::string& worker_id) const {
  std::lock_guard lock(mu_);
  const Worker* w = find(worker_id);
  if (!w) return std::nullopt;
  return w->epoch;
}

std::optional<uint64_t> KvIndex::last_seq(const std::string& worker_id) const {
  std::lock_guard lock(mu_);
  const Worker* w = find(worker_id);
  if (!w) return std::nullopt;
  return w->last_seq;
}

std::vector<engine::BlockKey> KvIndex::keys(const std::string& worker_id, engine::KvTier tier) const {
  std::lock_guard lock(mu_);
  std::vector<engine::BlockKey> out;
  const Worker* w = find(worker_id);
  if (!w) return out;
  const uint64_t bit = uint64_t(1) << w->slot;
  const size_t t = size_t(tier) - 1;
  for (const auto& [key, entry] : entries_) {
    if (entry.masks[t] & bit) out.push_back(key);
  }
  std::sort(out.begin(), out.end());
  return out;
}

size_t KvIndex::num_keys(engine::KvTier tier) const {
  std::lock_guard lock(mu_);
  return distinct_keys_[size_t(tier) - 1];
}

size_t KvIndex::num_keys(const std::string& worker_id, engine::KvTier tier) const {
  std::lock_guard lock(mu_);
  const Worker* w = find(worker_id);
  return w == nullptr ? 0 : w->num_keys[size_t(tier) - 1];
}

KvIndexStats KvIndex::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::vector<WorkerMatch> KvIndex::match(std::span<const engine::BlockKey> chain, engine::KvTier tier) const {
  std::lock_guard lock(mu_);
  const size_t t = size_t(tier) - 1;
  std::array<size_t, kMaxWorkers> blocks{};
  uint64_t alive = used_slots_;
  size_t i = 0;
  for (; i < chain.size() && alive != 0; ++i) {
    auto it = entries_.find(chain[i]);
    const uint64_t next = it == entries_.end() ? 0 : (it->second.masks[t] & alive);
    for (uint64_t ended = alive & ~next; ended != 0; ended &= ended - 1) blocks[size_t(std::countr_zero(ended))] = i;
    alive = next;
  }
  for (; alive != 0; alive &= alive - 1) blocks[size_t(std::countr_zero(alive))] = i;
  std::vector<WorkerMatch> out;
  out.reserve(workers_.size());
  for (const auto& [id, w] : workers_) out.push_back({id, blocks[size_t(w.slot)], w.state});
  return out;
}

}  // namespace pdserve::router
