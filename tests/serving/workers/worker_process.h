// A worker process for the multi-process serving tests: pdserve-prefill or pdserve-decode
// started with fork/exec, its stdout read until the READY line (which names its gRPC address),
// its stderr kept in a log file. Every wait is bounded; the destructor kills what still runs.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace pdserve::testing {

class WorkerProcess {
 public:
  // Starts `binary` with `args`; stderr goes to `log`.
  WorkerProcess(const std::string& binary, std::vector<std::string> args, const std::filesystem::path& log)
      : log_(log) {
    args.insert(args.begin(), binary);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (pipe(out) != 0) return;
    const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err, STDERR_FILENO);
      close(out[0]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    close(err);
    stdout_ = out[0];
    fcntl(stdout_, F_SETFL, O_NONBLOCK);
  }
  ~WorkerProcess() {
    if (stdout_ >= 0) close(stdout_);
    kill9();
  }
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Waits for "READY grpc=HOST:PORT ..."; false on timeout or exit.
  bool wait_ready(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{stdout_, POLLIN, 0};
      poll(&p, 1, 20);
      char buf[4096];
      ssize_t n;
      while ((n = read(stdout_, buf, sizeof buf)) > 0) out_.append(buf, size_t(n));
      const size_t at = out_.find("READY grpc=");
      if (at != std::string::npos) {
        const size_t end = out_.find_first_of(" \n", at + 11);
        if (end != std::string::npos) {
          address_ = out_.substr(at + 11, end - at - 11);
          return true;
        }
      }
      if (n == 0) return false;  // The process closed stdout: it exited.
    }
    return false;
  }
  const std::string& address() const { return address_; }
  const std::filesystem::path& log() const { return log_; }

  void kill9() {
    if (pid_ <= 0 || reaped_) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  // SIGTERM, then the exit status within `timeout` (-1 if it had to be killed).
  int terminate(std::chrono::milliseconds timeout) {
    if (pid_ <= 0 || reaped_) return -1;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill9();
    return -1;
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int stdout_ = -1;
  bool reaped_ = false;
  std::string out_;
  std::string address_;
};

}  // namespace pdserve::testing
