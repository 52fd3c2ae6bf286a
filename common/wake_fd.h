// WakeFd: an eventfd that one thread blocks on (in poll(), beside its sockets) and any thread
// signals, so that work posted from elsewhere ends the wait at once instead of at the next
// timeout. Signals coalesce: one drain() consumes every signal since the last.
#pragma once

namespace pdserve {

class WakeFd {
 public:
  // Aborts the process if the kernel refuses an eventfd (nothing could wake the owner then).
  WakeFd();
  ~WakeFd();
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  // Makes fd() readable until the next drain(). Thread-safe and async-signal-safe.
  void signal() const;
  // Consumes the pending signals; true if there were any. Never blocks.
  bool drain() const;
  // For poll()/zmq_poll(): readable while a signal is pending.
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace pdserve
