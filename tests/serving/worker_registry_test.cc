// The router's worker registry with self-registered workers: registration, heartbeats and expiry
// on a FakeClock (no sleeping, no worker processes: nothing here is polled), and the Registry
// service's checks of a registering worker.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/secrets.h"
#include "router/policy.h"
#include "router/registry_service.h"
#include "router/worker_registry.h"

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> addresses(const WorkerRegistry& r) {
  std::vector<std::string> out;
  for (const auto& e : r.listed()) out.push_back(e.address);
  return out;
}

RegistryOptions options() {
  RegistryOptions o;
  o.heartbeat_interval = 1s;
  o.heartbeat_timeout = 3s;
  return o;
}

TEST(WorkerRegistryExpiry, ARegisteredWorkerStaysWhileItHeartbeatsAndGoesAfterTheTimeout) {
  FakeClock clock;
  WorkerRegistry reg({{"127.0.0.1:1001", worker::ROLE_PREFILL}}, options(), clock);
  ASSERT_TRUE(reg.register_worker({"127.0.0.1:1002", worker::ROLE_DECODE}, "d0").ok());
  EXPECT_EQ(addresses(reg), (std::vector<std::string>{"127.0.0.1:1001", "127.0.0.1:1002"}));
  EXPECT_TRUE(reg.has_role(worker::ROLE_DECODE));
  ASSERT_EQ(reg.loads(worker::ROLE_DECODE).size(), 1u);
  const int index = reg.loads(worker::ROLE_DECODE)[0].index;
  EXPECT_EQ(reg.address(index), "127.0.0.1:1002");
  EXPECT_FALSE(reg.loads(worker::ROLE_DECODE)[0].up);  // Up only once an Info poll answers.
  EXPECT_EQ(reg.gauges().size(), 2u);

  // Heartbeats within the timeout keep it.
  for (int i = 0; i < 5; ++i) {
    clock.advance(2900ms);
    EXPECT_TRUE(reg.heartbeat("127.0.0.1:1002"));
    EXPECT_TRUE(reg.expire().empty());
  }
  // Exactly the timeout since the last heartbeat is still in time; past it, dropped.
  clock.advance(3s);
  EXPECT_TRUE(reg.expire().empty());
  clock.advance(1ms);
  EXPECT_EQ(reg.expire(), std::vector<std::string>{"127.0.0.1:1002"});
  EXPECT_EQ(addresses(reg), std::vector<std::string>{"127.0.0.1:1001"});
  EXPECT_TRUE(reg.loads(worker::ROLE_DECODE).empty());
  EXPECT_FALSE(reg.has_role(worker::ROLE_DECODE));
  EXPECT_EQ(reg.gauges().size(), 1u);
  EXPECT_TRUE(reg.expire().empty());  // Dropped once.
  // A late heartbeat is told to register again.
  EXPECT_FALSE(reg.heartbeat("127.0.0.1:1002"));

  // Static workers never expire (and their heartbeats are accepted).
  clock.advance(1h);
  EXPECT_TRUE(reg.expire().empty());
  EXPECT_TRUE(reg.heartbeat("127.0.0.1:1001"));

  // Registering again reuses the slot, so indices held by requests in flight stay valid.
  ASSERT_TRUE(reg.register_worker({"127.0.0.1:1002", worker::ROLE_DECODE}, "d0").ok());
  ASSERT_EQ(reg.loads(worker::ROLE_DECODE).size(), 1u);
  EXPECT_EQ(reg.loads(worker::ROLE_DECODE)[0].index, index);
  // Deregistering drops it at once.
  EXPECT_TRUE(reg.deregister("127.0.0.1:1002"));
  EXPECT_FALSE(reg.deregister("127.0.0.1:1002"));
  EXPECT_FALSE(reg.deregister("127.0.0.1:1001"));  // Static: not removable.
  EXPECT_EQ(addresses(reg), std::vector<std::string>{"127.0.0.1:1001"});
}

// Between polls a prefill worker's queue is the polled one plus what this router sent it, less
// the prefills it saw answered since: an idle worker does not look busy until the next poll.
TEST(WorkerRegistryLoad, AnsweredPrefillsLeaveTheQueueBetweenPolls) {
  FakeClock clock;
  WorkerRegistry reg({{"127.0.0.1:1001", worker::ROLE_PREFILL}}, options(), clock);
  const auto queued = [&] { return reg.loads(worker::ROLE_PREFILL).at(0).queued_prefill_tokens; };
  const int p = reg.loads(worker::ROLE_PREFILL).at(0).index;
  EXPECT_EQ(queued(), 0);
  reg.note_assigned(p, 0, 300);
  reg.note_assigned(p, 0, 200);
  EXPECT_EQ(queued(), 500);
  reg.note_prefill_done(p, 300);
  EXPECT_EQ(queued(), 200);
  reg.note_prefill_done(p, 200);
  EXPECT_EQ(queued(), 0);
  // A prefill answered that the last poll had not counted (it came from before): never below 0.
  reg.note_prefill_done(p, 100);
  EXPECT_EQ(queued(), 0);
  EXPECT_EQ(reg.loads(worker::ROLE_PREFILL).at(0).running, 0);
}

// The same for a decode-side worker's blocks and running requests: a request that ended gives
// its blocks back (cached and evictable on the worker) before the next poll says so.
TEST(WorkerRegistryLoad, EndedRequestsGiveTheirBlocksBackBetweenPolls) {
  FakeClock clock;
  WorkerRegistry reg({{"127.0.0.1:1001", worker::ROLE_DECODE}}, options(), clock);
  const auto load = [&] { return reg.loads(worker::ROLE_DECODE).at(0); };
  const int d = load().index;
  const int free_before = load().free_blocks;
  for (int i = 0; i < 3; ++i) reg.note_assigned(d, 24, 0);
  EXPECT_EQ(load().free_blocks, free_before - 72);
  EXPECT_EQ(load().running, 3);
  reg.note_request_done(d, 24);
  reg.note_request_done(d, 24);
  EXPECT_EQ(load().free_blocks, free_before - 24);
  EXPECT_EQ(load().running, 1);
  reg.note_request_done(d, 24);
  reg.note_request_done(d, 24);  // One more than was sent: never above the capacity, never below 0.
  EXPECT_EQ(load().running, 0);
  EXPECT_LE(load().free_blocks, load().num_blocks);
}

// Requests that come one at a time find every worker idle: the ties go to the least recently
// chosen worker, and a decode worker to the one least recently chosen with this prefill worker,
// so 2 × 2 workers serve all four pairs within four requests (not prefill 0 → decode 0 each time).
TEST(WorkerRegistryLoad, IdleWorkersTakeTurnsAndEachProducerMeetsEveryDecodeWorker) {
  FakeClock clock;
  WorkerRegistry reg({{"127.0.0.1:1001", worker::ROLE_PREFILL},
                      {"127.0.0.1:1002", worker::ROLE_PREFILL},
                      {"127.0.0.1:1003", worker::ROLE_DECODE},
                      {"127.0.0.1:1004", worker::ROLE_DECODE}},
                     options(), clock);
  // Nothing is polled here: the loads are the registry's notes on workers taken as up and empty.
  const auto idle = [&](worker::Role role, int producer) {
    std::vector<WorkerLoad> loads = reg.loads(role, producer);
    for (WorkerLoad& l : loads) {
      l.up = true;
      l.num_blocks = l.free_blocks = 100;
    }
    return loads;
  };
  std::vector<std::pair<int, int>> pairs;
  for (int request = 0; request < 8; ++request) {
    const int p = pick_prefill(idle(worker::ROLE_PREFILL, -1), {}, idle(worker::ROLE_DECODE, -1), 10, {});
    ASSERT_GE(p, 0);
    reg.note_chosen(p);
    const std::vector<WorkerLoad> producer = idle(worker::ROLE_PREFILL, -1);
    const int d = pick_decode(idle(worker::ROLE_DECODE, p), 10, {}, &producer.at(p));
    ASSERT_GE(d, 0);
    reg.note_chosen(d, p);
    pairs.emplace_back(p, d);
  }
  // Prefill 0 and 1 in turn, and decode 2 and 3 in turn; each prefill worker meets decode 2,
  // then decode 3, then decode 2 again.
  EXPECT_EQ(pairs, (std::vector<std::pair<int, int>>{{0, 2}, {1, 3}, {0, 3}, {1, 2}, {0, 2}, {1, 3}, {0, 3}, {1, 2}}));
}

TEST(WorkerRegistryExpiry, RegistrationIsChecked) {
  FakeClock clock;
  WorkerRegistry reg({{"127.0.0.1:1001", worker::ROLE_PREFILL}}, options(), clock);
  EXPECT_TRUE(absl::IsInvalidArgument(reg.register_worker({"", worker::ROLE_DECODE}, "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(reg.register_worker({"127.0.0.1:1003", worker::ROLE_UNSPECIFIED}, "x")));
  EXPECT_TRUE(absl::IsFailedPrecondition(reg.register_worker({"127.0.0.1:1001", worker::ROLE_DECODE}, "x")));
  EXPECT_TRUE(reg.register_worker({"127.0.0.1:1001", worker::ROLE_PREFILL}, "p0").ok());
  EXPECT_EQ(addresses(reg), std::vector<std::string>{"127.0.0.1:1001"});
}

TEST(RegistryService, RefusesWorkersTheRouterDoesNotUseAndAnswersItsTimings) {
  FakeClock clock;
  WorkerRegistry reg({}, options(), clock);
  RegistryService pd(reg, {"stories260K", "/models/stories260K.bin"}, KvMode::kPush);
  worker::RegisterRequest req;
  req.set_address("127.0.0.1:1010");
  req.set_role(worker::ROLE_AGGREGATED);
  req.set_model("stories260K");
  worker::RegisterResponse resp;
  EXPECT_EQ(pd.Register(nullptr, &req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  req.set_role(worker::ROLE_DECODE);
  req.set_model("llama-70b");
  const grpc::Status other = pd.Register(nullptr, &req, &resp);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(other.error_message().find("llama-70b"), std::string::npos);
  EXPECT_TRUE(reg.listed().empty());

  req.set_model("/models/stories260K.bin");
  ASSERT_TRUE(pd.Register(nullptr, &req, &resp).ok());
  EXPECT_EQ(resp.heartbeat_interval_ms(), 1000);
  EXPECT_EQ(resp.expiry_ms(), 3000);
  worker::HeartbeatRequest hb;
  hb.set_address("127.0.0.1:1010");
  worker::HeartbeatResponse known;
  ASSERT_TRUE(pd.Heartbeat(nullptr, &hb, &known).ok());
  EXPECT_TRUE(known.known());
  clock.advance(4s);
  reg.expire();
  ASSERT_TRUE(pd.Heartbeat(nullptr, &hb, &known).ok());
  EXPECT_FALSE(known.known());

  RegistryService agg(reg, {"stories260K"}, KvMode::kAggregated);
  req.set_role(worker::ROLE_PREFILL);
  EXPECT_EQ(agg.Register(nullptr, &req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // pull-host reads prompts from the prefill workers' host tier: one without it is refused.
  RegistryService via_host(reg, {"stories260K"}, KvMode::kPullHost);
  req.set_model("stories260K");
  req.set_address("127.0.0.1:1011");
  const grpc::Status no_tier = via_host.Register(nullptr, &req, &resp);
  EXPECT_EQ(no_tier.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(no_tier.error_message().find("--host-kv-bytes"), std::string::npos) << no_tier.error_message();
  req.set_host_kv_blocks(3276);
  EXPECT_TRUE(via_host.Register(nullptr, &req, &resp).ok());
  req.set_host_kv_blocks(0);
  req.set_role(worker::ROLE_DECODE);  // Its host tier is its own business.
  req.set_address("127.0.0.1:1012");
  EXPECT_TRUE(via_host.Register(nullptr, &req, &resp).ok());
}

// With cluster tokens, Registry calls need one in their metadata: a worker without it (or with
// another) cannot register or heartbeat; with it, it registers. The registry's slots are capped.
TEST(RegistryService, ClusterTokenGuardsRegistrationAndSlotsAreCapped) {
  FakeClock clock;
  RegistryOptions o = options();
  o.max_registered = 2;
  WorkerRegistry reg({}, o, clock);
  RegistryService service(reg, {"stories260K"}, KvMode::kPush, {"old-token", "s3cret"});
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  auto stub = worker::Registry::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  auto call = [&](const std::string& address, const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata(kClusterTokenMetadata, token);
    worker::RegisterRequest req;
    req.set_address(address);
    req.set_role(worker::ROLE_DECODE);
    worker::RegisterResponse resp;
    return stub->Register(&ctx, req, &resp);
  };
  const grpc::Status none = call("127.0.0.1:2001", "");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(none.error_message().find("--cluster-token-file"), std::string::npos) << none.error_message();
  EXPECT_EQ(call("127.0.0.1:2001", "s3cre").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("127.0.0.1:2001", "s3cret!").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(reg.listed().empty());
  EXPECT_TRUE(call("127.0.0.1:2001", "s3cret").ok());
  EXPECT_TRUE(call("127.0.0.1:2002", "old-token").ok());  // A token being rotated out still works.
  EXPECT_EQ(reg.listed().size(), 2u);
  {
    grpc::ClientContext ctx;  // A heartbeat without the token.
    worker::HeartbeatRequest hb;
    hb.set_address("127.0.0.1:2001");
    worker::HeartbeatResponse r;
    EXPECT_EQ(stub->Heartbeat(&ctx, hb, &r).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // A third address: the registry is full.
  const grpc::Status full = call("127.0.0.1:2003", "s3cret");
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  server->Shutdown();
}

}  // namespace
}  // namespace pdserve::router
