// Fault tests of kvtransfer sessions with real producer and consumer processes (kv_peer) over
// UCX shared memory and ZeroMQ: kill -9 of either side mid-transfer, a lost notification in
// each mode, a peer that never answers, and aborts from either side. In every case both
// survivors give every block back within the lease (plus the quarantine where a remote peer
// could still touch them), nothing hangs, and the survivor reports a clear error.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/kvtransfer/kv_process.h"

namespace pdserve::kvtransfer::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kTp = 2;
// Allowance over the protocol's own bounds (lease, quarantine, timeouts) for a loaded machine.
constexpr auto kSlack = 3s;

class SessionFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pdserve-kvfault-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<PeerProcess> spawn(const std::string& role, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--role", role, "--tps", std::to_string(kTp), "--blocks", "8",
                                  "--peer-timeout-ms", "1000", "--connect-timeout-ms", "1000",
                                  "--quarantine-ms", "500"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = std::make_unique<PeerProcess>(args, "sm,self", dir_ / (role + ".log"));
    EXPECT_TRUE(p->start(30s)) << p->log();
    return p;
  }

  // Waits until every rank of `p` reported the request failed and released its blocks;
  // returns the failure lines.
  std::vector<std::string> failed_and_released(PeerProcess& p, const std::string& id,
                                               std::chrono::milliseconds within) {
    const bool done = p.wait_until(
        [&] {
          return p.count("EVENT " + id + " ") >= kTp && p.count("RELEASED " + id + " ") >= kTp;
        },
        within);
    EXPECT_TRUE(done) << "blocks not back within " << within.count() << " ms\n"
                      << p.output() << p.log();
    std::vector<std::string> lines = p.lines("EVENT " + id + " ");
    for (const auto& l : lines) EXPECT_NE(l.find(" failed "), std::string::npos) << l;
    return lines;
  }

  std::string expect_cmd(PeerProcess& producer, const std::string& id, int lease_ms) {
    return absl::StrCat("expect ", id, " ", kTp, " ", kTp, " ", lease_ms, " ",
                        producer.endpoints(kTp), " 6,7");
  }
  std::string push_cmd(PeerProcess& consumer, const std::string& id, int lease_ms,
                       const std::string& extra = "") {
    return absl::StrCat("push ", id, " ", kTp, " ", kTp, " ", lease_ms, " ",
                        consumer.endpoints(kTp), " 2,3 6,7 ", extra);
  }

  fs::path dir_;
};

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines) {
    if (l.find(what) == std::string::npos) return false;
  }
  return !lines.empty();
}

TEST_F(SessionFaultTest, ConsumerKilledMidPushProducerFailsAndFreesWithinLease) {
  auto producer = spawn("producer", {"--layer-delay-ms", "300"});
  auto consumer = spawn("consumer");
  consumer->send(expect_cmd(*producer, "k1", 8000));
  ASSERT_TRUE(consumer->wait_until([&] { return consumer->count("ACK k1 ") == kTp; }, 10s));
  const auto start = Clock::now();
  producer->send(push_cmd(*consumer, "k1", 8000));
  // Layer 1 on both ranks: 300 ms in, the (non-blocking) dial to the consumer has long ended.
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("POSTED k1 ") >= 2 * 2; }, 10s));
  consumer->kill9();
  const auto lines = failed_and_released(*producer, "k1", 8000ms + kSlack);
  EXPECT_LT(Clock::now() - start, 8000ms + kSlack);
  EXPECT_TRUE(mentions(lines, "lost")) << producer->output();
  EXPECT_EQ(producer->quit(10s), 0);
}

TEST_F(SessionFaultTest, ProducerKilledMidPushConsumerFailsAndFreesWithinLease) {
  auto producer = spawn("producer");
  auto consumer = spawn("consumer");
  consumer->send(expect_cmd(*producer, "k2", 4000));
  ASSERT_TRUE(consumer->wait_until([&] { return consumer->count("ACK k2 ") == kTp; }, 10s));
  const auto start = Clock::now();
  producer->send(push_cmd(*consumer, "k2", 4000, "stall=1"));
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("POSTED k2 ") >= 2 * 2; }, 10s));
  producer->kill9();
  // The consumer learns of the death from the heartbeats at once, but a silent producer could
  // be paused rather than dead, so its blocks come back at lease + quarantine.
  const auto lines = failed_and_released(*consumer, "k2", 4500ms + kSlack);
  EXPECT_LT(Clock::now() - start, 4000ms + 500ms + kSlack);
  // The consumer's own dial to the producer (expect_push binds the fan-in without blocking) may
  // still have been in its handshake on a loaded machine: then that ended it.
  for (const auto& l : lines) {
    EXPECT_TRUE(l.find("lost") != std::string::npos || l.find("closed during the handshake") != std::string::npos)
        << l;
  }
  EXPECT_FALSE(lines.empty());
  EXPECT_EQ(consumer->quit(10s), 0);
}

TEST_F(SessionFaultTest, LostWriteDoneFailsTheConsumerAtItsLease) {
  auto producer = spawn("producer", {"--drop-notifications", "1"});
  auto consumer = spawn("consumer");
  consumer->send(expect_cmd(*producer, "l1", 2000));
  ASSERT_TRUE(consumer->wait_until([&] { return consumer->count("ACK l1 ") == kTp; }, 10s));
  const auto start = Clock::now();
  producer->send(push_cmd(*consumer, "l1", 2000));
  // The producer believes it is done; the consumer never sees a sealed count, so it must not
  // serve the request. The producer answers its abort, so the blocks need no quarantine.
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("RELEASED l1 ") == kTp; }, 10s));
  const auto lines = failed_and_released(*consumer, "l1", 2000ms + kSlack);
  EXPECT_LT(Clock::now() - start, 2000ms + kSlack);
  EXPECT_TRUE(mentions(lines, "lease expired")) << consumer->output();
  EXPECT_EQ(consumer->quit(10s), 0);
  EXPECT_EQ(producer->quit(10s), 0);
  EXPECT_GE(producer->count("COUNTERS "), 1u);
}

TEST_F(SessionFaultTest, LostReleaseFreesTheProducerAtLeasePlusQuarantine) {
  auto producer = spawn("producer");
  auto consumer = spawn("consumer", {"--drop-notifications", "1"});
  const auto start = Clock::now();
  producer->send(absl::StrCat("hold r1 ", kTp, " ", kTp, " 2000 2,3"));
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("ACK r1 ") == kTp; }, 10s));
  consumer->send(absl::StrCat("pull r1 ", kTp, " ", kTp, " 1000 ", producer->endpoints(kTp),
                              " 2,3 6,7"));
  ASSERT_TRUE(consumer->wait_until([&] { return consumer->count("EVENT r1 ") == kTp; }, 10s));
  for (const auto& l : consumer->lines("EVENT r1 ")) {
    EXPECT_NE(l.find(" ready wrong=0 "), std::string::npos) << l;
  }
  const auto lines = failed_and_released(*producer, "r1", 2500ms + kSlack);
  EXPECT_LT(Clock::now() - start, 2500ms + kSlack);
  EXPECT_TRUE(mentions(lines, "lease expired")) << producer->output();
}

TEST_F(SessionFaultTest, ConsumerThatNeverAnswersFailsThePushAtOnce) {
  auto producer = spawn("producer");
  auto consumer = spawn("consumer");
  consumer->signal(SIGSTOP);
  const auto start = Clock::now();
  producer->send(push_cmd(*consumer, "n1", 10000));
  const auto lines = failed_and_released(*producer, "n1", 1000ms + kSlack);
  EXPECT_LT(Clock::now() - start, 1000ms + kSlack);
  EXPECT_TRUE(mentions(lines, "no handshake answer")) << producer->output();
  consumer->signal(SIGCONT);
}

// The control channel dials without blocking the rank's thread: while one push waits on a
// consumer that never answers (SIGSTOP: its kernel accepts the connection, nobody handshakes),
// a push from the same producer ranks to a healthy consumer completes at once, and the first
// fails with a clear error at its connect timeout, not before.
TEST_F(SessionFaultTest, PeerThatNeverAnswersStallsOnlyItsOwnRequests) {
  constexpr auto kConnectTimeout = 4000ms;
  auto producer = spawn("producer", {"--connect-timeout-ms", "4000"});
  auto healthy = spawn("consumer");
  std::vector<std::string> args{"--role", "consumer", "--tps", std::to_string(kTp), "--blocks", "8"};
  auto stopped = std::make_unique<PeerProcess>(args, "sm,self", dir_ / "stopped.log");
  ASSERT_TRUE(stopped->start(30s)) << stopped->log();
  healthy->send(expect_cmd(*producer, "h1", 20000));
  ASSERT_TRUE(healthy->wait_until([&] { return healthy->count("ACK h1 ") == kTp; }, 10s));
  stopped->signal(SIGSTOP);
  const auto start = Clock::now();
  producer->send(push_cmd(*stopped, "b1", 20000));
  producer->send(push_cmd(*healthy, "h1", 20000));
  ASSERT_TRUE(healthy->wait_until([&] { return healthy->count("EVENT h1 ") == kTp; }, kConnectTimeout));
  EXPECT_LT(Clock::now() - start, kConnectTimeout / 2) << producer->output();
  for (const auto& l : healthy->lines("EVENT h1 ")) EXPECT_NE(l.find(" ready wrong=0 "), std::string::npos) << l;
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("EVENT h1 ") == kTp; }, 10s));
  EXPECT_EQ(producer->count("EVENT b1 "), 0u) << producer->output();  // Still dialing.
  const auto lines = failed_and_released(*producer, "b1", kConnectTimeout + kSlack);
  EXPECT_GE(Clock::now() - start, kConnectTimeout - 100ms);
  EXPECT_TRUE(mentions(lines, "no handshake answer")) << producer->output();
  stopped->signal(SIGCONT);
}

TEST_F(SessionFaultTest, ProducerThatNeverAnswersFailsThePullBothSidesFree) {
  auto producer = spawn("producer");
  auto consumer = spawn("consumer");
  producer->send(absl::StrCat("hold n2 ", kTp, " ", kTp, " 2500 2,3"));
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("ACK n2 ") == kTp; }, 10s));
  producer->signal(SIGSTOP);
  const auto start = Clock::now();
  consumer->send(absl::StrCat("pull n2 ", kTp, " ", kTp, " 2000 ", producer->endpoints(kTp),
                              " 2,3 6,7"));
  const auto lines = failed_and_released(*consumer, "n2", 1000ms + kSlack);
  EXPECT_LT(Clock::now() - start, 1000ms + kSlack);
  EXPECT_TRUE(mentions(lines, "no handshake answer")) << consumer->output();
  producer->signal(SIGCONT);
  const auto held = failed_and_released(*producer, "n2", 3000ms + kSlack);
  EXPECT_TRUE(mentions(held, "lease expired")) << producer->output();
}

TEST_F(SessionFaultTest, AbortFromEitherSideFreesBothSidesPromptly) {
  for (const char* side : {"consumer", "producer"}) {
    auto producer = spawn("producer");
    auto consumer = spawn("consumer");
    const std::string id = absl::StrCat("a-", side);
    consumer->send(expect_cmd(*producer, id, 10000));
    ASSERT_TRUE(consumer->wait_until([&] { return consumer->count("ACK " + id) == kTp; }, 10s));
    const auto start = Clock::now();
    producer->send(push_cmd(*consumer, id, 10000, "stall=2"));
    ASSERT_TRUE(producer->wait_until([&] { return producer->count("POSTED " + id) >= 6; }, 10s));
    PeerProcess& aborter = std::string(side) == "consumer" ? *consumer : *producer;
    aborter.send(absl::StrCat("abort ", id, " ", kTp));
    const auto p = failed_and_released(*producer, id, kSlack);
    const auto c = failed_and_released(*consumer, id, kSlack);
    // Well within the 10 s lease: the abort and its answer replace the quarantine.
    EXPECT_LT(Clock::now() - start, kSlack) << side;
    EXPECT_TRUE(mentions(p, "abort")) << producer->output();
    EXPECT_TRUE(mentions(c, "abort")) << consumer->output();
    // The side that was aborted says its peer did it (a push producer that already answered its
    // Prefill can blame only this way).
    const bool consumer_aborted = std::string(side) == "consumer";
    EXPECT_TRUE(mentions(consumer_aborted ? p : c, "Fault='peer'"))
        << (consumer_aborted ? producer->output() : consumer->output());
  }
}

}  // namespace
}  // namespace pdserve::kvtransfer::testing
