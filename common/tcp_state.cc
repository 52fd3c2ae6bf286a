#include "common/tcp_state.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pdserve {
namespace {

// Writes `addr` into a sock_diag address (4 big-endian words); the family it parsed as.
StatusOr<int> put_address(const std::string& addr, __be32 out[4]) {
  std::memset(out, 0, 4 * sizeof(__be32));
  if (inet_pton(AF_INET, addr.c_str(), out) == 1) return AF_INET;
  if (inet_pton(AF_INET6, addr.c_str(), out) == 1) return AF_INET6;
  return absl::InvalidArgumentError(absl::StrCat("'", addr, "' is not a numeric IP address"));
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

StatusOr<TcpConnectionState> tcp_connection_state(const std::string& local_addr, int local_port,
                                                  const std::string& remote_addr, int remote_port) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } ask{};
  PD_ASSIGN_OR_RETURN(const int family, put_address(local_addr, ask.request.id.idiag_src));
  PD_ASSIGN_OR_RETURN(const int remote_family, put_address(remote_addr, ask.request.id.idiag_dst));
  if (family != remote_family)
    return absl::InvalidArgumentError(absl::StrCat(local_addr, " and ", remote_addr, " are of different families"));
  ask.header.nlmsg_len = sizeof(ask);
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST;  // One connection by its address pair, not a dump.
  ask.request.sdiag_family = uint8_t(family);
  ask.request.sdiag_protocol = IPPROTO_TCP;
  ask.request.idiag_states = ~0u;
  ask.request.id.idiag_sport = htons(uint16_t(local_port));
  ask.request.id.idiag_dport = htons(uint16_t(remote_port));
  ask.request.id.idiag_cookie[0] = ask.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  Fd nl{::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)};
  if (nl.fd < 0) return absl::UnavailableError(absl::StrCat("sock_diag netlink socket: ", std::strerror(errno)));
  timeval timeout{0, 100000};  // The kernel answers at once; never hold the caller up long.
  ::setsockopt(nl.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl.fd, &ask, sizeof ask, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return absl::UnavailableError(absl::StrCat("sock_diag request: ", std::strerror(errno)));
  alignas(nlmsghdr) char buffer[8192];
  const ssize_t got = ::recv(nl.fd, buffer, sizeof buffer, 0);
  if (got < 0) return absl::UnavailableError(absl::StrCat("sock_diag answer: ", std::strerror(errno)));
  int left = int(got);
  for (auto* h = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
    if (h->nlmsg_type == NLMSG_ERROR) {
      const int error = -reinterpret_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
      if (error == ENOENT) return TcpConnectionState::kNotFound;
      return absl::UnavailableError(absl::StrCat("sock_diag: ", std::strerror(error)));
    }
    if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
      const auto* msg = reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      if (msg->id.idiag_dport != ask.request.id.idiag_dport ||
          std::memcmp(msg->id.idiag_dst, ask.request.id.idiag_dst, sizeof msg->id.idiag_dst) != 0)
        return TcpConnectionState::kNotFound;  // The listener, not the connection.
      return msg->idiag_state == TCP_ESTABLISHED ? TcpConnectionState::kEstablished
                                                 : TcpConnectionState::kClosedByPeer;
    }
  }
  return absl::UnavailableError("sock_diag: no answer about the connection");
}

}  // namespace pdserve
