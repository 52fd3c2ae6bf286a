// Processes for the multi-process router tests: `pdserve up` clusters, hand-started workers and
// routers (anything that prints "READY grpc=... [http=...]"), free loopback ports, and the
// `pdserve` CLI run to completion. Every wait is bounded and every child is killed on the way out.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/command_output.h"
#include "tests/engine/test_model.h"

namespace pdserve::testing {

using namespace std::chrono_literals;

inline const std::string kBin = std::string(PDSERVE_BINARY_DIR) + "/tools/pdserve";

inline bool port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

// A port p with p and p+1 free (the router's gRPC and HTTP ports), below Linux's ephemeral
// range (32768+), where the many client sockets of parallel tests would take it meanwhile.
inline int free_port_pair() {
  std::mt19937 rng(std::random_device{}() ^ unsigned(getpid()));
  for (int i = 0; i < 200; ++i) {
    const int p = 20000 + int(rng() % 6000) * 2;
    if (port_free(p) && port_free(p + 1)) return p;
  }
  return 0;
}

// A child process that prints "READY grpc=..." when it serves (`pdserve up`, a worker, the
// router): waits for that line; stops it (SIGTERM, then SIGKILL). Its stderr goes to `log`, kept
// afterwards, or when none is given to a temporary file removed with the process.
class Process {
 public:
  explicit Process(std::vector<std::string> args, std::filesystem::path log = {})
      : log_(std::move(log)), keep_log_(!log_.empty()) {
    static int counter = 0;
    if (log_.empty()) {
      log_ = std::filesystem::temp_directory_path() /
             ("pdserve_proc_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".log");
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (pipe(out) != 0) return;
    const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
    out_ = out[0];
    fcntl(out_, F_SETFL, O_NONBLOCK);
  }
  ~Process() {
    stop(10s);
    if (out_ >= 0) close(out_);
    if (!keep_log_) std::filesystem::remove(log_);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Waits for "READY grpc=... [http=...]"; false on timeout or exit.
  bool wait_ready(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string buf;
    while (std::chrono::steady_clock::now() < deadline) {
      char b[1024];
      ssize_t n;
      while ((n = read(out_, b, sizeof b)) > 0) buf.append(b, size_t(n));
      const size_t at = buf.find("READY grpc=");
      const size_t nl = buf.find('\n', at);
      if (at != std::string::npos && nl != std::string::npos) {
        std::istringstream line(buf.substr(at, nl - at));
        std::string word;
        while (line >> word) {
          if (word.rfind("grpc=", 0) == 0) grpc_ = word.substr(5);
          if (word.rfind("http=", 0) == 0) http_port_ = std::stoi(word.substr(word.rfind(':') + 1));
          if (word.rfind("probe=", 0) == 0) probe_port_ = std::stoi(word.substr(word.rfind(':') + 1));
        }
        return true;
      }
      if (n == 0 || exited()) return false;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  // SIGTERM and the exit code within `timeout`; SIGKILL and -1 after it.
  int stop(std::chrono::milliseconds timeout) {
    if (pid_ <= 0 || reaped_) return status_;
    ::kill(pid_, SIGTERM);
    return wait_exit(timeout);
  }
  // The exit code within `timeout`, or -1 (and SIGKILL) if it still runs.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (exited()) return status_;
      std::this_thread::sleep_for(20ms);
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
    return -1;
  }
  // SIGKILL at once (a crash, for the fault tests).
  void kill9() {
    if (pid_ <= 0 || reaped_) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  bool exited() {
    if (reaped_) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return reaped_;
  }
  const std::filesystem::path& log_path() const { return log_; }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Child pids of the `up` process (its workers and router).
  std::vector<pid_t> children() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(pid_) + "/children");
    std::vector<pid_t> out;
    pid_t p;
    while (in >> p) out.push_back(p);
    return out;
  }
  const std::string& grpc() const { return grpc_; }
  int http_port() const { return http_port_; }
  int probe_port() const { return probe_port_; }  // A worker's --probe-port, from its READY line.
  pid_t pid() const { return pid_; }

 private:
  std::filesystem::path log_;
  bool keep_log_ = false;
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  int status_ = -1;
  std::string grpc_;
  int http_port_ = 0;
  int probe_port_ = 0;
};

// `pdserve up --model stories260K --port P <args>`.
class Cluster : public Process {
 public:
  // `pdserve up ARGS` on `model` (the bundled stories260K unless given).
  explicit Cluster(std::vector<std::string> args, const std::string& model = stories_bin())
      : Process(up_args(std::move(args), model)) {}

 private:
  static std::vector<std::string> up_args(std::vector<std::string> args, const std::string& model) {
    // P/D tests are about prefill workers and the KV they move: short prompts, which decode-local
    // prefill (the default) keeps off the prefill workers, go there unless a test says otherwise.
    const bool pd = std::find(args.begin(), args.end(), "--prefill") != args.end();
    if (pd && std::find(args.begin(), args.end(), "--local-prefill-tokens") == args.end())
      args.insert(args.end(), {"--local-prefill-tokens", "0"});
    args.insert(args.begin(), {kBin, "up", "--model", model, "--port", std::to_string(free_port_pair())});
    return args;
  }
};

inline CommandOutput pdserve(const std::vector<std::string>& args) {
  std::string cmd = "timeout 60 " + kBin;
  for (const std::string& a : args) cmd += " '" + a + "'";
  return run_command(cmd + " 2>/dev/null");
}


}  // namespace pdserve::testing
