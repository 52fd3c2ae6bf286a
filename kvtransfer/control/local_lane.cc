#include "kvtransfer/control/local_lane.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pdserve::kvtransfer {
namespace {

// sockaddr_un for an abstract address (leading NUL, no terminator); false if it does not fit.
bool abstract_address(const std::string& name, sockaddr_un& addr, socklen_t& length) {
  if (name.empty() || name.size() + 1 > sizeof(addr.sun_path)) return false;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return true;
}

std::string random_name() {
  std::random_device device;
  std::string name = "pdserve-kv-";
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&name, "%08x", device());
  return name;
}

}  // namespace

StatusOr<std::unique_ptr<LocalLane>> LocalLane::open() {
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("local lane: socket: ", std::strerror(errno)));
  // 128 random bits: a name already bound (EADDRINUSE) is as good as impossible, but retried.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::string name = random_name();
    sockaddr_un addr;
    socklen_t length = 0;
    abstract_address(name, addr, length);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), length) == 0) {
      return std::unique_ptr<LocalLane>(new LocalLane(fd, name));
    }
    if (errno != EADDRINUSE) break;
  }
  const int error = errno;
  ::close(fd);
  return absl::UnavailableError(absl::StrCat("local lane: bind: ", std::strerror(error)));
}

LocalLane::~LocalLane() { ::close(fd_); }

Status LocalLane::send(const std::string& address, const std::string& bytes) const {
  sockaddr_un addr;
  socklen_t length = 0;
  if (!abstract_address(address, addr, length)) {
    return absl::UnavailableError(absl::StrCat("local lane: unusable address of ", address.size(), " bytes"));
  }
  const ssize_t sent = ::sendto(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&addr), length);
  if (sent == static_cast<ssize_t>(bytes.size())) return absl::OkStatus();
  const int error = sent < 0 ? errno : EMSGSIZE;
  switch (error) {
    case EAGAIN:
    case ENOBUFS:
    case EMSGSIZE:
      return absl::ResourceExhaustedError(absl::StrCat("local lane: ", std::strerror(error)));
    default:  // ECONNREFUSED, ENOENT: nobody bound there, seen from here.
      return absl::UnavailableError(absl::StrCat("local lane: ", std::strerror(error)));
  }
}

std::optional<LocalLane::Datagram> LocalLane::receive(size_t max_bytes) {
  buffer_.resize(max_bytes + 1);
  sockaddr_un addr;
  socklen_t length = sizeof(addr);
  const ssize_t got = ::recvfrom(fd_, buffer_.data(), buffer_.size(), MSG_DONTWAIT,
                                 reinterpret_cast<sockaddr*>(&addr), &length);
  if (got < 0) return std::nullopt;  // EAGAIN: nothing waits (nothing else can fail here).
  Datagram datagram;
  const size_t path = offsetof(sockaddr_un, sun_path);
  if (length > path + 1 && addr.sun_path[0] == '\0') {
    datagram.from.assign(addr.sun_path + 1, length - path - 1);
  }
  datagram.bytes.assign(buffer_.data(), static_cast<size_t>(got));
  return datagram;
}

}  // namespace pdserve::kvtransfer
