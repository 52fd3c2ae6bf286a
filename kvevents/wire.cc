#include "kvevents/wire.h"

#include <algorithm>

namespace pdserve::kvevents {

namespace {
constexpr std::string_view kTopicPrefix = "kv/";
}  // namespace

std::string topic_for(std::string_view worker_id) { return std::string(kTopicPrefix).append(worker_id); }

std::optional<std::string> worker_of_topic(std::string_view topic) {
  if (!topic.starts_with(kTopicPrefix)) return std::nullopt;
  return std::string(topic.substr(kTopicPrefix.size()));
}

std::string encode_u64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(v >> (8 * (7 - i))));
  return out;
}

std::optional<uint64_t> decode_u64(std::string_view bytes) {
  if (bytes.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (char c : bytes) v = (v << 8) | uint8_t(c);
  return v;
}

std::string key_bytes(const engine::BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

std::optional<engine::BlockKey> key_from_bytes(std::string_view bytes) {
  engine::BlockKey k;
  if (bytes.size() != k.bytes.size()) return std::nullopt;
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(k.bytes.data()));
  return k;
}

Tier to_proto(engine::KvTier tier) {
  switch (tier) {
    case engine::KvTier::kDevice: return TIER_DEVICE;
    case engine::KvTier::kHost: return TIER_HOST;
    case engine::KvTier::kDisk: return TIER_DISK;
  }
  return TIER_UNSPECIFIED;
}

std::optional<engine::KvTier> from_proto(Tier tier) {
  switch (tier) {
    case TIER_DEVICE: return engine::KvTier::kDevice;
    case TIER_HOST: return engine::KvTier::kHost;
    case TIER_DISK: return engine::KvTier::kDisk;
    default: return std::nullopt;
  }
}

}  // namespace pdserve::kvevents
