#include "common/wake_fd.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pdserve {

WakeFd::WakeFd() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) {
    std::fprintf(stderr, "fatal: eventfd: %s\n", std::strerror(errno));
    std::abort();
  }
}

WakeFd::~WakeFd() { close(fd_); }

void WakeFd::signal() const {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: the fd is readable anyway.
  while (write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

bool WakeFd::drain() const {
  uint64_t count = 0;
  ssize_t n;
  while ((n = read(fd_, &count, sizeof count)) < 0 && errno == EINTR) {
  }
  return n == sizeof count && count > 0;
}

}  // namespace pdserve
