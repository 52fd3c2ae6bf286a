#include "router/kv_event_subscriber.h"

#include <map>
#include <optional>
#include <vector>
#include <zmq.hpp>

#include "common/logging.h"
#include "kvevents/wire.h"

namespace pdserve::router {

namespace kv = pdserve::kvevents;

namespace {

// Longest wait of the loop, so that deadlines on an injected clock are seen soon.
constexpr auto kMaxPollWait = std::chrono::milliseconds(100);
constexpr int kSubHighWaterMark = 100000;

// One worker's sockets and its pending replay.
struct Connection {
  std::string pub_endpoint, replay_endpoint;
  std::unique_ptr<zmq::socket_t> sub;
  std::unique_ptr<zmq::socket_t> dealer;  // Only while a replay is pending.
  std::optional<TimePoint> deadline;      // Of the pending replay.
  std::optional<TimePoint> retry_at;      // Of the next attempt, after a failure.
  ReplayRequest retry;
};

std::vector<zmq::message_t> recv_all(zmq::socket_t& s) {
  std::vector<zmq::message_t> parts;
  zmq::message_t part;
  if (!s.recv(part, zmq::recv_flags::dontwait)) return parts;
  parts.push_back(std::move(part));
  while (parts.back().more()) {
    zmq::message_t next;
    (void)s.recv(next, zmq::recv_flags::none);
    parts.push_back(std::move(next));
  }
  return parts;
}

}  // namespace

struct KvEventSubscriber::Io {
  zmq::context_t context{1};
  std::map<std::string, Connection> connections;
};

KvEventSubscriber::KvEventSubscriber(KvIndex& index, KvEventSubscriberOptions options)
    : index_(index), options_(options), io_(std::make_unique<Io>()) {
  thread_ = std::thread([this] { run(); });
}

KvEventSubscriber::~KvEventSubscriber() {
  stop_ = true;
  wake_.signal();
  thread_.join();
}

Status KvEventSubscriber::add_worker(const std::string& worker_id, const std::string& pub_endpoint,
                                     const std::string& replay_endpoint, std::optional<KvScheme> scheme) {
  PD_ASSIGN_OR_RETURN(ReplayRequest request, index_.add_worker(worker_id, std::move(scheme)));
  {
    std::lock_guard lock(mu_);
    commands_.push_back({true, worker_id, pub_endpoint, replay_endpoint, request});
  }
  wake_.signal();
  return absl::OkStatus();
}

void KvEventSubscriber::remove_worker(const std::string& worker_id) {
  index_.remove_worker(worker_id);
  {
    std::lock_guard lock(mu_);
    commands_.push_back({false, worker_id, "", "", {}});
  }
  wake_.signal();
}

KvEventSubscriberStats KvEventSubscriber::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void KvEventSubscriber::run() {
  auto& connections = io_->connections;
  // Sends `request` on a fresh DEALER, so that a late reply to an abandoned request can never
  // be mistaken for this one's; with no replay endpoint the attempt fails at once.
  auto send_replay = [&](const std::string& id, Connection& c, ReplayRequest request) {
    c.dealer.reset();
    c.retry_at.reset();
    const TimePoint now = options_.clock->now();
    if (c.replay_endpoint.empty()) {
      if (auto again = index_.on_replay_failed(id)) {
        c.retry = *again;
        c.retry_at =
            now + (index_.state(id) == WorkerKvState::kDegraded ? options_.degraded_retry : options_.retry_backoff);
      }
      return;
    }
    try {
      c.dealer = std::make_unique<zmq::socket_t>(io_->context, zmq::socket_type::dealer);
      c.dealer->set(zmq::sockopt::linger, 0);
      c.dealer->connect(c.replay_endpoint);
      c.dealer->send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      c.dealer->send(zmq::buffer(kv::kReplayVerb), zmq::send_flags::sndmore);
      c.dealer->send(zmq::buffer(kv::encode_u64(request.epoch)), zmq::send_flags::sndmore);
      c.dealer->send(zmq::buffer(kv::encode_u64(request.from_seq)), zmq::send_flags::none);
      c.deadline = now + options_.replay_timeout;
    } catch (const zmq::error_t& e) {
      PD_LOG_WARN("KV replay request to {} ({}): {}", id, c.replay_endpoint, e.what());
      c.dealer.reset();
      c.deadline = now;  // Fails at the next deadline check.
    }
  };
  auto fail_replay = [&](const std::string& id, Connection& c) {
    c.dealer.reset();
    c.deadline.reset();
    if (auto again = index_.on_replay_failed(id)) {
      c.retry = *again;
      c.retry_at = options_.clock->now() +
                   (index_.state(id) == WorkerKvState::kDegraded ? options_.degraded_retry : options_.retry_backoff);
    }
  };
  auto parse = [&](const zmq::message_t& payload, kv::KvEventBatch& batch) {
    if (batch.ParseFromArray(payload.data(), int(payload.size()))) return true;
    std::lock_guard lock(mu_);
    ++stats_.malformed;
    return false;
  };

  while (!stop_) {
    std::deque<Command> commands;
    {
      std::lock_guard lock(mu_);
      commands.swap(commands_);
    }
    for (Command& cmd : commands) {
      connections.erase(cmd.worker_id);
      if (!cmd.add) continue;
      Connection c;
      c.pub_endpoint = cmd.pub_endpoint;
      c.replay_endpoint = cmd.replay_endpoint;
      try {
        c.sub = std::make_unique<zmq::socket_t>(io_->context, zmq::socket_type::sub);
        c.sub->set(zmq::sockopt::rcvhwm, kSubHighWaterMark);
        c.sub->set(zmq::sockopt::linger, 0);
        c.sub->set(zmq::sockopt::subscribe, kv::topic_for(cmd.worker_id));
        c.sub->connect(cmd.pub_endpoint);
      } catch (const zmq::error_t& e) {
        PD_LOG_WARN("KV events subscribe to {} ({}): {}", cmd.worker_id, cmd.pub_endpoint, e.what());
        c.sub.reset();
      }
      auto [it, _] = connections.emplace(cmd.worker_id, std::move(c));
      send_replay(it->first, it->second, cmd.request);
    }

    // Timeouts and retries.
    const TimePoint now = options_.clock->now();
    Duration wait = kMaxPollWait;
    for (auto& [id, c] : connections) {
      if (c.deadline && now >= *c.deadline) fail_replay(id, c);
      if (c.retry_at && now >= *c.retry_at) send_replay(id, c, c.retry);
      if (c.deadline) wait = std::min<Duration>(wait, *c.deadline - now);
      if (c.retry_at) wait = std::min<Duration>(wait, *c.retry_at - now);
    }

    std::vector<zmq::pollitem_t> items{{nullptr, wake_.fd(), ZMQ_POLLIN, 0}};
    std::vector<std::pair<const std::string*, bool>> owners;  // (worker, is replay socket)
    for (auto& [id, c] : connections) {
      if (c.sub) {
        items.push_back({c.sub->handle(), 0, ZMQ_POLLIN, 0});
        owners.push_back({&id, false});
      }
      if (c.dealer) {
        items.push_back({c.dealer->handle(), 0, ZMQ_POLLIN, 0});
        owners.push_back({&id, true});
      }
    }
    zmq::poll(items.data(), items.size(),
              std::chrono::duration_cast<std::chrono::milliseconds>(std::max<Duration>(wait, Duration(0))));
    wake_.drain();

    for (size_t i = 1; i < items.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      const std::string& id = *owners[i - 1].first;
      Connection& c = connections.at(id);
      if (!owners[i - 1].second) {
        // Live: [topic, seq, payload]. Drains what is queued, up to a bound per turn.
        for (int n = 0; n < 1024 && c.sub; ++n) {
          auto parts = recv_all(*c.sub);
          if (parts.empty()) break;
          kv::KvEventBatch batch;
          if (parts.size() != 3 || !parse(parts[2], batch)) continue;
          {
            std::lock_guard lock(mu_);
            ++stats_.live_messages;
          }
          if (auto request = index_.on_live(id, batch)) send_replay(id, c, *request);
        }
        continue;
      }
      // Replay: ["", topic, seq, payload], then ["", topic, kEndSeq, ""].
      for (int n = 0; n < 1024 && c.dealer; ++n) {
        auto parts = recv_all(*c.dealer);
        if (parts.empty()) break;
        if (parts.size() != 4) {
          std::lock_guard lock(mu_);
          ++stats_.malformed;
          continue;
        }
        {
          std::lock_guard lock(mu_);
          ++stats_.replay_messages;
        }
        c.deadline = options_.clock->now() + options_.replay_timeout;  // Progress, however long the reply.
        if (kv::decode_u64(parts[2].to_string_view()) == kv::kEndSeq) {
          c.dealer.reset();
          c.deadline.reset();
          if (auto request = index_.on_replay_end(id)) send_replay(id, c, *request);
          break;
        }
        kv::KvEventBatch batch;
        if (parse(parts[3], batch)) index_.on_replay_batch(id, batch);
      }
    }
  }
}

}  // namespace pdserve::router
