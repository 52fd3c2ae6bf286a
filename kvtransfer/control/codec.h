// Encoding and strict decoding of control-channel envelopes. Everything that arrives from the
// network goes through decode_envelope(), which refuses (with a status, never a crash) messages
// that are oversized, malformed or truncated, of an unknown protocol version or message type,
// or missing fields their type requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "proto/kvtransfer.pb.h"

namespace pdserve::kvtransfer {

// Bumped on any incompatible change of proto/kvtransfer.proto.
inline constexpr uint32_t kControlProtocolVersion = 2;
// Handshakes carry a few region descriptors of a few hundred bytes each; 1 MiB leaves room
// for many regions while bounding what a bad peer can make us allocate.
inline constexpr size_t kDefaultMaxMessageBytes = 1 << 20;

// Serializes the envelope with the current protocol version stamped in.
std::string encode_envelope(proto::Envelope envelope);

// Parses and validates one envelope received from a peer.
StatusOr<proto::Envelope> decode_envelope(std::string_view bytes,
                                          size_t max_bytes = kDefaultMaxMessageBytes);

// The envelope's message type, for logs ("handshake", "write_done", ...).
const char* message_type_name(const proto::Envelope& envelope);

}  // namespace pdserve::kvtransfer
