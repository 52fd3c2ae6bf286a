#include "kvevents/kv_event_publisher.h"

#include <poll.h>

#include <algorithm>
#include <random>
#include <zmq.hpp>

#include "common/logging.h"
#include "kvevents/batch_ring.h"
#include "kvevents/key_mirror.h"
#include "kvevents/wire.h"
#include "proto/kvevents.pb.h"

namespace pdserve::kvevents {

namespace {

// Longest wait of the I/O loop: bounds how late a heartbeat is when the injected clock jumps.
constexpr auto kMaxPollWait = std::chrono::milliseconds(100);
// Wait while a replay client's sends are stalled on EAGAIN.
constexpr auto kStalledPollWait = std::chrono::milliseconds(1);
// Replay messages sent per loop turn, over all clients, so that live events are not starved.
constexpr int kReplaySendBudget = 256;
// Live messages queue in ZeroMQ up to this many per subscriber; beyond it PUB drops, and the
// consumer's gap check and replay recover.
constexpr int kPubHighWaterMark = 100000;

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

uint64_t random_epoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (uint64_t(rd()) << 32) | rd();
  return e;
}

struct ReplyMessage {
  uint64_t seq;
  std::string payload;
};

// One replay client's pending reply: resumed where EAGAIN stopped it.
struct ReplyStream {
  std::string id;
  std::deque<ReplyMessage> messages;
};

}  // namespace

struct KvEventPublisher::Io {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
  BatchRing ring;
  KeyMirror mirror;
  std::deque<ReplyStream> streams;
  std::string topic;
  uint64_t last_seq = 0;
  TimePoint next_heartbeat;

  explicit Io(const KvEventPublisherOptions& o) : ring(o.buffer_batches, o.buffer_bytes) {}
};

StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::create(KvEventPublisherOptions options) {
  if (options.max_batch_events == 0) return absl::InvalidArgumentError("max_batch_events must be positive");
  auto io = std::make_unique<Io>(options);
  std::string bound_pub, bound_replay;
  try {
    io->pub.set(zmq::sockopt::sndhwm, kPubHighWaterMark);
    io->pub.set(zmq::sockopt::linger, 0);
    io->pub.bind(options.pub_endpoint);
    bound_pub = io->pub.get(zmq::sockopt::last_endpoint);
    if (!options.replay_endpoint.empty()) {
      io->replay.emplace(io->context, zmq::socket_type::router);
      io->replay->set(zmq::sockopt::router_mandatory, 1);
      io->replay->set(zmq::sockopt::linger, 0);
      io->replay->bind(options.replay_endpoint);
      bound_replay = io->replay->get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("KV events bind (", options.pub_endpoint, ", ", options.replay_endpoint, "): ", e.what()));
  }
  const uint64_t epoch = options.epoch.value_or(random_epoch());
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(options), std::move(io), epoch));
  p->bound_pub_ = std::move(bound_pub);
  p->bound_replay_ = std::move(bound_replay);
  return p;
}

Status KvEventPublisher::start(KvEventSource source) {
  if (source.worker_id.empty()) return absl::InvalidArgumentError("KV events need a worker id");
  if (thread_.joinable()) return absl::FailedPreconditionError("KV event publisher already started");
  source_ = std::move(source);
  io_->topic = topic_for(source_.worker_id);
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options, std::unique_ptr<Io> io, uint64_t epoch)
    : options_(std::move(options)), io_(std::move(io)), epoch_(epoch) {
  io_->next_heartbeat = options_.clock->now() + options_.heartbeat_interval;
}

KvEventPublisher::~KvEventPublisher() {
  stop_ = true;
  wake_.signal();
  if (thread_.joinable()) thread_.join();
}

void KvEventPublisher::stored(engine::KvTier tier, const std::optional<engine::BlockKey>& parent,
                              std::span<const engine::BlockKey> keys, uint32_t first_block_index,
                              std::span<const int32_t> tokens) {
  if (keys.empty()) return;
  RawEvent e{EventType::kStored, tier, parent, {keys.begin(), keys.end()}, first_block_index, {}};
  if (options_.include_tokens) e.tokens.assign(tokens.begin(), tokens.end());
  std::lock_guard lock(mu_);
  pending_.push_back(std::move(e));
}

void KvEventPublisher::removed(engine::KvTier tier, std::span<const engine::BlockKey> keys) {
  if (keys.empty()) return;
  std::lock_guard lock(mu_);
  pending_.push_back(RawEvent{EventType::kRemoved, tier, std::nullopt, {keys.begin(), keys.end()}, 0, {}});
}

void KvEventPublisher::cleared(engine::KvTier tier) {
  std::lock_guard lock(mu_);
  pending_.push_back(RawEvent{EventType::kCleared, tier, std::nullopt, {}, 0, {}});
}

void KvEventPublisher::step_end() {
  {
    std::lock_guard lock(mu_);
    if (pending_.empty()) return;  // An idle step publishes nothing.
    steps_.push_back(std::move(pending_));
    pending_.clear();
    ++steps_ended_;
  }
  wake_.signal();
}

void KvEventPublisher::flush() {
  std::unique_lock lock(mu_);
  const uint64_t target = steps_ended_;
  published_cv_.wait(lock, [&] { return steps_published_ >= target || stop_; });
}

KvEventPublisherStats KvEventPublisher::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

namespace {

// Splits a step's events into batches of at most `cap` block transitions.
class BatchBuilder {
 public:
  BatchBuilder(size_t cap, std::vector<KvEventBatch>& out) : cap_(cap), out_(out) {}

  // Room in the open batch, opening a new one when it is full.
  size_t room() {
    if (out_.empty() || used_ >= cap_) {
      out_.emplace_back();
      used_ = 0;
    }
    return cap_ - used_;
  }
  KvEvent* add(size_t weight) {
    used_ += weight;
    return out_.back().add_events();
  }

 private:
  size_t cap_;
  size_t used_ = 0;
  std::vector<KvEventBatch>& out_;
};

}  // namespace

void KvEventPublisher::publish_step(const Step& step) {
  std::vector<KvEventBatch> batches;
  BatchBuilder builder(options_.max_batch_events, batches);
  uint64_t events = 0;
  for (const RawEvent& e : step) {
    switch (e.type) {
      case EventType::kStored: {
        const size_t tokens_per_key = e.tokens.size() / e.keys.size();
        for (size_t off = 0; off < e.keys.size();) {
          const size_t n = std::min(builder.room(), e.keys.size() - off);
          auto* s = builder.add(n)->mutable_stored();
          s->set_tier(to_proto(e.tier));
          const std::optional<engine::BlockKey> parent = off == 0 ? e.parent : e.keys[off - 1];
          if (parent) s->set_parent_key(key_bytes(*parent));
          for (size_t i = off; i < off + n; ++i) s->add_keys(key_bytes(e.keys[i]));
          s->set_first_block_index(e.first_block_index + uint32_t(off));
          if (tokens_per_key > 0) {
            s->mutable_token_ids()->Add(e.tokens.begin() + ptrdiff_t(off * tokens_per_key),
                                        e.tokens.begin() + ptrdiff_t((off + n) * tokens_per_key));
          }
          off += n;
        }
        io_->mirror.stored(e.tier, e.keys);
        events += e.keys.size();
        break;
      }
      case EventType::kRemoved: {
        for (size_t off = 0; off < e.keys.size();) {
          const size_t n = std::min(builder.room(), e.keys.size() - off);
          auto* r = builder.add(n)->mutable_removed();
          r->set_tier(to_proto(e.tier));
          for (size_t i = off; i < off + n; ++i) r->add_keys(key_bytes(e.keys[i]));
          off += n;
        }
        io_->mirror.removed(e.tier, e.keys);
        events += e.keys.size();
        break;
      }
      case EventType::kCleared:
        builder.room();
        builder.add(1)->mutable_cleared()->set_tier(to_proto(e.tier));
        io_->mirror.cleared(e.tier);
        ++events;
        break;
    }
  }
  const double ts = unix_now();
  uint64_t dropped = 0;
  for (KvEventBatch& b : batches) {
    b.set_epoch(epoch_);
    b.set_seq(++io_->last_seq);
    b.set_worker_id(source_.worker_id);
    b.set_ts_unix(ts);
    b.set_block_size(source_.block_size);
    b.set_compat_hash(source_.compat_hash);
    b.set_key_scheme(std::string(kKeySchemeV1) + key_bytes(source_.key_root));
    std::string payload = b.SerializeAsString();
    if (options_.drop_policy->drop(b.seq(), false)) {
      ++dropped;
    } else {
      io_->pub.send(zmq::buffer(io_->topic), zmq::send_flags::sndmore);
      io_->pub.send(zmq::buffer(encode_u64(b.seq())), zmq::send_flags::sndmore);
      io_->pub.send(zmq::buffer(payload), zmq::send_flags::none);
    }
    io_->ring.push(b.seq(), std::move(payload));
  }
  std::lock_guard lock(mu_);
  stats_.last_seq = io_->last_seq;
  stats_.batches += batches.size();
  stats_.events += events;
  stats_.dropped += dropped;
}

void KvEventPublisher::send_heartbeat() {
  KvEventBatch b;
  b.set_epoch(epoch_);
  b.set_worker_id(source_.worker_id);
  b.set_ts_unix(unix_now());
  b.set_block_size(source_.block_size);
  b.set_compat_hash(source_.compat_hash);
  b.set_key_scheme(std::string(kKeySchemeV1) + key_bytes(source_.key_root));
  auto* hb = b.add_events()->mutable_heartbeat();
  hb->set_last_seq(io_->last_seq);
  hb->set_num_keys_device(io_->mirror.size(engine::KvTier::kDevice));
  hb->set_num_keys_host(io_->mirror.size(engine::KvTier::kHost));
  hb->set_num_keys_disk(io_->mirror.size(engine::KvTier::kDisk));
  if (!options_.drop_policy->drop(0, true)) {
    io_->pub.send(zmq::buffer(io_->topic), zmq::send_flags::sndmore);
    io_->pub.send(zmq::buffer(encode_u64(0)), zmq::send_flags::sndmore);
    io_->pub.send(zmq::buffer(b.SerializeAsString()), zmq::send_flags::none);
  }
  std::lock_guard lock(mu_);
  ++stats_.heartbeats;
}

namespace {

// The reply to REPLAY(epoch, from_seq): the ring's batches from from_seq when it holds them
// all and the epoch is ours, else a snapshot of every present key as of last_seq.
std::deque<ReplyMessage> answer_replay(uint64_t epoch, uint64_t from_seq, uint64_t our_epoch, uint64_t last_seq,
                                       const BatchRing& ring, const KeyMirror& mirror, const KvEventBatch& header,
                                       size_t cap, bool* snapshot) {
  std::deque<ReplyMessage> out;
  const bool nothing_missing = from_seq == last_seq + 1;
  *snapshot =
      !(epoch == our_epoch && from_seq > 0 && (nothing_missing || ring.covers(from_seq)) && from_seq <= last_seq + 1);
  if (!*snapshot) {
    for (uint64_t s = from_seq; s <= last_seq; ++s) out.push_back({s, ring.at(s)});
    return out;
  }
  KvEventBatch batch = header;
  batch.set_snapshot(true);
  batch.set_snapshot_seq(last_seq);
  size_t used = 0;
  auto emit = [&] {
    out.push_back({0, batch.SerializeAsString()});
    batch.clear_events();
    used = 0;
  };
  for (engine::KvTier tier : {engine::KvTier::kDevice, engine::KvTier::kHost, engine::KvTier::kDisk}) {
    const std::vector<engine::BlockKey> keys = mirror.keys(tier);
    for (size_t off = 0; off < keys.size();) {
      if (used >= cap) emit();
      const size_t n = std::min(cap - used, keys.size() - off);
      auto* s = batch.add_events()->mutable_stored();
      s->set_tier(to_proto(tier));
      for (size_t i = off; i < off + n; ++i) s->add_keys(key_bytes(keys[i]));
      used += n;
      off += n;
    }
  }
  emit();  // At least one batch, so that even an empty snapshot tells its epoch and seq.
  return out;
}

}  // namespace

void KvEventPublisher::run() {
  auto& io = *io_;
  KvEventBatch header;
  header.set_epoch(epoch_);
  header.set_worker_id(source_.worker_id);
  header.set_block_size(source_.block_size);
  header.set_compat_hash(source_.compat_hash);
  header.set_key_scheme(std::string(kKeySchemeV1) + key_bytes(source_.key_root));

  while (!stop_) {
    const TimePoint now = options_.clock->now();
    if (now >= io.next_heartbeat) {
      send_heartbeat();
      io.next_heartbeat = now + options_.heartbeat_interval;
    }
    auto wait = std::min<Duration>(io.next_heartbeat - now, kMaxPollWait);
    if (!io.streams.empty()) wait = kStalledPollWait;
    zmq::pollitem_t items[2] = {{nullptr, wake_.fd(), ZMQ_POLLIN, 0}, {nullptr, 0, ZMQ_POLLIN, 0}};
    int n_items = 1;
    if (io.replay) {
      items[1].socket = io.replay->handle();
      n_items = 2;
    }
    zmq::poll(items, size_t(n_items), std::chrono::duration_cast<std::chrono::milliseconds>(wait));
    wake_.drain();

    std::deque<Step> steps;
    {
      std::lock_guard lock(mu_);
      steps.swap(steps_);
    }
    for (const Step& s : steps) publish_step(s);
    if (!steps.empty()) {
      std::lock_guard lock(mu_);
      steps_published_ += steps.size();
      published_cv_.notify_all();
    }

    if (!io.replay) continue;
    // Requests: [id, "", REPLAY, epoch, from_seq]; anything else is ignored.
    while (true) {
      std::vector<zmq::message_t> parts;
      zmq::message_t part;
      if (!io.replay->recv(part, zmq::recv_flags::dontwait)) break;
      parts.push_back(std::move(part));
      while (parts.back().more()) {
        zmq::message_t next;
        (void)io.replay->recv(next, zmq::recv_flags::none);
        parts.push_back(std::move(next));
      }
      if (parts.size() != 5 || parts[2].to_string_view() != kReplayVerb) continue;
      const auto epoch = decode_u64(parts[3].to_string_view());
      const auto from = decode_u64(parts[4].to_string_view());
      if (!epoch || !from) continue;
      bool snapshot = false;
      ReplyStream stream{parts[0].to_string(), answer_replay(*epoch, *from, epoch_, io.last_seq, io.ring, io.mirror,
                                                             header, options_.max_batch_events, &snapshot)};
      stream.messages.push_back({kEndSeq, ""});
      io.streams.push_back(std::move(stream));
      std::lock_guard lock(mu_);
      ++(snapshot ? stats_.snapshots : stats_.replays);
    }
    // Sends, resumed where EAGAIN stopped them; an unreachable client's stream is dropped.
    int budget = kReplaySendBudget;
    for (auto it = io.streams.begin(); it != io.streams.end() && budget > 0;) {
      bool gone = false;
      while (!it->messages.empty() && budget > 0) {
        const ReplyMessage& m = it->messages.front();
        try {
          if (!io.replay->send(zmq::buffer(it->id), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) break;
        } catch (const zmq::error_t& e) {
          gone = true;  // EHOSTUNREACH: the client went away (ROUTER_MANDATORY).
          break;
        }
        io.replay->send(zmq::str_buffer(""), zmq::send_flags::sndmore);
        io.replay->send(zmq::buffer(io.topic), zmq::send_flags::sndmore);
        io.replay->send(zmq::buffer(encode_u64(m.seq)), zmq::send_flags::sndmore);
        io.replay->send(zmq::buffer(m.payload), zmq::send_flags::none);
        it->messages.pop_front();
        --budget;
      }
      if (gone || it->messages.empty()) {
        it = io.streams.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::lock_guard lock(mu_);
  published_cv_.notify_all();
}

}  // namespace pdserve::kvevents
