// WorkerService: the gRPC Worker API (proto/worker.proto) over one engine loop, for every role:
// aggregated (Generate runs the whole request), prefill (Prefill) and decode (Reserve, and
// Generate from pushed or pulled KV). Info and Abort serve all roles. A client that cancels, or
// a stream that can no longer be written, aborts the request in the engine.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "engine/engine_loop.h"
#include "proto/worker.grpc.pb.h"
#include "worker/decode_role.h"
#include "worker/peer_tier.h"
#include "worker/prefill_role.h"

namespace pdserve::worker {

class WorkerService final : public Worker::Service {
 public:
  // `prefill` is set for the prefill role, `decode` for the decode role, neither for aggregated.
  // `kv_compat` is the deployment's KV-compatibility label Info reports (--kv-compat).
  WorkerService(Role role, std::string worker_id, engine::EngineLoop& loop, PrefillRole* prefill,
                DecodeRole* decode, std::string kv_compat = "");

  // Draining (SIGTERM): new work (Reserve, Prefill, Generate other than the claim of a push
  // reservation made before) is refused with UNAVAILABLE, which the router places elsewhere;
  // what is in flight goes on.
  void set_draining() { draining_ = true; }
  // Reserve, Prefill and Generate calls running now.
  int in_flight() const { return in_flight_.load(); }

  // The id Info reports (known once the server has its port).
  void set_worker_id(std::string id) {
    std::lock_guard lock(id_mu_);
    worker_id_ = std::move(id);
  }

  // The KV-event endpoints Info reports (known once the publisher is bound).
  void set_kv_events(std::string pub_endpoint, std::string replay_endpoint) {
    std::lock_guard lock(id_mu_);
    kv_events_endpoint_ = std::move(pub_endpoint);
    kv_replay_endpoint_ = std::move(replay_endpoint);
  }

  // The worker's peer tier (--kv-peer-tier): serves PeerLease/PeerRelease, and Prefill reads a
  // request's PrefixSource through it. Set before serving; none: those are refused.
  void set_peer_tier(PeerTier* peer) { peer_ = peer; }

  grpc::Status Info(grpc::ServerContext* context, const InfoRequest* request, WorkerInfo* reply) override;
  grpc::Status Reserve(grpc::ServerContext* context, const ReserveRequest* request,
                       ReserveResponse* reply) override;
  grpc::Status Prefill(grpc::ServerContext* context, const PrefillRequest* request,
                       PrefillResponse* reply) override;
  grpc::Status Generate(grpc::ServerContext* context, const WorkerGenerateRequest* request,
                        grpc::ServerWriter<WorkerEvent>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const WorkerAbortRequest* request,
                     WorkerAbortResponse* reply) override;
  grpc::Status PeerLease(grpc::ServerContext* context, const PeerLeaseRequest* request,
                         PeerLeaseResponse* reply) override;
  grpc::Status PeerRelease(grpc::ServerContext* context, const PeerReleaseRequest* request,
                           PeerReleaseResponse* reply) override;

 private:
  // Streams an engine request's events until it finishes or the client goes away. `kv`: how a
  // P/D request's KV arrived (PreparedDecode's transfer fields; null for an aggregated one),
  // for the final event.
  grpc::Status stream(grpc::ServerContext* context, engine::GenerationRequest request, const PreparedDecode* kv,
                      grpc::ServerWriter<WorkerEvent>* writer);

  // Counts a handler as in flight for its lifetime.
  class InFlight;

  const Role role_;
  const std::string kv_compat_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::mutex id_mu_;
  std::string worker_id_;           // Guarded by id_mu_.
  std::string kv_events_endpoint_;  // Guarded by id_mu_.
  std::string kv_replay_endpoint_;  // Guarded by id_mu_.
  engine::EngineLoop& loop_;
  PrefillRole* prefill_;
  DecodeRole* decode_;
  PeerTier* peer_ = nullptr;
};

}  // namespace pdserve::worker
