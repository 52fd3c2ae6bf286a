// LocalLane: the control channel's same-host shortcut. A unix datagram socket bound to a random
// abstract address (Linux; per network namespace), announced in the handshake. A notification
// sent on it wakes the receiving rank thread directly, where a ZeroMQ message passes through an
// I/O thread on each side first: on a 2-vCPU VM each thread hop costs 60-75 µs, two thirds of a
// small transfer's control time (docs/kvtransfer.md, "Where a 16-token request's time goes").
//
// Trust is the control channel's (ControlChannel frames and checks the datagrams): the kernel
// stamps every datagram with its sender's bound address, which no other process can hold while
// the sender lives, and each starts with a random token the sender announced only in its
// handshake (with a cluster key: encrypted), so a process that binds the address after its owner
// exited cannot pass for it either. A peer out of reach (another host or network namespace) is
// found so at the first send, and the caller falls back to ZeroMQ. This class only moves bytes.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace pdserve::kvtransfer {

class LocalLane {
 public:
  // Binds a socket to a fresh random abstract address.
  static StatusOr<std::unique_ptr<LocalLane>> open();
  ~LocalLane();

  LocalLane(const LocalLane&) = delete;
  LocalLane& operator=(const LocalLane&) = delete;

  // The bound address, without the abstract namespace's leading NUL: what peers send to.
  const std::string& address() const { return address_; }
  // Readable while a datagram waits (for poll()/zmq_poll()).
  int fd() const { return fd_; }

  // Sends one datagram to the lane bound at `address`, without blocking. Unavailable when no
  // lane is bound there from this network namespace (the peer is elsewhere, or gone: fall back
  // for good); ResourceExhausted when its queue is full or the datagram too big (fall back for
  // this message).
  Status send(const std::string& address, const std::string& bytes) const;

  struct Datagram {
    std::string from;   // The sender's bound address (empty if it sent from an unbound socket).
    std::string bytes;  // Truncated to `max_bytes` + 1 when longer, so the caller can refuse it.
  };
  // The next waiting datagram, without blocking; nullopt when none waits.
  std::optional<Datagram> receive(size_t max_bytes);

 private:
  LocalLane(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}

  int fd_;
  std::string address_;
  std::string buffer_;  // Reused across receive() calls.
};

}  // namespace pdserve::kvtransfer
