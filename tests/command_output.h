// Running a shell command from a test and keeping what it printed: the CLI and cluster tests
// drive the pdserve programs this way.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace pdserve::testing {

struct CommandOutput {
  int exit_code = -1;  // 128 + the signal when a signal ended it.
  std::string out;     // Its standard output.
};

// Runs `cmd` through /bin/sh and waits for it.
inline CommandOutput run_command(const std::string& cmd) {
  CommandOutput run;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) run.out.append(buf.data(), n);
  const int status = pclose(p);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace pdserve::testing
