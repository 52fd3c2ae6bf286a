// The kvtransfer control channel: ZeroMQ messaging between one rank and its peer ranks, next
// to the UCX data path. Each rank binds one ROUTER socket that peers dial, and opens one DEALER
// socket per peer it dials itself. A dialing side first sends a Handshake; the listener checks
// the compat hash before anything else and answers HandshakeAck (refusing mismatched KV
// geometry with both geometries in the error). Afterwards either side sends notifications
// (WriteDone, Release, Abort, and in pull mode with debug checksums ChecksumRequest and
// BlockChecksums) and heartbeats. Every received frame goes through the strict
// decoder; refused frames are logged and counted, never fatal. Beside ZeroMQ, each channel has a
// same-host lane (local_lane.h): a notification sent with Route::kLocalFirst to a peer on this
// host wakes its receiving thread directly, skipping ZeroMQ's I/O thread on both sides.
//
// Threading: a ControlChannel is used from one thread (ZeroMQ sockets are not thread-safe).
// Nothing happens in the background: incoming handshakes are answered, heartbeats sent and
// lost peers detected only inside receive(), so the owner calls it in its loop.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "common/wake_fd.h"
#include "kvtransfer/control/curve.h"
#include "kvtransfer/control/local_lane.h"
#include "proto/kvtransfer.pb.h"

namespace pdserve::kvtransfer {

struct ControlChannelOptions {
  // Where the ROUTER binds, e.g. "tcp://127.0.0.1:*" (the port is chosen by the system).
  std::string bind_endpoint = "tcp://127.0.0.1:*";
  // This rank's identity: compat hash, role, tp size, rank, worker address, regions, arena,
  // geometry. Sent as the Handshake when dialing, and returned in the HandshakeAck when
  // accepting.
  proto::Handshake local;
  // Heartbeats and peer-loss deadlines are measured with this clock.
  const Clock* clock = &RealClock::instance();
  Duration heartbeat_interval = std::chrono::seconds(1);
  // A peer not heard from for this long is reported lost.
  Duration peer_timeout = std::chrono::seconds(10);
  size_t max_message_bytes = 1 << 20;
  // How long closing the channel may wait to deliver queued messages. 0 (default) drops them,
  // so that a dead peer can never stall shutdown; a process that sends a final notification
  // and exits sets a short bound instead.
  Duration linger = Duration(0);
  // Polled beside the sockets (not owned; it must outlive the channel): once another thread
  // signals it, receive() drains it and returns a kWoken event, so the owner's loop runs at once.
  const WakeFd* wake = nullptr;
  // The cluster's kvtransfer key (Z85 CURVE secret, kvtransfer/control/curve.h): when set, every
  // connection is CURVE-encrypted and only peers holding the same key get through. Empty:
  // plaintext (a trusted network only).
  std::string curve_secret_key;
  // Opens the same-host lane (LocalLane) and announces it in the handshake. Off: every message
  // goes through ZeroMQ (and peers can send this channel nothing on a lane).
  bool local_lane = true;
};

// How send() carries a message.
enum class Route : uint8_t {
  kChannel,     // ZeroMQ, in order with every other message to that peer.
  kLocalFirst,  // The peer's same-host lane when it has one this process reaches, else ZeroMQ.
                // It may overtake messages sent earlier through ZeroMQ.
};

// What the same-host lanes carried since creation.
struct LaneCounters {
  uint64_t sent = 0;       // Messages sent on a peer's lane.
  uint64_t fell_back = 0;  // kLocalFirst messages that went through ZeroMQ instead.
  uint64_t received = 0;   // Accepted from a handshaken peer's lane.
};

// A peer whose handshake succeeded, from either side.
struct ControlPeer {
  uint64_t id = 0;
  bool dialed = false;   // We connected to it (else it connected to us).
  std::string endpoint;  // The endpoint we dialed; empty for peers that dialed us.
  proto::Role role = proto::ROLE_UNSPECIFIED;
  uint32_t tp_size = 0;
  uint32_t rank = 0;
  std::string worker_address;
  uint64_t incarnation = 0;  // Handshake.incarnation: which process on that endpoint.
  std::map<std::string, std::string> regions;  // Region name → transport descriptor.
  proto::ArenaInfo arena;  // Unset (all zero) when the peer announced no KV arena.
  proto::ArenaInfo host_arena;  // Unset (all zero) when the peer announced no host-tier arena.
  std::string local_lane;  // Its same-host lane's address; empty when it has none.
  std::string local_lane_token;  // What its lane datagrams start with.
};

// What receive() hands to its caller.
struct ControlEvent {
  // kWoken: ControlChannelOptions::wake was signalled (nothing arrived; the owner has work).
  // kDialed: a dial started with start_connect() ended: `peer` is the handshaken peer, or 0 and
  // `error` says why not (as connect()'s errors).
  enum class Kind { kPeerJoined, kMessage, kPeerLost, kWoken, kDialed };
  Kind kind = Kind::kMessage;
  uint64_t peer = 0;
  proto::Envelope message;  // kMessage: anything but a handshake or heartbeat.
  Status error;             // kPeerLost, kDialed: why.
  uint64_t dial = 0;        // kDialed: start_connect()'s id.
};

class ControlChannel {
 public:
  // Binds the ROUTER socket.
  static StatusOr<std::unique_ptr<ControlChannel>> create(ControlChannelOptions options);
  ~ControlChannel();

  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // The bound endpoint with its real port, for peers to dial.
  const std::string& endpoint() const { return endpoint_; }

  // Dials a peer and handshakes within `timeout`; a live earlier handshake with the same
  // endpoint is reused without a round trip, unless `incarnation` (0: any) names another process:
  // then the old peer is reported lost (kPeerLost) and the endpoint dialed again. A refusal is
  // FailedPrecondition with the reason, and so is a failed security handshake (not the same
  // kvtransfer key on both sides); an endpoint where nobody accepts connections (a dead
  // process), or one that hangs up before answering, is Unavailable at once.
  // Blocks the calling thread for up to `timeout`: an owner that serves other requests meanwhile
  // uses cached() and start_connect() instead.
  StatusOr<ControlPeer> connect(const std::string& endpoint, Duration timeout, uint64_t incarnation = 0);
  // The live peer handshaken at `endpoint` (any incarnation if 0), without a round trip; null
  // when it must be dialed (a peer there of another incarnation is then reported lost). Valid
  // until the channel's next non-const call.
  const ControlPeer* cached(const std::string& endpoint, uint64_t incarnation = 0);
  // Starts dialing and returns at once: receive() services the dial beside everything else and
  // reports its end, within `timeout`, as a kDialed event carrying the returned id.
  StatusOr<uint64_t> start_connect(const std::string& endpoint, Duration timeout, uint64_t incarnation = 0);
  // Sends a notification (or any message) to a handshaken peer, without blocking.
  Status send(uint64_t peer, const proto::Envelope& message, Route route = Route::kChannel);
  // Services the sockets for at most `timeout` of real time and returns the next event, or
  // DeadlineExceeded when none came; a zero timeout looks once without waiting. zmq_poll counts
  // whole milliseconds: without a wake fd a remainder under one is slept, with one it is polled
  // as a whole millisecond.
  StatusOr<ControlEvent> receive(Duration timeout);
  // A handshaken peer by id.
  StatusOr<ControlPeer> peer(uint64_t id) const;

  // Frames refused by the decoder or by protocol rules, and connections refused for want of
  // the cluster key, since creation.
  uint64_t refused_count() const { return refused_ + (zap_ ? zap_->refused() : 0); }
  LaneCounters lane_counters() const { return lane_counters_; }

 private:
  struct PeerState {
    ControlPeer info;
    std::unique_ptr<zmq::socket_t> dealer;  // Dialed peers.
    std::string routing_id;                 // Peers that dialed us.
    TimePoint last_heard;
    bool lost = false;
    bool lane_unreachable = false;  // Its lane refused a datagram: ZeroMQ only from then on.
    // The peer knows our lane, so it accepts our datagrams: it answered our handshake (a
    // connection we dialed), or sent something after it (one it dialed: it has our answer).
    bool lane_ready = false;
  };

  // A dial in flight: its DEALER, whose handshake answer completes it, and that socket's monitor.
  struct PendingDial {
    std::string endpoint;
    Duration timeout{0};
    std::chrono::steady_clock::time_point deadline;
    std::unique_ptr<zmq::socket_t> dealer;
    std::unique_ptr<zmq::socket_t> monitor;
    PendingDial() = default;
    PendingDial(PendingDial&&) = default;
    ~PendingDial();  // Stops the monitor before its socket closes.
  };

  explicit ControlChannel(ControlChannelOptions options);
  // Looks at a dial's sockets without waiting: its peer (now handshaken) or error once it ended.
  std::optional<StatusOr<ControlPeer>> step_dial(PendingDial& dial);
  Status bind();
  Status send_to(PeerState& peer, const std::string& bytes);
  // Sends through the ROUTER to the socket with that routing id.
  Status send_routed(const std::string& routing_id, const std::string& bytes);
  // Handles one frame from the ROUTER (routing id known) or from a dialed peer.
  void on_router_frame(const std::string& routing_id, const std::string& bytes);
  void on_dealer_frame(uint64_t peer, const std::string& bytes);
  // Handles every datagram waiting on the lane.
  void drain_lane();
  // Handles a decoded message from a handshaken peer.
  void on_peer_message(uint64_t peer, proto::Envelope envelope);
  // Sends heartbeats when due and reports peers that went quiet.
  void tick();
  // Marks a peer lost (closing a dialed one's socket) and queues kPeerLost with `why`.
  void lose(uint64_t id, PeerState& peer, const Status& why);
  void refuse(const std::string& from, const Status& why);

  const ControlChannelOptions options_;
  zmq::context_t context_;
  std::optional<CurveKey> curve_;
  std::unique_ptr<ZapHandler> zap_;  // With curve_: bound before router_.
  zmq::socket_t router_;
  std::unique_ptr<LocalLane> lane_;  // With options_.local_lane.
  std::string lane_token_;           // With lane_: this channel's Handshake.local_lane_token.
  LaneCounters lane_counters_;
  std::string endpoint_;
  std::map<uint64_t, PeerState> peers_;
  std::map<std::string, uint64_t> peer_by_endpoint_;
  std::map<std::string, uint64_t> peer_by_routing_id_;
  std::deque<ControlEvent> events_;
  TimePoint last_heartbeat_;
  uint64_t next_peer_id_ = 1;
  uint64_t next_dial_ = 0;  // Names each dial's monitor socket.
  std::map<uint64_t, PendingDial> dials_;  // By start_connect() id.
  uint64_t next_dial_id_ = 1;
  uint64_t refused_ = 0;
};

}  // namespace pdserve::kvtransfer
