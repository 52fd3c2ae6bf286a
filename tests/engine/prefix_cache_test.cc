// The prefix cache's parts on their own: block keys against golden vectors computed by an
// independent implementation (Python's hashlib, docs/prefix_caching.md), the index's exact
// hit checks and descendant invalidation, and the allocator under 100k random operations
// with every invariant checked after each one — with real keys and with keys that all
// collide, where every hit must still hold exactly the KV its request needs.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/block_allocator.h"
#include "engine/prefix/block_key.h"

namespace pdserve::engine {
namespace {

std::array<uint8_t, 32> counting_digest() {
  std::array<uint8_t, 32> d{};
  for (int i = 0; i < 32; ++i) d[size_t(i)] = uint8_t(i);
  return d;
}

std::vector<int32_t> iota(int from, int count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) v[size_t(i)] = from + i;
  return v;
}

TEST(BlockKey, MatchesTheGoldenVectors) {
  const BlockKey root = key_root({0x0123456789abcdefull, counting_digest(), 16, ""});
  EXPECT_EQ(root.hex(), "e735509f1d1a4c44eaccae66cfe275a2");
  EXPECT_EQ(key_root({0x0123456789abcdefull, counting_digest(), 16, "s3cret"}).hex(),
            "f9efa21c0443cad4d0e8a3e8d000ea6b");
  EXPECT_EQ(canonical_namespace("tenant-a"), "salt=tenant-a;adapter=");
  EXPECT_EQ(canonical_namespace(""), "");
  const BlockKey ns = namespace_root(root, canonical_namespace("tenant-a"));
  EXPECT_EQ(ns.hex(), "c9806a28a4df1d9ea3ffffd69b362ced");
  EXPECT_EQ(namespace_root(root, ""), root);
  const std::vector<int32_t> tokens = iota(1, 40);
  const auto keys = block_keys(root, tokens, 16);
  ASSERT_EQ(keys.size(), 2u);  // Only full blocks.
  EXPECT_EQ(keys[0].hex(), "540ccbdf09fb8780df5eb97380e04f8e");
  EXPECT_EQ(keys[1].hex(), "6d5a22fdd294e534f4dde5754cb29e37");
  EXPECT_EQ(block_keys(ns, tokens, 16)[0].hex(), "493aeb759b87e6f523b9acd741874bfb");
  EXPECT_EQ(block_keys(root, tokens, 16, 1).size(), 1u);
}

TEST(BlockKey, EveryRootInputChangesTheKeys) {
  const KeyRootInputs base{7, counting_digest(), 16, ""};
  const BlockKey root = key_root(base);
  KeyRootInputs other = base;
  other.kv_spec_fingerprint = 8;
  EXPECT_NE(key_root(other), root);
  other = base;
  other.weights_digest[31] ^= 1;
  EXPECT_NE(key_root(other), root);
  other = base;
  other.block_size = 32;
  EXPECT_NE(key_root(other), root);
  other = base;
  other.secret = "x";
  EXPECT_NE(key_root(other), root);
}

// The allocator's prefix side through its public interface.
class CachedPool : public ::testing::Test {
 protected:
  static constexpr int kBlock = 4;
  BlockKey ns{};
  std::vector<BlockKey> keys(const std::vector<int32_t>& tokens) { return block_keys(ns, tokens, kBlock); }
  // Caches a request's first `n` blocks as the engine does at a step's end.
  void cache_all(BlockAllocator& a, const std::vector<int>& blocks, const std::vector<int32_t>& tokens, int n) {
    const auto k = keys(tokens);
    std::optional<CachedLink> link;
    for (int i = 0; i < n; ++i) {
      link = a.cache(blocks[size_t(i)], k[size_t(i)], link, ns, uint32_t(i),
                     std::span(tokens).subspan(size_t(i) * kBlock, kBlock));
      ASSERT_TRUE(link.has_value()) << i;
    }
  }
  // A finished request's `total` blocks, its first `n` cached and all released: they wait,
  // evictable, for a hit.
  std::vector<int> cache_and_release(BlockAllocator& a, const std::vector<int32_t>& tokens, int total, int n) {
    auto got = a.allocate_cached({}, ns, tokens, total);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return {};
    EXPECT_EQ(got->cached_blocks, 0);
    cache_all(a, got->blocks, tokens, n);
    EXPECT_TRUE(a.release(got->blocks).ok());
    return got->blocks;
  }
};

TEST_F(CachedPool, ReleasedCachedBlocksAreHitAndCountAsFree) {
  BlockAllocator a(8, kBlock);
  const auto prompt = iota(0, 12);
  const std::vector<int> first = cache_and_release(a, prompt, 4, 3);
  EXPECT_EQ(a.num_free(), 8);
  EXPECT_EQ(a.counts().evictable, 3);
  EXPECT_EQ(a.counts().cached, 3);
  auto second = a.allocate_cached(std::span<const BlockKey>(keys(prompt)).first(2), ns, prompt, 4);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->cached_blocks, 2);
  EXPECT_EQ(std::vector<int>(second->blocks.begin(), second->blocks.begin() + 2),
            std::vector<int>(first.begin(), first.begin() + 2));
  EXPECT_TRUE(a.check_invariants().ok()) << a.check_invariants();
}

TEST_F(CachedPool, AnEvictableHitIsNotRoom) {
  BlockAllocator a(4, kBlock);
  const auto prompt = iota(0, 16);
  cache_and_release(a, prompt, 4, 4);
  // 4 evictable blocks; a request hitting 2 of them needs 3 more: only 2 are left.
  auto second = a.allocate_cached(std::span<const BlockKey>(keys(prompt)).first(2), ns, prompt, 5);
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_EQ(a.counts().evictable, 4);  // Unchanged.
  EXPECT_TRUE(a.allocate_cached(std::span<const BlockKey>(keys(prompt)).first(2), ns, prompt, 4).ok());
  EXPECT_TRUE(a.check_invariants().ok());
}

TEST_F(CachedPool, EvictingABlockUncachesItsDescendants) {
  BlockAllocator a(3, kBlock);
  const auto prompt = iota(0, 12);
  auto first = a.allocate_cached({}, ns, prompt, 3);
  cache_all(a, first->blocks, prompt, 3);
  // Keep the last block held: it is uncached when its ancestor goes but stays its holder's.
  ASSERT_TRUE(a.release({first->blocks[0], first->blocks[1]}).ok());
  // The LRU list evicts a sequence's deepest block first: block 1, then 0.
  auto one = a.allocate(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0], first->blocks[1]);
  EXPECT_EQ(a.counts().cached, 1);  // Block 2 went with its parent.
  EXPECT_EQ(a.ref_count(first->blocks[2]), 1);
  EXPECT_TRUE(a.check_invariants().ok()) << a.check_invariants();
  // Block 0 alone still hits.
  EXPECT_EQ(a.cached_prefix(keys(prompt), ns, prompt), 1);
}

TEST_F(CachedPool, TokensAreComparedOnEveryHit) {
  BlockAllocator a(8, kBlock);
  const auto prompt = iota(0, 8);
  cache_and_release(a, prompt, 2, 2);
  // Same keys, other tokens: a collision, and a miss.
  auto other = iota(100, 8);
  EXPECT_EQ(a.cached_prefix(keys(prompt), ns, other), 0);
  EXPECT_EQ(a.counts().collisions, 1u);
  // Other namespace root with the same keys: a miss.
  BlockKey other_ns{};
  other_ns.bytes[0] = 1;
  EXPECT_EQ(a.cached_prefix(keys(prompt), other_ns, prompt), 0);
  EXPECT_EQ(a.cached_prefix(keys(prompt), ns, prompt), 2);
}

TEST_F(CachedPool, ADuplicateStaysPrivateAndTheChainGoesOnThroughTheCanonicalBlock) {
  BlockAllocator a(8, kBlock);
  const auto prompt = iota(0, 8);
  auto x = a.allocate_cached({}, ns, prompt, 2);
  auto y = a.allocate_cached({}, ns, prompt, 2);  // Admitted together: both compute.
  cache_all(a, x->blocks, prompt, 2);
  const auto k = keys(prompt);
  auto link = a.cache(y->blocks[0], k[0], std::nullopt, ns, 0, std::span(prompt).first(kBlock));
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->block, x->blocks[0]);  // The canonical one stands for it.
  EXPECT_EQ(a.counts().cached, 2);
  ASSERT_TRUE(a.release(y->blocks).ok());
  EXPECT_EQ(a.num_free(), 6);
  EXPECT_EQ(a.counts().evictable, 0);  // x holds the cached ones; y's were private.
  EXPECT_TRUE(a.check_invariants().ok());
}

TEST_F(CachedPool, ResetUncachesEverything) {
  BlockAllocator a(4, kBlock);
  const auto prompt = iota(0, 8);
  auto x = a.allocate_cached({}, ns, prompt, 2);
  cache_all(a, x->blocks, prompt, 2);
  ASSERT_TRUE(a.release({x->blocks[1]}).ok());
  a.reset_cache();
  EXPECT_EQ(a.counts().cached, 0);
  EXPECT_EQ(a.counts().evictable, 0);
  EXPECT_EQ(a.num_free(), 3);
  EXPECT_TRUE(a.check_invariants().ok());
}

// 100k random operations by 8 simulated requests over a small pool, with prompts drawn from a
// few shared prefixes so that hits, duplicates, evictions and invalidations all happen. Each
// block's simulated KV is the token prefix it was computed for; a hit must return blocks whose
// KV is exactly the request's prefix.
void run_property(std::function<BlockKey(const BlockKey&, std::span<const int32_t>)> key_fn, uint64_t* hits,
                  uint64_t* collisions) {
  constexpr int kBlock = 4, kBlocks = 40, kRequests = 8;
  BlockAllocator a(kBlocks, kBlock);
  const BlockKey ns{};
  std::mt19937 rng(1234);
  struct Request {
    bool active = false;
    std::vector<int32_t> tokens;
    std::vector<BlockKey> keys;
    std::vector<int> blocks;
    int computed = 0, chain_done = 0;
    std::optional<CachedLink> chain;
    bool broken = false;
    std::vector<int> extra_refs;  // A transfer's references.
  };
  std::vector<Request> reqs(kRequests);
  std::map<int, std::vector<int32_t>> kv;  // Block → the prefix its KV was computed for.
  std::vector<std::vector<int32_t>> bases;
  for (int b = 0; b < 3; ++b) {
    std::vector<int32_t> base;
    for (int i = 0; i < 24; ++i) base.push_back(int32_t(rng() % 3));
    bases.push_back(base);
  }
  auto keys_of = [&](const std::vector<int32_t>& tokens) {
    std::vector<BlockKey> out;
    extend_block_keys(out, ns, tokens, kBlock, int(tokens.size()) / kBlock, key_fn);
    return out;
  };
  for (int op = 0; op < 100000; ++op) {
    Request& r = reqs[rng() % kRequests];
    const int kind = int(rng() % 10);
    if (!r.active) {
      // Start: a shared prefix of random length plus a random tail.
      r = Request{};
      const auto& base = bases[rng() % bases.size()];
      r.tokens.assign(base.begin(), base.begin() + int64_t(rng() % base.size()));
      for (int i = int(rng() % 9); i > 0; --i) r.tokens.push_back(int32_t(rng() % 3));
      if (r.tokens.empty()) r.tokens.push_back(1);
      r.keys = keys_of(r.tokens);
      const int max_hit = (int(r.tokens.size()) - 1) / kBlock;
      const int total = (int(r.tokens.size()) + kBlock - 1) / kBlock + int(rng() % 3);
      auto got = a.allocate_cached(std::span(r.keys).first(size_t(max_hit)), ns, r.tokens, total);
      if (!got.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(got.status()));
        continue;
      }
      ASSERT_EQ(int(got->blocks.size()), total);
      ASSERT_LE(got->cached_blocks, max_hit);
      for (int i = 0; i < got->cached_blocks; ++i) {
        const std::vector<int32_t> want(r.tokens.begin(), r.tokens.begin() + (i + 1) * kBlock);
        ASSERT_EQ(kv[got->blocks[size_t(i)]], want) << "op " << op << ": a hit with the wrong KV";
      }
      *hits += uint64_t(got->cached_blocks);
      r.active = true;
      r.blocks = got->blocks;
      r.computed = got->cached_blocks * kBlock;
      r.chain_done = got->cached_blocks;
      r.chain = got->last_hit;
    } else if (kind < 5 && r.computed < int(r.tokens.size())) {
      // A step: compute some tokens, then cache the blocks they filled.
      const int upto = std::min<int>(int(r.tokens.size()), r.computed + 1 + int(rng() % 8));
      for (int pos = r.computed; pos < upto; ++pos) {
        const int block = r.blocks[size_t(pos / kBlock)];
        kv[block].assign(r.tokens.begin(), r.tokens.begin() + pos + 1);
      }
      r.computed = upto;
      for (int i = r.chain_done; !r.broken && i < r.computed / kBlock; ++i) {
        r.chain = a.cache(r.blocks[size_t(i)], r.keys[size_t(i)], r.chain, ns, uint32_t(i),
                          std::span(r.tokens).subspan(size_t(i) * kBlock, kBlock));
        if (!r.chain) {
          r.broken = true;
        } else {
          r.chain_done = i + 1;
        }
      }
    } else if (kind == 5 && r.extra_refs.empty()) {
      r.extra_refs = r.blocks;  // A transfer starts reading.
      ASSERT_TRUE(a.retain(r.extra_refs).ok());
    } else if (kind == 6 && !r.extra_refs.empty()) {
      ASSERT_TRUE(a.release(r.extra_refs).ok());
      r.extra_refs.clear();
    } else if (kind == 7 && rng() % 500 == 0) {
      a.reset_cache();
    } else if (kind >= 8) {
      ASSERT_TRUE(a.release(r.blocks).ok());  // Finished (a transfer may still hold them).
      if (!r.extra_refs.empty()) ASSERT_TRUE(a.release(r.extra_refs).ok());
      r = Request{};
    }
    const Status ok = a.check_invariants();
    ASSERT_TRUE(ok.ok()) << "op " << op << ": " << ok;
  }
  *collisions = a.counts().collisions;
  for (Request& r : reqs) {
    if (!r.active) continue;
    ASSERT_TRUE(a.release(r.blocks).ok());
    if (!r.extra_refs.empty()) ASSERT_TRUE(a.release(r.extra_refs).ok());
  }
  EXPECT_EQ(a.num_free(), kBlocks);
  EXPECT_TRUE(a.check_invariants().ok());
}

TEST(BlockAllocatorProperty, HundredThousandRandomOperationsKeepEveryInvariant) {
  uint64_t hits = 0, collisions = 0;
  run_property(chain_key, &hits, &collisions);
  EXPECT_GT(hits, 1000u);  // The workload does exercise the cache.
  EXPECT_EQ(collisions, 0u);
}

TEST(BlockAllocatorProperty, KeysThatAllCollideNeverHandBackWrongKv) {
  uint64_t hits = 0, collisions = 0;
  run_property([](const BlockKey&, std::span<const int32_t>) { return BlockKey{}; }, &hits, &collisions);
  EXPECT_GT(collisions, 1000u);
}

}  // namespace
}  // namespace pdserve::engine
