// Prefix-cache block keys: the 128-bit name of a full KV block's content, chained from the
// keys of the blocks before it, so that equal keys mean equal token prefixes (up to a 2^-64
// collision chance at 2^32 blocks, which the engine's exact token check on every hit turns
// into a counted miss). The engine's cache, its KV events and the router's index all compute
// keys with these functions, so there is one key space. The encoding is canonical binary with
// published golden vectors (docs/prefix_caching.md), so that any language can reproduce it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::engine {

struct BlockKey {
  std::array<uint8_t, 16> bytes{};

  bool operator==(const BlockKey&) const = default;
  auto operator<=>(const BlockKey&) const = default;
  std::string hex() const;  // 32 lowercase hex digits.
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine_contiguous(std::move(h), k.bytes.data(), k.bytes.size());
  }
};

// What a key root covers: two engines share keys only when all of it is equal.
struct KeyRootInputs {
  uint64_t kv_spec_fingerprint = 0;          // engine::KvCacheSpec::fingerprint(): geometry, dtypes.
  std::array<uint8_t, 32> weights_digest{};  // engine::weights_digest(): which checkpoint.
  uint32_t block_size = 0;
  std::string secret;  // Optional per-deployment salt (--kv-hash-secret-file); may be empty.
};

// K("pdserve/kv-root/v1" ‖ u64le fingerprint ‖ digest ‖ u32le block_size ‖ u32le |secret| ‖ secret),
// where K(x) is the first 16 bytes of SHA-256(x).
BlockKey key_root(const KeyRootInputs& in);

// A request's namespace (its cache salt; an adapter id later), canonically
// "salt=<cache_salt>;adapter=<adapter>". Requests share blocks only within one namespace.
std::string canonical_namespace(std::string_view cache_salt, std::string_view adapter = "");

// The chain's start for a namespace: `root` itself for the empty namespace (no salt, no
// adapter), else K("pdserve/kv-ns/v1" ‖ root ‖ u32le |ns| ‖ ns).
BlockKey namespace_root(const BlockKey& root, std::string_view ns);

// K(0x02 ‖ parent ‖ 16 zero bytes (extra: multimodal later) ‖ u32le tokens...): the key of a
// block holding `tokens` whose predecessor's key is `parent` (the namespace root for block 0).
BlockKey chain_key(const BlockKey& parent, std::span<const int32_t> tokens);

// How a block's key follows from its parent's and its tokens: chain_key, or a test's stand-in
// (PrefixCacheOptions::key_fn).
using BlockKeyFn = std::function<BlockKey(const BlockKey& parent, std::span<const int32_t> tokens)>;

// Appends to `keys` (the keys of tokens' leading blocks so far) the keys of the following full
// blocks of `tokens`, chained from `ns_root`, until there are min(max_blocks, |tokens| /
// block_size): the one chaining loop of the engine, its sequences and lookups alike.
void extend_block_keys(std::vector<BlockKey>& keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                       int block_size, int max_blocks, const BlockKeyFn& key_fn);

// The keys of the first min(max_blocks, |tokens| / block_size) full blocks of `tokens`,
// chained from `ns_root` by chain_key.
std::vector<BlockKey> block_keys(const BlockKey& ns_root, std::span<const int32_t> tokens, int block_size,
                                 int max_blocks = 1 << 30);

}  // namespace pdserve::engine
