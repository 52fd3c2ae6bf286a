// PubDropPolicy: decides whether the publisher drops a live PUB message instead of sending it,
// the fault seam through which tests lose messages the way a full send queue or a network
// partition would. The batch still enters the replay buffer: only the live copy is lost.
// Production uses NeverDrop.
#pragma once

#include <cstdint>

namespace pdserve::kvevents {

class PubDropPolicy {
 public:
  virtual ~PubDropPolicy() = default;
  // Called on the publisher's I/O thread for each live message; `seq` is 0 for a heartbeat.
  virtual bool drop(uint64_t seq, bool heartbeat) = 0;
};

class NeverDrop final : public PubDropPolicy {
 public:
  bool drop(uint64_t, bool) override { return false; }
};

}  // namespace pdserve::kvevents
