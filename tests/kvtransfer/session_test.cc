// Unit tests of the per-request session state machine (kvtransfer/session.h): sealing, count
// checks, duplicates, leases, quarantine and the exactly-once block release, on a FakeClock.
#include "kvtransfer/fault.h"
#include "kvtransfer/session.h"

#include <gtest/gtest.h>

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

struct Released {
  int calls = 0;
  std::vector<int> blocks;
  BlockReleaseFn fn() {
    return [this](const std::string&, std::vector<int> b) {
      ++calls;
      blocks = std::move(b);
    };
  }
};

class SessionTest : public ::testing::Test {
 protected:
  Session make(SessionSide side, TransferMode mode, std::vector<int> peers) {
    return Session("r1", side, mode, {3, 4}, std::move(peers), clock_.now() + 10s, 1s,
                   released_.fn());
  }
  FakeClock clock_;
  Released released_;
};

// The role each (side, mode) pair plays, fixed with the session: who posts the data ops and
// whose blocks the peer touches.
TEST_F(SessionTest, EachSideAndModeHasOneRole) {
  struct Case {
    SessionSide side;
    TransferMode mode;
    TransferRole role;
    bool posts_ops;
    const char* name;
  };
  const Case cases[] = {
      {SessionSide::kProducer, TransferMode::kPush, TransferRole::kPushProducer, true, "push producer"},
      {SessionSide::kConsumer, TransferMode::kPush, TransferRole::kPushConsumer, false, "push consumer"},
      {SessionSide::kProducer, TransferMode::kPull, TransferRole::kPullProducer, false, "pull producer"},
      {SessionSide::kConsumer, TransferMode::kPull, TransferRole::kPullConsumer, true, "pull consumer"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(transfer_role(c.side, c.mode), c.role) << c.name;
    EXPECT_EQ(posts_ops(c.role), c.posts_ops) << c.name;
    EXPECT_STREQ(transfer_role_name(c.role), c.name);
    const Session s = make(c.side, c.mode, {0});
    EXPECT_EQ(s.role(), c.role) << c.name;
    EXPECT_EQ(s.remote_access(), !c.posts_ops) << c.name;
  }
}

TEST_F(SessionTest, PushProducerCompletesOnlyAfterSealAndEveryLeg) {
  Session s = make(SessionSide::kProducer, TransferMode::kPush, {0, 1});
  ASSERT_TRUE(s.add_scheduled(0, 5).ok());
  ASSERT_TRUE(s.add_scheduled(1, 2).ok());
  EXPECT_FALSE(s.add_scheduled(7, 1).ok()) << "rank 7 is not in the fan-out";
  EXPECT_EQ(s.leg_done(0, 5, 5), LegResult::kAccepted);
  EXPECT_EQ(s.state(), SessionState::kActive) << "not sealed yet";
  ASSERT_TRUE(s.seal().ok());
  EXPECT_FALSE(s.seal().ok());
  EXPECT_FALSE(s.add_scheduled(0, 1).ok()) << "no write after the seal";
  EXPECT_EQ(s.scheduled(0), 5u);
  EXPECT_FALSE(s.maybe_release(clock_.now()));
  EXPECT_EQ(s.leg_done(1, 2, 2), LegResult::kAccepted);
  EXPECT_EQ(s.state(), SessionState::kComplete);
  EXPECT_TRUE(s.maybe_release(clock_.now()));
  EXPECT_FALSE(s.maybe_release(clock_.now()));
  EXPECT_EQ(released_.calls, 1);
  EXPECT_EQ(released_.blocks, (std::vector<int>{3, 4}));
  EXPECT_TRUE(s.finished());
}

TEST_F(SessionTest, PushProducerWithEmptyFanOutCompletesAtSeal) {
  Session s = make(SessionSide::kProducer, TransferMode::kPush, {});
  ASSERT_TRUE(s.seal().ok());
  EXPECT_EQ(s.state(), SessionState::kComplete);
}

TEST_F(SessionTest, ConsumerReadyNeedsMatchingCountFromEveryFanInRank) {
  Session s = make(SessionSide::kConsumer, TransferMode::kPush, {0, 1});
  EXPECT_EQ(s.leg_done(0, 4, 4), LegResult::kAccepted);
  EXPECT_EQ(s.leg_done(0, 4, 4), LegResult::kDuplicate);
  EXPECT_EQ(s.leg_done(5, 4, 4), LegResult::kUnknownPeer);
  EXPECT_EQ(s.state(), SessionState::kActive);
  EXPECT_EQ(s.leg_done(1, 9, 9), LegResult::kAccepted);
  EXPECT_EQ(s.state(), SessionState::kReady);
  EXPECT_FALSE(s.maybe_release(clock_.now() + 1h)) << "a ready consumer's blocks belong to decode";
  EXPECT_EQ(released_.calls, 0);
  EXPECT_TRUE(s.finished());
}

TEST_F(SessionTest, CountMismatchFailsTheRequest) {
  Session s = make(SessionSide::kConsumer, TransferMode::kPush, {0, 1});
  EXPECT_EQ(s.leg_done(0, 3, 4), LegResult::kMismatch);
  EXPECT_EQ(s.state(), SessionState::kAborted);
  EXPECT_EQ(s.error().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.error().message().find("cannot prove"), std::string::npos);
  EXPECT_EQ(s.leg_done(1, 4, 4), LegResult::kInactive);
}

TEST_F(SessionTest, AbortedPushConsumerWaitsForQuietWritersOrQuarantine) {
  Session s = make(SessionSide::kConsumer, TransferMode::kPush, {0, 1});
  ASSERT_TRUE(s.fail(absl::UnavailableError("producer lost")));
  EXPECT_FALSE(s.fail(absl::InternalError("second")));
  EXPECT_EQ(s.error().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(s.maybe_release(clock_.now())) << "producers may still be writing";
  s.leg_quiet(0);
  EXPECT_FALSE(s.maybe_release(clock_.now()));
  clock_.advance(10s);
  EXPECT_FALSE(s.maybe_release(clock_.now())) << "lease passed, quarantine not yet";
  clock_.advance(1s);
  EXPECT_TRUE(s.maybe_release(clock_.now()));
  EXPECT_EQ(released_.calls, 1);
}

TEST_F(SessionTest, AbortedConsumerReleasesAtOnceWhenEveryWriterConfirmedItStopped) {
  Session s = make(SessionSide::kConsumer, TransferMode::kPush, {0, 1});
  s.fail(absl::AbortedError("x"));
  s.leg_quiet(0);
  s.leg_quiet(1);
  EXPECT_TRUE(s.maybe_release(clock_.now()));
  EXPECT_EQ(released_.calls, 1);
}

TEST_F(SessionTest, LocalOpsAreNeverForcedByTheQuarantine) {
  // A push producer's own puts must end (the endpoint makes them) before its blocks go back.
  Session s = make(SessionSide::kProducer, TransferMode::kPush, {0});
  s.fail(absl::AbortedError("x"));
  clock_.advance(1h);
  EXPECT_FALSE(s.maybe_release(clock_.now()));
  s.leg_quiet(0);
  EXPECT_TRUE(s.maybe_release(clock_.now()));
}

TEST_F(SessionTest, LeaseExpiresOnlyWhileActive) {
  Session s = make(SessionSide::kConsumer, TransferMode::kPull, {0});
  EXPECT_FALSE(s.check_lease(clock_.now()));
  clock_.advance(10s);
  EXPECT_TRUE(s.check_lease(clock_.now()));
  EXPECT_EQ(s.error().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(s.check_lease(clock_.now()));

  Session ready = make(SessionSide::kConsumer, TransferMode::kPull, {0});
  ready.leg_done(0, 0, 0);
  clock_.advance(1h);
  EXPECT_FALSE(ready.check_lease(clock_.now()));
  EXPECT_EQ(ready.state(), SessionState::kReady);
}

// A lease that passes on the side waiting for its peer's word (push consumer, pull producer) is
// the peer's fault (a stalled peer or a lost message: the router re-places the request and
// counts it against the peer); on the side posting the ops it is its own.
TEST_F(SessionTest, AnExpiredLeaseBlamesThePeerOnTheWaitingSide) {
  for (auto [side, mode, peer] : {std::tuple{SessionSide::kConsumer, TransferMode::kPush, true},
                                  {SessionSide::kProducer, TransferMode::kPull, true},
                                  {SessionSide::kProducer, TransferMode::kPush, false},
                                  {SessionSide::kConsumer, TransferMode::kPull, false}}) {
    Session s = make(side, mode, side == SessionSide::kProducer && mode == TransferMode::kPull ? std::vector<int>{}
                                                                                               : std::vector<int>{0});
    clock_.advance(10s);
    ASSERT_TRUE(s.check_lease(clock_.now()));
    EXPECT_EQ(s.error().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(is_peer_fault(s.error()), peer) << transfer_role_name(s.role());
  }
}

TEST_F(SessionTest, PullProducerLearnsFanOutFromFirstReleaseAndFreesAfterAll) {
  Session s = make(SessionSide::kProducer, TransferMode::kPull, {});
  EXPECT_FALSE(s.peers_known());
  EXPECT_EQ(s.leg_done(0, 0, 0), LegResult::kUnknownPeer);
  ASSERT_TRUE(s.set_peers({0, 1}).ok());
  EXPECT_FALSE(s.set_peers({2}).ok());
  EXPECT_EQ(s.leg_done(0, 0, 0), LegResult::kAccepted);
  EXPECT_EQ(s.leg_done(0, 0, 0), LegResult::kDuplicate);
  EXPECT_FALSE(s.maybe_release(clock_.now()));
  EXPECT_EQ(s.leg_done(1, 0, 0), LegResult::kAccepted);
  EXPECT_EQ(s.state(), SessionState::kComplete);
  EXPECT_TRUE(s.maybe_release(clock_.now()));
  EXPECT_EQ(released_.calls, 1);
}

TEST_F(SessionTest, PullProducerWithUnknownFanOutHoldsUntilLeasePlusQuarantine) {
  Session s = make(SessionSide::kProducer, TransferMode::kPull, {});
  clock_.advance(10s);
  EXPECT_TRUE(s.check_lease(clock_.now()));
  EXPECT_FALSE(s.maybe_release(clock_.now())) << "an unknown consumer may still be reading";
  clock_.advance(1s);
  EXPECT_TRUE(s.maybe_release(clock_.now()));
  EXPECT_FALSE(s.maybe_release(clock_.now()));
  EXPECT_EQ(released_.calls, 1);
}

}  // namespace
}  // namespace pdserve::kvtransfer
