// CURVE security for the kvtransfer control channel: one cluster key (a CurveZMQ key pair that
// every worker of the cluster holds) encrypts and authenticates every control connection. Each
// ROUTER is a CURVE server with the cluster key; each DEALER a CURVE client with the same pair;
// a ZAP handler (ZeroMQ's authentication hook, one per channel context) admits only clients
// that proved they hold the cluster's secret key, so a process without it can neither read nor
// send a notification. Keys are Z85 text (40 characters), as `pdserve kv-keygen` prints them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <zmq.hpp>

#include "common/status.h"

namespace pdserve::kvtransfer {

struct CurveKey {
  std::string secret_z85;  // 40 characters.
  std::string public_z85;  // Derived from the secret.
  std::string public_raw;  // 32 bytes, as ZAP requests carry a client's key.
};

// The key pair of a Z85 secret key (surrounding whitespace ignored); InvalidArgument if it is
// not one.
StatusOr<CurveKey> parse_curve_key(std::string_view secret_z85);
// A new random secret key, Z85.
StatusOr<std::string> new_curve_secret();

// Sets a socket up as a CURVE server (`server`) or client of the cluster key.
void apply_curve(zmq::socket_t& socket, const CurveKey& key, bool server);

// Answers ZeroMQ's authentication requests for the sockets of one context. Bind it before any
// CURVE server socket of that context binds; call answer() whenever its socket is readable.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, CurveKey key);
  zmq::socket_t& socket() { return socket_; }
  // Answers every queued request: 200 for a CURVE client with the cluster key, 400 otherwise.
  void answer();
  // Clients turned away since creation.
  uint64_t refused() const { return refused_; }

 private:
  CurveKey key_;
  zmq::socket_t socket_;
  uint64_t refused_ = 0;
};

}  // namespace pdserve::kvtransfer
