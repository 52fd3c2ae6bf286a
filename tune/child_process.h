// A child program the tuner runs (`pdserve up` for a topology, `pdserve bench` for a load
// point): started with its output appended to a log file, waited for with a deadline, and
// stopped with SIGTERM (then SIGKILL) so that no process outlives the tuner — the child dies
// with it even on SIGKILL (PR_SET_PDEATHSIG), as `pdserve up`'s own children do.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace pdserve::tune {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr append to `log_path`.
  static StatusOr<ChildProcess> start(const std::vector<std::string>& argv, const std::string& log_path);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();  // Stops it if still running.

  // Whether it has exited (reaping it); its exit code then in exit_code().
  bool exited();
  // Waits up to `timeout` for it to exit; DeadlineExceeded (still running) otherwise.
  Status wait(Duration timeout);
  // SIGTERM, up to `grace` to exit, then SIGKILL; reaps it.
  void stop(Duration grace);
  // The exit status: the code, or 128 + signal; -1 while running.
  int exit_code() const { return exit_code_; }
  pid_t pid() const { return pid_; }

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

}  // namespace pdserve::tune
