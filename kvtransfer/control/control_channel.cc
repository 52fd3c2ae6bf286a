#include "kvtransfer/control/control_channel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include <zmq_addon.hpp>

#include "absl/strings/escaping.h"

#include "common/logging.h"
#include "kvtransfer/control/codec.h"

namespace pdserve::kvtransfer {
namespace {

// Longest single poll inside receive(), so heartbeats and peer deadlines are checked often.
constexpr auto kPollSlice = std::chrono::milliseconds(10);

Status zmq_status(const char* what, const zmq::error_t& e) {
  return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
}

int64_t to_ms(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

template <typename Message>
void copy_identity(const Message& m, ControlPeer& peer) {
  peer.role = m.role();
  peer.tp_size = m.tp_size();
  peer.rank = m.rank();
  peer.worker_address = m.worker_address();
  peer.incarnation = m.incarnation();
  for (const auto& region : m.regions()) peer.regions[region.name()] = region.blob();
  peer.arena = m.arena();
  peer.host_arena = m.host_arena();
  peer.local_lane = m.local_lane();
  peer.local_lane_token = m.local_lane_token();
}

// How many lane datagrams one receive() round takes at most, so that a flood of them (any
// local process can send some) never keeps the channel from its sockets and heartbeats.
constexpr int kLaneBatch = 64;
constexpr size_t kLaneTokenBytes = 16;

std::string random_token() {
  std::random_device device;
  std::string token(kLaneTokenBytes, '\0');
  for (size_t i = 0; i < token.size(); i += sizeof(uint32_t)) {
    const uint32_t bits = device();
    std::memcpy(token.data() + i, &bits, sizeof(bits));
  }
  return token;
}

// Whether `bytes` starts with `token`, in time independent of where they differ.
bool starts_with_token(const std::string& bytes, const std::string& token) {
  if (token.size() != kLaneTokenBytes || bytes.size() < token.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= static_cast<unsigned char>(bytes[i] ^ token[i]);
  return diff == 0;
}

}  // namespace

StatusOr<std::unique_ptr<ControlChannel>> ControlChannel::create(ControlChannelOptions options) {
  try {
    std::unique_ptr<ControlChannel> channel(new ControlChannel(std::move(options)));
    PD_RETURN_IF_ERROR(channel->bind());
    return channel;
  } catch (const zmq::error_t& e) {
    return zmq_status("control channel setup", e);
  }
}

ControlChannel::ControlChannel(ControlChannelOptions options)
    : options_(std::move(options)),
      context_(1),
      router_(context_, zmq::socket_type::router),
      last_heartbeat_(options_.clock->now()) {}

ControlChannel::~ControlChannel() = default;

Status ControlChannel::bind() {
  if (!options_.curve_secret_key.empty()) {
    PD_ASSIGN_OR_RETURN(curve_, parse_curve_key(options_.curve_secret_key));
    zap_ = std::make_unique<ZapHandler>(context_, *curve_);
    apply_curve(router_, *curve_, /*server=*/true);
  }
  router_.set(zmq::sockopt::linger, static_cast<int>(to_ms(options_.linger)));
  // Sending to a peer that is gone must fail loudly, not vanish.
  router_.set(zmq::sockopt::router_mandatory, 1);
  // ZeroMQ drops (and disconnects) far oversized frames before they are buffered whole; the
  // decoder refuses, with a log line, everything above the exact limit.
  router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(2 * options_.max_message_bytes));
  // IPv6 endpoints as well as IPv4 ones (ZeroMQ sockets are IPv4-only unless told).
  router_.set(zmq::sockopt::ipv6, 1);
  try {
    router_.bind(options_.bind_endpoint);
  } catch (const zmq::error_t& e) {
    return zmq_status(("bind " + options_.bind_endpoint).c_str(), e);
  }
  endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  if (options_.local_lane) {
    // Without one every message still goes through ZeroMQ: slower, never wrong.
    StatusOr<std::unique_ptr<LocalLane>> lane = LocalLane::open();
    if (lane.ok()) {
      lane_ = std::move(*lane);
      lane_token_ = random_token();
    } else {
      PD_LOG_WARN("control: no same-host lane: {}", lane.status().ToString());
    }
  }
  return absl::OkStatus();
}

const ControlPeer* ControlChannel::cached(const std::string& endpoint, uint64_t incarnation) {
  auto it = peer_by_endpoint_.find(endpoint);
  if (it == peer_by_endpoint_.end()) return nullptr;
  const uint64_t id = it->second;
  PeerState& cached = peers_.at(id);
  if (!cached.lost && (incarnation == 0 || cached.info.incarnation == incarnation)) return &cached.info;
  if (!cached.lost) {
    // ZeroMQ reconnected the socket to the new process under us, which never handshook on it.
    lose(id, cached, absl::UnavailableError(absl::StrCat("the peer at ", endpoint, " restarted (incarnation ",
                                                         absl::Hex(cached.info.incarnation), ", now ",
                                                         absl::Hex(incarnation), ")")));
  }
  return nullptr;
}

StatusOr<ControlPeer> ControlChannel::connect(const std::string& endpoint, Duration timeout, uint64_t incarnation) {
  if (const ControlPeer* known = cached(endpoint, incarnation)) return *known;
  PD_ASSIGN_OR_RETURN(const uint64_t id, start_connect(endpoint, timeout, incarnation));
  PendingDial& dial = dials_.at(id);
  try {
    while (true) {
      if (std::optional<StatusOr<ControlPeer>> ended = step_dial(dial)) {
        dials_.erase(id);
        return *ended;
      }
      // Our own ROUTER's authentication requests are answered meanwhile: a peer dialing us
      // must not wait for this dial to end.
      zmq::pollitem_t items[] = {{dial.dealer->handle(), 0, ZMQ_POLLIN, 0},
                                 {dial.monitor->handle(), 0, ZMQ_POLLIN, 0},
                                 {zap_ ? zap_->socket().handle() : nullptr, -1, short(zap_ ? ZMQ_POLLIN : 0), 0}};
      const auto left = std::max(dial.deadline - std::chrono::steady_clock::now(),
                                 std::chrono::steady_clock::duration(0));
      zmq::poll(items, zap_ ? 3 : 2, std::chrono::ceil<std::chrono::milliseconds>(left));
      if (zap_) zap_->answer();
    }
  } catch (const zmq::error_t& e) {
    dials_.erase(id);
    return zmq_status(("connect " + endpoint).c_str(), e);
  }
}

StatusOr<uint64_t> ControlChannel::start_connect(const std::string& endpoint, Duration timeout,
                                                 uint64_t incarnation) {
  // An older process's peer there is reported lost first, as connect() does.
  (void)cached(endpoint, incarnation);
  try {
    PendingDial dial;
    dial.endpoint = endpoint;
    dial.timeout = timeout;
    dial.deadline = std::chrono::steady_clock::now() + timeout;
    dial.dealer = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    zmq::socket_t& dealer = *dial.dealer;
    dealer.set(zmq::sockopt::linger, static_cast<int>(to_ms(options_.linger)));
    dealer.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(2 * options_.max_message_bytes));
    dealer.set(zmq::sockopt::ipv6, 1);
    if (curve_) apply_curve(dealer, *curve_, /*server=*/false);
    // ZeroMQ retries a refused connection forever without telling the socket: its monitor
    // does tell, so a dial to a dead process fails at once rather than at `timeout`.
    const std::string monitor_endpoint = absl::StrCat("inproc://pdserve-dial-", next_dial_++);
    if (zmq_socket_monitor(dealer.handle(), monitor_endpoint.c_str(),
                           ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
      throw zmq::error_t();
    }
    dial.monitor = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
    dial.monitor->set(zmq::sockopt::linger, 0);
    dial.monitor->connect(monitor_endpoint);
    dealer.connect(endpoint);
    proto::Envelope hello;
    *hello.mutable_handshake() = options_.local;
    if (lane_) {
      hello.mutable_handshake()->set_local_lane(lane_->address());
      hello.mutable_handshake()->set_local_lane_token(lane_token_);
    }
    const std::string bytes = encode_envelope(hello);
    if (!dealer.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
      return absl::UnavailableError(absl::StrCat("cannot queue a handshake to ", endpoint));
    }
    const uint64_t id = next_dial_id_++;
    dials_.emplace(id, std::move(dial));
    return id;
  } catch (const zmq::error_t& e) {
    return zmq_status(("connect " + endpoint).c_str(), e);
  }
}

ControlChannel::PendingDial::~PendingDial() {
  if (dealer && monitor) zmq_socket_monitor(dealer->handle(), nullptr, 0);
}

std::optional<StatusOr<ControlPeer>> ControlChannel::step_dial(PendingDial& dial) {
  const std::string& endpoint = dial.endpoint;
  zmq::message_t frame;
  if (dial.monitor->recv(frame, zmq::recv_flags::dontwait)) {
    // A monitor event: 2 bytes of event id and 4 of value, then a frame with the address.
    uint16_t event = 0;
    if (frame.size() >= sizeof(event)) std::memcpy(&event, frame.data(), sizeof(event));
    if (event == ZMQ_EVENT_CONNECT_RETRIED)
      return absl::UnavailableError(absl::StrCat("connection refused by ", endpoint, " (no process accepts there)"));
    if (event == ZMQ_EVENT_DISCONNECTED || event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
      return absl::UnavailableError(absl::StrCat("the connection to ", endpoint, " closed during the handshake"));
    // A mechanism (PROTOCOL) or key (AUTH) mismatch: a configuration error of one of the two
    // sides — the dialer cannot tell which — so not the peer's fault (fault.h).
    return absl::FailedPreconditionError(absl::StrCat(
        "the ZeroMQ security handshake with ", endpoint, " failed: both sides need the same kvtransfer key (",
        curve_ ? "this side has one" : "this side has none", ")"));
  }
  while (dial.dealer->recv(frame, zmq::recv_flags::dontwait)) {
    auto decoded = decode_envelope(frame.to_string_view(), options_.max_message_bytes);
    if (!decoded.ok()) {
      refuse(endpoint, decoded.status());
      continue;
    }
    if (!decoded->has_handshake_ack()) {
      refuse(endpoint, absl::FailedPreconditionError(absl::StrCat(
                           "expected handshake_ack, got ", message_type_name(*decoded))));
      continue;
    }
    const proto::HandshakeAck& ack = decoded->handshake_ack();
    if (!ack.accepted()) {
      PD_LOG_WARN("control: {} refused our handshake: {}", endpoint, ack.error());
      return absl::FailedPreconditionError(
          absl::StrCat("peer ", endpoint, " refused the handshake: ", ack.error()));
    }
    const uint64_t id = next_peer_id_++;
    PeerState& peer = peers_[id];
    peer.info.id = id;
    peer.info.dialed = true;
    peer.info.endpoint = endpoint;
    copy_identity(ack, peer.info);
    peer.lane_ready = true;  // It read our handshake, and our lane, before it answered.
    zmq_socket_monitor(dial.dealer->handle(), nullptr, 0);
    dial.monitor.reset();
    peer.dealer = std::move(dial.dealer);
    peer.last_heard = options_.clock->now();
    peer_by_endpoint_[endpoint] = id;
    return peer.info;
  }
  if (std::chrono::steady_clock::now() >= dial.deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("no handshake answer from ", endpoint, " within ", to_ms(dial.timeout), " ms"));
  }
  return std::nullopt;
}

Status ControlChannel::send(uint64_t id, const proto::Envelope& message, Route route) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("no control peer ", id));
  PeerState& peer = it->second;
  if (peer.lost) return absl::UnavailableError(absl::StrCat("control peer ", id, " lost"));
  const std::string bytes = encode_envelope(message);
  if (route == Route::kLocalFirst) {
    if (lane_ && peer.lane_ready && !peer.info.local_lane.empty() && !peer.lane_unreachable) {
      const Status sent = lane_->send(peer.info.local_lane, lane_token_ + bytes);
      if (sent.ok()) {
        ++lane_counters_.sent;
        return absl::OkStatus();
      }
      // Unavailable: not bound there from this host and network namespace (or the process is
      // gone; heartbeats tell). Otherwise only this message does not fit now.
      if (absl::IsUnavailable(sent)) {
        peer.lane_unreachable = true;
        PD_LOG_DEBUG("control: peer {}'s lane is out of reach ({}); ZeroMQ only", id, sent.ToString());
      }
    }
    ++lane_counters_.fell_back;
  }
  return send_to(peer, bytes);
}

Status ControlChannel::send_to(PeerState& peer, const std::string& bytes) {
  if (!peer.dealer) return send_routed(peer.routing_id, bytes);
  try {
    if (!peer.dealer->send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
      return absl::UnavailableError(absl::StrCat("send queue to peer ", peer.info.id, " full"));
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return zmq_status("send", e);
  }
}

Status ControlChannel::send_routed(const std::string& routing_id, const std::string& bytes) {
  try {
    const bool sent =
        router_.send(zmq::buffer(routing_id), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
            .has_value() &&
        router_.send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
    if (!sent) return absl::UnavailableError("send queue full");
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return zmq_status("send", e);
  }
}

StatusOr<ControlPeer> ControlChannel::peer(uint64_t id) const {
  auto it = peers_.find(id);
  if (it == peers_.end()) return absl::NotFoundError(absl::StrCat("no control peer ", id));
  return it->second.info;
}

StatusOr<ControlEvent> ControlChannel::receive(Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool looked = false;  // A zero timeout still looks at the sockets once.
  try {
    while (true) {
      tick();
      if (!events_.empty()) {
        ControlEvent event = std::move(events_.front());
        events_.pop_front();
        return event;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline && (looked || timeout > Duration(0))) return absl::DeadlineExceededError("no control event");
      looked = true;

      std::vector<zmq::pollitem_t> items{{router_.handle(), 0, ZMQ_POLLIN, 0}};
      if (options_.wake) items.push_back({nullptr, options_.wake->fd(), ZMQ_POLLIN, 0});
      if (zap_) items.push_back({zap_->socket().handle(), 0, ZMQ_POLLIN, 0});
      const size_t lane_item = items.size();
      if (lane_) items.push_back({nullptr, lane_->fd(), ZMQ_POLLIN, 0});
      std::vector<uint64_t> dial_ids;
      auto dial_deadline = deadline;
      for (auto& [id, dial] : dials_) {
        items.push_back({dial.dealer->handle(), 0, ZMQ_POLLIN, 0});
        items.push_back({dial.monitor->handle(), 0, ZMQ_POLLIN, 0});
        dial_ids.push_back(id);
        dial_deadline = std::min(dial_deadline, dial.deadline);
      }
      const size_t first_dealer = items.size();
      std::vector<uint64_t> dealer_peers;
      for (auto& [id, peer] : peers_) {
        if (peer.dealer && !peer.lost) {
          items.push_back({peer.dealer->handle(), 0, ZMQ_POLLIN, 0});
          dealer_peers.push_back(id);
        }
      }
      // A dial's timeout ends the wait too (rounded up: zmq_poll counts whole milliseconds).
      const auto slice = std::clamp<std::chrono::steady_clock::duration>(
          dial_deadline < deadline ? std::chrono::ceil<std::chrono::milliseconds>(dial_deadline - now)
                                   : deadline - now,
          std::chrono::steady_clock::duration(0), kPollSlice);
      auto whole_ms = std::chrono::duration_cast<std::chrono::milliseconds>(slice);
      // zmq_poll counts whole milliseconds: under one, nap and then look, rather than spin
      // through the remainder with zero-timeout polls (an idle rank thread would burn a core).
      // With a wake fd the remainder is polled as a whole millisecond instead, so a wake-up
      // still ends it at once.
      if (whole_ms.count() == 0 && slice.count() > 0) {
        if (options_.wake) {
          whole_ms = std::chrono::milliseconds(1);
        } else {
          std::this_thread::sleep_for(slice);
        }
      }
      zmq::poll(items, whole_ms);
      if (zap_) zap_->answer();

      if (items[0].revents & ZMQ_POLLIN) {
        std::vector<zmq::message_t> frames;
        while (zmq::recv_multipart(router_, std::back_inserter(frames),
                                   zmq::recv_flags::dontwait)) {
          if (frames.size() != 2) {
            refuse(frames.empty() ? "?" : frames[0].to_string(),
                   absl::InvalidArgumentError(
                       absl::StrCat("expected 2 frames, got ", frames.size())));
          } else {
            on_router_frame(frames[0].to_string(), frames[1].to_string());
          }
          frames.clear();
        }
      }
      for (size_t i = 0; i < dial_ids.size(); ++i) {
        PendingDial& dial = dials_.at(dial_ids[i]);
        std::optional<StatusOr<ControlPeer>> ended = step_dial(dial);
        if (!ended) continue;
        ControlEvent event{ControlEvent::Kind::kDialed, 0, {}, absl::OkStatus()};
        event.dial = dial_ids[i];
        if (ended->ok()) {
          event.peer = (*ended)->id;
        } else {
          event.error = ended->status();
        }
        dials_.erase(dial_ids[i]);
        events_.push_back(std::move(event));
      }
      for (size_t i = 0; i < dealer_peers.size(); ++i) {
        if (!(items[first_dealer + i].revents & ZMQ_POLLIN)) continue;
        PeerState& peer = peers_.at(dealer_peers[i]);
        zmq::message_t frame;
        while (!peer.lost && peer.dealer->recv(frame, zmq::recv_flags::dontwait)) {
          on_dealer_frame(dealer_peers[i], frame.to_string());
        }
      }
      if (lane_ && (items[lane_item].revents & ZMQ_POLLIN)) drain_lane();
      if (options_.wake && (items[1].revents & ZMQ_POLLIN) && options_.wake->drain()) {
        events_.push_back(ControlEvent{ControlEvent::Kind::kWoken, 0, {}, absl::OkStatus()});
      }
    }
  } catch (const zmq::error_t& e) {
    return zmq_status("receive", e);
  }
}

void ControlChannel::on_router_frame(const std::string& routing_id, const std::string& bytes) {
  auto decoded = decode_envelope(bytes, options_.max_message_bytes);
  if (!decoded.ok()) return refuse(routing_id, decoded.status());
  proto::Envelope envelope = std::move(*decoded);
  auto known = peer_by_routing_id_.find(routing_id);

  if (envelope.has_handshake()) {
    const proto::Handshake& hello = envelope.handshake();
    const proto::Handshake& local = options_.local;
    proto::Envelope reply;
    proto::HandshakeAck& ack = *reply.mutable_handshake_ack();
    // The geometry check comes first: everything else is meaningless between mismatched caches.
    if (hello.compat_hash() != local.compat_hash()) {
      ack.set_error(absl::StrCat("incompatible KV geometry: peer compat hash ",
                                 absl::Hex(hello.compat_hash()), " [", hello.geometry(),
                                 "] != local ", absl::Hex(local.compat_hash()), " [",
                                 local.geometry(), "]"));
    } else if (hello.role() == local.role()) {
      ack.set_error(absl::StrCat("both ranks have role ", proto::Role_Name(local.role())));
    } else {
      ack.set_accepted(true);
      ack.set_role(local.role());
      ack.set_tp_size(local.tp_size());
      ack.set_rank(local.rank());
      ack.set_worker_address(local.worker_address());
      ack.set_incarnation(local.incarnation());
      *ack.mutable_regions() = local.regions();
      *ack.mutable_arena() = local.arena();
      *ack.mutable_host_arena() = local.host_arena();
      if (lane_) {
        ack.set_local_lane(lane_->address());
        ack.set_local_lane_token(lane_token_);
      }
    }
    if (!ack.accepted()) {
      PD_LOG_WARN("control: refusing handshake from rank {}/{}: {}", hello.rank(),
                  hello.tp_size(), ack.error());
      ++refused_;
    } else {
      // A repeated handshake from the same socket (a retry) updates the existing peer.
      const uint64_t id = known != peer_by_routing_id_.end() ? known->second : next_peer_id_++;
      PeerState& peer = peers_[id];
      peer.info = ControlPeer{};
      peer.info.id = id;
      copy_identity(hello, peer.info);
      peer.routing_id = routing_id;
      peer.last_heard = options_.clock->now();
      peer.lost = false;
      peer.lane_ready = false;  // Until it shows it has our answer.
      peer_by_routing_id_[routing_id] = id;
      events_.push_back(ControlEvent{ControlEvent::Kind::kPeerJoined, id, {}, absl::OkStatus()});
    }
    const Status sent = send_routed(routing_id, encode_envelope(reply));
    if (!sent.ok()) PD_LOG_WARN("control: cannot answer a handshake: {}", sent.ToString());
    return;
  }

  if (known == peer_by_routing_id_.end() || peers_.at(known->second).lost) {
    return refuse(routing_id, absl::FailedPreconditionError(absl::StrCat(
                                  message_type_name(envelope), " before a handshake")));
  }
  on_peer_message(known->second, std::move(envelope));
}

void ControlChannel::on_dealer_frame(uint64_t id, const std::string& bytes) {
  auto decoded = decode_envelope(bytes, options_.max_message_bytes);
  if (!decoded.ok()) return refuse(absl::StrCat("peer ", id), decoded.status());
  on_peer_message(id, std::move(*decoded));
}

void ControlChannel::drain_lane() {
  for (int taken = 0; taken < kLaneBatch; ++taken) {
    std::optional<LocalLane::Datagram> datagram = lane_->receive(kLaneTokenBytes + options_.max_message_bytes);
    if (!datagram) return;
    // The sender's address is the kernel's, so it names a live process, and the token proves it
    // is the one that announced that address to us (not one that bound it after that one
    // exited). Either of a peer's two connections serves.
    uint64_t from = 0;
    for (const auto& [id, peer] : peers_) {
      if (!peer.lost && !datagram->from.empty() && peer.info.local_lane == datagram->from &&
          starts_with_token(datagram->bytes, peer.info.local_lane_token)) {
        from = id;
        break;
      }
    }
    if (from == 0) {
      // Counted, and only logged at debug level: any local process can send these.
      ++refused_;
      PD_LOG_DEBUG("control: refused a lane datagram from @{}: not from a live handshaken peer", datagram->from);
      continue;
    }
    auto decoded = decode_envelope(std::string_view(datagram->bytes).substr(kLaneTokenBytes),
                                   options_.max_message_bytes);
    if (!decoded.ok()) {
      refuse(absl::StrCat("lane @", datagram->from), decoded.status());
      continue;
    }
    if (decoded->has_handshake() || decoded->has_handshake_ack() || decoded->has_heartbeat()) {
      // Liveness is ZeroMQ's to tell (heartbeats on the connection), never the lane's.
      refuse(absl::StrCat("lane @", datagram->from),
             absl::FailedPreconditionError(absl::StrCat(message_type_name(*decoded), " on the lane")));
      continue;
    }
    ++lane_counters_.received;
    peers_.at(from).lane_ready = true;  // It sent to our lane: it has our answer.
    events_.push_back(ControlEvent{ControlEvent::Kind::kMessage, from, std::move(*decoded), absl::OkStatus()});
  }
}

void ControlChannel::on_peer_message(uint64_t id, proto::Envelope envelope) {
  if (envelope.has_handshake() || envelope.has_handshake_ack()) {
    return refuse(absl::StrCat("peer ", id),
                  absl::FailedPreconditionError(absl::StrCat(
                      "unexpected ", message_type_name(envelope), " after the handshake")));
  }
  PeerState& peer = peers_.at(id);
  peer.last_heard = options_.clock->now();
  peer.lane_ready = true;  // A frame after the handshake: it has our answer, and our lane.
  if (envelope.has_heartbeat()) return;
  events_.push_back(
      ControlEvent{ControlEvent::Kind::kMessage, id, std::move(envelope), absl::OkStatus()});
}

void ControlChannel::tick() {
  const TimePoint now = options_.clock->now();
  const bool beat = now - last_heartbeat_ >= options_.heartbeat_interval;
  if (beat) last_heartbeat_ = now;
  for (auto& [id, peer] : peers_) {
    if (peer.lost) continue;
    if (now - peer.last_heard > options_.peer_timeout) {
      lose(id, peer,
           absl::UnavailableError(absl::StrCat("no control message from peer ", id, " (rank ", peer.info.rank,
                                               ") for ", to_ms(now - peer.last_heard), " ms")));
      continue;
    }
    if (beat) {
      proto::Envelope heartbeat;
      heartbeat.mutable_heartbeat();
      const Status sent = send_to(peer, encode_envelope(heartbeat));
      if (!sent.ok()) PD_LOG_DEBUG("control: heartbeat to peer {}: {}", id, sent.ToString());
    }
  }
}

void ControlChannel::lose(uint64_t id, PeerState& peer, const Status& why) {
  peer.lost = true;
  if (peer.dealer) {
    peer_by_endpoint_.erase(peer.info.endpoint);
    peer.dealer.reset();
  } else {
    peer_by_routing_id_.erase(peer.routing_id);
  }
  PD_LOG_WARN("control: {}", std::string(why.message()));
  events_.push_back(ControlEvent{ControlEvent::Kind::kPeerLost, id, {}, why});
}

void ControlChannel::refuse(const std::string& from, const Status& why) {
  ++refused_;
  PD_LOG_WARN("control: refused a frame from {}: {}", absl::CHexEscape(from), why.ToString());
}

}  // namespace pdserve::kvtransfer
