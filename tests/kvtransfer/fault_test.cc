// Fault attribution (kvtransfer/fault.h): a failure marked as the peer's stays so, and only an
// unreachable peer (not a refused handshake or a mismatch) is marked by unreachable_peer.
#include <gtest/gtest.h>

#include "kvtransfer/fault.h"

namespace pdserve::kvtransfer {
namespace {

TEST(Fault, PeerFaultsAreMarkedAndKeepTheirCodeAndMessage) {
  const Status lost = peer_fault(absl::UnavailableError("peer rank 0/1 lost"));
  EXPECT_TRUE(is_peer_fault(lost));
  EXPECT_TRUE(absl::IsUnavailable(lost));
  EXPECT_EQ(lost.message(), "peer rank 0/1 lost");
  EXPECT_FALSE(is_peer_fault(absl::UnavailableError("my own rank failed")));
  EXPECT_TRUE(peer_fault(absl::OkStatus()).ok());
  EXPECT_FALSE(is_peer_fault(absl::OkStatus()));
  Status copy = lost;  // Statuses are passed around by value: the mark travels with them.
  EXPECT_TRUE(is_peer_fault(copy));
}

TEST(Fault, OnlyAnUnreachablePeerIsItsFault) {
  EXPECT_TRUE(is_peer_fault(unreachable_peer(absl::UnavailableError("no handshake answer"))));
  EXPECT_TRUE(is_peer_fault(unreachable_peer(absl::DeadlineExceededError("connect timed out"))));
  EXPECT_FALSE(is_peer_fault(unreachable_peer(absl::InvalidArgumentError("is DECODE rank 1/2, expected rank 0/2"))));
  EXPECT_FALSE(is_peer_fault(unreachable_peer(absl::FailedPreconditionError("compat hash differs"))));
}

}  // namespace
}  // namespace pdserve::kvtransfer
