#include "tune/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace pdserve::tune {

StatusOr<ChildProcess> ChildProcess::start(const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to start");
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError("cannot open " + log_path);
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(log);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  ::close(log);
  ChildProcess c;
  c.pid_ = pid;
  return c;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_), exit_code_(other.exit_code_) {
  other.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    stop(std::chrono::seconds(5));
    pid_ = other.pid_;
    exit_code_ = other.exit_code_;
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { stop(std::chrono::seconds(5)); }

bool ChildProcess::exited() {
  if (pid_ < 0) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
  exit_code_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  pid_ = -1;
  return true;
}

Status ChildProcess::wait(Duration timeout) {
  // A child's exit is not an fd to poll without a pidfd; a short tick is cheap next to the
  // seconds these programs run.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exited()) {
    if (std::chrono::steady_clock::now() >= deadline) return absl::DeadlineExceededError("still running");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::OkStatus();
}

void ChildProcess::stop(Duration grace) {
  if (pid_ < 0) return;
  kill(pid_, SIGTERM);
  if (!wait(grace).ok()) {
    kill(pid_, SIGKILL);
    (void)wait(std::chrono::seconds(10));
  }
}

}  // namespace pdserve::tune
