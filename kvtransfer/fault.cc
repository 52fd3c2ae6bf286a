#include "kvtransfer/fault.h"

#include "absl/strings/cord.h"

namespace pdserve::kvtransfer {
namespace {
constexpr const char* kPayloadUrl = "type.pdserve/kvtransfer.Fault";
}  // namespace

Status peer_fault(Status s) {
  if (!s.ok()) s.SetPayload(kPayloadUrl, absl::Cord("peer"));
  return s;
}

bool is_peer_fault(const Status& s) {
  const auto payload = s.GetPayload(kPayloadUrl);
  return payload.has_value() && *payload == "peer";
}

Status unreachable_peer(Status s) {
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) return peer_fault(std::move(s));
  return s;
}

}  // namespace pdserve::kvtransfer
