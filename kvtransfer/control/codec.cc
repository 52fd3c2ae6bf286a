#include "kvtransfer/control/codec.h"

namespace pdserve::kvtransfer {
namespace {

Status invalid(const char* type, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(type, ": ", what));
}

Status validate_identity(const char* type, proto::Role role, uint32_t tp_size, uint32_t rank,
                         const std::string& worker_address) {
  if (role != proto::ROLE_PREFILL && role != proto::ROLE_DECODE) {
    return invalid(type, "unknown role");
  }
  if (tp_size == 0) return invalid(type, "tp_size is 0");
  if (rank >= tp_size) return invalid(type, "rank is not below tp_size");
  if (worker_address.empty()) return invalid(type, "no worker address");
  return absl::OkStatus();
}

Status validate_body(const proto::Envelope& e) {
  switch (e.body_case()) {
    case proto::Envelope::kHandshake: {
      const auto& m = e.handshake();
      return validate_identity("handshake", m.role(), m.tp_size(), m.rank(), m.worker_address());
    }
    case proto::Envelope::kHandshakeAck: {
      const auto& m = e.handshake_ack();
      if (!m.accepted()) {
        return m.error().empty() ? invalid("handshake_ack", "refusal without a reason")
                                 : absl::OkStatus();
      }
      return validate_identity("handshake_ack", m.role(), m.tp_size(), m.rank(),
                               m.worker_address());
    }
    case proto::Envelope::kWriteDone:
      if (e.write_done().request_id().empty()) return invalid("write_done", "no request id");
      return absl::OkStatus();
    case proto::Envelope::kRelease: {
      const auto& m = e.release();
      if (m.request_id().empty()) return invalid("release", "no request id");
      if (m.consumer_tp() == 0 || m.consumer_rank() >= m.consumer_tp()) {
        return invalid("release", "consumer rank is not below consumer_tp");
      }
      return absl::OkStatus();
    }
    case proto::Envelope::kAbort:
      if (e.abort().request_id().empty()) return invalid("abort", "no request id");
      return absl::OkStatus();
    case proto::Envelope::kHeartbeat:
      return absl::OkStatus();
    case proto::Envelope::kChecksumRequest: {
      const auto& m = e.checksum_request();
      if (m.request_id().empty()) return invalid("checksum_request", "no request id");
      if (m.consumer_tp() == 0 || m.consumer_rank() >= m.consumer_tp()) {
        return invalid("checksum_request", "consumer rank is not below consumer_tp");
      }
      return absl::OkStatus();
    }
    case proto::Envelope::kBlockChecksums:
      if (e.block_checksums().request_id().empty()) {
        return invalid("block_checksums", "no request id");
      }
      return absl::OkStatus();
    case proto::Envelope::BODY_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("envelope has an unknown or no message type");
}

}  // namespace

std::string encode_envelope(proto::Envelope envelope) {
  envelope.set_version(kControlProtocolVersion);
  return envelope.SerializeAsString();
}

StatusOr<proto::Envelope> decode_envelope(std::string_view bytes, size_t max_bytes) {
  if (bytes.size() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "envelope of ", bytes.size(), " bytes exceeds the limit of ", max_bytes, " bytes"));
  }
  proto::Envelope envelope;
  if (!envelope.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed or truncated envelope (", bytes.size(), " bytes)"));
  }
  if (envelope.version() != kControlProtocolVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported control protocol version ", envelope.version(),
                     " (this build speaks ", kControlProtocolVersion, ")"));
  }
  PD_RETURN_IF_ERROR(validate_body(envelope));
  return envelope;
}

const char* message_type_name(const proto::Envelope& envelope) {
  switch (envelope.body_case()) {
    case proto::Envelope::kHandshake: return "handshake";
    case proto::Envelope::kHandshakeAck: return "handshake_ack";
    case proto::Envelope::kWriteDone: return "write_done";
    case proto::Envelope::kRelease: return "release";
    case proto::Envelope::kAbort: return "abort";
    case proto::Envelope::kHeartbeat: return "heartbeat";
    case proto::Envelope::kChecksumRequest: return "checksum_request";
    case proto::Envelope::kBlockChecksums: return "block_checksums";
    case proto::Envelope::BODY_NOT_SET: break;
  }
  return "unknown";
}

}  // namespace pdserve::kvtransfer
