// KvRankEndpoint's push sessions: the producer rank opens the request, posts each layer's puts,
// seals and sends WRITE_DONE once its flushes ended; the consumer rank reserves and checks each
// producer rank's WRITE_DONE against its own plan.
#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"

#include "common/logging.h"
#include "kvtransfer/fault.h"
#include "kvtransfer/kv_endpoint.h"
#include "kvtransfer/kv_endpoint_internal.h"

namespace pdserve::kvtransfer {

Status KvRankEndpoint::begin_push(const PushRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kProducer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("begin_push on a consumer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  PD_REFUSE_IF_ERROR(check_blocks(in.producer_blocks, layout_.num_blocks(), "producer"));
  PD_REFUSE_IF_ERROR(in.consumer_blocks.size() == in.producer_blocks.size()
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("producer and consumer block counts differ"));
  PD_REFUSE_IF_ERROR(static_cast<int>(in.consumer_endpoints.size()) == in.consumer_tp
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("need one endpoint per consumer rank"));
  PD_REFUSE_IF_ERROR(sent_blocks(in.producer_blocks, in.skip_blocks).status());
  StatusOr<const RankMap*> map = map_for(options_.tp, in.consumer_tp);
  PD_REFUSE_IF_ERROR(map.status());
  // Connect first, so that block ids outside a consumer's arena are refused like other bad
  // input; a consumer that cannot be reached fails the registered request instead.
  StatusOr<Fan> fan = connect_fan(in.request_id, (*map)->fan_out[options_.rank], in.consumer_endpoints,
                                  in.consumer_tp, in.consumer_incarnations, &in.consumer_blocks, KvRegion::kDevice,
                                  "consumer");
  PD_REFUSE_IF_ERROR(fan.status());
  Request& request = add_request(in.request_id, TransferMode::kPush, in.producer_blocks,
                                 (*map)->fan_out[options_.rank], in.lease);
  request.producer_tp = options_.tp;
  request.consumer_tp = in.consumer_tp;
  request.producer_blocks = in.producer_blocks;
  request.consumer_blocks = in.consumer_blocks;
  request.skip_blocks = in.skip_blocks;
  request.layers_posted.assign(layout_.num_layers(), false);
  return start_legs(in.request_id, request, *fan);
}

Status KvRankEndpoint::open_push_leg(const std::string& id, Request& request, int c, Leg& leg, Remote& remote) {
  leg.remote = remote.address;
  PD_RETURN_IF_ERROR(ensure_transport(remote));
  PD_RETURN_IF_ERROR(remote_region(remote, KvRegion::kDevice).status());
  PD_ASSIGN_OR_RETURN(leg.plan, plan(options_.rank, c, remote, request, request.consumer_blocks, request.skip_blocks));
  for (int layer = 0; layer < static_cast<int>(request.layers_posted.size()); ++layer) {
    if (request.layers_posted[layer]) PD_RETURN_IF_ERROR(post_layer(id, request, c, leg, layer));
  }
  return absl::OkStatus();
}

Status KvRankEndpoint::layer_ready(const std::string& id, int layer) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  Request& request = it->second;
  Session& session = *request.session;
  if (session.role() != TransferRole::kPushProducer) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer_ready on a ", transfer_role_name(session.role()), " request (a push producer's call)"));
  }
  if (!session.active()) return session.error();
  if (layer < 0 || layer >= layout_.num_layers()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (request.layers_posted[layer]) {
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " of ", id, " posted twice"));
  }
  request.layers_posted[layer] = true;
  for (auto& [c, leg] : request.legs) {
    if (leg.dialing) continue;  // Posted once its dial ended (open_push_leg).
    const Status status = post_layer(id, request, c, leg, layer);
    if (!status.ok()) {
      fail(request, absl::Status(status.code(),
                                 absl::StrCat("request ", id, ": puts of layer ", layer,
                                              " to consumer rank ", c, ": ",
                                              std::string(status.message()))));
      return request.session->error();
    }
  }
  return absl::OkStatus();
}

Status KvRankEndpoint::post_layer(const std::string& id, Request& request, int c, Leg& leg, int layer) {
  const LayerCopies& copies = leg.plan.layers[layer];
  if (copies.ops.empty()) return absl::OkStatus();
  Remote& remote = remotes_.at(leg.remote);
  PD_RETURN_IF_ERROR(remote.error);
  PD_ASSIGN_OR_RETURN(const RemoteRegionId destination, remote_region(remote, KvRegion::kDevice));
  TransferBatch batch{remote.transport_peer, {}};
  batch.ops.reserve(copies.ops.size());
  for (const CopyOp& op : copies.ops) {
    batch.ops.push_back({OpCode::kPut, region_, op.src_offset, destination, op.dst_offset, op.length});
  }
  PD_ASSIGN_OR_RETURN(BatchId posted, post_batch(batch));
  leg.batches.push_back(posted);
  leg.posted += copies.ops.size();
  request.bytes += copies.bytes;
  request.ops += copies.ops.size();
  return request.session->add_scheduled(c, copies.ops.size());
}

Status KvRankEndpoint::seal(const std::string& id, std::optional<int32_t> first_token) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  Request& request = it->second;
  if (request.session->role() != TransferRole::kPushProducer) {
    return absl::FailedPreconditionError(absl::StrCat("seal on a ", transfer_role_name(request.session->role()),
                                                      " request (a push producer's call)"));
  }
  if (request.dials_pending > 0 && request.session->active()) {
    if (request.deferred_seal) return absl::FailedPreconditionError(absl::StrCat(id, " sealed twice"));
    request.deferred_seal = first_token;  // on_dialed seals once the last leg is open.
    return absl::OkStatus();
  }
  return seal_now(id, request, first_token);
}

Status KvRankEndpoint::seal_now(const std::string& id, Request& request, std::optional<int32_t> first_token) {
  PD_RETURN_IF_ERROR(request.session->seal());
  request.first_token = first_token;
  request.sealed_at = options_.clock->now();
  // A flush completes once every put posted before it is remotely complete.
  for (auto& [c, leg] : request.legs) {
    if (leg.posted == 0) continue;
    StatusOr<BatchId> flush = flush_peer(remotes_.at(leg.remote).transport_peer);
    if (!flush.ok()) {
      fail(request, absl::Status(flush.status().code(),
                                 absl::StrCat("request ", id, ": flush to consumer rank ", c,
                                              ": ", std::string(flush.status().message()))));
      return request.session->error();
    }
    leg.flush = *flush;
  }
  // Shared-memory puts are complete once posted, so one progress round usually ends the flush:
  // WRITE_DONE leaves now, not after the progress thread and this one took turns.
  transport_->progress();
  step_push_producer(id, request);
  return absl::OkStatus();
}

Status KvRankEndpoint::expect_push(const ExpectPushRequest& in) {
  PD_REFUSE_IF_ERROR(options_.side == SessionSide::kConsumer
                         ? absl::OkStatus()
                         : absl::FailedPreconditionError("expect_push on a producer rank"));
  PD_REFUSE_IF_ERROR(check_new_request(in.request_id));
  PD_REFUSE_IF_ERROR(check_blocks(in.consumer_blocks, layout_.num_blocks(), "consumer"));
  PD_REFUSE_IF_ERROR(in.producer_endpoints.empty() ||
                             static_cast<int>(in.producer_endpoints.size()) == in.producer_tp
                         ? absl::OkStatus()
                         : absl::InvalidArgumentError("need one endpoint per producer rank"));
  PD_REFUSE_IF_ERROR(sent_blocks(in.consumer_blocks, in.skip_blocks).status());
  StatusOr<const RankMap*> map = map_for(in.producer_tp, options_.tp);
  PD_REFUSE_IF_ERROR(map.status());
  Request& request = add_request(in.request_id, TransferMode::kPush, in.consumer_blocks,
                                 (*map)->fan_in[options_.rank], in.lease);
  request.producer_tp = in.producer_tp;
  request.consumer_tp = options_.tp;
  request.consumer_blocks = in.consumer_blocks;
  request.skip_blocks = in.skip_blocks;
  if (in.producer_endpoints.empty()) return absl::OkStatus();
  // The producer's blocks are unknown until its WRITE_DONE: nothing to range-check yet.
  StatusOr<Fan> fan = connect_fan(in.request_id, (*map)->fan_in[options_.rank], in.producer_endpoints,
                                  in.producer_tp, in.producer_incarnations, nullptr, KvRegion::kDevice, "producer");
  if (fan.ok() && fan->unreachable.ok()) {
    for (auto& [p, remote] : fan->remotes) request.legs.at(p).remote = remote->address;
    wait_for_dials(in.request_id, request, *fan);
    return absl::OkStatus();
  }
  const Status why = fan.ok() ? fan->unreachable : fan.status();
  // Nobody has written yet: the producer could not be reached, so it is quiet.
  for (auto& [q, l] : request.legs) request.session->leg_quiet(q);
  fail(request, why);
  return why;
}

void KvRankEndpoint::on_write_done(Remote& from, const proto::Envelope& envelope) {
  const proto::WriteDone& done = envelope.write_done();
  auto it = requests_.find(done.request_id());
  if (it == requests_.end()) {
    ++counters_.stale_ignored;
    PD_LOG_DEBUG("kvtransfer: stale write_done for {}", done.request_id());
    return;
  }
  Request& request = it->second;
  Session& session = *request.session;
  const int p = static_cast<int>(done.producer_rank());
  auto refuse = [&](const std::string& why) {
    ++counters_.refused;
    PD_LOG_WARN("kvtransfer {}.{}: refused write_done for {} from rank {}/{}: {}", options_.name,
                options_.rank, done.request_id(), from.rank, from.tp, why);
  };
  if (session.role() != TransferRole::kPushConsumer) {
    return refuse(absl::StrCat("a ", transfer_role_name(session.role()), " request, not a push consumer's"));
  }
  if (from.role != proto::ROLE_PREFILL || from.tp != request.producer_tp || from.rank != p ||
      static_cast<int>(done.consumer_rank()) != options_.rank) {
    return refuse(absl::StrCat("sender or ranks do not match (producer_rank ", p,
                               ", consumer_rank ", done.consumer_rank(), ")"));
  }
  auto leg_it = request.legs.find(p);
  if (leg_it == request.legs.end()) return refuse("producer rank not in the fan-in");
  Leg& leg = leg_it->second;
  if (!leg.remote.empty() && leg.remote != from.address) {
    return refuse("from another producer group than the request's");
  }
  leg.remote = from.address;
  if (session.leg_is_done(p)) {
    if (session.leg_done(p, done.sealed_count(), done.sealed_count()) == LegResult::kDuplicate) {
      ++counters_.duplicates_ignored;
    }
    return;
  }
  if (!session.active()) {
    ++counters_.stale_ignored;
    session.leg_quiet(p);  // It flushed before notifying: it no longer writes.
    return;
  }
  request.producer_blocks.assign(done.producer_blocks().begin(), done.producer_blocks().end());
  Status status = request.producer_blocks.size() == request.consumer_blocks.size()
                      ? check_blocks(request.producer_blocks, from.arena(KvRegion::kDevice).layout->num_blocks(), "producer")
                      : absl::InvalidArgumentError("write_done without the producer's block ids");
  if (status.ok() && static_cast<int>(done.skip_blocks()) != request.skip_blocks) {
    status = absl::InvalidArgumentError(absl::StrCat("producer skipped ", done.skip_blocks(),
                                                     " blocks, this consumer expected ", request.skip_blocks));
  }
  StatusOr<TransferPlan> planned = absl::UnknownError("unplanned");
  if (status.ok()) {
    planned = plan(p, options_.rank, from, request, request.consumer_blocks, request.skip_blocks);
    status = planned.status();
  }
  session.leg_quiet(p);
  if (!status.ok()) {
    refuse(status.ToString());
    fail(request, absl::DataLossError(absl::StrCat("request ", done.request_id(),
                                                   ": cannot check producer rank ", p,
                                                   "'s writes: ", status.ToString())));
    return;
  }
  leg.plan = std::move(*planned);
  seams_.received->before_verify(arena(), leg.plan);
  if (options_.checksums && done.block_checksums_size() > 0) {
    const Status verified = verify_checksums(done.request_id(), request, p, leg,
                                             {done.block_checksums().begin(),
                                              done.block_checksums().end()});
    if (!verified.ok()) {
      fail(request, verified);
      return;
    }
  }
  if (done.has_first_token()) request.first_token = done.first_token();
  if (done.seal_to_send_s() > 0)
    request.push_tail = std::max(request.push_tail, std::chrono::duration_cast<Duration>(
                                                        std::chrono::duration<double>(done.seal_to_send_s())));
  request.bytes += leg.plan.total_bytes;
  request.ops += done.sealed_count();
  if (session.leg_done(p, done.sealed_count(), leg.plan.total_ops) == LegResult::kMismatch) {
    ++counters_.failures;
    PD_LOG_WARN("kvtransfer {}.{}: {}", options_.name, options_.rank, session.error().ToString());
  }
}

void KvRankEndpoint::step_push_producer(const std::string& id, Request& request) {
  Session& session = *request.session;
  if (session.state() != SessionState::kSealed) return;
  for (auto& [c, leg] : request.legs) {
    if (session.leg_is_done(c)) continue;
    std::string error;
    bool failed = false, pending = false;
    for (BatchId b : leg.batches) {
      const BatchState s = batch_state(b, &error);
      failed |= s == BatchState::kError;
      pending |= s == BatchState::kInProgress;
    }
    if (leg.flush) {
      const BatchState s = batch_state(*leg.flush, &error);
      failed |= s == BatchState::kError;
      pending |= s == BatchState::kInProgress;
    }
    if (failed) {
      fail(request, peer_fault(absl::UnavailableError(absl::StrCat("request ", id, ": writes to consumer rank ",
                                                        c, " failed: ", error))));
      return;
    }
    if (pending) continue;
    proto::Envelope message;
    proto::WriteDone& done = *message.mutable_write_done();
    done.set_request_id(id);
    done.set_producer_rank(options_.rank);
    done.set_consumer_rank(c);
    done.set_sealed_count(session.scheduled(c));
    if (request.first_token) done.set_first_token(*request.first_token);
    done.set_seal_to_send_s(std::chrono::duration<double>(options_.clock->now() - request.sealed_at).count());
    for (int b : request.producer_blocks) done.add_producer_blocks(b);
    done.set_skip_blocks(request.skip_blocks);
    if (options_.checksums) {
      for (uint64_t sum : checksums(sent_consumer_blocks(request), leg.plan, remotes_.at(leg.remote),
                                    ChecksumSide::kSource, KvRegion::kDevice)) {
        done.add_block_checksums(sum);
      }
    }
    const Status sent = notify(remotes_.at(leg.remote), message);
    if (!sent.ok()) {
      fail(request, peer_fault(absl::UnavailableError(absl::StrCat("request ", id, ": write_done to consumer rank ",
                                                        c, ": ", std::string(sent.message())))));
      return;
    }
    session.leg_done(c, session.scheduled(c), session.scheduled(c));
  }
}

}  // namespace pdserve::kvtransfer
