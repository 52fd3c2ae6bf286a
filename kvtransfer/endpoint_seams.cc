#include "kvtransfer/endpoint_seams.h"

#include <mutex>
#include <random>

#include "kvtransfer/kv_endpoint.h"

namespace pdserve::kvtransfer {
namespace {

class ControlNotifier final : public Notifier {
 public:
  // A leg-completing notification is the last step of a request's transfer: the same-host
  // lane, where there is one, saves it ZeroMQ's two I/O-thread hops. Overtaking an earlier
  // message is harmless: the only ones that may precede it on a leg are the handshake (answered
  // before the lane is known) and, in pull, the checksums it waited for.
  Status notify(ControlChannel& control, uint64_t control_id, const proto::Envelope& message) override {
    return control.send(control_id, message, Route::kLocalFirst);
  }
};

// TestFaults::drop_notifications: "sent", but `fraction` of them never leave (drawn per
// notification; the others are sent as ControlNotifier sends them).
class DroppingNotifier final : public Notifier {
 public:
  explicit DroppingNotifier(double fraction) : fraction_(fraction), rng_(std::random_device{}()) {}
  Status notify(ControlChannel& control, uint64_t control_id, const proto::Envelope& message) override {
    {
      std::lock_guard lock(mu_);
      if (std::uniform_real_distribution<double>(0, 1)(rng_) < fraction_) return absl::OkStatus();
    }
    return sent_.notify(control, control_id, message);
  }

 private:
  const double fraction_;
  std::mutex mu_;
  std::mt19937_64 rng_;  // Guarded by mu_.
  ControlNotifier sent_;
};

class NoReceivedBytesHook final : public ReceivedBytesHook {
 public:
  void before_verify(uint8_t*, const TransferPlan&) override {}
};

// TestFaults::corrupt_received: flips the first byte the leg's first op wrote.
class CorruptingHook final : public ReceivedBytesHook {
 public:
  void before_verify(uint8_t* arena, const TransferPlan& plan) override {
    for (const LayerCopies& layer : plan.layers) {
      if (layer.ops.empty()) continue;
      arena[layer.ops.front().dst_offset] ^= 0x5a;
      return;
    }
  }
};

}  // namespace

EndpointSeams make_endpoint_seams(const engine::KvCacheSpec& spec, const TestFaults& faults) {
  EndpointSeams seams;
  seams.planning_spec = faults.planning_spec ? *faults.planning_spec : spec;
  seams.mutate_map = faults.mutate_map ? faults.mutate_map : [](RankMap&) {};
  if (faults.drop_notifications > 0) {
    seams.notifier = std::make_unique<DroppingNotifier>(faults.drop_notifications);
  } else {
    seams.notifier = std::make_unique<ControlNotifier>();
  }
  if (faults.corrupt_received) {
    seams.received = std::make_unique<CorruptingHook>();
  } else {
    seams.received = std::make_unique<NoReceivedBytesHook>();
  }
  return seams;
}

}  // namespace pdserve::kvtransfer
