// The KV cache's host tier (engine/host_kv_tier.h) in the engine on the bundled model: a device
// cache holding about two requests keeps serving earlier prompts from the host tier (and not
// without it), the same tokens either way; preempted requests swap out to it and resume from it;
// the decode side's reservations continue their device hit in it; the device path (a backend
// whose memory the host cannot touch) copies through the Backend interface and gives the CPU's
// tokens; pull-host's lease shares the prompt blocks the write-through cached and copies only the
// rest; the peer tier's primitives (a source's stamped lease, a reader's reserved slots adopted
// into its cache) carry a prefix between engines, and a stamp no longer holds once its slot was
// taken; and a host tier without the prefix cache is refused.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/host_kv_tier.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/kv_copy.h"
#include "tests/engine/test_model.h"
#include "tests/engine/tier_scenario.h"

namespace pdserve::engine {
namespace {

constexpr uint64_t kBlockBytes = 16 * 1280;  // stories260K at TP 1.

StatusOr<std::unique_ptr<Engine>> try_engine(uint64_t device_bytes, uint64_t host_bytes, bool guarded = false,
                                             bool prefix_cache = true) {
  EngineOptions o;
  o.kv_cache_bytes = device_bytes;
  o.host_kv_bytes = host_bytes;
  o.prefix_cache.enabled = prefix_cache;
  if (guarded)
    o.backend_factory = [](int) -> StatusOr<std::unique_ptr<Backend>> {
      return pdserve::testing::make_guarded_backend();
    };
  return pdserve::testing::try_stories_engine(std::move(o));
}

std::unique_ptr<Engine> make_engine(uint64_t device_bytes, uint64_t host_bytes, bool guarded = false) {
  auto e = try_engine(device_bytes, host_bytes, guarded);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

using pdserve::testing::prompt_of;
using pdserve::testing::run;

// The scenario on one engine: a device cache of ~2 requests (1,500,000 bytes: 73
// blocks), 64 MiB of host tier; ten distinct ~375-token prompts, then the first five again.
TEST(HostTier, ServesWhatTheDeviceCacheGaveUp) {
  for (bool host : {false, true}) {
    auto e = make_engine(1500000, host ? 64u << 20 : 0);
    ASSERT_EQ(e->stats().num_blocks, 73);
    std::vector<GenerationResult> first;
    for (int i = 0; i < 10; ++i) first.push_back(run(*e, prompt_of(375, i)));
    for (int i = 0; i < 5; ++i) {
      const GenerationResult again = run(*e, prompt_of(375, i));
      EXPECT_EQ(again.token_ids, first[size_t(i)].token_ids) << i;
      if (host) {
        EXPECT_GE(again.cached_tokens, 256) << i;
      } else {
        EXPECT_EQ(again.cached_tokens, 0) << i << ": the device cache gave it up";
      }
    }
    const EngineStats s = e->stats();
    EXPECT_EQ(s.free_blocks, s.num_blocks);
    if (host) {
      EXPECT_EQ(s.host_blocks, int((64u << 20) / kBlockBytes));
      EXPECT_GE(s.host_hit_tokens, 5u * 256);
      EXPECT_GT(s.host_stored_blocks, 0u);
      EXPECT_EQ(s.host_free_blocks, s.host_blocks);  // Nothing held: every slot is free or evictable.
      EXPECT_GT(s.host_cached_blocks, 0);
      EXPECT_GT(e->cached_prefix_tokens(prompt_of(375, 0)), 256);  // The router's view counts it too.
    }
  }
}

// Preempted sequences store their blocks in the host tier; resumed, they load them instead of
// recomputing, with the same tokens as a pool that never runs short.
TEST(HostTier, PreemptedRequestsResumeFromIt) {
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(prompt_of(100, i));
  auto run_all = [&](Engine& e) {
    std::vector<std::vector<int>> out(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams p;
      p.max_tokens = 300;
      p.ignore_eos = true;
      p.temperature = 0.8f;
      p.seed = int(i);
      EXPECT_TRUE(e.add_request({std::to_string(i), prompts[i], p}, [&out, i](const TokenEvent& ev) {
                     if (ev.token >= 0) out[i].push_back(ev.token);
                   }).ok());
    }
    EXPECT_TRUE(e.run_until_idle().ok());
    return out;
  };
  const auto want = run_all(*make_engine(0, 0));
  uint64_t recomputed[2] = {0, 0};
  for (bool host : {false, true}) {
    auto e = make_engine(60 * kBlockBytes, host ? 600 * kBlockBytes : 0);
    EXPECT_EQ(run_all(*e), want) << "host tier: " << host;
    const EngineStats s = e->stats();
    EXPECT_GT(s.preemptions, 0u);
    EXPECT_EQ(s.free_blocks, s.num_blocks);
    recomputed[host] = s.prefill_tokens;
    if (host) {
      EXPECT_GT(s.host_loaded_blocks, 0u);
    }
  }
  EXPECT_LT(recomputed[1], recomputed[0]) << "swapped-out blocks come back instead of being recomputed";
}

// The decode side of P/D: a reservation's device hit goes on in the host tier, and the blocks
// loaded from it hold the prompt's KV (the decode gives the whole run's tokens with only the
// rest transferred).
TEST(HostTier, ReservationsContinueTheDeviceHitInIt) {
  const std::vector<int> prompt = prompt_of(200, 3);  // 12 full blocks and 8 tokens.
  SamplingParams params;
  params.max_tokens = 30;
  params.ignore_eos = true;
  auto decode = make_engine(40 * kBlockBytes, 400 * kBlockBytes);
  const std::vector<int> whole = run(*decode, prompt, 30).token_ids;
  for (int i = 0; i < 4; ++i) run(*decode, prompt_of(200, 10 + i), 4);  // Evicts the prompt from the device.
  const uint64_t loaded = decode->stats().host_loaded_blocks;
  auto reserved = decode->reserve_cached_blocks(prompt, "", int(prompt.size()));
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(reserved->cached_blocks, 12);
  EXPECT_EQ(decode->stats().host_loaded_blocks - loaded, 12u) << "the device had given them all up";
  auto prefill = make_engine(0, 0);
  const auto handed = pdserve::testing::run_prefill_only(*prefill, prompt, params);
  // Only the last, partial block crosses.
  std::vector<int> from(handed.blocks.begin() + 12, handed.blocks.end());
  std::vector<int> to(reserved->blocks.begin() + 12, reserved->blocks.end());
  pdserve::testing::copy_kv(*prefill, from, *decode, to, 1);
  EXPECT_EQ(pdserve::testing::decode_preloaded(*decode, prompt, params, reserved->blocks, handed.first_token), whole);
  ASSERT_TRUE(prefill->release_blocks(handed.blocks).ok());
  EXPECT_EQ(decode->stats().free_blocks, decode->stats().num_blocks);
}

// pull-host's lease of a prefilled prompt: the full blocks the write-through stored as their step
// ended are shared (pinned: no eviction takes them while leased), only the partial last block is
// copied; in another namespace nothing is cached, so everything is copied. Released, every slot is
// free or evictable again.
TEST(HostTier, ALeaseSharesTheBlocksTheWriteThroughStored) {
  const std::vector<int> prompt = prompt_of(200, 5);  // 12 full blocks and 8 tokens.
  SamplingParams params;
  params.max_tokens = 1;
  auto prefill = make_engine(40 * kBlockBytes, 400 * kBlockBytes);
  const auto handed = pdserve::testing::run_prefill_only(*prefill, prompt, params);
  ASSERT_EQ(handed.blocks.size(), 13u);
  auto slots = prefill->lease_host_copy(prompt, "", handed.blocks);
  ASSERT_TRUE(slots.ok()) << slots.status();
  EXPECT_EQ(slots->size(), 13u);
  EngineStats s = prefill->stats();
  EXPECT_EQ(s.host_lease_shared_blocks, 12u);
  EXPECT_EQ(s.host_lease_copied_blocks, 1u);
  EXPECT_EQ(s.host_free_blocks, s.host_blocks - 13);  // Shared ones are pinned, not evictable.
  auto other = prefill->lease_host_copy(prompt, "another namespace", handed.blocks);
  ASSERT_TRUE(other.ok()) << other.status();
  s = prefill->stats();
  EXPECT_EQ(s.host_lease_shared_blocks, 12u);
  EXPECT_EQ(s.host_lease_copied_blocks, 14u);
  ASSERT_TRUE(prefill->release_host_lease(*slots).ok());
  ASSERT_TRUE(prefill->release_host_lease(*other).ok());
  ASSERT_TRUE(prefill->release_blocks(handed.blocks).ok());
  s = prefill->stats();
  EXPECT_EQ(s.host_free_blocks, s.host_blocks);
  EXPECT_EQ(s.free_blocks, s.num_blocks);
}

// The peer tier by hand (worker/peer_tier.h does it over kvtransfer): the source leases the
// prefix its host tier holds, the reader copies the slots into slots it reserved and adopts
// them, and then serves the prompt from its host tier, with the source's tokens.
TEST(HostTier, APeerLeaseCarriesAPrefixIntoAnotherEnginesTier) {
  const std::vector<int> prompt = prompt_of(375, 3);  // 23 full blocks.
  auto source = make_engine(1500000, 64u << 20);
  auto reader = make_engine(1500000, 64u << 20);
  const GenerationResult want = run(*source, prompt);
  HostKvTier& from = *source->host_tier();
  HostKvTier& to = *reader->host_tier();
  const Engine::PromptKeys k = source->prompt_keys(prompt, "", 1 << 20);
  ASSERT_EQ(k.keys, reader->prompt_keys(prompt, "", 1 << 20).keys);
  HostKvTier::PeerLease lease = from.lease_prefix(k.keys, k.ns_root, prompt, 20);
  ASSERT_EQ(lease.slots.size(), 20u);
  ASSERT_EQ(lease.stamps.size(), 20u);
  EXPECT_EQ(source->stats().host_free_blocks, source->stats().host_blocks - 20);  // Pinned.
  auto slots = to.reserve(20);
  ASSERT_TRUE(slots.ok()) << slots.status();
  pdserve::testing::copy_kv_arena(from.layout(0), from.arena(0), lease.slots, to.layout(0), to.arena(0), *slots, 20);
  auto intact = from.release_peer_lease(lease);
  ASSERT_TRUE(intact.ok()) << intact.status();
  EXPECT_TRUE(*intact);
  auto held = to.adopt(k.keys, k.ns_root, prompt, 0, *slots);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, 20);
  EXPECT_EQ(to.held_prefix(k.keys, k.ns_root, prompt), 20);
  const GenerationResult got = run(*reader, prompt);
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.cached_tokens, 20 * 16);
  EXPECT_EQ(reader->stats().host_hit_tokens, 20u * 16);
  EXPECT_EQ(source->stats().host_free_blocks, source->stats().host_blocks);
}

// A stamp names a slot's content, not the slot: once the source's tier dropped the block (a
// lease that ran out, then eviction or a reset), the stamp no longer holds, and a reader's copy
// is refused rather than taken for the prompt's KV.
TEST(HostTier, AStampNoLongerHoldsOnceItsSlotWasTaken) {
  const std::vector<int> prompt = prompt_of(200, 7);
  auto source = make_engine(1500000, 64u << 20);
  run(*source, prompt);
  HostKvTier& tier = *source->host_tier();
  const Engine::PromptKeys k = source->prompt_keys(prompt, "", 1 << 20);
  HostKvTier::PeerLease lease = tier.lease_prefix(k.keys, k.ns_root, prompt, 1 << 20);
  ASSERT_EQ(lease.slots.size(), 12u);
  EXPECT_TRUE(tier.stamps_hold(lease));
  // The lease ran out: unpinned with its stamps checked, then the source's tier moved on.
  auto intact = tier.release_peer_lease(lease);
  ASSERT_TRUE(intact.ok() && *intact);
  EXPECT_TRUE(tier.stamps_hold(lease));  // Still cached, merely evictable.
  source->reset_prefix_cache();
  EXPECT_FALSE(tier.stamps_hold(lease));
  run(*source, prompt);  // Cached again, in the same slots perhaps, at new generations.
  EXPECT_FALSE(tier.stamps_hold(lease));
  auto late = tier.release_peer_lease(lease, /*unpin=*/false);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(*late);
  // A reader's slots past a chain its tier does not hold go back uncached.
  auto reader = make_engine(1500000, 64u << 20);
  auto slots = reader->host_tier()->reserve(4);
  ASSERT_TRUE(slots.ok());
  auto held = reader->host_tier()->adopt(k.keys, k.ns_root, prompt, 2, *slots);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, 0);
  EXPECT_EQ(reader->stats().host_free_blocks, reader->stats().host_blocks);
}

// On a backend whose memory the host cannot touch, the tier copies through the Backend
// interface only, and serves the same tokens as the CPU engine.
TEST(HostTier, TheDevicePathCopiesThroughTheBackend) {
  auto cpu = make_engine(1500000, 64u << 20);
  auto device = make_engine(1500000, 64u << 20, /*guarded=*/true);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 6; ++i) {
      const GenerationResult a = run(*cpu, prompt_of(375, i)), b = run(*device, prompt_of(375, i));
      EXPECT_EQ(b.token_ids, a.token_ids) << "round " << round << " prompt " << i;
      EXPECT_EQ(b.cached_tokens, a.cached_tokens) << "round " << round << " prompt " << i;
    }
  }
  EXPECT_GT(device->stats().host_loaded_blocks, 0u);
}

TEST(HostTier, RefusesWhatItCannotHonour) {
  auto e = try_engine(1500000, 64u << 20, false, /*prefix_cache=*/false);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(e.status()));
  EXPECT_NE(std::string(e.status().message()).find("prefix cache"), std::string::npos) << e.status();
  // The filesystem tier goes through the host tier, and its cap needs it.
  auto create = [](const EngineOptions& o) -> StatusOr<std::unique_ptr<Engine>> {
    auto model = load_model({pdserve::testing::stories_bin()});
    if (!model.ok()) return model.status();
    return Engine::create(std::move(*model), o);
  };
  EngineOptions o;
  o.kv_offload_dir = ::testing::TempDir();
  auto no_host = create(o);
  ASSERT_FALSE(no_host.ok());
  EXPECT_NE(std::string(no_host.status().message()).find("--host-kv-bytes"), std::string::npos) << no_host.status();
  o.kv_offload_dir.clear();
  o.kv_offload_dir_bytes = 1 << 20;
  auto no_dir = create(o);
  ASSERT_FALSE(no_dir.ok());
  EXPECT_NE(std::string(no_dir.status().message()).find("--kv-offload-dir"), std::string::npos) << no_dir.status();
  auto tiny = try_engine(1500000, 100);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(std::string(tiny.status().message()).find("holds no block"), std::string::npos) << tiny.status();
}

}  // namespace
}  // namespace pdserve::engine
