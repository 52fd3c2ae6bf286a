// Multi-process integration tests of the UCX transport and the ZeroMQ control channel on
// loopback: real processes (transport_peer), real UCX over shared memory and over tcp, real
// ZeroMQ; no mocks. This process only spawns, kills and waits, so it never holds UCX state
// across fork().
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A transport_peer child process with its stderr in a file; killed if still running at the end.
class Child {
 public:
  Child(std::vector<std::string> args, const std::string& tls, fs::path log) : log_(log) {
    args.insert(args.begin(), TRANSPORT_PEER_PATH);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The environment is built before fork: only exec-safe calls may follow it.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0) env_strings.emplace_back(*e);
    }
    env_strings.push_back("UCX_TLS=" + tls);
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fd, STDERR_FILENO);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    close(fd);
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Exit code, or -1 if it did not exit within `timeout` (the destructor then kills it).
  int wait(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;  // fork() failed.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(5ms);
    }
    return -1;
  }
  void kill9() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  std::string log() const { return read_file(log_); }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  fs::path log_;
};

class TransportProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pdserve-transport-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  Child spawn(const std::string& role, const std::string& mode,
              std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--role", role, "--mode", mode, "--endpoint-file",
                                  (dir_ / "endpoint").string(), "--marker",
                                  (dir_ / "marker").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return Child(args, GetParam(), dir_ / (role + ".log"));
  }

  bool wait_for_marker(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (fs::exists(dir_ / "marker")) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

  fs::path dir_;
};

std::string logs(const Child& a, const Child& b) { return a.log() + "\n" + b.log(); }

TEST_P(TransportProcessTest, PullGetsProducerBytesAfterHandshake) {
  Child producer = spawn("producer", "pull");
  Child consumer = spawn("consumer", "pull");
  EXPECT_EQ(consumer.wait(20s), 0) << logs(producer, consumer);
  EXPECT_EQ(producer.wait(10s), 0) << logs(producer, consumer);
}

TEST_P(TransportProcessTest, PushPutsFlushesThenWriteDone) {
  Child consumer = spawn("consumer", "push");
  Child producer = spawn("producer", "push");
  EXPECT_EQ(producer.wait(20s), 0) << logs(producer, consumer);
  EXPECT_EQ(consumer.wait(10s), 0) << logs(producer, consumer);
}

TEST_P(TransportProcessTest, WrongCompatHashIsRefusedWithClearError) {
  Child producer = spawn("producer", "pull", {"--model", "model-a"});
  Child consumer = spawn("consumer", "pull", {"--model", "model-b"});
  EXPECT_EQ(consumer.wait(20s), 3) << logs(producer, consumer);
  EXPECT_NE(consumer.log().find("incompatible KV geometry"), std::string::npos)
      << consumer.log();
  EXPECT_NE(producer.log().find("refusing handshake"), std::string::npos) << producer.log();
}

// The consumer reads in a loop; the producer is killed mid-transfer; the consumer must see the
// failure (batch error, peer-error callback, or control-channel loss) and exit, not hang.
TEST_P(TransportProcessTest, KillingProducerMidPullFailsConsumerInBoundedTime) {
  Child producer = spawn("producer", "pull-until-error", {"--bytes", "16777216"});
  Child consumer = spawn("consumer", "pull-until-error", {"--bytes", "16777216"});
  ASSERT_TRUE(wait_for_marker(20s)) << logs(producer, consumer);
  producer.kill9();
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(consumer.wait(15s), 0) << consumer.log();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s);
  EXPECT_NE(consumer.log().find("detected peer failure"), std::string::npos) << consumer.log();
}

TEST_P(TransportProcessTest, KillingConsumerMidPushFailsProducerInBoundedTime) {
  Child consumer = spawn("consumer", "push-until-error", {"--bytes", "16777216"});
  Child producer = spawn("producer", "push-until-error", {"--bytes", "16777216"});
  ASSERT_TRUE(wait_for_marker(20s)) << logs(producer, consumer);
  consumer.kill9();
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(producer.wait(15s), 0) << producer.log();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 10s);
  EXPECT_NE(producer.log().find("detected peer failure"), std::string::npos) << producer.log();
}

INSTANTIATE_TEST_SUITE_P(Tls, TransportProcessTest,
                         ::testing::Values("sm,self", "tcp,self"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace pdserve::kvtransfer
