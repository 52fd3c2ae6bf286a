// Unit tests of the ZeroMQ control channel on loopback inside one process: handshake accept,
// refusal on compat-hash mismatch, handshake caching, notifications both ways, refusal of junk
// frames without harm, peer loss by heartbeat timeout on an injected clock, fast failure of a
// refused dial, CURVE with the cluster key (encrypted on the wire, refused without it), and the
// non-blocking dial (start_connect, cached, kDialed) against a listener answered by hand, and
// the same-host lane (LocalLane): taken both ways, fallen back from, closed to strangers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>
#include <utility>
#include <thread>

#include <gtest/gtest.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvtransfer/control/codec.h"
#include "kvtransfer/control/control_channel.h"
#include "kvtransfer/control/local_lane.h"

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

ControlChannelOptions options_for(proto::Role role, uint64_t hash, const Clock* clock) {
  ControlChannelOptions o;
  o.local.set_compat_hash(hash);
  o.local.set_role(role);
  o.local.set_tp_size(2);
  o.local.set_rank(role == proto::ROLE_PREFILL ? 0 : 1);
  o.local.set_worker_address(role == proto::ROLE_PREFILL ? "prefill-addr" : "decode-addr");
  o.local.set_geometry(absl::StrCat("geometry-", hash));
  auto* r = o.local.add_regions();
  r->set_name("kv");
  r->set_blob("descriptor");
  o.clock = clock;
  o.max_message_bytes = 4096;
  return o;
}

std::unique_ptr<ControlChannel> make(proto::Role role, uint64_t hash,
                                     const Clock* clock = &RealClock::instance()) {
  auto channel = ControlChannel::create(options_for(role, hash, clock));
  EXPECT_TRUE(channel.ok()) << channel.status();
  return std::move(*channel);
}

// Runs the listener's receive() on another thread (the channel's only user meanwhile) and
// collects its events.
class Serving {
 public:
  explicit Serving(ControlChannel& channel) : thread_([this, &channel] {
    while (!stop_) {
      auto event = channel.receive(5ms);
      if (event.ok()) events_.push_back(std::move(*event));
    }
  }) {}
  std::vector<ControlEvent> stop() {
    stop_ = true;
    thread_.join();
    return std::move(events_);
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<ControlEvent> events_;
  std::thread thread_;
};

StatusOr<ControlEvent> next_message(ControlChannel& channel) {
  for (int i = 0; i < 200; ++i) {
    auto event = channel.receive(10ms);
    if (event.ok() && event->kind != ControlEvent::Kind::kPeerJoined) return event;
  }
  return absl::DeadlineExceededError("nothing");
}

// The next event of `kind` on `waiting`, while `serviced` are serviced on this same thread (so
// that nothing moves unless the caller's loop runs), within `within` of real time; the events
// passed over are dropped.
std::optional<ControlEvent> await_event(ControlChannel& waiting, ControlEvent::Kind kind,
                                        std::initializer_list<ControlChannel*> serviced, Duration within = 5s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    for (ControlChannel* other : serviced) {
      while (other->receive(Duration(0)).ok()) {
      }
    }
    auto event = waiting.receive(1ms);
    if (event.ok() && event->kind == kind) return std::move(*event);
  }
  return std::nullopt;
}

// A listener answered by hand: a bare ROUTER that accepts connections (as a stopped or busy
// process's kernel does) and answers a handshake only when the test says so.
class HandAnsweredPeer {
 public:
  HandAnsweredPeer() : socket_(context_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint = socket_.get(zmq::sockopt::last_endpoint);
  }
  // The routing id of the next handshake to arrive within `within` (other frames are skipped).
  std::optional<std::string> next_handshake(Duration within) {
    auto got = next_frame(within, [](const proto::Envelope& e) { return e.has_handshake(); });
    return got ? std::optional<std::string>(got->first) : std::nullopt;
  }
  // Accepts the handshake that came from `routing_id`, as decode rank 1/2 of incarnation 0x77,
  // announcing `local_lane` (none if empty).
  void accept(const std::string& routing_id, const std::string& local_lane = "") {
    proto::Envelope reply;
    proto::HandshakeAck& ack = *reply.mutable_handshake_ack();
    ack.set_accepted(true);
    ack.set_local_lane(local_lane);
    ack.set_role(proto::ROLE_DECODE);
    ack.set_tp_size(2);
    ack.set_rank(1);
    ack.set_worker_address("hand-addr");
    ack.set_incarnation(kIncarnation);
    const std::string bytes = encode_envelope(reply);
    socket_.send(zmq::buffer(routing_id), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(bytes), zmq::send_flags::none);
  }
  // The type of the next message (handshakes skipped) to arrive within `within`; "" if none.
  std::string next_message_type(Duration within) {
    auto got = next_frame(within, [](const proto::Envelope& e) { return !e.has_handshake(); });
    return got ? message_type_name(got->second) : "";
  }
  static constexpr uint64_t kIncarnation = 0x77;
  std::string endpoint;

 private:
  // The next (routing id, envelope) to arrive within `within` that `wanted` accepts; others are
  // skipped.
  template <typename Wanted>
  std::optional<std::pair<std::string, proto::Envelope>> next_frame(Duration within, Wanted wanted) {
    const auto until = std::chrono::steady_clock::now() + within;
    do {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 10ms);
      std::vector<zmq::message_t> frames;
      while (zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        auto decoded = frames.size() == 2 ? decode_envelope(frames[1].to_string_view())
                                          : StatusOr<proto::Envelope>(absl::InvalidArgumentError("frames"));
        if (decoded.ok() && wanted(*decoded)) return std::make_pair(frames[0].to_string(), std::move(*decoded));
        frames.clear();
      }
    } while (std::chrono::steady_clock::now() < until);
    return std::nullopt;
  }

  zmq::context_t context_;
  zmq::socket_t socket_;
};

// start_connect() returns before anything was answered (the listener runs on this thread, only
// after it returned); receive() then reports the handshaken peer as kDialed, and the connection
// carries messages both ways. The injected clock stays still: dials need no heartbeat.
TEST(ControlChannelTest, StartConnectReportsTheHandshakenPeerAndMessagesRoundTrip) {
  FakeClock clock;
  auto decode = make(proto::ROLE_DECODE, 7, &clock);
  auto prefill = make(proto::ROLE_PREFILL, 7, &clock);
  auto dial = prefill->start_connect(decode->endpoint(), 5s);
  ASSERT_TRUE(dial.ok()) << dial.status();
  EXPECT_EQ(prefill->cached(decode->endpoint()), nullptr) << "no handshake answered yet";
  auto dialed = await_event(*prefill, ControlEvent::Kind::kDialed, {decode.get()});
  ASSERT_TRUE(dialed.has_value());
  EXPECT_EQ(dialed->dial, *dial);
  ASSERT_TRUE(dialed->error.ok()) << dialed->error;
  auto peer = prefill->peer(dialed->peer);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_TRUE(peer->dialed);
  EXPECT_EQ(peer->endpoint, decode->endpoint());
  EXPECT_EQ(peer->role, proto::ROLE_DECODE);
  EXPECT_EQ(peer->worker_address, "decode-addr");
  auto cached = prefill->cached(decode->endpoint());
  ASSERT_NE(cached, nullptr);
  EXPECT_EQ(cached->id, dialed->peer);

  proto::Envelope done;
  done.mutable_write_done()->set_request_id("r1");
  done.mutable_write_done()->set_sealed_count(12);
  ASSERT_TRUE(prefill->send(dialed->peer, done).ok());
  auto got = await_event(*decode, ControlEvent::Kind::kMessage, {prefill.get()});
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->message.write_done().sealed_count(), 12u);
  proto::Envelope release;
  release.mutable_release()->set_request_id("r1");
  release.mutable_release()->set_consumer_tp(2);
  release.mutable_release()->set_consumer_rank(1);
  ASSERT_TRUE(decode->send(got->peer, release).ok());
  auto back = await_event(*prefill, ControlEvent::Kind::kMessage, {decode.get()});
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->peer, dialed->peer);
  EXPECT_EQ(back->message.release().request_id(), "r1");
  EXPECT_EQ(decode->refused_count() + prefill->refused_count(), 0u);
}

// A dial nobody answers (the connection is accepted, the handshake never answered) stays in
// flight without holding up its channel: start_connect() returns at once, another dial ends and
// that peer's messages arrive meanwhile, and the answer, when it comes, ends the dial.
TEST(ControlChannelTest, ADialNobodyAnswersStaysInFlightAndOthersProceed) {
  FakeClock clock;
  HandAnsweredPeer silent;
  auto decode = make(proto::ROLE_DECODE, 7, &clock);
  auto prefill = make(proto::ROLE_PREFILL, 7, &clock);
  const auto start = std::chrono::steady_clock::now();
  // A timeout longer than the test takes: only the hand-sent answer can end this dial in time.
  auto stalled = prefill->start_connect(silent.endpoint, 20s);
  ASSERT_TRUE(stalled.ok()) << stalled.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "start_connect waited for the answer";
  auto healthy = prefill->start_connect(decode->endpoint(), 5s);
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  ASSERT_NE(*stalled, *healthy);

  auto dialed = await_event(*prefill, ControlEvent::Kind::kDialed, {decode.get()});
  ASSERT_TRUE(dialed.has_value());
  EXPECT_EQ(dialed->dial, *healthy) << "the unanswered dial ended";
  ASSERT_TRUE(dialed->error.ok()) << dialed->error;
  proto::Envelope done;
  done.mutable_write_done()->set_request_id("r1");
  ASSERT_TRUE(prefill->send(dialed->peer, done).ok());
  auto got = await_event(*decode, ControlEvent::Kind::kMessage, {prefill.get()});
  ASSERT_TRUE(got.has_value());
  proto::Envelope release;
  release.mutable_release()->set_request_id("r1");
  release.mutable_release()->set_consumer_tp(2);
  ASSERT_TRUE(decode->send(got->peer, release).ok());
  auto back = await_event(*prefill, ControlEvent::Kind::kMessage, {decode.get()});
  ASSERT_TRUE(back.has_value()) << "a message waited for the unanswered dial";
  EXPECT_EQ(back->message.release().request_id(), "r1");

  // Still dialed, not connected: the handshake arrived and is unanswered.
  const std::optional<std::string> hello = silent.next_handshake(5s);
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(prefill->cached(silent.endpoint), nullptr);
  auto idle = prefill->receive(Duration(0));
  EXPECT_FALSE(idle.ok() && idle->kind == ControlEvent::Kind::kDialed) << "ended unanswered";

  silent.accept(*hello);
  auto answered = await_event(*prefill, ControlEvent::Kind::kDialed, {});
  ASSERT_TRUE(answered.has_value());
  EXPECT_EQ(answered->dial, *stalled);
  ASSERT_TRUE(answered->error.ok()) << answered->error;
  auto peer = prefill->peer(answered->peer);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->worker_address, "hand-addr");
  auto cached = prefill->cached(silent.endpoint);
  ASSERT_NE(cached, nullptr);
  EXPECT_EQ(cached->id, answered->peer);
}

// Unanswered, a dial ends at its timeout (real time: it bounds receive()'s real waits; the
// injected clock stays still) as DeadlineExceeded naming the endpoint, not before, and the
// endpoint is not cached.
TEST(ControlChannelTest, ADialNobodyAnswersEndsAtItsTimeout) {
  FakeClock clock;
  HandAnsweredPeer silent;
  auto prefill = make(proto::ROLE_PREFILL, 7, &clock);
  const auto start = std::chrono::steady_clock::now();
  auto dial = prefill->start_connect(silent.endpoint, 100ms);
  ASSERT_TRUE(dial.ok()) << dial.status();
  auto ended = await_event(*prefill, ControlEvent::Kind::kDialed, {});
  ASSERT_TRUE(ended.has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_EQ(ended->dial, *dial);
  EXPECT_EQ(ended->peer, 0u);
  EXPECT_EQ(ended->error.code(), absl::StatusCode::kDeadlineExceeded) << ended->error;
  EXPECT_NE(ended->error.message().find(absl::StrCat("no handshake answer from ", silent.endpoint, " within 100 ms")),
            std::string::npos)
      << ended->error;
  EXPECT_EQ(prefill->cached(silent.endpoint), nullptr);
}

// Once a dial ended, the endpoint's peer is cached: cached() and connect() hand back the same
// entry without a second dial (the hand-answered listener would not answer one), for its own
// incarnation or any; naming another incarnation drops it (kPeerLost), as after a restart.
TEST(ControlChannelTest, ADialedPeerIsCachedAndNotDialedAgain) {
  FakeClock clock;
  HandAnsweredPeer listener;
  auto prefill = make(proto::ROLE_PREFILL, 7, &clock);
  auto dial = prefill->start_connect(listener.endpoint, 5s);
  ASSERT_TRUE(dial.ok()) << dial.status();
  const std::optional<std::string> hello = listener.next_handshake(5s);
  ASSERT_TRUE(hello.has_value());
  listener.accept(*hello);
  auto dialed = await_event(*prefill, ControlEvent::Kind::kDialed, {});
  ASSERT_TRUE(dialed.has_value());
  ASSERT_TRUE(dialed->error.ok()) << dialed->error;

  for (uint64_t incarnation : {uint64_t(0), HandAnsweredPeer::kIncarnation}) {
    auto cached = prefill->cached(listener.endpoint, incarnation);
    ASSERT_NE(cached, nullptr) << incarnation;
    EXPECT_EQ(cached->id, dialed->peer);
  }
  auto again = prefill->connect(listener.endpoint, 1ms);
  ASSERT_TRUE(again.ok()) << again.status() << " (dialed again)";
  EXPECT_EQ(again->id, dialed->peer);
  EXPECT_FALSE(listener.next_handshake(50ms).has_value()) << "a second handshake arrived";

  EXPECT_EQ(prefill->cached(listener.endpoint, HandAnsweredPeer::kIncarnation + 1), nullptr);
  auto lost = prefill->receive(Duration(0));
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->kind, ControlEvent::Kind::kPeerLost);
  EXPECT_EQ(lost->peer, dialed->peer);
  EXPECT_EQ(prefill->cached(listener.endpoint), nullptr);
}

TEST(ControlChannelTest, HandshakeAcceptedCachedAndNotificationsFlowBothWays) {
  auto decode = make(proto::ROLE_DECODE, 7);
  auto prefill = make(proto::ROLE_PREFILL, 7);
  Serving serving(*decode);
  auto peer = prefill->connect(decode->endpoint(), 2s);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->role, proto::ROLE_DECODE);
  EXPECT_EQ(peer->rank, 1u);
  EXPECT_EQ(peer->tp_size, 2u);
  EXPECT_EQ(peer->worker_address, "decode-addr");
  EXPECT_EQ(peer->regions.at("kv"), "descriptor");
  auto again = prefill->connect(decode->endpoint(), 1ms);  // No round trip: cached.
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id, peer->id);

  proto::Envelope done;
  done.mutable_write_done()->set_request_id("r1");
  done.mutable_write_done()->set_sealed_count(12);
  done.mutable_write_done()->set_first_token(99);
  ASSERT_TRUE(prefill->send(peer->id, done).ok());
  std::this_thread::sleep_for(50ms);
  std::vector<ControlEvent> events = serving.stop();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, ControlEvent::Kind::kPeerJoined);
  auto joined = decode->peer(events[0].peer);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->role, proto::ROLE_PREFILL);
  EXPECT_EQ(joined->worker_address, "prefill-addr");
  EXPECT_FALSE(joined->dialed);
  ASSERT_EQ(events[1].kind, ControlEvent::Kind::kMessage);
  EXPECT_EQ(events[1].message.write_done().sealed_count(), 12u);
  EXPECT_EQ(events[1].message.write_done().first_token(), 99);

  // The listener answers on the same connection.
  proto::Envelope release;
  release.mutable_release()->set_request_id("r1");
  release.mutable_release()->set_consumer_tp(2);
  release.mutable_release()->set_consumer_rank(1);
  ASSERT_TRUE(decode->send(events[1].peer, release).ok());
  auto got = next_message(*prefill);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->peer, peer->id);
  EXPECT_EQ(got->message.release().consumer_rank(), 1u);
  EXPECT_EQ(decode->refused_count(), 0u);
  EXPECT_EQ(prefill->refused_count(), 0u);
}

// Route::kLocalFirst between two channels of one host takes the same-host lane both ways (the
// dialer's and the listener's): the messages arrive as kMessage from the handshaken peer, and
// nothing goes through ZeroMQ. Route::kChannel (the default) still does.
TEST(ControlChannelTest, LocalFirstNotificationsTakeTheSameHostLaneBothWays) {
  auto decode = make(proto::ROLE_DECODE, 7);
  auto prefill = make(proto::ROLE_PREFILL, 7);
  Serving serving(*decode);
  auto peer = prefill->connect(decode->endpoint(), 2s);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_FALSE(peer->local_lane.empty()) << "the listener announces its lane";
  proto::Envelope done;
  done.mutable_write_done()->set_request_id("r1");
  done.mutable_write_done()->set_sealed_count(12);
  ASSERT_TRUE(prefill->send(peer->id, done, Route::kLocalFirst).ok());
  std::this_thread::sleep_for(50ms);
  std::vector<ControlEvent> events = serving.stop();
  ASSERT_EQ(events.size(), 2u);
  ASSERT_EQ(events[1].kind, ControlEvent::Kind::kMessage);
  EXPECT_EQ(events[1].peer, events[0].peer);
  EXPECT_EQ(events[1].message.write_done().sealed_count(), 12u);
  EXPECT_EQ(prefill->lane_counters().sent, 1u);
  EXPECT_EQ(prefill->lane_counters().fell_back, 0u);
  EXPECT_EQ(decode->lane_counters().received, 1u);
  auto joined = decode->peer(events[0].peer);
  ASSERT_TRUE(joined.ok());
  EXPECT_FALSE(joined->local_lane.empty()) << "the dialer announces its lane";

  proto::Envelope release;
  release.mutable_release()->set_request_id("r1");
  release.mutable_release()->set_consumer_tp(2);
  release.mutable_release()->set_consumer_rank(1);
  ASSERT_TRUE(decode->send(events[1].peer, release, Route::kLocalFirst).ok());
  auto got = next_message(*prefill);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->peer, peer->id);
  EXPECT_EQ(got->message.release().consumer_rank(), 1u);
  EXPECT_EQ(decode->lane_counters().sent, 1u);
  EXPECT_EQ(prefill->lane_counters().received, 1u);

  ASSERT_TRUE(decode->send(events[1].peer, release).ok());  // Route::kChannel: ZeroMQ.
  ASSERT_TRUE(next_message(*prefill).ok());
  EXPECT_EQ(decode->lane_counters().sent, 1u);
  EXPECT_EQ(prefill->lane_counters().received, 1u);
  EXPECT_EQ(decode->refused_count(), 0u);
  EXPECT_EQ(prefill->refused_count(), 0u);
}

// A peer without a lane (local_lane off), or one whose announced lane cannot be reached from
// here, gets kLocalFirst messages through ZeroMQ: nothing is lost, the fallback is counted.
TEST(ControlChannelTest, LocalFirstFallsBackToZeroMqWhenThePeerHasNoReachableLane) {
  ControlChannelOptions no_lane = options_for(proto::ROLE_DECODE, 7, &RealClock::instance());
  no_lane.local_lane = false;
  auto decode = ControlChannel::create(no_lane);
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto prefill = make(proto::ROLE_PREFILL, 7);
  {
    Serving serving(**decode);
    auto peer = prefill->connect((*decode)->endpoint(), 2s);
    ASSERT_TRUE(peer.ok()) << peer.status();
    EXPECT_TRUE(peer->local_lane.empty());
    proto::Envelope done;
    done.mutable_write_done()->set_request_id("r1");
    ASSERT_TRUE(prefill->send(peer->id, done, Route::kLocalFirst).ok());
    std::this_thread::sleep_for(50ms);
    std::vector<ControlEvent> events = serving.stop();
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[1].message.write_done().request_id(), "r1");
    EXPECT_EQ(prefill->lane_counters().sent, 0u);
    EXPECT_EQ(prefill->lane_counters().fell_back, 1u);
  }

  // A lane announced but bound nowhere (as seen from another network namespace): the first send
  // finds out, and that peer is not tried on the lane again.
  HandAnsweredPeer listener;
  auto dial = prefill->start_connect(listener.endpoint, 5s);
  ASSERT_TRUE(dial.ok()) << dial.status();
  std::optional<std::string> routing_id = listener.next_handshake(5s);
  ASSERT_TRUE(routing_id.has_value());
  listener.accept(*routing_id, "pdserve-kv-bound-nowhere");
  auto dialed = await_event(*prefill, ControlEvent::Kind::kDialed, {});
  ASSERT_TRUE(dialed.has_value() && dialed->error.ok());
  proto::Envelope done;
  done.mutable_write_done()->set_request_id("r2");
  ASSERT_TRUE(prefill->send(dialed->peer, done, Route::kLocalFirst).ok());
  ASSERT_TRUE(prefill->send(dialed->peer, done, Route::kLocalFirst).ok());
  EXPECT_EQ(prefill->lane_counters().sent, 0u);
  EXPECT_EQ(prefill->lane_counters().fell_back, 3u);
  EXPECT_EQ(listener.next_message_type(2s), "write_done");
  EXPECT_EQ(listener.next_message_type(2s), "write_done");
}

// The lane admits datagrams only from addresses that a live handshaken peer announced: a process
// that learnt a channel's lane address but never handshook is refused and counted, and delivers
// nothing, whatever it sends.
TEST(ControlChannelTest, LaneDatagramsFromStrangersAreRefused) {
  auto decode = make(proto::ROLE_DECODE, 7);
  auto prefill = make(proto::ROLE_PREFILL, 7);
  Serving serving(*decode);
  auto peer = prefill->connect(decode->endpoint(), 2s);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto stranger = LocalLane::open();
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  proto::Envelope done;
  done.mutable_write_done()->set_request_id("forged");
  ASSERT_TRUE((*stranger)->send(peer->local_lane, encode_envelope(done)).ok());
  std::this_thread::sleep_for(50ms);
  std::vector<ControlEvent> events = serving.stop();
  ASSERT_EQ(events.size(), 1u) << "only the handshake's kPeerJoined";
  EXPECT_EQ(events[0].kind, ControlEvent::Kind::kPeerJoined);
  EXPECT_EQ(decode->refused_count(), 1u);
  EXPECT_EQ(decode->lane_counters().received, 0u);
}

// A process that binds a peer's lane address after that peer exited (the kernel frees it at
// once, while the channel has not yet lost the peer to its heartbeat timeout) cannot pass for it:
// without the token the peer announced in its handshake, its datagrams are refused.
TEST(ControlChannelTest, ADeadPeersLaneAddressCannotBeTakenOver) {
  auto decode = make(proto::ROLE_DECODE, 7);
  auto prefill = make(proto::ROLE_PREFILL, 7);
  std::string decode_lane, prefill_lane;
  {
    Serving serving(*decode);
    auto peer = prefill->connect(decode->endpoint(), 2s);
    ASSERT_TRUE(peer.ok()) << peer.status();
    decode_lane = peer->local_lane;
    std::vector<ControlEvent> events = serving.stop();
    ASSERT_EQ(events.size(), 1u);
    auto joined = decode->peer(events[0].peer);
    ASSERT_TRUE(joined.ok());
    prefill_lane = joined->local_lane;
    EXPECT_EQ(joined->local_lane_token.size(), 16u);
  }
  prefill.reset();  // Its process "exits": the address is free.

  const int squatter = socket(AF_UNIX, SOCK_DGRAM, 0);
  ASSERT_GE(squatter, 0);
  auto address = [](const std::string& name, sockaddr_un& addr) {
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  };
  sockaddr_un own, to;
  const socklen_t own_length = address(prefill_lane, own), to_length = address(decode_lane, to);
  ASSERT_EQ(bind(squatter, reinterpret_cast<const sockaddr*>(&own), own_length), 0) << std::strerror(errno);
  proto::Envelope done;
  done.mutable_write_done()->set_request_id("forged");
  const std::string bare = encode_envelope(done);
  const std::string guessed = std::string(16, '\0') + bare;
  for (const std::string* datagram : {&bare, &guessed}) {
    ASSERT_EQ(sendto(squatter, datagram->data(), datagram->size(), 0, reinterpret_cast<const sockaddr*>(&to), to_length),
              static_cast<ssize_t>(datagram->size()));
  }
  close(squatter);
  const auto until = std::chrono::steady_clock::now() + 200ms;
  while (std::chrono::steady_clock::now() < until) {
    auto event = decode->receive(10ms);
    EXPECT_FALSE(event.ok() && event->kind == ControlEvent::Kind::kMessage) << "a forged message was delivered";
  }
  EXPECT_EQ(decode->refused_count(), 2u);
  EXPECT_EQ(decode->lane_counters().received, 0u);
}

// LocalLane alone: a datagram arrives whole with its sender's address; a lane bound nowhere is
// Unavailable; one too big for a datagram is ResourceExhausted (the caller falls back).
TEST(LocalLaneTest, SendsReceivesAndRefusesWhatItCannotCarry) {
  auto a = LocalLane::open();
  auto b = LocalLane::open();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->address(), (*b)->address());
  EXPECT_FALSE((*b)->receive(64).has_value());
  ASSERT_TRUE((*a)->send((*b)->address(), "hello").ok());
  pollfd readable{(*b)->fd(), POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, 1000), 1);
  std::optional<LocalLane::Datagram> got = (*b)->receive(64);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->from, (*a)->address());
  EXPECT_EQ(got->bytes, "hello");
  EXPECT_FALSE((*b)->receive(64).has_value());
  ASSERT_TRUE((*a)->send((*b)->address(), std::string(100, 'x')).ok());
  got = (*b)->receive(64);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->bytes.size(), 65u) << "longer than the limit: cut at limit + 1, for the caller to refuse";

  EXPECT_TRUE(absl::IsUnavailable((*a)->send("pdserve-kv-bound-nowhere", "x")));
  EXPECT_TRUE(absl::IsUnavailable((*a)->send(std::string(200, 'n'), "x")));
  EXPECT_TRUE(absl::IsResourceExhausted((*a)->send((*b)->address(), std::string(8 << 20, 'x'))));
}

TEST(ControlChannelTest, AWakeEndsReceiveAtOnceAndAZeroTimeoutStillLooks) {
  WakeFd wake;
  ControlChannelOptions o = options_for(proto::ROLE_DECODE, 7, &RealClock::instance());
  o.wake = &wake;
  auto decode = ControlChannel::create(o);
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto prefill = make(proto::ROLE_PREFILL, 7);
  // Whichever comes first, the signal or the wait, receive() returns within the hour.
  std::thread signaller([&] { wake.signal(); });
  auto woken = (*decode)->receive(3600s);
  signaller.join();
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(woken->kind, ControlEvent::Kind::kWoken);
  EXPECT_FALSE(wake.drain());  // receive() consumed the signal.

  // receive(0) looks at the sockets once: a handshake gets answered by zero-timeout calls alone.
  std::atomic<bool> answered{false};
  std::thread dialer([&] {
    answered = prefill->connect((*decode)->endpoint(), 10s).ok();
  });
  bool joined = false;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!joined && std::chrono::steady_clock::now() < until) {
    auto event = (*decode)->receive(Duration(0));
    joined = event.ok() && event->kind == ControlEvent::Kind::kPeerJoined;
    if (!event.ok()) std::this_thread::yield();
  }
  dialer.join();
  EXPECT_TRUE(joined);
  EXPECT_TRUE(answered);
}

TEST(ControlChannelTest, AnotherIncarnationDropsTheCachedPeerAndDialsAgain) {
  ControlChannelOptions o = options_for(proto::ROLE_DECODE, 7, &RealClock::instance());
  o.local.set_incarnation(0xabc);
  auto decode = ControlChannel::create(o);
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto prefill = make(proto::ROLE_PREFILL, 7);
  Serving serving(**decode);
  auto first = prefill->connect((*decode)->endpoint(), 2s);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->incarnation, 0xabcu);
  auto same = prefill->connect((*decode)->endpoint(), 1ms, 0xabc);  // Cached: no round trip.
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->id, first->id);
  // The caller heard of another process on that endpoint: the cached peer is lost, and the
  // endpoint handshakes again (here the same process answers, with its own incarnation).
  auto fresh = prefill->connect((*decode)->endpoint(), 2s, 0xdef);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(fresh->id, first->id);
  EXPECT_EQ(fresh->incarnation, 0xabcu);
  auto lost = prefill->receive(0ms);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->kind, ControlEvent::Kind::kPeerLost);
  EXPECT_EQ(lost->peer, first->id);
  EXPECT_NE(lost->error.message().find("restarted"), std::string::npos) << lost->error;
  serving.stop();
}

// A dial to a port nobody listens on (a killed worker's) fails as soon as the connection is
// refused, not at the end of its handshake timeout.
TEST(ControlChannelTest, ADialThatIsRefusedFailsAtOnceAsUnavailable) {
  std::string dead_endpoint;
  {
    auto gone = make(proto::ROLE_DECODE, 1);
    dead_endpoint = gone->endpoint();
  }
  auto prefill = make(proto::ROLE_PREFILL, 1);
  // With a timeout far beyond the test's own: only the refusal can end the dial in time.
  auto peer = prefill->connect(dead_endpoint, 600s);
  ASSERT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  EXPECT_NE(peer.status().message().find("refused"), std::string::npos) << peer.status();
}

// A TCP relay between a dialing channel and a listening one that keeps every byte it relays,
// to see what an eavesdropper on the network would.
class WireTap {
 public:
  explicit WireTap(const std::string& target_endpoint) {
    target_port_ = std::stoi(target_endpoint.substr(target_endpoint.rfind(':') + 1));
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] { relay(); });
  }
  ~WireTap() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  std::string endpoint;
  std::string bytes() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void relay() {
    pollfd l{listener_, POLLIN, 0};
    while (!stop_ && ::poll(&l, 1, 10) <= 0) {
    }
    if (stop_) return;
    const int in = ::accept(listener_, nullptr, nullptr);
    const int out = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in t{};
    t.sin_family = AF_INET;
    t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    t.sin_port = htons(uint16_t(target_port_));
    if (::connect(out, reinterpret_cast<sockaddr*>(&t), sizeof(t)) != 0) return;
    pollfd fds[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
    char buf[4096];
    while (!stop_) {
      if (::poll(fds, 2, 10) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) stop_ = true;
        if (n <= 0) break;
        {
          std::lock_guard lock(mu_);
          seen_.append(buf, size_t(n));
        }
        (void)::write(fds[1 - i].fd, buf, size_t(n));
      }
    }
    ::close(in);
    ::close(out);
  }
  int listener_ = -1, target_port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string seen_;
  std::thread thread_;
};

// With the cluster key both ends handshake and talk as before, and a notification's content
// never shows on the wire (it does without the key: the tap sees what there is to see).
TEST(ControlChannelTest, WithTheClusterKeyTheWireCarriesNoPlaintext) {
  auto key = new_curve_secret();
  ASSERT_TRUE(key.ok()) << key.status();
  for (bool encrypted : {false, true}) {
    ControlChannelOptions d = options_for(proto::ROLE_DECODE, 7, &RealClock::instance());
    ControlChannelOptions p = options_for(proto::ROLE_PREFILL, 7, &RealClock::instance());
    if (encrypted) d.curve_secret_key = p.curve_secret_key = *key;
    auto decode = ControlChannel::create(d);
    auto prefill = ControlChannel::create(p);
    ASSERT_TRUE(decode.ok() && prefill.ok());
    WireTap tap((*decode)->endpoint());
    Serving serving(**decode);
    auto peer = (*prefill)->connect(tap.endpoint, 5s);
    ASSERT_TRUE(peer.ok()) << peer.status();
    EXPECT_EQ(peer->worker_address, "decode-addr");
    proto::Envelope done;
    done.mutable_write_done()->set_request_id("the-secret-request-id");
    ASSERT_TRUE((*prefill)->send(peer->id, done).ok());
    bool delivered = false;
    for (int i = 0; i < 200 && !delivered; ++i) {
      std::this_thread::sleep_for(5ms);
      delivered = tap.bytes().size() > 0 && i > 10;
    }
    std::vector<ControlEvent> events = serving.stop();
    ASSERT_EQ(events.size(), 2u) << (encrypted ? "CURVE" : "plaintext");
    EXPECT_EQ(events[1].message.write_done().request_id(), "the-secret-request-id");
    const std::string wire = tap.bytes();
    EXPECT_EQ(wire.find("the-secret-request-id") != std::string::npos, !encrypted) << (encrypted ? "CURVE" : "plaintext");
    EXPECT_EQ(wire.find("decode-addr") != std::string::npos, !encrypted) << "the handshake's identity";
  }
}

// A peer without the cluster key, or with another one, cannot handshake: the dial fails at
// once, and the listener counts the refusal it could attribute (another key; no key at all is a
// mechanism mismatch ZeroMQ drops before authentication).
TEST(ControlChannelTest, WithoutTheClusterKeyAPeerCannotHandshake) {
  auto key = new_curve_secret();
  auto other = new_curve_secret();
  ASSERT_TRUE(key.ok() && other.ok());
  ControlChannelOptions d = options_for(proto::ROLE_DECODE, 7, &RealClock::instance());
  d.curve_secret_key = *key;
  auto decode = ControlChannel::create(d);
  ASSERT_TRUE(decode.ok()) << decode.status();
  Serving serving(**decode);
  for (const std::string& theirs : {std::string(), *other}) {
    ControlChannelOptions p = options_for(proto::ROLE_PREFILL, 7, &RealClock::instance());
    p.curve_secret_key = theirs;
    auto prefill = ControlChannel::create(p);
    ASSERT_TRUE(prefill.ok());
    auto peer = (*prefill)->connect((*decode)->endpoint(), 600s);  // Only a fast failure ends in time.
    EXPECT_FALSE(peer.ok()) << (theirs.empty() ? "no key" : "another key");
  }
  // One that knows the cluster's public key but holds another key pair gets through CURVE's
  // handshake: the authentication hook turns it away, so its handshake never arrives.
  auto cluster = parse_curve_key(*key);
  ASSERT_TRUE(cluster.ok());
  char pub[41], sec[41];
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  zmq::context_t ctx;
  zmq::socket_t intruder(ctx, zmq::socket_type::dealer);
  intruder.set(zmq::sockopt::linger, 0);
  intruder.set(zmq::sockopt::curve_serverkey, cluster->public_z85);
  intruder.set(zmq::sockopt::curve_publickey, std::string(pub));
  intruder.set(zmq::sockopt::curve_secretkey, std::string(sec));
  intruder.connect((*decode)->endpoint());
  proto::Envelope hello;
  *hello.mutable_handshake() = options_for(proto::ROLE_PREFILL, 7, &RealClock::instance()).local;
  const std::string bytes = encode_envelope(hello);
  (void)intruder.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  for (int i = 0; i < 400 && (*decode)->refused_count() == 0; ++i) std::this_thread::sleep_for(5ms);
  std::vector<ControlEvent> events = serving.stop();
  EXPECT_TRUE(events.empty()) << "a peer without the key joined";
  EXPECT_EQ((*decode)->refused_count(), 1u);
  // A malformed key is refused when the channel is made.
  ControlChannelOptions bad = options_for(proto::ROLE_DECODE, 7, &RealClock::instance());
  bad.curve_secret_key = "not a key";
  EXPECT_TRUE(absl::IsInvalidArgument(ControlChannel::create(bad).status()));
}

TEST(ControlChannelTest, MismatchedCompatHashIsRefusedWithBothGeometries) {
  auto decode = make(proto::ROLE_DECODE, 1);
  auto prefill = make(proto::ROLE_PREFILL, 2);
  Serving serving(*decode);
  auto peer = prefill->connect(decode->endpoint(), 2s);
  std::vector<ControlEvent> events = serving.stop();
  ASSERT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition) << peer.status();
  const std::string message(peer.status().message());
  EXPECT_NE(message.find("incompatible KV geometry"), std::string::npos) << message;
  EXPECT_NE(message.find("geometry-1"), std::string::npos) << message;
  EXPECT_NE(message.find("geometry-2"), std::string::npos) << message;
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(decode->refused_count(), 1u);
}

TEST(ControlChannelTest, SameRoleIsRefused) {
  auto a = make(proto::ROLE_DECODE, 1);
  auto b = make(proto::ROLE_DECODE, 1);
  Serving serving(*a);
  auto peer = b->connect(a->endpoint(), 2s);
  serving.stop();
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A process that accepts the connection but never answers (stopped, say) times out.
TEST(ControlChannelTest, ConnectToAPeerThatNeverAnswersTimesOut) {
  zmq::context_t ctx;
  zmq::socket_t silent(ctx, zmq::socket_type::router);
  silent.set(zmq::sockopt::linger, 0);
  silent.bind("tcp://127.0.0.1:*");
  auto prefill = make(proto::ROLE_PREFILL, 1);
  auto peer = prefill->connect(silent.get(zmq::sockopt::last_endpoint), 100ms);
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kDeadlineExceeded) << peer.status();
}

TEST(ControlChannelTest, JunkFramesAreRefusedAndHarmless) {
  auto decode = make(proto::ROLE_DECODE, 5);
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(decode->endpoint());
  proto::Envelope newer;
  newer.mutable_heartbeat();
  newer.set_version(kControlProtocolVersion + 1);
  proto::Envelope early;
  early.mutable_write_done()->set_request_id("r");
  const std::vector<std::string> junk = {
      std::string("\xff\xff\xff", 3),                          // Malformed.
      encode_envelope(early).substr(0, 4),                     // Truncated.
      std::string(5000, 'x'),                                  // Over the 4096-byte limit.
      newer.SerializeAsString(),                               // Unknown version.
      std::string("\x08\x01\x98\x06\x01", 5),                  // Unknown message type.
      encode_envelope(early),                                  // Valid, but before a handshake.
  };
  for (const auto& bytes : junk) raw.send(zmq::buffer(bytes), zmq::send_flags::none);
  // Two frames in one message are refused too.
  raw.send(zmq::str_buffer("a"), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("b"), zmq::send_flags::none);
  for (int i = 0; i < 50 && decode->refused_count() < junk.size() + 1; ++i) {
    EXPECT_FALSE(decode->receive(10ms).ok());
  }
  EXPECT_EQ(decode->refused_count(), junk.size() + 1);

  // Still serves a real peer afterwards.
  auto prefill = make(proto::ROLE_PREFILL, 5);
  Serving serving(*decode);
  EXPECT_TRUE(prefill->connect(decode->endpoint(), 2s).ok());
  serving.stop();
}

TEST(ControlChannelTest, HeartbeatsKeepPeersAliveAndSilenceLosesThem) {
  FakeClock clock;
  auto decode = make(proto::ROLE_DECODE, 3, &clock);
  auto prefill = make(proto::ROLE_PREFILL, 3, &clock);
  Serving serving(*decode);
  auto peer = prefill->connect(decode->endpoint(), 2s);
  ASSERT_TRUE(peer.ok()) << peer.status();
  serving.stop();

  // Both sides service their sockets while time passes: heartbeats (every 1 s) keep both alive
  // far beyond the 10 s peer timeout.
  for (int i = 0; i < 30; ++i) {
    clock.advance(1s);
    for (ControlChannel* c : {decode.get(), prefill.get()}) {
      auto event = c->receive(5ms);
      if (event.ok()) {
        EXPECT_NE(event->kind, ControlEvent::Kind::kPeerLost) << event->error;
      }
    }
  }
  // The decode side goes silent.
  clock.advance(11s);
  auto lost = prefill->receive(100ms);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->kind, ControlEvent::Kind::kPeerLost);
  EXPECT_EQ(lost->peer, peer->id);
  EXPECT_EQ(prefill->send(peer->id, proto::Envelope()).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve::kvtransfer
