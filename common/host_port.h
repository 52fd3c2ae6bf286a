// HOST:PORT addresses as the flags, gRPC, ZeroMQ and cpp-httplib spell them: an IPv6 host is
// written in brackets ("[::1]:50051"), which the socket APIs want without. One parser, so the
// worker's flags, its router registration, kvtransfer endpoints and the CLI agree on IPv6.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve {

struct HostPort {
  std::string host;  // Without brackets.
  std::string port;
};

// Splits at the last colon and drops the host's brackets; InvalidArgument when there is no
// host, no colon or no port.
StatusOr<HostPort> split_host_port(std::string_view host_port);

// `host` as it goes before ":PORT": in brackets when it is an IPv6 address not yet bracketed.
std::string bracket_host(std::string_view host);

}  // namespace pdserve
