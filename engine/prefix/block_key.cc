#include "engine/prefix/block_key.h"

#include <openssl/sha.h>

#include <algorithm>

namespace pdserve::engine {

namespace {

// Builds a canonical little-endian message and hashes it.
class Message {
 public:
  Message& bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    return *this;
  }
  Message& text(std::string_view s) { return bytes(s.data(), s.size()); }
  Message& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
    return *this;
  }
  Message& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
    return *this;
  }
  Message& key(const BlockKey& k) { return bytes(k.bytes.data(), k.bytes.size()); }
  BlockKey digest() const {
    uint8_t full[SHA256_DIGEST_LENGTH];
    SHA256(buf_.data(), buf_.size(), full);
    BlockKey k;
    std::copy(full, full + k.bytes.size(), k.bytes.begin());
    return k;
  }
  void clear() { buf_.clear(); }

 private:
  std::vector<uint8_t> buf_;
};

}  // namespace

std::string BlockKey::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(32);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

BlockKey key_root(const KeyRootInputs& in) {
  return Message()
      .text("pdserve/kv-root/v1")
      .u64(in.kv_spec_fingerprint)
      .bytes(in.weights_digest.data(), in.weights_digest.size())
      .u32(in.block_size)
      .u32(uint32_t(in.secret.size()))
      .text(in.secret)
      .digest();
}

std::string canonical_namespace(std::string_view cache_salt, std::string_view adapter) {
  if (cache_salt.empty() && adapter.empty()) return "";
  return std::string("salt=").append(cache_salt).append(";adapter=").append(adapter);
}

BlockKey namespace_root(const BlockKey& root, std::string_view ns) {
  if (ns.empty()) return root;
  return Message().text("pdserve/kv-ns/v1").key(root).u32(uint32_t(ns.size())).text(ns).digest();
}

BlockKey chain_key(const BlockKey& parent, std::span<const int32_t> tokens) {
  static constexpr uint8_t kBlockTag = 0x02;
  static constexpr uint8_t kNoExtra[16] = {};
  Message m;
  m.bytes(&kBlockTag, 1).key(parent).bytes(kNoExtra, sizeof(kNoExtra));
  for (int32_t t : tokens) m.u32(uint32_t(t));
  return m.digest();
}

void extend_block_keys(std::vector<BlockKey>& keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                       int block_size, int max_blocks, const BlockKeyFn& key_fn) {
  if (block_size <= 0) return;
  const size_t n = std::min<size_t>(tokens.size() / size_t(block_size), size_t(std::max(0, max_blocks)));
  keys.reserve(n);
  while (keys.size() < n) {
    const BlockKey& parent = keys.empty() ? ns_root : keys.back();
    keys.push_back(key_fn(parent, tokens.subspan(keys.size() * size_t(block_size), size_t(block_size))));
  }
}

std::vector<BlockKey> block_keys(const BlockKey& ns_root, std::span<const int32_t> tokens, int block_size,
                                 int max_blocks) {
  std::vector<BlockKey> keys;
  extend_block_keys(keys, ns_root, tokens, block_size, max_blocks, chain_key);
  return keys;
}

}  // namespace pdserve::engine
