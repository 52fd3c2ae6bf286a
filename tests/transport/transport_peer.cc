// One side of a multi-process transport test: a producer (prefill) or consumer (decode) rank
// that moves a patterned buffer over the real UCX transport, coordinated over the real ZeroMQ
// control channel. transport_integration_test spawns two of these per case. The listening side
// writes its control endpoint to --endpoint-file; the dialing side waits for that file.
//
//   pull: producer listens; consumer handshakes, gets, verifies, sends Release.
//   push: consumer listens; producer handshakes, puts, flushes, sends WriteDone; consumer
//         verifies only after WriteDone, then sends Release.
//   pull-until-error / push-until-error: the initiator transfers in a loop, writes
//         --marker after its first verified round and exits 0 once it detects that its peer
//         died (batch error, UCX peer-error callback or control-channel peer loss); the
//         passive side serves until it is killed.
//
// Exit codes: 0 success, 2 setup error, 3 handshake refused, 4 wrong bytes, 5 timed out.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "engine/kv_spec.h"
#include "kvtransfer/control/compat.h"
#include "kvtransfer/control/control_channel.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

constexpr int kOk = 0, kSetup = 2, kRefused = 3, kMismatch = 4, kTimeout = 5;
constexpr int kChunks = 8;
constexpr const char* kRequest = "req-1";

struct Args {
  std::string role, mode, endpoint_file, marker, model = "tiny-llama", tls;
  size_t bytes = 4 << 20;
};

#define LOG(...)                                              \
  do {                                                        \
    std::fprintf(stderr, "[%s %d] ", g_role, getpid());       \
    std::fprintf(stderr, __VA_ARGS__);                        \
    std::fputc('\n', stderr);                                 \
  } while (0)
const char* g_role = "?";

uint8_t pattern(size_t i) { return static_cast<uint8_t>(i * 131 + 7 + (i >> 13)); }

engine::KvCacheSpec test_spec() {
  engine::KvCacheSpec spec;
  spec.block_size = 16;
  engine::LayerKvSpec kv;
  kv.num_kv_heads = 4;
  kv.head_dim = 64;
  kv.v_head_dim = 64;
  engine::LayerKvSpec key_only = kv;
  key_only.kind = engine::KvKind::kKeyOnly;
  key_only.v_head_dim = 0;
  key_only.num_kv_heads = 1;
  spec.layers = {kv, key_only};
  return spec;
}

// Chunk i of the source lands at chunk (kChunks - 1 - i) of the destination, so that offset
// mistakes on either side show up as wrong bytes.
std::vector<TransferOp> ops_for(OpCode opcode, RegionId local, RemoteRegionId remote,
                                size_t bytes) {
  const size_t chunk = bytes / kChunks;
  std::vector<TransferOp> ops;
  for (int i = 0; i < kChunks; ++i) {
    const uint64_t src = i * chunk, dst = (kChunks - 1 - i) * chunk;
    // Push: local is the source. Pull: remote is the source.
    ops.push_back(opcode == OpCode::kPut ? TransferOp{opcode, local, src, remote, dst, chunk}
                                         : TransferOp{opcode, local, dst, remote, src, chunk});
  }
  return ops;
}

bool verify(const std::vector<uint8_t>& dst) {
  const size_t chunk = dst.size() / kChunks;
  for (int i = 0; i < kChunks; ++i) {
    for (size_t j = 0; j < chunk; ++j) {
      const size_t at = (kChunks - 1 - i) * chunk + j;
      if (dst[at] != pattern(i * chunk + j)) {
        LOG("byte %zu is %d, expected %d", at, dst[at], pattern(i * chunk + j));
        return false;
      }
    }
  }
  return true;
}

bool write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

std::string wait_for_file(const std::string& path, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    std::string text;
    if (in && std::getline(in, text) && !text.empty()) return text;
    std::this_thread::sleep_for(5ms);
  }
  return "";
}

class Peer {
 public:
  explicit Peer(const Args& args) : args_(args) {}

  int run() {
    const bool producer = args_.role == "producer";
    const bool push = args_.mode.rfind("push", 0) == 0;
    const bool until_error = args_.mode.find("until-error") != std::string::npos;
    const bool listener = push ? !producer : producer;
    if (int rc = setup(producer, until_error); rc != kOk) return rc;
    if (listener) return until_error ? serve_forever() : serve(producer);
    return initiate(push, until_error);
  }

 private:
  int setup(bool producer, bool until_error) {
    auto transport = UcxTransport::create({.name = args_.role});
    if (!transport.ok()) return fail(kSetup, transport.status());
    transport_ = std::move(*transport);
    transport_->set_peer_error_callback([this](PeerId, const Status& error) {
      LOG("peer error callback: %s", error.ToString().c_str());
      peer_failed_ = true;
    });
    buffer_.assign(args_.bytes, 0);
    if (producer) {
      for (size_t i = 0; i < buffer_.size(); ++i) buffer_[i] = pattern(i);
    }
    auto region = transport_->register_region({buffer_.data(), buffer_.size()});
    if (!region.ok()) return fail(kSetup, region.status());
    region_ = region->id;

    const engine::KvCacheSpec spec = test_spec();
    ControlChannelOptions options;
    options.local.set_compat_hash(compat_hash(args_.model, spec));
    options.local.set_geometry(args_.model + ": " + spec.describe());
    options.local.set_role(producer ? proto::ROLE_PREFILL : proto::ROLE_DECODE);
    options.local.set_tp_size(1);
    options.local.set_rank(0);
    options.local.set_worker_address(transport_->local_address());
    auto* desc = options.local.add_regions();
    desc->set_name("kv");
    desc->set_blob(region->descriptor);
    options.linger = 1s;  // This process sends a final message and exits.
    if (until_error) {
      options.heartbeat_interval = 200ms;
      options.peer_timeout = 2s;
    }
    auto channel = ControlChannel::create(std::move(options));
    if (!channel.ok()) return fail(kSetup, channel.status());
    channel_ = std::move(*channel);
    LOG("%s, control at %s", transport_->describe().c_str(), channel_->endpoint().c_str());
    return kOk;
  }

  // Listener of pull (producer) or push (consumer): answer the handshake, wait for the
  // notification, and finish.
  int serve(bool producer) {
    if (!write_file(args_.endpoint_file, channel_->endpoint())) return fail(kSetup, "endpoint");
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto event = channel_->receive(100ms);
      if (!event.ok()) continue;
      if (event->kind == ControlEvent::Kind::kPeerJoined) {
        LOG("peer %llu joined", static_cast<unsigned long long>(event->peer));
        continue;
      }
      if (event->kind == ControlEvent::Kind::kPeerLost) return fail(kTimeout, event->error);
      const proto::Envelope& m = event->message;
      if (producer && m.has_release() && m.release().request_id() == kRequest) {
        LOG("released by consumer rank %u", m.release().consumer_rank());
        return kOk;
      }
      if (!producer && m.has_write_done() && m.write_done().request_id() == kRequest) {
        const proto::WriteDone& done = m.write_done();
        if (done.sealed_count() != kChunks || !done.has_first_token() ||
            done.first_token() != 42) {
          LOG("bad write_done: %s", done.ShortDebugString().c_str());
          return kMismatch;
        }
        // Only now are the producer's writes known to be remotely complete.
        if (!verify(buffer_)) return kMismatch;
        LOG("verified %zu bytes after write_done", buffer_.size());
        proto::Envelope release;
        release.mutable_release()->set_request_id(kRequest);
        release.mutable_release()->set_consumer_tp(1);
        const Status sent = channel_->send(event->peer, release);
        return sent.ok() ? kOk : fail(kSetup, sent);
      }
    }
    return fail(kTimeout, "no notification");
  }

  // Passive side of the kill tests: keep answering until killed (bounded all the same).
  int serve_forever() {
    if (!write_file(args_.endpoint_file, channel_->endpoint())) return fail(kSetup, "endpoint");
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) (void)channel_->receive(100ms);
    return fail(kTimeout, "was not killed");
  }

  int initiate(bool push, bool until_error) {
    const std::string endpoint = wait_for_file(args_.endpoint_file, 10s);
    if (endpoint.empty()) return fail(kSetup, "no endpoint file");
    auto peer = channel_->connect(endpoint, 5s);
    if (!peer.ok()) {
      return fail(peer.status().code() == absl::StatusCode::kFailedPrecondition ? kRefused
                                                                                : kSetup,
                  peer.status());
    }
    // A second connect must reuse the cached handshake.
    auto again = channel_->connect(endpoint, 1ms);
    if (!again.ok() || again->id != peer->id) return fail(kSetup, "handshake not cached");
    auto ucx_peer = transport_->connect(peer->worker_address);
    if (!ucx_peer.ok()) return fail(kSetup, ucx_peer.status());
    auto remote = transport_->load_remote_region(*ucx_peer, peer->regions.at("kv"));
    if (!remote.ok()) return fail(kSetup, remote.status());
    const TransferBatch batch{*ucx_peer, ops_for(push ? OpCode::kPut : OpCode::kGet, region_,
                                                  *remote, buffer_.size())};
    if (until_error) return transfer_until_error(peer->id, *ucx_peer, batch, push);

    if (Status s = run_batch(transport_->post(batch)); !s.ok()) return fail(kTimeout, s);
    if (push) {
      // Put completion is local only: flush before telling the consumer.
      if (Status s = run_batch(transport_->flush(*ucx_peer)); !s.ok()) return fail(kTimeout, s);
      proto::Envelope done;
      auto* wd = done.mutable_write_done();
      wd->set_request_id(kRequest);
      wd->set_sealed_count(kChunks);
      wd->set_first_token(42);
      if (Status s = channel_->send(peer->id, done); !s.ok()) return fail(kSetup, s);
      return wait_for_release();
    }
    if (!verify(buffer_)) return kMismatch;
    LOG("verified %zu pulled bytes", buffer_.size());
    if (auto info = transport_->endpoint_info(*ucx_peer); info.ok()) LOG("%s", info->c_str());
    proto::Envelope release;
    release.mutable_release()->set_request_id(kRequest);
    release.mutable_release()->set_consumer_tp(1);
    const Status sent = channel_->send(peer->id, release);
    return sent.ok() ? kOk : fail(kSetup, sent);
  }

  int wait_for_release() {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto event = channel_->receive(100ms);
      if (event.ok() && event->kind == ControlEvent::Kind::kMessage &&
          event->message.has_release()) {
        LOG("consumer released");
        return kOk;
      }
    }
    return fail(kTimeout, "no release");
  }

  int transfer_until_error(uint64_t control_peer, PeerId ucx_peer, const TransferBatch& batch,
                           bool push) {
    control_peer_ = control_peer;
    ucx_peer_ = ucx_peer;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    bool marked = false;
    while (std::chrono::steady_clock::now() < deadline) {
      auto id = transport_->post(batch);
      if (id.ok() && push) {
        Status s = wait_batch(*id);
        if (!s.ok()) return detected(s);
        id = transport_->flush(ucx_peer);
      }
      if (!id.ok()) return detected(id.status());
      if (Status s = wait_batch(*id); !s.ok()) return detected(s);
      if (!marked) {
        if (!push && !verify(buffer_)) return kMismatch;
        marked = write_file(args_.marker, "1");
      }
      if (peer_failed_) return detected(absl::UnavailableError("peer error callback"));
    }
    return fail(kTimeout, "peer death not detected");
  }

  // Waits for a batch in slices, servicing the control channel in between.
  Status wait_batch(BatchId id) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      Status s = transport_->wait(id, 50ms);
      if (s.code() != absl::StatusCode::kDeadlineExceeded) {
        (void)transport_->release_batch(id);
        return s;
      }
      // The control channel's heartbeat is the backstop for transports that cannot see a
      // dead target by themselves (shared-memory puts land in memory nobody reads any more).
      auto event = channel_->receive(Duration(0));
      if (event.ok() && event->kind == ControlEvent::Kind::kPeerLost &&
          event->peer == control_peer_) {
        LOG("control channel lost the peer: %s", event->error.ToString().c_str());
        (void)transport_->disconnect(ucx_peer_, std::string(event->error.message()));
      }
    }
    (void)transport_->release_batch(id);
    return absl::DeadlineExceededError("batch did not finish");
  }

  Status run_batch(StatusOr<BatchId> id) {
    if (!id.ok()) return id.status();
    Status s = transport_->wait(*id, 10s);
    (void)transport_->release_batch(*id);
    return s;
  }

  int detected(const Status& s) {
    const auto c = transport_->counters();
    LOG("detected peer failure: %s (ops failed %llu, peer failures %llu)", s.ToString().c_str(),
        static_cast<unsigned long long>(c.ops_failed),
        static_cast<unsigned long long>(c.peer_failures));
    return kOk;
  }

  int fail(int rc, const Status& s) {
    LOG("error: %s", s.ToString().c_str());
    return rc;
  }
  int fail(int rc, const char* what) {
    LOG("error: %s", what);
    return rc;
  }

  const Args args_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<ControlChannel> channel_;
  std::vector<uint8_t> buffer_;
  RegionId region_ = 0;
  uint64_t control_peer_ = 0;  // Set in the until-error modes.
  PeerId ucx_peer_ = 0;
  std::atomic<bool> peer_failed_{false};
};

}  // namespace
}  // namespace pdserve::kvtransfer

int main(int argc, char** argv) {
  pdserve::kvtransfer::Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--role") args.role = value;
    else if (key == "--mode") args.mode = value;
    else if (key == "--endpoint-file") args.endpoint_file = value;
    else if (key == "--marker") args.marker = value;
    else if (key == "--model") args.model = value;
    else if (key == "--tls") args.tls = value;
    else if (key == "--bytes") args.bytes = std::stoull(value);
    else return pdserve::kvtransfer::kSetup;
  }
  if ((args.role != "producer" && args.role != "consumer") || args.endpoint_file.empty()) {
    std::fprintf(stderr, "usage: transport_peer --role producer|consumer --mode M "
                         "--endpoint-file F [--tls T] [--model M] [--bytes N] [--marker F]\n");
    return pdserve::kvtransfer::kSetup;
  }
  pdserve::kvtransfer::g_role = args.role == "producer" ? "producer" : "consumer";
  // UCX reads UCX_TLS when the context is created, so it is set before anything else.
  if (!args.tls.empty()) setenv("UCX_TLS", args.tls.c_str(), 1);
  pdserve::init_logging();
  return pdserve::kvtransfer::Peer(args).run();
}
