// The seams through which the mutation and fault tests break a KvRankEndpoint on purpose
// (TestFaults): the spec and rank map it plans with, how it sends its notifications (WRITE_DONE,
// RELEASE), and what happens to received bytes before they are verified. The endpoint always
// goes through them; make_endpoint_seams() picks once, at creation, the production
// implementations (the real spec, the control channel, nothing) or the faulty ones TestFaults
// asks for, so that no production path branches on a test fault.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"
#include "engine/kv_spec.h"
#include "kvtransfer/control/control_channel.h"
#include "kvtransfer/rank_map.h"
#include "kvtransfer/transfer_plan.h"

namespace pdserve::kvtransfer {

struct TestFaults;

// Sends a notification that completes a leg (WRITE_DONE, RELEASE).
class Notifier {
 public:
  virtual ~Notifier() = default;
  virtual Status notify(ControlChannel& control, uint64_t control_id, const proto::Envelope& message) = 0;
};

// Sees a consumer leg's received bytes right before the debug checksums verify them.
class ReceivedBytesHook {
 public:
  virtual ~ReceivedBytesHook() = default;
  virtual void before_verify(uint8_t* arena, const TransferPlan& plan) = 0;
};

struct EndpointSeams {
  engine::KvCacheSpec planning_spec;         // Layouts and maps are planned with it.
  std::function<void(RankMap&)> mutate_map;  // Applied to every map built.
  std::unique_ptr<Notifier> notifier;
  std::unique_ptr<ReceivedBytesHook> received;
};

// Production seams for `spec`, or the faults `faults` asks for.
EndpointSeams make_endpoint_seams(const engine::KvCacheSpec& spec, const TestFaults& faults);

}  // namespace pdserve::kvtransfer
