// The kernel's view of one TCP connection of this host, found by its address pair through the
// sock_diag netlink interface. A server library that hands its handler neither the socket nor a
// "connection closed" query (Debian 12's cpp-httplib 0.11) still lets the handler learn that its
// client went away: the connection leaves ESTABLISHED once the client closes or resets it.
#pragma once

#include <string>

#include "common/status.h"

namespace pdserve {

enum class TcpConnectionState {
  kEstablished,   // Both sides open.
  kClosedByPeer,  // Found, but no longer established: the peer closed or reset it.
  // The kernel knows no such connection, or answered about another socket (its lookup falls
  // back to the listener): gone — or not visible to sock_diag at all, which a caller that never
  // saw the connection established cannot tell apart.
  kNotFound,
};

// The state of the TCP connection from `local_addr`:`local_port` to `remote_addr`:`remote_port`
// (numeric IPv4 or IPv6 addresses, as the server saw them). Unavailable when the kernel cannot
// be asked (no sock_diag in this sandbox), InvalidArgument for an address that is not numeric.
StatusOr<TcpConnectionState> tcp_connection_state(const std::string& local_addr, int local_port,
                                                  const std::string& remote_addr, int remote_port);

}  // namespace pdserve
