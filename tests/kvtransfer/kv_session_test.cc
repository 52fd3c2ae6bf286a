// Multi-process integration tests of kvtransfer sessions: a producer and a consumer kv_peer
// process, each holding TP groups of 1, 2, 4 and 8 ranks, move a synthetic KV cache that
// mixes per-layer geometries (tests/kvtransfer/kv_sim.h's mixed spec) over real UCX and
// ZeroMQ on loopback, in push and pull mode, for every (producer TP, consumer TP) pair; the
// consumer verifies every element of its blocks. Deliberately wrong planning (geometry, rank
// map) must make the same check fail, and bad input must be refused.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/kvtransfer/kv_process.h"

namespace pdserve::kvtransfer::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kProducerBlocks = "2,3,7,5";
constexpr const char* kConsumerBlocks = "6,7,0,2";

struct Outcome {
  int ready_ok = 0;     // Consumer ranks ready with every element right.
  int ready_wrong = 0;  // Consumer ranks ready with wrong elements.
  int consumer_failed = 0;
  int producer_complete = 0;
  int producer_failed = 0;
  bool first_token = false;  // Some consumer rank got the first token 42.
  std::string text;
};

class SessionProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pdserve-kvsession-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<PeerProcess> spawn(const std::string& role, std::vector<std::string> extra = {},
                                     const std::string& tls = "sm,self") {
    std::vector<std::string> args{"--role", role, "--tps", "1,2,4,8", "--blocks", "8"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = std::make_unique<PeerProcess>(args, tls, dir_ / (role + std::to_string(++spawned_) + ".log"));
    EXPECT_TRUE(p->start(30s)) << p->log();
    return p;
  }

  // Waits until every rank of both groups reported the request, then summarizes.
  Outcome finish(PeerProcess& producer, PeerProcess& consumer, const std::string& id, int P,
                 int C, std::chrono::milliseconds timeout) {
    const std::string ev = "EVENT " + id + " ";
    const bool done = consumer.wait_until(
        [&] {
          return producer.count(ev) >= static_cast<size_t>(P) &&
                 consumer.count(ev) >= static_cast<size_t>(C);
        },
        timeout);
    Outcome o;
    for (const auto& l : consumer.lines(ev)) {
      // Right elements in the sent blocks, and no byte changed in the skipped ones.
      if (l.find(" ready wrong=0 touched=0 ") != std::string::npos) ++o.ready_ok;
      else if (l.find(" ready ") != std::string::npos) ++o.ready_wrong;
      else ++o.consumer_failed;
      if (l.find("first=42") != std::string::npos) o.first_token = true;
    }
    for (const auto& l : producer.lines(ev)) {
      if (l.find(" complete ") != std::string::npos) ++o.producer_complete;
      else ++o.producer_failed;
    }
    o.text = absl::StrCat(done ? "" : "TIMED OUT\n", "producer:\n", producer.output(),
                          "\nconsumer:\n", consumer.output());
    return o;
  }

  bool all_acked(PeerProcess& p, const std::string& id, int n) {
    const std::string ack = "ACK " + id + " ";
    if (!p.wait_until([&] { return p.count(ack) >= static_cast<size_t>(n); }, 10s)) return false;
    for (const auto& l : p.lines(ack)) {
      if (l.find(" OK") == std::string::npos) return false;
    }
    return true;
  }

  // Generous default leases: a transfer that works is not slowed by them, and a loaded test
  // machine must not turn a slow transfer into a failure.
  Outcome push(PeerProcess& producer, PeerProcess& consumer, const std::string& id, int P, int C,
               int lease_ms = 30000, int skip = 0) {
    const std::string skip_word = skip > 0 ? absl::StrCat(" skip=", skip) : "";
    consumer.send(absl::StrCat("expect ", id, " ", C, " ", P, " ", lease_ms, " ",
                               producer.endpoints(P), " ", kConsumerBlocks, skip_word));
    EXPECT_TRUE(all_acked(consumer, id, C)) << consumer.output();
    producer.send(absl::StrCat("push ", id, " ", P, " ", C, " ", lease_ms, " ",
                               consumer.endpoints(C), " ", kProducerBlocks, " ", kConsumerBlocks,
                               skip_word));
    return finish(producer, consumer, id, P, C, std::chrono::milliseconds(lease_ms) + 10s);
  }

  Outcome pull(PeerProcess& producer, PeerProcess& consumer, const std::string& id, int P, int C,
               int lease_ms = 30000, int skip = 0) {
    producer.send(absl::StrCat("hold ", id, " ", P, " ", C, " ", lease_ms, " ", kProducerBlocks));
    EXPECT_TRUE(all_acked(producer, id, P)) << producer.output();
    consumer.send(absl::StrCat("pull ", id, " ", C, " ", P, " ", lease_ms / 2, " ",
                               producer.endpoints(P), " ", kProducerBlocks, " ", kConsumerBlocks,
                               skip > 0 ? absl::StrCat(" skip=", skip) : ""));
    return finish(producer, consumer, id, P, C, std::chrono::milliseconds(lease_ms) + 10s);
  }

  fs::path dir_;
  int spawned_ = 0;
};

void expect_verified(const Outcome& o, int P, int C, const char* mode) {
  EXPECT_EQ(o.ready_ok, C) << mode << " " << P << "->" << C << "\n" << o.text;
  EXPECT_EQ(o.producer_complete, P) << mode << " " << P << "->" << C << "\n" << o.text;
}

class SessionMatrixTest
    : public SessionProcessTest,
      public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {};

// Every (P, C) in {1,2,4,8}², through one producer and one consumer process. A process pair
// runs one mode: with shared memory, UCX 1.13 refuses an endpoint in one direction next to an
// existing one in the other ("asymmetric endpoint configuration"; see docs/kvtransfer.md).
TEST_P(SessionMatrixTest, EveryTpPairArrivesBitIdentical) {
  const auto& [tls, mode] = GetParam();
  auto producer = spawn("producer", {}, tls);
  auto consumer = spawn("consumer", {}, tls);
  for (int P : {1, 2, 4, 8}) {
    for (int C : {1, 2, 4, 8}) {
      const std::string id = absl::StrCat(mode, "-p", P, "c", C);
      if (mode == "push") {
        const Outcome o = push(*producer, *consumer, id, P, C);
        expect_verified(o, P, C, "push");
        EXPECT_TRUE(o.first_token) << o.text;
      } else {
        expect_verified(pull(*producer, *consumer, id, P, C), P, C, "pull");
      }
      // Every producer rank gave its blocks back; the ready consumer ranks kept theirs.
      EXPECT_TRUE(producer->wait_until(
          [&] { return producer->count("RELEASED " + id + " ") == static_cast<size_t>(P); }, 5s))
          << producer->output();
      EXPECT_EQ(consumer->count("RELEASED " + id + " "), 0u);
    }
  }
  EXPECT_EQ(producer->quit(10s), 0) << producer->log();
  EXPECT_EQ(consumer->quit(10s), 0) << consumer->log();
  // No rank kept a request open, refused a message or saw a lease expire.
  for (PeerProcess* p : {producer.get(), consumer.get()}) {
    EXPECT_EQ(p->count("COUNTERS "), 15u);
    for (const auto& l : p->lines("COUNTERS ")) {
      EXPECT_NE(l.find("refused=0 "), std::string::npos) << l;
      EXPECT_NE(l.find("expired=0 "), std::string::npos) << l;
      EXPECT_NE(l.find("open=0"), std::string::npos) << l;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    TlsMode, SessionMatrixTest,
    ::testing::Combine(::testing::Values("sm,self", "tcp,self"), ::testing::Values("push", "pull")),
    [](const auto& info) {
      return (std::get<0>(info.param) == "sm,self" ? std::string("shm_") : std::string("tcp_")) +
             std::get<1>(info.param);
    });

TEST_F(SessionProcessTest, DebugChecksumsVerifyInPushMode) {
  auto producer = spawn("producer", {"--checksums", "1"});
  auto consumer = spawn("consumer", {"--checksums", "1"});
  for (auto [P, C] : {std::pair{2, 4}, {8, 2}, {1, 1}}) {
    expect_verified(push(*producer, *consumer, absl::StrCat("ck", P, C), P, C), P, C, "push");
  }
}

TEST_F(SessionProcessTest, DebugChecksumsVerifyInPullMode) {
  auto producer = spawn("producer", {"--checksums", "1"});
  auto consumer = spawn("consumer", {"--checksums", "1"});
  for (auto [P, C] : {std::pair{2, 4}, {8, 2}, {4, 8}, {1, 1}}) {
    const std::string id = absl::StrCat("ckpull", P, C);
    expect_verified(pull(*producer, *consumer, id, P, C), P, C, "pull");
    EXPECT_TRUE(producer->wait_until(
        [&] { return producer->count("RELEASED " + id + " ") == static_cast<size_t>(P); }, 5s))
        << producer->output();
  }
  EXPECT_EQ(producer->quit(10s), 0) << producer->log();
  EXPECT_EQ(consumer->quit(10s), 0) << consumer->log();
  for (PeerProcess* p : {producer.get(), consumer.get()}) {
    for (const auto& l : p->lines("COUNTERS ")) {
      EXPECT_NE(l.find("refused=0 "), std::string::npos) << l;
      EXPECT_NE(l.find("open=0"), std::string::npos) << l;
    }
  }
}

// Every consumer rank fails because of a checksum mismatch: its own (DATA_LOSS), or another
// rank's that reached it as an abort through a producer rank, whichever came first.
void expect_checksum_failures(const std::vector<std::string>& events) {
  bool data_loss = false;
  for (const auto& l : events) {
    EXPECT_NE(l.find(" failed "), std::string::npos) << l;
    EXPECT_NE(l.find("checksum mismatch in consumer block"), std::string::npos) << l;
    EXPECT_NE(l.find("between producer rank"), std::string::npos) << l;
    data_loss |= l.find("error=DATA_LOSS: ") != std::string::npos;
  }
  EXPECT_TRUE(data_loss);
}

TEST_F(SessionProcessTest, CorruptedByteFailsThePushWithDataLoss) {
  auto producer = spawn("producer", {"--checksums", "1"});
  auto consumer = spawn("consumer", {"--checksums", "1", "--corrupt", "1"});
  const Outcome o = push(*producer, *consumer, "ckbadpush", 2, 4);
  EXPECT_EQ(o.consumer_failed, 4) << o.text;
  expect_checksum_failures(consumer->lines("EVENT ckbadpush "));
  // The producers had finished writing: they complete; the failed consumers give theirs back.
  EXPECT_TRUE(consumer->wait_until([&] { return consumer->count("RELEASED ckbadpush ") == 4u; },
                                   10s))
      << consumer->output();
  EXPECT_TRUE(producer->wait_until([&] { return producer->count("RELEASED ckbadpush ") == 2u; },
                                   10s))
      << producer->output();
}

// A byte corrupted on the way (flipped by the consumer after its reads, before the check) fails
// the pull with DATA_LOSS naming the block and ranks, and every block still comes back on both
// sides: the producer frees on the consumer's abort, well inside the lease.
TEST_F(SessionProcessTest, CorruptedByteFailsThePullWithDataLoss) {
  auto producer = spawn("producer", {"--checksums", "1"});
  auto consumer = spawn("consumer", {"--checksums", "1", "--corrupt", "1"});
  for (auto [P, C] : {std::pair{2, 4}, {8, 2}, {1, 1}}) {
    const std::string id = absl::StrCat("ckbad", P, C);
    const auto start = std::chrono::steady_clock::now();
    const Outcome o = pull(*producer, *consumer, id, P, C);
    EXPECT_EQ(o.consumer_failed, C) << o.text;
    EXPECT_EQ(o.producer_complete, 0) << o.text;
    expect_checksum_failures(consumer->lines("EVENT " + id + " "));
    EXPECT_TRUE(producer->wait_until(
        [&] { return producer->count("RELEASED " + id + " ") == static_cast<size_t>(P); }, 10s))
        << producer->output();
    EXPECT_TRUE(consumer->wait_until(
        [&] { return consumer->count("RELEASED " + id + " ") == static_cast<size_t>(C); }, 10s))
        << consumer->output();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "freed only at the lease";
  }
  EXPECT_EQ(producer->quit(10s), 0) << producer->log();
  EXPECT_EQ(consumer->quit(10s), 0) << consumer->log();
  for (PeerProcess* p : {producer.get(), consumer.get()}) {
    for (const auto& l : p->lines("COUNTERS ")) {
      EXPECT_NE(l.find("expired=0 "), std::string::npos) << l;
      EXPECT_NE(l.find("open=0"), std::string::npos) << l;
    }
  }
}

// The mutation tests: the same end-to-end check must fail when the planning side uses a wrong
// geometry or rank map. In pull mode the consumer plans alone, so the element check is the only
// line of defence; in push mode the consumer's re-planned count usually trips first.
class SessionMutationTest : public SessionProcessTest,
                            public ::testing::WithParamInterface<const char*> {};

TEST_P(SessionMutationTest, WrongPlanningFailsTheCheck) {
  const std::string how = GetParam();
  // A rotated map needs two producer ranks; flipped orders only matter when the TP sizes
  // differ (with equal TP whole block parts move, whatever the order inside them).
  const std::vector<std::pair<int, int>> pairs =
      how == "layer0"   ? std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {4, 8}, {8, 2}}
      : how == "order"  ? std::vector<std::pair<int, int>>{{1, 2}, {4, 8}, {8, 2}}
                        : std::vector<std::pair<int, int>>{{2, 2}, {4, 8}, {8, 2}};
  {  // Pull: the consumer plans wrongly.
    auto producer = spawn("producer");
    auto consumer = spawn("consumer", {"--mutate", how});
    for (auto [P, C] : pairs) {
      const Outcome o = pull(*producer, *consumer, absl::StrCat("m-pull-", P, C), P, C, 4000);
      EXPECT_LT(o.ready_ok, C) << how << " pull " << P << "->" << C << "\n" << o.text;
      if (how == "order") {
        // Same sizes, same heads: every get succeeds, and only the data check catches it.
        EXPECT_GT(o.ready_wrong, 0) << o.text;
      }
    }
  }
  {  // Push: the producer plans wrongly.
    auto producer = spawn("producer", {"--mutate", how});
    auto consumer = spawn("consumer");
    for (auto [P, C] : pairs) {
      const Outcome o = push(*producer, *consumer, absl::StrCat("m-push-", P, C), P, C, 3000);
      EXPECT_LT(o.ready_ok, C) << how << " push " << P << "->" << C << "\n" << o.text;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Mutations, SessionMutationTest,
                         ::testing::Values("layer0", "order", "rotate"));

// The control: the unmutated processes pass the very same pairs (the mutation test would be
// vacuous if these failed too).
TEST_F(SessionProcessTest, UnmutatedControlPassesTheSamePairs) {
  for (const char* mode : {"pull", "push"}) {
    auto producer = spawn("producer");
    auto consumer = spawn("consumer");
    for (auto [P, C] : {std::pair{1, 1}, {2, 2}, {4, 8}, {8, 2}}) {
      const std::string id = absl::StrCat("c-", mode, P, C);
      expect_verified(std::string(mode) == "pull" ? pull(*producer, *consumer, id, P, C)
                                                  : push(*producer, *consumer, id, P, C),
                      P, C, mode);
    }
  }
}

// Prefix reuse: a transfer from request block k on moves exactly blocks [k, n). The consumer's
// first k blocks hold a sentinel (its "prefix cache") that must be untouched, the rest must be
// bit-identical, and every count (the producer's seal, the consumer's re-planned check) covers
// only the sent blocks, or the request would fail. Equal and heterogeneous TP, push and pull,
// with debug checksums on so that they too cover only [k, n).
TEST_F(SessionProcessTest, SkipBlocksMovesOnlyTheSuffix) {
  for (const char* mode : {"push", "pull"}) {
    auto producer = spawn("producer", {"--checksums", "1"});
    auto consumer = spawn("consumer", {"--checksums", "1"});
    for (auto [P, C] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 2}}) {
      for (int k : {1, 3, 4}) {
        const std::string id = absl::StrCat("skip-", mode, "-p", P, "c", C, "k", k);
        const Outcome o = std::string(mode) == "push" ? push(*producer, *consumer, id, P, C, 30000, k)
                                                      : pull(*producer, *consumer, id, P, C, 30000, k);
        expect_verified(o, P, C, mode);
      }
    }
    EXPECT_EQ(producer->quit(10s), 0) << producer->log();
    EXPECT_EQ(consumer->quit(10s), 0) << consumer->log();
    for (PeerProcess* p : {producer.get(), consumer.get()}) {
      for (const auto& l : p->lines("COUNTERS ")) EXPECT_NE(l.find("refused=0 "), std::string::npos) << l;
    }
  }
}

// The two sides disagreeing on k is caught: the consumer refuses the WRITE_DONE and fails.
TEST_F(SessionProcessTest, SkipBlocksMismatchFailsThePush) {
  auto producer = spawn("producer");
  auto consumer = spawn("consumer");
  consumer->send(absl::StrCat("expect skipbad 2 1 30000 ", producer->endpoints(1), " ", kConsumerBlocks,
                              " skip=2"));
  ASSERT_TRUE(all_acked(*consumer, "skipbad", 2)) << consumer->output();
  producer->send(absl::StrCat("push skipbad 1 2 30000 ", consumer->endpoints(2), " ", kProducerBlocks, " ",
                              kConsumerBlocks, " skip=1"));
  ASSERT_TRUE(consumer->wait_until([&] { return consumer->count("EVENT skipbad ") == 2u; }, 20s))
      << consumer->output();
  for (const auto& l : consumer->lines("EVENT skipbad ")) {
    EXPECT_NE(l.find(" failed "), std::string::npos) << l;
    EXPECT_NE(l.find("skipped 1 blocks"), std::string::npos) << l;
  }
}

TEST_F(SessionProcessTest, BlockIdsOutOfRangeAreRefusedAndLogged) {
  auto producer = spawn("producer");
  auto consumer = spawn("consumer");
  consumer.get()->send("expect bad1 2 2 2000 - 1,99");
  producer->send("hold bad2 2 2 2000 -1,3");
  producer->send(absl::StrCat("push bad3 2 2 2000 ", consumer->endpoints(2), " 1,2 8,0"));
  consumer->send(absl::StrCat("pull bad4 2 2 2000 ", producer->endpoints(2), " 1,2 3,3"));
  ASSERT_TRUE(consumer->wait_until([&] { return consumer->count("ACK bad") >= 4; }, 10s));
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("ACK bad") >= 4; }, 10s));
  for (PeerProcess* p : {producer.get(), consumer.get()}) {
    for (const auto& l : p->lines("ACK bad")) {
      if (l.find("ACK bad3 ") == 0) continue;
      EXPECT_TRUE(l.find("OUT_OF_RANGE") != std::string::npos ||
                  l.find("listed twice") != std::string::npos)
          << l;
    }
  }
  // bad3's consumer ids are outside the consumer's arena, which the producer learns only from
  // the handshake of its first dial to it: that dial does not block the rank, so the request is
  // registered, then fails with OUT_OF_RANGE and gives its blocks back.
  ASSERT_TRUE(producer->wait_until(
      [&] { return producer->count("EVENT bad3 ") >= 2 && producer->count("RELEASED bad3 ") >= 2; }, 10s))
      << producer->output();
  for (const auto& l : producer->lines("EVENT bad3 ")) EXPECT_NE(l.find("OUT_OF_RANGE"), std::string::npos) << l;
  // The others were refused before anything was registered: nothing to release.
  EXPECT_EQ(producer->count("RELEASED bad2"), 0u);
  // Once the consumer is known, the same ids are refused at once.
  producer->send(absl::StrCat("push bad5 2 2 2000 ", consumer->endpoints(2), " 1,2 8,0"));
  ASSERT_TRUE(producer->wait_until([&] { return producer->count("ACK bad5 ") >= 2; }, 10s));
  for (const auto& l : producer->lines("ACK bad5 ")) EXPECT_NE(l.find("OUT_OF_RANGE"), std::string::npos) << l;
  EXPECT_EQ(producer->count("RELEASED bad5"), 0u);
  EXPECT_EQ(consumer->quit(10s), 0);
  EXPECT_EQ(producer->quit(10s), 0);
  EXPECT_NE(consumer->log().find("refused: OUT_OF_RANGE"), std::string::npos) << consumer->log();
  EXPECT_NE(producer->log().find("refused: OUT_OF_RANGE"), std::string::npos) << producer->log();
}

TEST_F(SessionProcessTest, WrongCompatHashIsRefusedAndTheRequestFailsCleanly) {
  auto producer = spawn("producer");
  auto consumer = spawn("consumer", {"--model", "another-model"});
  consumer->send("expect h1 2 2 3000 - 6,7");
  producer->send(absl::StrCat("push h1 2 2 3000 ", consumer->endpoints(2), " 2,3 6,7"));
  // Both ranks' releases and failure events, in whichever order they print.
  ASSERT_TRUE(producer->wait_until(
      [&] { return producer->count("RELEASED h1 ") >= 2 && producer->count("EVENT h1 ") >= 2; }, 10s))
      << producer->output();
  // The refusal ends the (non-blocking) dial, after begin_push registered the request.
  for (const auto& l : producer->lines("EVENT h1 ")) {
    EXPECT_NE(l.find("incompatible KV geometry"), std::string::npos) << l;
  }
  EXPECT_EQ(producer->count("EVENT h1 "), 2u) << producer->output();
  EXPECT_EQ(consumer->quit(10s), 0);
  EXPECT_NE(consumer->log().find("refusing handshake"), std::string::npos) << consumer->log();
}

}  // namespace
}  // namespace pdserve::kvtransfer::testing
