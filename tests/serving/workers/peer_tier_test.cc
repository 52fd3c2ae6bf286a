// The peer tier (worker/peer_tier.h) between two in-process engines over real kvtransfer
// endpoints (UCX, ZeroMQ) and a real gRPC server for the source's PeerLease/PeerRelease: a TP1
// reader reads the prefix a TP2 source's host tier holds, caches it and serves the prompt from
// it with the source's tokens; a source whose blocks were dropped during the read answers the
// release "not intact" and the reader drops what it read (the stale-reference bug, vllm#52234);
// an unreachable source or one holding nothing is a miss; and the serving side refuses bad
// leases and unpins every slot.
#include "worker/peer_tier.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>

#include "tests/engine/tier_scenario.h"

namespace pdserve::worker {
namespace {

using pdserve::testing::prompt_of;
using pdserve::testing::run;

std::unique_ptr<engine::Engine> engine_with_host_tier(int tp) {
  engine::EngineOptions o;
  o.kv_cache_bytes = 4 << 20;
  o.host_kv_bytes = 16 << 20;
  o.tp = tp;
  o.prefix_cache.enabled = true;
  return pdserve::testing::stories_engine(std::move(o));
}

std::unique_ptr<PeerTier> peer_tier_of(engine::Engine& engine) {
  PeerTierOptions o;
  o.kv.model_id = "stories260K";
  o.lease = std::chrono::seconds(5);
  o.read_timeout = std::chrono::seconds(5);
  auto t = PeerTier::create(engine, std::move(o));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// The source's Worker API for the peer tier, with a hook run after each lease is granted.
class PeerService final : public Worker::Service {
 public:
  explicit PeerService(PeerTier& tier) : tier_(tier) {}
  std::function<void()> after_lease;

  grpc::Status PeerLease(grpc::ServerContext*, const PeerLeaseRequest* request, PeerLeaseResponse* reply) override {
    auto r = tier_.lease(*request);
    if (!r.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(r.status().message()));
    *reply = *r;
    if (after_lease) after_lease();
    return grpc::Status::OK;
  }
  grpc::Status PeerRelease(grpc::ServerContext*, const PeerReleaseRequest* request,
                           PeerReleaseResponse* reply) override {
    *reply = tier_.release(*request);
    return grpc::Status::OK;
  }

 private:
  PeerTier& tier_;
};

struct Source {
  std::unique_ptr<engine::Engine> engine = engine_with_host_tier(2);
  std::unique_ptr<PeerTier> tier = peer_tier_of(*engine);
  PeerService service{*tier};
  std::unique_ptr<grpc::Server> server;
  std::string address;

  Source() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~Source() { server->Shutdown(); }
};

PrefixSource source_at(const std::string& address, int blocks) {
  PrefixSource s;
  s.set_address(address);
  s.set_blocks(blocks);
  return s;
}

int host_free(engine::Engine& e) { return e.stats().host_free_blocks; }

TEST(PeerTier, ATp1ReaderServesWhatATp2SourcesHostTierHeld) {
  Source source;
  const std::vector<int> prompt = prompt_of(300, 1);  // 18 full blocks, the last one partial.
  const engine::GenerationResult want = run(*source.engine, prompt);
  auto reader_engine = engine_with_host_tier(1);
  auto reader = peer_tier_of(*reader_engine);
  ASSERT_TRUE(reader);
  EXPECT_EQ(reader->read("r1", prompt, "", source_at(source.address, 18)), 18);
  PeerTierStats r = reader->stats();
  EXPECT_EQ(r.reads, 1u);
  EXPECT_EQ(r.read_blocks, 18u);
  EXPECT_EQ(r.failed_reads + r.stale_reads, 0u);
  EXPECT_GT(r.read_bytes, 0u);
  EXPECT_EQ(source.tier->stats().leases, 1u);
  EXPECT_EQ(host_free(*source.engine), source.engine->stats().host_blocks) << "every slot unpinned";
  const engine::GenerationResult got = run(*reader_engine, prompt);
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.cached_tokens, 18 * 16);
  // Holding it now, the reader does not read it again.
  EXPECT_EQ(reader->read("r2", prompt, "", source_at(source.address, 18)), 18);
  EXPECT_EQ(reader->stats().reads, 1u);
  EXPECT_EQ(host_free(*reader_engine), reader_engine->stats().host_blocks);
}

TEST(PeerTier, AReadWhoseBlocksTheSourceDroppedMeanwhileIsDropped) {
  Source source;
  const std::vector<int> prompt = prompt_of(200, 2);
  run(*source.engine, prompt);
  // Dropped by the source after the lease: the pinned slots still hold the bytes, but their
  // stamps no longer hold, so nothing tells the reader they are still that prompt's.
  source.service.after_lease = [&] { source.engine->reset_prefix_cache(); };
  auto reader_engine = engine_with_host_tier(1);
  auto reader = peer_tier_of(*reader_engine);
  ASSERT_TRUE(reader);
  EXPECT_EQ(reader->read("r1", prompt, "", source_at(source.address, 12)), 0);
  const PeerTierStats r = reader->stats();
  EXPECT_EQ(r.stale_reads, 1u);
  EXPECT_EQ(r.read_blocks, 0u);
  EXPECT_EQ(host_free(*reader_engine), reader_engine->stats().host_blocks) << "the read's slots went back";
  EXPECT_EQ(reader_engine->cached_prefix_tokens(prompt), 0);
  EXPECT_EQ(host_free(*source.engine), source.engine->stats().host_blocks);
}

TEST(PeerTier, AnUnreachableOrEmptySourceIsAMiss) {
  auto reader_engine = engine_with_host_tier(1);
  auto reader = peer_tier_of(*reader_engine);
  ASSERT_TRUE(reader);
  const std::vector<int> prompt = prompt_of(200, 3);
  EXPECT_EQ(reader->read("r1", prompt, "", source_at("127.0.0.1:1", 12)), 0);
  Source source;  // Holds nothing of the prompt.
  EXPECT_EQ(reader->read("r2", prompt, "", source_at(source.address, 12)), 0);
  const PeerTierStats r = reader->stats();
  EXPECT_EQ(r.reads, 2u);
  EXPECT_EQ(r.failed_reads, 2u);
  EXPECT_EQ(source.tier->stats().leases, 0u);
  EXPECT_EQ(host_free(*reader_engine), reader_engine->stats().host_blocks);
}

TEST(PeerTier, TheSourceRefusesBadLeasesAndUnpinsAtTheLeasesEnd) {
  Source source;
  const std::vector<int> prompt = prompt_of(200, 4);
  run(*source.engine, prompt);
  PeerLeaseRequest rq;
  rq.mutable_prompt()->Add(prompt.begin(), prompt.end());
  rq.set_reader_tp(1);
  EXPECT_EQ(source.tier->lease(rq).status().code(), absl::StatusCode::kInvalidArgument) << "no lease id";
  rq.set_lease_id("l1");
  rq.set_reader_tp(0);
  EXPECT_EQ(source.tier->lease(rq).status().code(), absl::StatusCode::kInvalidArgument) << "no reader TP";
  rq.set_reader_tp(1);
  rq.set_lease_ms(50);
  auto leased = source.tier->lease(rq);
  ASSERT_TRUE(leased.ok()) << leased.status();
  EXPECT_EQ(leased->blocks(), 12);
  EXPECT_EQ(source.tier->lease(rq).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(host_free(*source.engine), source.engine->stats().host_blocks - 12);
  // Never released: the reaper unpins it at its end, keeping its stamps for a late release.
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       source.tier->stats().expired_leases == 0 && std::chrono::steady_clock::now() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(source.tier->stats().expired_leases, 1u);
  EXPECT_EQ(host_free(*source.engine), source.engine->stats().host_blocks);
  PeerReleaseRequest rel;
  rel.set_lease_id("l1");
  EXPECT_TRUE(source.tier->release(rel).intact()) << "still cached, at the same generations";
  EXPECT_FALSE(source.tier->release(rel).intact()) << "released already: unknown";
}

}  // namespace
}  // namespace pdserve::worker
