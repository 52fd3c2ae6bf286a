// A kv_peer child process for the multi-process kvtransfer tests: started with fork/exec, fed
// line commands on stdin, its stdout lines collected, its stderr kept in a log file. Every
// wait is bounded; the destructor kills the child if it is still running.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace pdserve::kvtransfer::testing {

class PeerProcess {
 public:
  PeerProcess(std::vector<std::string> args, const std::string& tls, std::filesystem::path log)
      : log_(std::move(log)) {
    args.insert(args.begin(), KV_PEER_PATH);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0) env.emplace_back(*e);
    }
    env.push_back("UCX_TLS=" + tls);
    if (!getenv("PDSERVE_LOG_LEVEL")) env.push_back("PDSERVE_LOG_LEVEL=info");
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return;
    const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(err, STDERR_FILENO);
      close(in[1]);
      close(out[0]);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err);
    stdin_ = in[1];
    stdout_ = out[0];
    fcntl(stdout_, F_SETFL, O_NONBLOCK);
  }
  ~PeerProcess() {
    if (stdin_ >= 0) close(stdin_);
    if (stdout_ >= 0) close(stdout_);
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  void send(const std::string& line) {
    const std::string l = line + "\n";
    if (write(stdin_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) return;
  }

  // Reads lines until `done` holds over everything read so far, or `timeout` passed.
  bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (done()) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{stdout_, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 20)));
      read_available();
    }
  }

  // Lines that start with `prefix` (read so far).
  std::vector<std::string> lines(const std::string& prefix) {
    read_available();
    std::vector<std::string> out;
    for (const auto& l : lines_) {
      if (l.rfind(prefix, 0) == 0) out.push_back(l);
    }
    return out;
  }
  size_t count(const std::string& prefix) { return lines(prefix).size(); }

  // Waits for READY and returns the control endpoints by (tp, rank).
  bool start(std::chrono::milliseconds timeout) {
    if (!wait_until([&] { return count("READY") > 0; }, timeout)) return false;
    for (const auto& l : lines("ENDPOINT ")) {
      std::istringstream in(l.substr(9));
      int tp = 0, rank = 0;
      std::string ep;
      in >> tp >> rank >> ep;
      auto& v = endpoints_[tp];
      if (static_cast<int>(v.size()) <= rank) v.resize(rank + 1);
      v[rank] = ep;
    }
    return true;
  }
  // Comma-separated endpoints of the TP group `tp`.
  std::string endpoints(int tp) const {
    std::string out;
    for (const auto& e : endpoints_.at(tp)) out += (out.empty() ? "" : ",") + e;
    return out;
  }

  void signal(int sig) { kill(pid_, sig); }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  // Asks the child to quit; returns its exit code, or -1 (then kills it) after `timeout`.
  int quit(std::chrono::milliseconds timeout) {
    send("quit");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      read_available();
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        read_available();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      usleep(5000);
    }
    return -1;
  }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    return s.size() > 6000 ? "..." + s.substr(s.size() - 6000) : s;
  }
  std::string output() {
    read_available();
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out.size() > 6000 ? "..." + out.substr(out.size() - 6000) : out;
  }

 private:
  void read_available() {
    char buf[65536];
    while (true) {
      const ssize_t n = read(stdout_, buf, sizeof(buf));
      if (n <= 0) break;
      partial_.append(buf, n);
    }
    size_t pos;
    while ((pos = partial_.find('\n')) != std::string::npos) {
      lines_.push_back(partial_.substr(0, pos));
      partial_.erase(0, pos + 1);
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int stdin_ = -1, stdout_ = -1;
  std::filesystem::path log_;
  std::string partial_;
  std::vector<std::string> lines_;
  std::map<int, std::vector<std::string>> endpoints_;
};

}  // namespace pdserve::kvtransfer::testing
