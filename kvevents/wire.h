// The KV-event wire helpers shared by the publisher and every consumer (docs/kv_events.md):
// the topic, the big-endian seq frame, the replay request and end marker, and the
// conversions between engine keys and tiers and their protobuf forms.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "engine/prefix/block_key.h"
#include "engine/prefix/kv_event_sink.h"
#include "proto/kvevents.pb.h"

namespace pdserve::kvevents {

// Frame 2 of a replay's end marker ([topic, kEndSeq, ""]).
inline constexpr uint64_t kEndSeq = UINT64_MAX;
// Frame 1 of a replay request: [REPLAY, epoch u64 BE, from_seq u64 BE].
inline constexpr std::string_view kReplayVerb = "REPLAY";
// Key scheme prefix of KvEventBatch.key_scheme (then the 16-byte key root).
inline constexpr std::string_view kKeySchemeV1 = "sha256-128/v1";

std::string topic_for(std::string_view worker_id);  // "kv/<worker_id>"
// The worker id of a topic, or nullopt when it is not a KV-event topic.
std::optional<std::string> worker_of_topic(std::string_view topic);

std::string encode_u64(uint64_t v);  // 8 bytes, big-endian.
// nullopt unless `bytes` is exactly 8 bytes.
std::optional<uint64_t> decode_u64(std::string_view bytes);

std::string key_bytes(const engine::BlockKey& k);
// nullopt unless `bytes` is exactly 16 bytes.
std::optional<engine::BlockKey> key_from_bytes(std::string_view bytes);

Tier to_proto(engine::KvTier tier);
// nullopt for TIER_UNSPECIFIED or an unknown value.
std::optional<engine::KvTier> from_proto(Tier tier);

}  // namespace pdserve::kvevents
