// Who a failed KV transfer is attributed to. When one side of a transfer dies, the side still
// alive fails too, and reports it; a router that blamed the reporter would mark a healthy worker
// down (one kill -9 of a decode worker took its only prefill worker out with it). So a failure
// caused by the remote side — the peer could not be reached, was lost, or its data path failed —
// carries a status payload saying so; workers pass it on to the router as the gRPC trailing
// metadata `pdserve-fault: peer`, and the router marks down the peer instead.
#pragma once

#include <string_view>

#include "common/status.h"

namespace pdserve::kvtransfer {

// The trailing-metadata key and value a worker sends for a peer fault.
inline constexpr std::string_view kFaultMetadataKey = "pdserve-fault";
inline constexpr std::string_view kPeerFault = "peer";

// `s` marked as the remote side's fault (unchanged when OK).
Status peer_fault(Status s);
// Whether `s` is marked as the remote side's fault.
bool is_peer_fault(const Status& s);
// peer_fault(s) when `s` says the peer could not be reached or answer in time (Unavailable,
// DeadlineExceeded); `s` itself otherwise (a refused handshake or a geometry mismatch is no
// dead peer).
Status unreachable_peer(Status s);

}  // namespace pdserve::kvtransfer
