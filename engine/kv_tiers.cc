#include "engine/kv_tiers.h"

#include "common/logging.h"

namespace pdserve::engine {

Status check_disk_tier_flags(const std::string& dir, uint64_t dir_bytes, Duration load_timeout) {
  if (load_timeout < Duration::zero()) return absl::InvalidArgumentError("--kv-load-timeout-ms must not be negative");
  if (dir.empty() && dir_bytes > 0) return absl::InvalidArgumentError("--kv-offload-dir-bytes needs --kv-offload-dir");
  if (dir.empty() && load_timeout > Duration::zero())
    return absl::InvalidArgumentError("--kv-load-timeout-ms bounds the filesystem tier's loads: it needs --kv-offload-dir");
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<KvTiers>> KvTiers::create(std::vector<HostKvTier::DeviceRank> device, Options options) {
  PD_RETURN_IF_ERROR(check_disk_tier_flags(options.disk.dir, options.disk.max_bytes, options.load_timeout));
  PD_ASSIGN_OR_RETURN(auto host, HostKvTier::create(std::move(device), options.host_bytes_per_rank, options.sink));
  std::unique_ptr<FsKvTier> disk;
  if (!options.disk.dir.empty()) {
    PD_ASSIGN_OR_RETURN(disk, FsKvTier::create(options.disk));
  }
  return std::unique_ptr<KvTiers>(new KvTiers(std::move(host), std::move(disk), options));
}

KvTiers::KvTiers(std::unique_ptr<HostKvTier> host, std::unique_ptr<FsKvTier> disk, const Options& options)
    : host_(std::move(host)),
      disk_(std::move(disk)),
      block_size_(options.disk.block_size),
      load_timeout_(options.load_timeout),
      clock_(*options.clock),
      on_prefetched_(options.on_prefetched) {
  if (disk_) loader_ = std::thread([this] { loader(); });
}

KvTiers::~KvTiers() {
  {
    std::lock_guard lock(loader_mu_);
    stop_ = true;
  }
  loader_cv_.notify_all();
  if (loader_.joinable()) loader_.join();
}

std::shared_ptr<KvTiers::Prefetch> KvTiers::prefetch(const Chain& chain, int from, int limit,
                                                     std::string_view request_id) {
  if (!disk_) return nullptr;
  const int c = disk_->chunk_blocks();
  const int first = from / c * c;
  limit = std::min<int>(limit, int(chain.keys.size()));
  const int end = limit / c * c;
  if (end <= first) return nullptr;
  auto p = std::make_shared<Prefetch>();
  p->request_id = std::string(request_id);
  p->keys.assign(chain.keys.begin() + first, chain.keys.begin() + end);
  p->tokens.assign(chain.tokens.begin() + int64_t(first) * block_size_, chain.tokens.begin() + int64_t(end) * block_size_);
  p->first = first;
  p->started = clock_.now();
  {
    std::lock_guard lock(loader_mu_);
    prefetches_.push_back(p);
  }
  ++disk_pending_loads_;
  loader_cv_.notify_one();
  return p;
}

void KvTiers::loader() {
  std::unique_lock lock(loader_mu_);
  while (true) {
    loader_cv_.wait(lock, [&] { return stop_ || !prefetches_.empty(); });
    if (stop_) break;
    std::shared_ptr<Prefetch> p = std::move(prefetches_.front());
    prefetches_.pop_front();
    lock.unlock();
    read_chunks(*p);
    p->done_.store(true, std::memory_order_release);
    if (on_prefetched_) on_prefetched_();
    lock.lock();
  }
  // Nobody waits for the rest any more (the engine is going): they end empty.
  for (auto& p : prefetches_) p->done_.store(true, std::memory_order_release);
  prefetches_.clear();
}

void KvTiers::read_chunks(Prefetch& p) {
  const int c = disk_->chunk_blocks();
  const int b = block_size_;
  // One clock reading before each file (and one after the last read).
  TimePoint now = clock_.now();
  const TimePoint reading = now;
  for (size_t at = 0; at + size_t(c) <= p.keys.size(); at += size_t(c)) {
    if (stop_.load() || p.cancelled_.load(std::memory_order_relaxed)) break;
    if (load_timeout_ > Duration::zero() && now - p.started >= load_timeout_) {
      ++disk_load_timeouts_;
      PD_LOG_DEBUG("{}: the filesystem tier's load passed --kv-load-timeout-ms at block {}: computing the rest",
                   p.request_id, p.first + int(at));
      break;
    }
    auto payload = disk_->load(std::span(p.keys).subspan(at, size_t(c)),
                               std::span(p.tokens).subspan(at * size_t(b), size_t(c) * size_t(b)));
    now = clock_.now();
    if (!payload) break;
    p.payloads.push_back(std::move(*payload));
  }
  disk_load_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(now - reading).count();
}

void KvTiers::store(const Chain& chain, int blocks, Progress& progress, std::string_view request_id) {
  if (blocks <= progress.host) return;
  auto held = host_->store(chain.keys, chain.ns_root, chain.tokens, chain.blocks, blocks);
  if (!held.ok()) {
    PD_LOG_ERROR("storing {} in the host KV tier: {}", request_id, held.status().ToString());
    return;
  }
  progress.host = *held;
  if (!disk_) return;
  // Whole chunks the host tier holds go on to the filesystem tier (cascaded copies).
  const int c = disk_->chunk_blocks();
  const int b = block_size_;
  for (int from = progress.disk; from + c <= progress.host; from += c) {
    auto payload = host_->export_canonical(chain.keys, chain.ns_root, chain.tokens, from, c);
    if (!payload) break;
    FsKvTier::Chunk chunk;
    chunk.keys.assign(chain.keys.begin() + from, chain.keys.begin() + from + c);
    chunk.tokens.assign(chain.tokens.begin() + int64_t(from) * b, chain.tokens.begin() + int64_t(from + c) * b);
    if (from > 0) chunk.parent = chain.keys[size_t(from) - 1];
    chunk.first_block_index = uint32_t(from);
    chunk.payload = std::move(*payload);
    disk_->store(std::move(chunk));
    progress.disk = from + c;
  }
}

int KvTiers::load_host(const Chain& chain, int at, int limit, std::string_view request_id) {
  auto end = host_->load(chain.keys, chain.ns_root, chain.tokens, chain.blocks, at, limit);
  if (!end.ok()) {
    PD_LOG_ERROR("loading {} from the host KV tier: {} (computing it instead)", request_id, end.status().ToString());
    return at;
  }
  return *end;
}

KvTiers::Loaded KvTiers::load(const Chain& chain, int from, int limit, Progress& progress,
                              std::string_view request_id, const Prefetch* prefetched) {
  Loaded loaded;
  loaded.host_end = load_host(chain, from, limit, request_id);
  int computed = loaded.host_end;
  const int c = disk_ ? disk_->chunk_blocks() : 0;
  // The prefetched chunks continue the run, each promoted through the host tier (whose chain
  // must reach it: what the device held of the prefix is stored there first).
  while (prefetched && computed < limit && (computed / c + 1) * c <= limit) {
    const int first = computed / c * c;
    const int k = (first - prefetched->first) / c;
    if (first < prefetched->first || k >= int(prefetched->payloads.size())) break;
    if (host_->held_prefix(chain.keys.first(size_t(first)), chain.ns_root, chain.tokens) < first) {
      auto held = host_->store(chain.keys, chain.ns_root, chain.tokens, chain.blocks, first);
      if (!held.ok() || *held < first) break;
    }
    auto held = host_->import_canonical(chain.keys, chain.ns_root, chain.tokens, first, c,
                                        prefetched->payloads[size_t(k)]);
    if (!held.ok()) {
      PD_LOG_ERROR("importing a chunk of {} into the host KV tier: {}", request_id, held.status().ToString());
      break;
    }
    const int end = load_host(chain, computed, limit, request_id);
    if (end <= computed) break;
    computed = end;
  }
  progress.host = std::max(progress.host, computed);
  loaded.end = computed;
  return loaded;
}

}  // namespace pdserve::engine
