// The one conversion between absl::Status (what pdserve's modules return) and grpc::Status
// (what crosses an RPC): the codes are the same numbers in both, so only the message moves.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "common/status.h"

namespace pdserve {

// The gRPC status for an absl status (same code, same message).
grpc::Status to_grpc(const Status& s);
// The absl status for a gRPC status, its message prefixed by `what` ("Prefill on host:port").
Status from_grpc(const grpc::Status& s, const std::string& what);

}  // namespace pdserve
