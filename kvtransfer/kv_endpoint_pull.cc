// KvRankEndpoint's pull sessions: the producer rank holds the blocks until its fan-out released
// them; the consumer rank reads its share, verifies it (debug checksums) and releases it.
#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"

#include "common/logging.h"
#include "kvtransfer/fault.h"
#include "kvtransfer/kv_endpoint.h"
#include "kvtransfer/kv_endpoint_internal.h"

namespace pdserve::kvtransfer {

Status KvRankEndpoint::hold(const HoldRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kProducer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("hold on a consumer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  if (in.region == KvRegion::kHost && !host_.layout)
    PD_REFUSE_IF_ERROR(absl::FailedPreconditionError("hold of host-tier blocks on a rank without a host tier"));
  PD_REFUSE_IF_ERROR(check_blocks(in.producer_blocks,
                                  in.region == KvRegion::kHost ? host_.layout->num_blocks() : layout_.num_blocks(),
                                  "producer"));
  std::vector<int> peers;
  if (in.consumer_tp > 0) {
    StatusOr<const RankMap*> map = map_for(options_.tp, in.consumer_tp);
    PD_REFUSE_IF_ERROR(map.status());
    peers = (*map)->fan_out[options_.rank];
  }
  Request& request = add_request(in.request_id, TransferMode::kPull, in.producer_blocks,
                                 std::move(peers), in.lease);
  request.producer_tp = options_.tp;
  request.consumer_tp = in.consumer_tp;
  request.producer_blocks = in.producer_blocks;
  request.region = in.region;
  return absl::OkStatus();
}

Status KvRankEndpoint::pull(const PullRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kConsumer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("pull on a producer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  PD_REFUSE_IF_ERROR(check_blocks(in.consumer_blocks, layout_.num_blocks(), "consumer"));
  PD_REFUSE_IF_ERROR(in.consumer_blocks.size() == in.producer_blocks.size()
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("producer and consumer block counts differ"));
  PD_REFUSE_IF_ERROR(static_cast<int>(in.producer_endpoints.size()) == in.producer_tp
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("need one endpoint per producer rank"));
  PD_REFUSE_IF_ERROR(sent_blocks(in.consumer_blocks, in.skip_blocks).status());
  StatusOr<const RankMap*> map = map_for(in.producer_tp, options_.tp);
  PD_REFUSE_IF_ERROR(map.status());
  StatusOr<Fan> fan = connect_fan(in.request_id, (*map)->fan_in[options_.rank], in.producer_endpoints,
                                  in.producer_tp, in.producer_incarnations, &in.producer_blocks, in.region,
                                  "producer");
  PD_REFUSE_IF_ERROR(fan.status());
  Request& request = add_request(in.request_id, TransferMode::kPull, in.consumer_blocks,
                                 (*map)->fan_in[options_.rank], in.lease);
  request.producer_tp = in.producer_tp;
  request.consumer_tp = options_.tp;
  request.producer_blocks = in.producer_blocks;
  request.consumer_blocks = in.consumer_blocks;
  request.skip_blocks = in.skip_blocks;
  request.region = in.region;
  return start_legs(in.request_id, request, *fan);
}

Status KvRankEndpoint::open_pull_leg(const std::string& id, Request& request, int p, Leg& leg, Remote& remote) {
  leg.remote = remote.address;
  PD_RETURN_IF_ERROR(ensure_transport(remote));
  PD_ASSIGN_OR_RETURN(leg.plan, plan(p, options_.rank, remote, request, request.consumer_blocks, request.skip_blocks));
  PD_ASSIGN_OR_RETURN(const RemoteRegionId source, remote_region(remote, request.region));
  TransferBatch batch{remote.transport_peer, {}};
  batch.ops.reserve(leg.plan.total_ops);
  for (const LayerCopies& layer : leg.plan.layers) {
    for (const CopyOp& op : layer.ops) {
      batch.ops.push_back({OpCode::kGet, region_, op.dst_offset, source, op.src_offset, op.length});
    }
  }
  if (!batch.ops.empty()) {
    PD_ASSIGN_OR_RETURN(BatchId posted, post_batch(batch));
    leg.batches.push_back(posted);
    leg.posted = batch.ops.size();
    request.bytes += leg.plan.total_bytes;
    request.ops += batch.ops.size();
  }
  if (!options_.checksums) return absl::OkStatus();
  // Asked now, so that the answer usually arrives while the gets still run.
  proto::Envelope message;
  proto::ChecksumRequest& ask = *message.mutable_checksum_request();
  ask.set_request_id(id);
  ask.set_consumer_rank(options_.rank);
  ask.set_consumer_tp(options_.tp);
  ask.set_producer_rank(p);
  for (int b : request.consumer_blocks) ask.add_consumer_blocks(b);
  ask.set_skip_blocks(request.skip_blocks);
  return send(remote, message);
}

void KvRankEndpoint::on_release(Remote& from, const proto::Release& release) {
  auto it = requests_.find(release.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int c = static_cast<int>(release.consumer_rank());
  const int consumer_tp = static_cast<int>(release.consumer_tp());
  if (!from_pull_consumer(from, request, c, consumer_tp, static_cast<int>(release.producer_rank()))) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused release of {} from rank {}/{}", options_.name,
                options_.rank, release.request_id(), from.rank, from.tp);
    return;
  }
  if (!learn_fan_out(request, consumer_tp).ok()) {
    ++counters_.refused;
    return;
  }
  switch (session.leg_done(c, 0, 0)) {
    case LegResult::kDuplicate: ++counters_.duplicates_ignored; break;
    case LegResult::kUnknownPeer: ++counters_.refused; break;
    case LegResult::kInactive:
      ++counters_.stale_ignored;
      session.leg_quiet(c);  // It finished reading before it released.
      break;
    default: break;
  }
}

bool KvRankEndpoint::from_pull_consumer(const Remote& from, const Request& request, int consumer_rank,
                                        int consumer_tp, int producer_rank) const {
  const Session& session = *request.session;
  return session.role() == TransferRole::kPullProducer &&
         from.role == proto::ROLE_DECODE && from.rank == consumer_rank && from.tp == consumer_tp &&
         producer_rank == options_.rank && (request.consumer_tp == 0 || request.consumer_tp == consumer_tp);
}

Status KvRankEndpoint::learn_fan_out(Request& request, int consumer_tp) {
  Session& session = *request.session;
  if (session.peers_known()) return absl::OkStatus();
  PD_ASSIGN_OR_RETURN(const RankMap* map, map_for(options_.tp, consumer_tp));
  request.consumer_tp = consumer_tp;
  PD_RETURN_IF_ERROR(session.set_peers(map->fan_out[options_.rank]));
  for (int q : session.peers()) request.legs[q];
  return absl::OkStatus();
}

void KvRankEndpoint::on_checksum_request(Remote& from, const proto::ChecksumRequest& ask) {
  auto it = requests_.find(ask.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    if (const std::string* ended = finished_.find(ask.request_id())) {
      // It ended here (another consumer rank aborted it) before this rank asked: without an
      // answer the asker would wait for its checksums until its lease. The reason travels on,
      // so every consumer rank reports the first failure, not only that there was one.
      proto::Envelope reply;
      reply.mutable_abort()->set_request_id(ask.request_id());
      reply.mutable_abort()->set_reason(absl::StrCat("the producer no longer holds the request: ", *ended));
      (void)send(from, reply);
    }
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int c = static_cast<int>(ask.consumer_rank());
  const int consumer_tp = static_cast<int>(ask.consumer_tp());
  auto refuse = [&](const std::string& why) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused checksum request for {} from rank {}/{}: {}",
                options_.name, options_.rank, ask.request_id(), from.rank, from.tp, why);
  };
  if (!from_pull_consumer(from, request, c, consumer_tp, static_cast<int>(ask.producer_rank())))
    return refuse("sender or ranks do not match");
  if (!session.active()) {
    // Failed here (another consumer rank aborted it) but not yet forgotten: as for a finished
    // id, the asker must hear why, or it would wait for its checksums until its lease (a pull
    // producer's legs are unbound, so step_abort's aborts do not reach it).
    ++counters_.stale_ignored;
    proto::Envelope reply;
    reply.mutable_abort()->set_request_id(ask.request_id());
    reply.mutable_abort()->set_reason(
        absl::StrCat("the producer no longer holds the request: ", session.error().ToString()));
    (void)send(from, reply);
    return;
  }
  const Status learnt = learn_fan_out(request, consumer_tp);
  if (!learnt.ok()) return refuse(learnt.ToString());
  if (!request.legs.count(c)) return refuse("consumer rank not in the fan-out");
  proto::Envelope message;
  proto::BlockChecksums& reply = *message.mutable_block_checksums();
  reply.set_request_id(ask.request_id());
  reply.set_producer_rank(options_.rank);
  reply.set_consumer_rank(c);
  // Without checksums on this side the answer is empty, and the consumer does not verify.
  if (options_.checksums) {
    const std::vector<int> consumer_blocks(ask.consumer_blocks().begin(),
                                           ask.consumer_blocks().end());
    Status status = consumer_blocks.size() == request.producer_blocks.size()
                        ? check_blocks(consumer_blocks, from.arena(KvRegion::kDevice).layout->num_blocks(), "consumer")
                        : absl::InvalidArgumentError("producer and consumer block counts differ");
    const int skip = static_cast<int>(ask.skip_blocks());
    StatusOr<TransferPlan> planned = absl::UnknownError("unplanned");
    if (status.ok()) {
      planned = plan(options_.rank, c, from, request, consumer_blocks, skip);
      status = planned.status();
    }
    if (!status.ok()) return refuse(status.ToString());
    const std::span<const int> sent(consumer_blocks.begin() + skip, consumer_blocks.end());
    for (uint64_t sum : checksums(sent, *planned, from, ChecksumSide::kSource, request.region)) {
      reply.add_checksums(sum);
    }
  }
  const Status sent = send(from, message);
  if (!sent.ok()) {
    PD_LOG_WARN("kvtransfer {}.{}: checksums of {} to consumer rank {}: {}", options_.name,
                options_.rank, ask.request_id(), c, sent.ToString());
  }
}

void KvRankEndpoint::on_block_checksums(Remote& from, const proto::BlockChecksums& sums) {
  auto it = requests_.find(sums.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int p = static_cast<int>(sums.producer_rank());
  auto leg_it = request.legs.find(p);
  if (session.role() != TransferRole::kPullConsumer ||
      from.role != proto::ROLE_PREFILL || from.rank != p || from.tp != request.producer_tp ||
      static_cast<int>(sums.consumer_rank()) != options_.rank || leg_it == request.legs.end() ||
      leg_it->second.remote != from.address) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused block checksums of {} from rank {}/{}", options_.name,
                options_.rank, sums.request_id(), from.rank, from.tp);
    return;
  }
  Leg& leg = leg_it->second;
  if (leg.expected_checksums) {
    ++counters_.duplicates_ignored;
    return;
  }
  leg.expected_checksums.emplace(sums.checksums().begin(), sums.checksums().end());
}

void KvRankEndpoint::step_pull_consumer(const std::string& id, Request& request) {
  Session& session = *request.session;
  if (!session.active()) return;
  for (auto& [p, leg] : request.legs) {
    if (session.leg_is_done(p) || leg.dialing) continue;
    std::string error;
    bool failed = false, pending = false;
    for (BatchId b : leg.batches) {
      const BatchState s = batch_state(b, &error);
      failed |= s == BatchState::kError;
      pending |= s == BatchState::kInProgress;
    }
    if (failed) {
      fail(request, peer_fault(absl::UnavailableError(absl::StrCat("request ", id, ": reads from producer rank ",
                                                        p, " failed: ", error))));
      return;
    }
    if (pending) continue;
    if (options_.checksums) {
      // The producer's checksums come over the control channel, maybe after the gets ended.
      if (!leg.expected_checksums) continue;
      seams_.received->before_verify(arena(), leg.plan);
      if (!leg.expected_checksums->empty()) {
        const Status verified = verify_checksums(id, request, p, leg, *leg.expected_checksums);
        if (!verified.ok()) {
          fail(request, verified);
          return;
        }
      }
    }
    proto::Envelope message;
    proto::Release& release = *message.mutable_release();
    release.set_request_id(id);
    release.set_consumer_rank(options_.rank);
    release.set_consumer_tp(options_.tp);
    release.set_producer_rank(p);
    const Status sent = notify(remotes_.at(leg.remote), message);
    if (!sent.ok()) {
      PD_LOG_WARN("kvtransfer {}.{}: release of {} to producer rank {}: {}", options_.name,
                  options_.rank, id, p, sent.ToString());
    }
    session.leg_done(p, 0, 0);
  }
}

}  // namespace pdserve::kvtransfer
