#include "engine/fs_kv_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/logging.h"

namespace pdserve::engine {
namespace {

// The header: one 4096-byte page, little-endian fields at fixed offsets, then the tokens and
// the payload, each from a page boundary.
constexpr char kMagic[8] = {'P', 'D', 'K', 'V', 'C', 'H', 'K', '1'};
// 2: the first block's parent key and index (KV events). Files of another version are misses
// (and live in another directory: pdkv-v<version>-<root>).
constexpr uint32_t kVersion = 2;
constexpr uint64_t kHeaderBytes = 4096;
constexpr size_t kKeysAt = 128;  // Block keys, 16 bytes each (at most 240 of them).
constexpr size_t kMaxChunkBlocks = (kHeaderBytes - kKeysAt - 16) / 16;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t compat;
  uint8_t key_root[16];
  uint32_t num_blocks;
  uint32_t block_size;
  uint64_t tokens_off, tokens_bytes;
  uint64_t payload_off, payload_bytes;
  uint64_t payload_xxh3;
  uint64_t writer_pid;
  uint64_t created_unix_ns;
  uint32_t first_block_index;
  uint32_t has_parent;
  uint8_t parent[16];
};
static_assert(sizeof(Header) <= kKeysAt);
constexpr size_t kHeaderHashAt = kHeaderBytes - 8;  // xxh3 of bytes [0, kHeaderHashAt).

uint64_t page_round(uint64_t n) { return (n + kHeaderBytes - 1) / kHeaderBytes * kHeaderBytes; }

Status write_all(int fd, const void* data, size_t bytes, off_t at) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("pwrite: ", std::strerror(errno)));
    }
    p += n;
    bytes -= size_t(n);
    at += n;
  }
  return absl::OkStatus();
}

bool read_all(int fd, void* data, size_t bytes, off_t at) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= size_t(n);
    at += n;
  }
  return true;
}

BlockKey key_at(const uint8_t* p) {
  BlockKey k;
  std::memcpy(k.bytes.data(), p, 16);
  return k;
}

// Where a file's chunk sits in its sequence, from its header (the KV events' chain).
void set_chain(const Header& h, FsKvTier::Chunk& chunk) {
  chunk.first_block_index = h.first_block_index;
  if (h.has_parent) chunk.parent.emplace(key_at(h.parent));
}

// Why a header read from a file is not one of this tier's (empty: it is): its checksum, magic,
// version, geometry and key root.
std::string header_problem(const std::vector<uint8_t>& header, const Header& h, uint64_t compat,
                           const BlockKey& key_root, int block_size) {
  uint64_t header_hash = 0;
  std::memcpy(&header_hash, header.data() + kHeaderHashAt, 8);
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != kVersion || h.header_bytes != kHeaderBytes)
    return "magic or version";
  if (header_hash != XXH3_64bits(header.data(), kHeaderHashAt)) return "header checksum";
  if (h.compat != compat || std::memcmp(h.key_root, key_root.bytes.data(), 16) != 0 ||
      h.block_size != uint32_t(block_size) || h.num_blocks == 0 || h.num_blocks > kMaxChunkBlocks)
    return "geometry, key root or block count";
  return "";
}

// A temporary file's writer pid (name: <final>.tmp.<pid>.<random>), or -1.
long temp_writer(const std::string& name) {
  const size_t at = name.find(".tmp.");
  if (at == std::string::npos) return -1;
  return std::strtol(name.c_str() + at + 5, nullptr, 10);
}

}  // namespace

StatusOr<std::unique_ptr<FsKvTier>> FsKvTier::create(Options options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("--kv-offload-dir is empty");
  if (options.chunk_blocks <= 0 || size_t(options.chunk_blocks) > kMaxChunkBlocks || options.block_size <= 0)
    return absl::InvalidArgumentError("bad filesystem tier chunk geometry");
  auto tier = std::unique_ptr<FsKvTier>(new FsKvTier(std::move(options)));
  std::error_code ec;
  std::filesystem::create_directories(tier->root_, ec);
  if (ec)
    return absl::FailedPreconditionError(
        absl::StrCat("--kv-offload-dir: cannot create ", tier->root_, ": ", ec.message()));
  // Temporary files of writers that are gone (killed mid-write): another live process may be
  // writing in a shared directory, so only those whose pid is dead, or that are over a minute
  // old, go.
  const auto now = std::filesystem::file_time_type::clock::now();
  for (auto it = std::filesystem::recursive_directory_iterator(tier->root_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const long pid = temp_writer(name);
    if (pid < 0 || !it->is_regular_file(ec)) continue;
    const bool dead = pid == 0 || (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) || pid == ::getpid();
    const bool old = now - it->last_write_time(ec) > std::chrono::minutes(1);
    if ((dead || old) && std::filesystem::remove(it->path(), ec)) ++tier->counters_.removed_temp_files;
  }
  tier->writer_ = std::thread([t = tier.get()] { t->writer(); });
  tier->scanner_ = std::thread([t = tier.get()] { t->scan(); });
  return tier;
}

FsKvTier::FsKvTier(Options options)
    : options_(std::move(options)),
      root_(absl::StrCat(options_.dir, "/pdkv-v", kVersion, "-", options_.key_root.hex().substr(0, 16))) {}

FsKvTier::~FsKvTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (scanner_.joinable()) scanner_.join();
}

std::string FsKvTier::path_of(const BlockKey& last) const {
  const std::string hex = last.hex();
  return absl::StrCat(root_, "/", hex.substr(0, 2), "/", hex.substr(2, 2), "/", hex, ".kvc");
}

bool FsKvTier::store(Chunk chunk) {
  if (int(chunk.keys.size()) != options_.chunk_blocks ||
      chunk.tokens.size() != size_t(options_.chunk_blocks) * size_t(options_.block_size))
    return false;
  std::lock_guard lock(mu_);
  if (files_.count(path_of(chunk.keys.back()))) return false;  // Content-addressed: stored already.
  for (const Chunk& q : queue_)
    if (q.keys.back() == chunk.keys.back()) return false;
  if (queue_.size() >= options_.max_queued_chunks) {
    ++counters_.dropped_chunks;
    return false;
  }
  queue_.push_back(std::move(chunk));
  cv_.notify_all();
  return true;
}

void FsKvTier::flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

FsKvTier::Counters FsKvTier::counters() const {
  std::lock_guard lock(mu_);
  Counters c = counters_;
  c.files = files_.size();
  return c;
}

void FsKvTier::writer() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // Stopping, and every queued chunk is written.
    Chunk chunk = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    const Status written = write_file(chunk);
    lock.lock();
    writing_ = false;
    if (written.ok()) {
      ++counters_.stored_chunks;
    } else {
      ++counters_.dropped_chunks;
      PD_LOG_WARN("filesystem KV tier: {}", written.ToString());
    }
    cv_.notify_all();
  }
}

Status FsKvTier::write_file(const Chunk& chunk) {
  const std::string final_path = path_of(chunk.keys.back());
  std::error_code ec;
  if (struct stat existing {}; ::stat(final_path.c_str(), &existing) == 0) {
    // Another writer's (or this one's, not indexed yet): indexed and announced, not written again.
    std::lock_guard lock(mu_);
    if (!files_.count(final_path)) note_file(final_path, uint64_t(existing.st_size), chunk);
    return absl::OkStatus();
  }
  std::filesystem::create_directories(std::filesystem::path(final_path).parent_path(), ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create the directory of ", final_path, ": ", ec.message()));
  std::vector<uint8_t> header(kHeaderBytes, 0);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.header_bytes = uint32_t(kHeaderBytes);
  h.compat = options_.compat;
  std::memcpy(h.key_root, options_.key_root.bytes.data(), 16);
  h.num_blocks = uint32_t(chunk.keys.size());
  h.block_size = uint32_t(options_.block_size);
  h.tokens_off = kHeaderBytes;
  h.tokens_bytes = chunk.tokens.size() * sizeof(int32_t);
  h.payload_off = h.tokens_off + page_round(h.tokens_bytes);
  h.payload_bytes = chunk.payload.size();
  h.payload_xxh3 = XXH3_64bits(chunk.payload.data(), chunk.payload.size());
  h.writer_pid = uint64_t(::getpid());
  h.created_unix_ns =
      uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count());
  h.first_block_index = chunk.first_block_index;
  h.has_parent = chunk.parent.has_value();
  if (chunk.parent) std::memcpy(h.parent, chunk.parent->bytes.data(), 16);
  std::memcpy(header.data(), &h, sizeof(h));
  for (size_t i = 0; i < chunk.keys.size(); ++i)
    std::memcpy(header.data() + kKeysAt + 16 * i, chunk.keys[i].bytes.data(), 16);
  const uint64_t header_hash = XXH3_64bits(header.data(), kHeaderHashAt);
  std::memcpy(header.data() + kHeaderHashAt, &header_hash, 8);

  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string temp = absl::StrCat(final_path, ".tmp.", ::getpid(), ".", rng());
  const int fd = ::open(temp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", temp, ": ", std::strerror(errno)));
  Status s = write_all(fd, header.data(), header.size(), 0);
  if (s.ok()) s = write_all(fd, chunk.tokens.data(), h.tokens_bytes, off_t(h.tokens_off));
  if (s.ok()) s = write_all(fd, chunk.payload.data(), h.payload_bytes, off_t(h.payload_off));
  // On disk before the name is: a crash leaves a temporary file or a whole one, never a torn one.
  if (s.ok() && ::fdatasync(fd) != 0) s = absl::InternalError(absl::StrCat("fdatasync: ", std::strerror(errno)));
  ::close(fd);
  if (s.ok() && ::rename(temp.c_str(), final_path.c_str()) != 0)
    s = absl::InternalError(absl::StrCat("rename to ", final_path, ": ", std::strerror(errno)));
  if (!s.ok()) {
    ::unlink(temp.c_str());
    return s;
  }
  std::lock_guard lock(mu_);
  note_file(final_path, h.payload_off + h.payload_bytes, chunk);
  evict_locked();
  return absl::OkStatus();
}

std::optional<std::vector<uint8_t>> FsKvTier::load(std::span<const BlockKey> keys, std::span<const int32_t> tokens) {
  if (int(keys.size()) != options_.chunk_blocks || tokens.size() != keys.size() * size_t(options_.block_size))
    return std::nullopt;
  const std::string path = path_of(keys.back());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // ENOENT: a miss; indexed, another worker evicted it (its keys are removed).
    if (errno == ENOENT) {
      std::lock_guard lock(mu_);
      forget_file(path);
    }
    return std::nullopt;
  }
  struct stat opened {};
  ::fstat(fd, &opened);
  std::string reason;
  std::vector<uint8_t> header(kHeaderBytes);
  std::vector<uint8_t> payload;
  Header h{};
  if (!read_all(fd, header.data(), header.size(), 0)) {
    reason = "short header";
  } else {
    std::memcpy(&h, header.data(), sizeof(h));
    reason = header_problem(header, h, options_.compat, options_.key_root, options_.block_size);
    if (reason.empty() && h.num_blocks != keys.size()) {
      reason = "block count";
    } else if (reason.empty()) {
      for (size_t i = 0; i < keys.size() && reason.empty(); ++i)
        if (std::memcmp(header.data() + kKeysAt + 16 * i, keys[i].bytes.data(), 16) != 0) reason = "block keys";
    }
  }
  if (reason.empty()) {
    std::vector<int32_t> stored(tokens.size());
    if (h.tokens_bytes != tokens.size() * sizeof(int32_t) ||
        !read_all(fd, stored.data(), h.tokens_bytes, off_t(h.tokens_off)))
      reason = "short tokens";
    else if (!std::equal(stored.begin(), stored.end(), tokens.begin()))
      reason = "tokens";
  }
  if (reason.empty()) {
    payload.resize(h.payload_bytes);
    if (h.payload_bytes > (uint64_t(1) << 34) || !read_all(fd, payload.data(), payload.size(), off_t(h.payload_off)))
      reason = "short payload";
    else if (XXH3_64bits(payload.data(), payload.size()) != h.payload_xxh3)
      reason = "payload checksum";
  }
  ::close(fd);
  std::lock_guard lock(mu_);
  if (!reason.empty()) {
    // Deleted only if it is still the file that failed (a writer may have replaced it).
    struct stat now {};
    if (::stat(path.c_str(), &now) == 0 && now.st_ino == opened.st_ino && now.st_dev == opened.st_dev)
      ::unlink(path.c_str());
    forget_file(path);
    ++counters_.corrupt_files;
    PD_LOG_WARN("filesystem KV tier: {} failed its check ({}): deleted, computed instead", path, reason);
    return std::nullopt;
  }
  ++counters_.loaded_chunks;
  struct stat now {};
  const bool still_there =
      ::stat(path.c_str(), &now) == 0 && now.st_ino == opened.st_ino && now.st_dev == opened.st_dev;
  if (!files_.count(path) && still_there) {
    // Written by another worker, not scanned yet: announced with what the read checked.
    Chunk chunk;
    chunk.keys.assign(keys.begin(), keys.end());
    chunk.tokens.assign(tokens.begin(), tokens.end());
    set_chain(h, chunk);
    note_file(path, h.payload_off + h.payload_bytes, chunk);
  } else if (files_.count(path)) {
    files_[path].used = ++clock_;
  }
  return payload;
}

void FsKvTier::note_file(const std::string& path, uint64_t bytes, const Chunk& chunk) {
  auto [it, added] = files_.try_emplace(path);
  File& f = it->second;
  counters_.bytes += bytes - f.bytes;
  f.bytes = bytes;
  f.used = ++clock_;
  if (!added) return;
  f.keys = chunk.keys;
  if (!options_.sink || chunk.keys.empty()) return;
  options_.sink->stored(KvTier::kDisk, chunk.parent, chunk.keys, chunk.first_block_index, chunk.tokens);
  options_.sink->step_end();  // This tier's threads step no engine: each file is a batch.
}

void FsKvTier::forget_file(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) return;
  counters_.bytes -= it->second.bytes;
  if (options_.sink && !it->second.keys.empty()) {
    options_.sink->removed(KvTier::kDisk, it->second.keys);
    options_.sink->step_end();
  }
  files_.erase(it);
}

std::vector<BlockKey> FsKvTier::cached_keys() const {
  std::lock_guard lock(mu_);
  std::vector<BlockKey> keys;
  for (const auto& [path, f] : files_) keys.insert(keys.end(), f.keys.begin(), f.keys.end());
  return keys;
}

void FsKvTier::wait_scanned() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return scanned_; });
}

void FsKvTier::evict_locked() {
  if (options_.max_bytes == 0 || counters_.bytes <= options_.max_bytes / 100 * 95) return;
  std::vector<std::pair<uint64_t, std::string>> by_use;
  for (const auto& [path, f] : files_) by_use.push_back({f.used, path});
  std::sort(by_use.begin(), by_use.end());
  for (const auto& [used, path] : by_use) {
    if (counters_.bytes <= options_.max_bytes / 100 * 85) break;
    ::unlink(path.c_str());  // A reader holding it open keeps its bytes.
    forget_file(path);
    ++counters_.evicted_files;
  }
}

void FsKvTier::scan() {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    {
      std::lock_guard lock(mu_);
      if (stop_) break;
    }
    const std::string path = it->path().string();
    if (!path.ends_with(".kvc") || !it->is_regular_file(ec)) continue;
    // Its header and tokens, for its KV events (a file that fails a check is left for a read to
    // delete: the scan only indexes).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    std::vector<uint8_t> header(kHeaderBytes);
    Header h{};
    Chunk chunk;
    bool good = read_all(fd, header.data(), header.size(), 0);
    if (good) {
      std::memcpy(&h, header.data(), sizeof(h));
      good = header_problem(header, h, options_.compat, options_.key_root, options_.block_size).empty() &&
             h.tokens_bytes == uint64_t(h.num_blocks) * h.block_size * sizeof(int32_t);
    }
    if (good) {
      chunk.tokens.resize(h.tokens_bytes / sizeof(int32_t));
      good = read_all(fd, chunk.tokens.data(), h.tokens_bytes, off_t(h.tokens_off));
    }
    ::close(fd);
    if (!good) {
      // Indexed by its size only (no keys, no events), so that the byte cap counts and evicts it;
      // a read of its key deletes it.
      chunk = {};
      h.payload_off = 0;
      h.payload_bytes = it->file_size(ec);
      if (ec) continue;
    }
    if (good) {
      for (uint32_t i = 0; i < h.num_blocks; ++i) chunk.keys.push_back(key_at(header.data() + kKeysAt + 16 * i));
      set_chain(h, chunk);
    }
    std::lock_guard lock(mu_);
    // Files the writer or a read noted meanwhile keep their (newer) use. One this process evicted
    // or deleted since the directory listing named it is gone: unlinks happen under this lock, so
    // a stat here sees them (without it the scan would count a file that no longer exists).
    struct stat still {};
    if (!files_.count(path) && ::stat(path.c_str(), &still) == 0) {
      note_file(path, h.payload_off + h.payload_bytes, chunk);
      files_[path].used = 0;  // Older than any use since start.
    }
  }
  std::lock_guard lock(mu_);
  evict_locked();
  scanned_ = true;
  cv_.notify_all();
}

}  // namespace pdserve::engine
