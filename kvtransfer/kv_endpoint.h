// One TP rank's kvtransfer endpoint: its registered KV arena, its UCX transport, its ZeroMQ
// control channel and the sessions of the requests it moves. A prefill worker runs one
// producer endpoint per rank, a decode worker one consumer endpoint per rank; ranks never
// share an endpoint, so each GPU's arena is registered and addressed on its own and the rank
// map pairs endpoints directly (design lesson 3).
//
// Push: the consumer rank reserves (expect_push); the producer rank opens the request
// (begin_push), posts each layer's puts as soon as the forward pass wrote it (layer_ready), and
// seals its counts when the pass ends (seal); progress() then flushes every consumer rank and
// sends WRITE_DONE{count} (design lesson 2). The consumer re-plans the pair from the same
// spec, map and block ids, and is ready only when every producer rank of its fan-in sealed a
// count equal to its own. Pull: the producer holds the blocks (hold); each consumer rank gets
// exactly what the map assigns it (pull) and sends RELEASE to each producer rank it read from;
// the producer frees once its whole fan-out released. See docs/kvtransfer.md.
//
// Threading: an endpoint is driven by one thread (its rank's): every method, progress()
// included, is called from it, and none blocks on a peer (control dials complete in progress()).
// The transport's own progress thread moves the data.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/kv_cache_layout.h"
#include "kvtransfer/block_checksums.h"
#include "kvtransfer/control/control_channel.h"
#include "kvtransfer/endpoint_seams.h"
#include "kvtransfer/finished_ids.h"
#include "kvtransfer/rank_map.h"
#include "kvtransfer/session.h"
#include "kvtransfer/transfer_plan.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {

// Deliberate faults for the mutation and fault tests, which prove that the end-to-end checks
// catch a broken geometry or rank map and that a lost notification is survived. Never set in
// production. The endpoint turns them into seams once, at creation (endpoint_seams.h).
struct TestFaults {
  std::optional<engine::KvCacheSpec> planning_spec;  // Plan with this spec's layouts and map.
  std::function<void(RankMap&)> mutate_map;
  // The fraction of WRITE_DONE / RELEASE notifications that are "sent" but never leave (1: all;
  // below 1, drawn at random per notification): each such transfer ends at its lease.
  double drop_notifications = 0;
  // Consumer: flips one received byte of each producer rank's share before the debug checksums
  // are verified, as a transfer that corrupted data would.
  bool corrupt_received = false;
};

struct KvEndpointOptions {
  engine::KvCacheSpec spec;
  std::string model_id;  // With the spec, the handshake's compat hash.
  SessionSide side = SessionSide::kProducer;
  int tp = 1;
  int rank = 0;
  // This rank's KV arena: KvCacheLayout(spec, rank, tp, num_blocks).total_bytes() bytes.
  void* arena = nullptr;
  // Instead of `arena` (which stays null), the endpoint allocates the arena through its
  // transport (Transport::allocate_region), zero-filled; arena() returns it. Over UCX shared
  // memory peers then copy straight into it rather than needing this side's help for every op
  // (docs/kvtransfer.md, Transport findings). It lives as long as the endpoint, so an engine
  // computing into it (EngineOptions::kv_arena_allocator) must be destroyed first.
  bool allocate_arena = false;
  // What `arena` is: host memory, or GPU memory (device `arena_device`) that the transport
  // registers as such — Unimplemented from create() when its UCX build cannot (then the worker
  // stages through a host mirror: KvStaging). Debug checksums need host memory.
  MemoryKind arena_memory = MemoryKind::kHost;
  int arena_device = 0;
  int num_blocks = 0;
  // Producer: the rank's host-tier arena (engine/host_kv_tier.h: the same per-rank layout with
  // `host_num_blocks` blocks, host memory), registered beside the KV arena so that consumers
  // pull blocks held there (HoldRequest::region). Null: none.
  void* host_arena = nullptr;
  int host_num_blocks = 0;
  std::string bind_endpoint = "tcp://127.0.0.1:*";
  const Clock* clock = &RealClock::instance();
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration peer_timeout = std::chrono::seconds(10);  // Silent peers are lost after this.
  Duration connect_timeout = std::chrono::seconds(5);
  Duration default_lease = std::chrono::seconds(30);  // For requests that give none.
  // How long after its lease a session whose blocks a remote peer accesses waits for that
  // peer's confirmation before it frees them anyway (the peer stops at its own lease).
  Duration quarantine = std::chrono::seconds(1);
  // While requests are open, progress() spins on the transport instead of sleeping in the
  // control poll: lower latency, and the speed of transports that emulate one-sided ops with
  // the target's help (UCX over shared memory it did not allocate, tcp). Costs a core per rank.
  bool busy_poll = false;
  // The transport copies with memcpy into (or out of) a peer's arena mapped into this process
  // instead of posting one UCX request per op (UcxTransportOptions::direct_copy). Off only to
  // measure the per-op path.
  bool direct_copy = true;
  // Leg-completing notifications (WRITE_DONE, RELEASE) to a peer on this host go through the
  // control channel's same-host lane (ControlChannelOptions::local_lane). Off only to measure
  // ZeroMQ's path.
  bool local_lane = true;
  // Debug: producers send a checksum per request block of what each consumer rank receives
  // (push: in WRITE_DONE; pull: answering the consumer's CHECKSUM_REQUEST); consumers verify
  // them before they are ready, and fail the request with DATA_LOSS on a mismatch.
  bool checksums = false;
  // The cluster's kvtransfer key (ControlChannelOptions::curve_secret_key): CURVE on the control
  // channel. Empty: plaintext.
  std::string curve_secret_key;
  // Called exactly once per request whose blocks this rank gives back (see session.h).
  BlockReleaseFn on_release;
  std::string name = "kv";
  TestFaults test_faults;
};

// Which of a producer rank's arenas a pull reads: its KV arena (the engine's blocks), or its
// host tier's (pull-host: the prefill worker copied the prompt there and freed its device blocks).
enum class KvRegion : uint8_t { kDevice, kHost };

// Push, producer rank: request `request_id`'s KV in `producer_blocks` goes to consumer block
// ids `consumer_blocks` (the same on every consumer rank) of the consumer TP group whose rank r
// listens on `consumer_endpoints[r]`.
struct PushRequest {
  std::string request_id;
  int consumer_tp = 1;
  std::vector<std::string> consumer_endpoints;
  std::vector<int> producer_blocks;
  std::vector<int> consumer_blocks;
  Duration lease{0};  // 0: the endpoint's default.
  // Optional, one per endpoint: the incarnation (incarnation()) each was when last heard of; a
  // cached connection to an older process there is dropped and dialed again.
  std::vector<uint64_t> consumer_incarnations;
  // Prefix reuse: request blocks [0, skip_blocks) are already in the consumer's blocks (its own
  // prefix cache); only [k, n) of both lists is sent, counted and checksummed. The consumer's
  // ExpectPushRequest must name the same k (WRITE_DONE carries it; a mismatch fails the request).
  int skip_blocks = 0;
};

// Push, consumer rank: blocks reserved for a request that a producer TP group will write.
// `producer_endpoints` (optional, recommended) binds the fan-in to that producer group, so that
// its death fails the request at once and aborts reach it.
struct ExpectPushRequest {
  std::string request_id;
  int producer_tp = 1;
  std::vector<int> consumer_blocks;
  std::vector<std::string> producer_endpoints;
  Duration lease{0};
  std::vector<uint64_t> producer_incarnations;  // Optional, as PushRequest::consumer_incarnations.
  int skip_blocks = 0;  // As PushRequest::skip_blocks.
};

// Pull, producer rank: blocks held for consumers to read. `consumer_tp` (0: unknown) gives
// the fan-out up front; otherwise it is learnt from the first RELEASE.
struct HoldRequest {
  std::string request_id;
  std::vector<int> producer_blocks;
  int consumer_tp = 0;
  Duration lease{0};
  KvRegion region = KvRegion::kDevice;  // Where producer_blocks are (kHost: host-tier slots).
};

// Pull, consumer rank: read the request from the producer group into `consumer_blocks`.
struct PullRequest {
  std::string request_id;
  int producer_tp = 1;
  std::vector<std::string> producer_endpoints;
  std::vector<int> producer_blocks;
  std::vector<int> consumer_blocks;
  Duration lease{0};
  std::vector<uint64_t> producer_incarnations;  // Optional, as PushRequest::consumer_incarnations.
  // As PushRequest::skip_blocks: reads only request blocks [k, n). The producer's hold() needs
  // no k: it only serves reads (and checksums, whose request carries k).
  int skip_blocks = 0;
  KvRegion region = KvRegion::kDevice;  // The producer's arena producer_blocks name (its hold's).
};

// The outcome of a request on this rank, returned by progress().
struct KvTransferEvent {
  enum class Kind : uint8_t {
    kReady,     // Consumer: the request's KV is in its blocks.
    kComplete,  // Producer: every consumer rank has its share; blocks freed.
    kFailed,    // Either side: `error` says why; blocks come back once safe.
  };
  std::string request_id;
  Kind kind = Kind::kFailed;
  Status error;
  std::optional<int32_t> first_token;  // Ready (push), from the producer rank that sampled it.
  Duration latency{0};                 // From the request's start on this rank.
  // Ready (push): the longest seal-to-WRITE_DONE time of the producer ranks it heard from, the
  // part of the transfer that their prefill's compute did not hide.
  Duration push_tail{0};
  uint64_t bytes = 0;                  // Moved by this rank for the request.
  uint64_t ops = 0;
};

struct KvEndpointCounters {
  uint64_t bytes = 0;  // Put (producer, push) or got (consumer, pull) by this rank.
  uint64_t ops = 0;
  uint64_t requests_done = 0;  // Ready or complete.
  uint64_t failures = 0;
  uint64_t leases_expired = 0;
  uint64_t duplicates_ignored = 0;
  uint64_t stale_ignored = 0;
  uint64_t refused = 0;  // Malformed or inconsistent notifications and requests.
  uint64_t blocks_released = 0;
  // Leg-completing notifications sent on a peer's same-host lane (KvEndpointOptions::local_lane).
  uint64_t notifications_on_lane = 0;
  Duration latency_total{0};
  Duration latency_max{0};

  // Folds in another rank's counters of the same worker: volumes and refusals add up; request
  // counts and times are the most any rank saw, since every rank takes part in every request.
  void merge_rank(const KvEndpointCounters& other);
};

class KvRankEndpoint {
 public:
  // Creates the transport, registers (or allocates) the arena and binds the control channel.
  static StatusOr<std::unique_ptr<KvRankEndpoint>> create(KvEndpointOptions options);
  ~KvRankEndpoint();

  KvRankEndpoint(const KvRankEndpoint&) = delete;
  KvRankEndpoint& operator=(const KvRankEndpoint&) = delete;

  // The control endpoint peers dial (and the router hands out).
  const std::string& control_endpoint() const;
  // This endpoint's random, nonzero id (Handshake.incarnation): peers that learn it (KvGroup)
  // tell this process from an earlier one on the same control endpoint.
  uint64_t incarnation() const { return incarnation_; }
  const engine::KvCacheLayout& layout() const { return layout_; }
  // The registered KV arena (options.arena, or the one allocate_arena made).
  uint8_t* arena() const { return static_cast<uint8_t*>(options_.arena); }
  // Which transport and settings this endpoint runs with, for logs (design lesson 4).
  std::string describe() const;

  // Producer, push: opens the request and connects its fan-out, without blocking: legs to a
  // consumer rank not yet dialed wait for the dial (layer_ready and seal are applied when it
  // ends; see docs/kvtransfer.md). Errors before the request is registered (bad ids, unknown TP,
  // duplicate id) leave the blocks with the caller; later ones fail it (kFailed event, blocks
  // released once safe), among them consumer block ids outside a consumer's arena first learnt
  // from its handshake.
  Status begin_push(const PushRequest& request);
  // Producer, push: layer `layer` is computed; posts its puts to every consumer rank.
  Status layer_ready(const std::string& request_id, int layer);
  // Producer, push: the forward pass ended; seals the counts (progress() flushes and notifies).
  // `first_token` rides on every WRITE_DONE this rank sends (rank 0 samples it).
  Status seal(const std::string& request_id, std::optional<int32_t> first_token);
  // Consumer, push: reserves the request's blocks and waits for the producers' WRITE_DONEs.
  Status expect_push(const ExpectPushRequest& request);
  // Producer, pull: holds the request's blocks until the fan-out released them or the lease.
  Status hold(const HoldRequest& request);
  // Consumer, pull: reads this rank's share from the producer group (with checksums, verifies
  // it against the producer's), then releases it.
  Status pull(const PullRequest& request);
  // Gives up on a request (either side); its peers are told.
  Status abort(const std::string& request_id, const std::string& reason);

  // Handles control messages, completions, peer failures and leases for up to `timeout` (less
  // once something happened: a message, a finished batch, a lost peer or wake()); returns the
  // requests that finished on this rank meanwhile.
  std::vector<KvTransferEvent> progress(Duration timeout);
  // Ends the current or next progress() wait early; the one call any thread may make (the
  // worker does after posting a command for the endpoint's thread).
  void wake() const { wake_.signal(); }
  // Requests not yet finished (including those waiting to release their blocks).
  size_t open_requests() const { return requests_.size(); }
  KvEndpointCounters counters() const;
  Transport& transport() { return *transport_; }

 private:
  // A peer rank, keyed by its transport address (one per remote endpoint; it may reach us over
  // two control connections, one dialed each way).
  struct Remote {
    std::string address;
    proto::Role role = proto::ROLE_UNSPECIFIED;
    int tp = 0, rank = 0;
    // Its arenas by KvRegion: the KV arena, and the host tier's (absent: none announced).
    struct Arena {
      std::optional<engine::KvCacheLayout> layout;
      std::optional<engine::KvCacheLayout> planning_layout;  // Of the seams' planning spec.
      std::string descriptor;
      std::optional<RemoteRegionId> loaded;  // Once the transport loaded the descriptor.
    };
    std::array<Arena, 2> arenas;
    Arena& arena(KvRegion region) { return arenas[size_t(region)]; }
    const Arena& arena(KvRegion region) const { return arenas[size_t(region)]; }
    uint64_t control_id = 0;  // Where notifications go.
    bool dialed = false;
    PeerId transport_peer = 0;
    bool transport_ready = false;
    Status error;  // Not OK once lost.
  };
  struct Leg {
    std::string remote;  // Remote::address; empty until bound.
    TransferPlan plan;
    std::vector<BatchId> batches;
    std::optional<BatchId> flush;
    uint64_t posted = 0;
    // Pull consumer with checksums: the producer rank's, once received.
    std::optional<std::vector<uint64_t>> expected_checksums;
    bool abort_sent = false;
    bool disconnected = false;
    bool dialing = false;  // Its peer's control connection is still being dialed (connect_fan).
  };
  struct Request {
    std::unique_ptr<Session> session;
    int producer_tp = 0, consumer_tp = 0;
    std::vector<int> producer_blocks, consumer_blocks;
    int skip_blocks = 0;  // Request blocks [0, k) are not sent (PushRequest::skip_blocks).
    KvRegion region = KvRegion::kDevice;  // Pull: the producer's arena read.
    std::map<int, Leg> legs;  // By peer rank.
    std::vector<bool> layers_posted;
    std::optional<int32_t> first_token;
    TimePoint start;
    TimePoint sealed_at;     // Push producer: when seal() ran.
    Duration push_tail{0};   // Push consumer: the longest producer rank's seal-to-WRITE_DONE.
    uint64_t bytes = 0, ops = 0;
    bool event_sent = false;
    int dials_pending = 0;  // Legs still dialing: a push producer posts and seals for them later.
    // Push producer: seal() ran while legs were dialing; the first token it was given.
    std::optional<std::optional<int32_t>> deferred_seal;
  };
  // A control dial in flight (ControlChannel::start_connect) and the request legs waiting on it.
  struct Dial {
    std::string endpoint;
    std::vector<std::pair<std::string, int>> waiters;  // (request id, peer rank).
    // Aborts of requests that failed while this dial was under way, sent once it ends (the
    // requests themselves may have given their blocks back and gone by then).
    std::vector<proto::Envelope> aborts;
  };

  explicit KvRankEndpoint(KvEndpointOptions options, engine::KvCacheLayout layout);
  Status init();

  StatusOr<const RankMap*> map_for(int producer_tp, int consumer_tp);
  // The peers a request exchanges with: `remotes` by rank for those already connected, `dialing`
  // (rank → dial id) for those whose control connection is being dialed without blocking this
  // thread (the registered request's legs wait: wait_for_dials), or `unreachable` (a peer fault,
  // for the registered request to fail with) naming the first rank that could not be dialed.
  // Returns an error (a refusal of caller input) when a connected peer's arena cannot hold
  // `remote_blocks`; a dialed one's is checked when its dial ends (on_dialed).
  struct Fan {
    std::map<int, Remote*> remotes;
    std::map<int, uint64_t> dialing;
    Status unreachable;
  };
  StatusOr<Fan> connect_fan(const std::string& request_id, const std::vector<int>& ranks,
                            const std::vector<std::string>& endpoints, int tp,
                            const std::vector<uint64_t>& incarnations,
                            const std::vector<int>* remote_blocks, KvRegion remote_region, const char* what);
  // FailedPrecondition naming the arena `region` that the peer (`who`: its role) did not announce.
  static Status missing_arena(const Remote& remote, KvRegion region, const char* who);
  // Checks `blocks` against the remote's arena `region` (FailedPrecondition when it has none).
  Status check_remote_blocks(const Remote& remote, KvRegion region, const std::vector<int>& blocks,
                             const char* what) const;
  // The arena a peer announced in region `region_name` with `info`, checked against this side's KV
  // spec (`what` names it in errors); nullopt when it announced none.
  StatusOr<std::optional<Remote::Arena>> announced_arena(const ControlPeer& peer, const char* region_name,
                                                         const proto::ArenaInfo& info, const char* what) const;
  Status record_remote(const ControlPeer& peer, Remote** out);
  // Records a handshaken peer (unless already recorded) and checks its role, TP and rank.
  StatusOr<Remote*> accept_dialed(const ControlPeer& peer, const std::string& endpoint, int tp, int rank);
  // Marks the fan's dialing legs of a registered request and queues them on their dials.
  void wait_for_dials(const std::string& id, Request& request, const Fan& fan);
  // A dial ended (kDialed): each waiting leg is bound and started, or its request fails.
  void on_dialed(const ControlEvent& event);
  // Starts a registered request's legs: fails it with the fan's unreachable peer, or queues the
  // dialing legs and opens the connected ones; returns the first error (the request failed with it).
  Status start_legs(const std::string& id, Request& request, const Fan& fan);
  // Opens leg `r` to a connected `remote` as the request's role does (open_pull_leg,
  // open_push_leg then a seal deferred to its last dial, or a push consumer's binding).
  Status open_leg(const std::string& id, Request& request, int r, Remote& remote);
  // `status` from leg `r` as the request's failure: naming the request, the peer (`what`: its
  // side) and its rank. Drops payloads: the caller marks a peer fault again.
  static Status leg_status(const std::string& id, const char* what, int r, const Status& status);
  // The other side's name in errors: "consumer" on a producer rank, else "producer".
  const char* peer_side_name() const { return options_.side == SessionSide::kProducer ? "consumer" : "producer"; }
  // Push producer: binds leg `c` to `remote` and plans it; posts the layers already ready.
  Status open_push_leg(const std::string& id, Request& request, int c, Leg& leg, Remote& remote);
  Status post_layer(const std::string& id, Request& request, int c, Leg& leg, int layer);
  // Push producer: seals the counts and flushes every leg (seal(), or once the last dial ended).
  Status seal_now(const std::string& id, Request& request, std::optional<int32_t> first_token);
  // Pull consumer: binds leg `p` to `remote`, posts its gets and asks for its checksums.
  Status open_pull_leg(const std::string& id, Request& request, int p, Leg& leg, Remote& remote);
  // Connects the transport to `remote` (once); its arenas are loaded by remote_region().
  Status ensure_transport(Remote& remote);
  // The transport's id of the remote's arena `region` (its descriptor loaded the first time; a
  // pull-host consumer never loads the producer's KV arena).
  StatusOr<RemoteRegionId> remote_region(Remote& remote, KvRegion region);
  // This rank's host-tier arena: its layouts, memory and registration.
  struct HostArena {
    std::optional<engine::KvCacheLayout> layout, planning_layout;  // Unset: none.
    RegionId id = 0;
  };
  // The producer's own planning layout and memory of arena `region`.
  const engine::KvCacheLayout& own_planning_layout(KvRegion region) const;
  uint8_t* own_memory(KvRegion region) const;
  StatusOr<TransferPlan> plan(int producer_rank, int consumer_rank, const Remote& remote,
                              const Request& request, const std::vector<int>& consumer_blocks,
                              int skip_blocks);
  Status check_blocks(const std::vector<int>& blocks, int num_blocks, const char* what) const;
  Status check_new_request(const std::string& request_id) const;
  Request& add_request(const std::string& id, TransferMode mode, std::vector<int> blocks,
                       std::vector<int> peers, Duration lease);

  void on_control_event(const ControlEvent& event);
  void on_write_done(Remote& from, const proto::Envelope& envelope);
  void on_release(Remote& from, const proto::Release& release);
  void on_abort(Remote& from, const proto::Abort& abort);
  void on_checksum_request(Remote& from, const proto::ChecksumRequest& ask);
  void on_block_checksums(Remote& from, const proto::BlockChecksums& sums);
  // Whether a pull message (RELEASE, CHECKSUM_REQUEST) for `request` may come from `from`: a
  // decode rank naming itself, this producer rank, and the request's consumer TP if known.
  bool from_pull_consumer(const Remote& from, const Request& request, int consumer_rank, int consumer_tp,
                          int producer_rank) const;
  // Pull producer held without the consumer TP: the first consumer message supplies it.
  Status learn_fan_out(Request& request, int consumer_tp);
  void on_remote_lost(const std::string& address, const Status& why);
  // Advances one request; true when it finished and can be forgotten.
  bool step(const std::string& id, Request& request, std::vector<KvTransferEvent>& events);
  void step_push_producer(const std::string& id, Request& request);
  void step_pull_consumer(const std::string& id, Request& request);
  void step_abort(const std::string& id, Request& request);
  // Keeps an abort for the dial leg (`id`, `rank`) waits on, to send when that dial ends.
  void queue_abort_on_dial(const std::string& id, int rank, const std::string& reason);
  void fail(Request& request, const Status& why);
  void send_abort(Request& request, int rank, Leg& leg, const std::string& reason);
  Status send(Remote& remote, const proto::Envelope& message);
  // A leg-completing notification (WRITE_DONE, RELEASE), through the seams' notifier.
  Status notify(Remote& remote, const proto::Envelope& message);
  // The transport's post() and flush(), for this endpoint's own ops. A batch that ends inside
  // them signals nothing (Transport::set_activity_callback), so the next progress() steps the
  // requests before it waits.
  StatusOr<BatchId> post_batch(const TransferBatch& batch);
  StatusOr<BatchId> flush_peer(PeerId peer);
  // State of a batch: in progress, done, or failed (with the error).
  BatchState batch_state(BatchId batch, std::string* error);
  bool leg_ops_ended(Leg& leg, std::string* error);
  // Debug checksums of a pair's plan, over the local arena at the ops' source (producer: its
  // arena `region`) or destination (consumer) offsets.
  std::vector<uint64_t> checksums(std::span<const int> consumer_blocks, const TransferPlan& plan,
                                  const Remote& remote, ChecksumSide side, KvRegion region) const;
  // The consumer blocks a request sends into: [skip_blocks, n).
  static std::span<const int> sent_consumer_blocks(const Request& request);
  // DATA_LOSS naming the block and ranks unless the received bytes match `expected`.
  Status verify_checksums(const std::string& id, const Request& request, int producer_rank,
                          const Leg& leg, const std::vector<uint64_t>& expected) const;

  KvEndpointOptions options_;
  engine::KvCacheLayout layout_;
  const uint64_t incarnation_;
  // Before the transport and the control channel: both signal or poll it until they are gone.
  WakeFd wake_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ControlChannel> control_;
  RegionId region_ = 0;
  HostArena host_;
  std::map<std::pair<int, int>, RankMap> maps_;
  std::map<std::string, Remote> remotes_;             // By address.
  std::map<uint64_t, std::string> remote_by_control_;  // Control peer id → address.
  std::map<std::string, Request> requests_;
  std::map<uint64_t, Dial> dials_;                   // By dial id.
  std::map<std::string, uint64_t> dial_by_endpoint_;  // One dial per endpoint at a time.
  // Recently finished or aborted ids and why they ended, for stale messages.
  FinishedIds finished_;
  EndpointSeams seams_;  // Production behaviour unless TestFaults asked otherwise.
  std::optional<engine::KvCacheLayout> planning_layout_;  // This rank's, of the planning spec.
  std::mutex transport_errors_mu_;  // Transport callbacks run on its progress thread.
  std::vector<std::pair<PeerId, Status>> transport_errors_;
  KvEndpointCounters counters_;
  bool remote_ops_expected_ = false;  // Last told to Transport::expect_remote_ops.
  bool step_before_waiting_ = false;  // Set by post_batch/flush_peer, cleared by progress().
};

}  // namespace pdserve::kvtransfer
