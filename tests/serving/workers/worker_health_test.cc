// A worker's deployment-facing parts: its probe answers (WorkerHealth) for each state, the
// kvtransfer endpoint it advertises behind a wildcard bind, and RouterSet registering with
// every router a name resolves to (two in-process Registry services behind a fake resolver).
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "common/host_port.h"
#include "proto/worker.grpc.pb.h"
#include "worker/kv_ranks.h"
#include "worker/router_set.h"
#include "worker/worker_health.h"

namespace pdserve::worker {
namespace {

using namespace std::chrono_literals;

TEST(WorkerHealth, StartupThenReadinessInOrderOfTheirConditions) {
  bool registered = false;
  WorkerHealth h("prefill", {.router = true, .rdma = true});
  EXPECT_TRUE(h.live().ok);
  EXPECT_FALSE(h.startup().ok);
  EXPECT_NE(h.ready().reason.find("loading the model"), std::string::npos);
  h.set_started([] { return WorkerLoadGauges{100, 25, 3, 1, 2, 40, 900, 120, 1.5, 7}; });
  EXPECT_TRUE(h.startup().ok);
  EXPECT_NE(h.ready().reason.find("gRPC"), std::string::npos);
  h.set_serving();
  h.set_rdma(false, "tcp/eth0, self/memory0");
  h.set_registration([&] { return registered; });
  const ProbeAnswer no_rdma = h.ready();
  EXPECT_FALSE(no_rdma.ok);
  EXPECT_NE(no_rdma.reason.find("RDMA required"), std::string::npos) << no_rdma.reason;
  EXPECT_NE(no_rdma.reason.find("tcp/eth0, self/memory0"), std::string::npos) << no_rdma.reason;
  h.set_rdma(true, "rc_mlx5/mlx5_0:1, tcp/eth0");
  EXPECT_EQ(h.ready().reason, "not registered with the router yet");
  registered = true;
  EXPECT_TRUE(h.ready().ok);
  const std::string m = h.metrics_text();
  EXPECT_NE(m.find("pdserve:worker_ready{role=\"prefill\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("pdserve:worker_rdma_available{role=\"prefill\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("pdserve:worker_kv_cache_usage_perc{role=\"prefill\"} 0.75\n"), std::string::npos) << m;
  EXPECT_NE(m.find("pdserve:worker_kv_transfer_failures_total{role=\"prefill\"} 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("# TYPE pdserve:worker_kv_transfer_failures_total counter\n"), std::string::npos) << m;
  EXPECT_NE(m.find("pdserve:worker_preemptions_total{role=\"prefill\"} 7\n"), std::string::npos) << m;
  // The engine's step counters and the step-time summary.
  for (const char* line : {"# TYPE pdserve:worker_steps_total counter\n", "pdserve:worker_steps_total{role=\"prefill\"} 40\n",
                           "pdserve:worker_step_prefill_tokens_total{role=\"prefill\"} 900\n",
                           "pdserve:worker_step_decode_sequences_total{role=\"prefill\"} 120\n",
                           "# TYPE pdserve:worker_step_seconds summary\n",
                           "pdserve:worker_step_seconds_sum{role=\"prefill\"} 1.5\n",
                           "pdserve:worker_step_seconds_count{role=\"prefill\"} 40\n"})
    EXPECT_NE(m.find(line), std::string::npos) << line << m;
  h.set_draining();
  EXPECT_FALSE(h.ready().ok);
  EXPECT_NE(h.ready().reason.find("draining"), std::string::npos);
  EXPECT_TRUE(h.live().ok) << "a draining worker is alive: the kubelet must not restart it";
  EXPECT_NE(h.metrics_text().find("pdserve:worker_draining{role=\"prefill\"} 1\n"), std::string::npos);
}

TEST(WorkerHealth, WithoutRequirementsReadyOnceServing) {
  WorkerHealth h("decode", {});
  h.set_started([] { return WorkerLoadGauges{}; });
  h.set_serving();
  h.set_rdma(false, "tcp/lo");
  EXPECT_TRUE(h.ready().ok) << h.ready().reason;
}

TEST(KvAdvertise, ReplacesTheBoundHost) {
  EXPECT_EQ(advertised_endpoint("tcp://0.0.0.0:5601", "10.1.2.3"), "tcp://10.1.2.3:5601");
  EXPECT_EQ(advertised_endpoint("tcp://127.0.0.1:5601", ""), "tcp://127.0.0.1:5601");
  EXPECT_EQ(advertised_endpoint("tcp://[::]:5601", "fd00::7"), "tcp://[fd00::7]:5601");
  EXPECT_EQ(advertised_endpoint("tcp://0.0.0.0:5601", "[fd00::7]"), "tcp://[fd00::7]:5601");
  EXPECT_EQ(advertised_endpoint("garbage", "10.1.2.3"), "garbage");
}

TEST(HostPort, SplitsAtTheLastColonAndHandlesIpv6Brackets) {
  auto v4 = split_host_port("10.0.0.1:50060");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "10.0.0.1");
  EXPECT_EQ(v4->port, "50060");
  auto v6 = split_host_port("[fd00::7]:8090");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "fd00::7");
  EXPECT_EQ(v6->port, "8090");
  for (const char* bad : {"host", "host:", ":80", ""}) EXPECT_FALSE(split_host_port(bad).ok()) << bad;
  EXPECT_EQ(bracket_host("fd00::7"), "[fd00::7]");
  EXPECT_EQ(bracket_host("[fd00::7]"), "[fd00::7]");
  EXPECT_EQ(bracket_host("10.0.0.1"), "10.0.0.1");
}

TEST(RouterResolve, NumericAndNamedHosts) {
  auto v4 = resolve_host_port("127.0.0.1:50051");
  ASSERT_TRUE(v4.ok()) << v4.status().message();
  EXPECT_EQ(*v4, std::vector<std::string>{"127.0.0.1:50051"});
  auto v6 = resolve_host_port("[::1]:7");
  ASSERT_TRUE(v6.ok()) << v6.status().message();
  EXPECT_EQ(*v6, std::vector<std::string>{"[::1]:7"});
  auto named = resolve_host_port("localhost:9");
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_FALSE(named->empty());
  EXPECT_FALSE(resolve_host_port("no-port").ok());
  EXPECT_FALSE(resolve_host_port("host.invalid:1").ok());
}

// A router's Registry that records who is registered.
class FakeRegistry final : public Registry::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest* req, RegisterResponse* resp) override {
    std::lock_guard lock(mu_);
    workers_.insert(req->address());
    resp->set_heartbeat_interval_ms(50);
    changed_.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest* req, HeartbeatResponse* resp) override {
    std::lock_guard lock(mu_);
    resp->set_known(workers_.count(req->address()) > 0);
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const DeregisterRequest* req, DeregisterResponse* resp) override {
    std::lock_guard lock(mu_);
    resp->set_found(workers_.erase(req->address()) > 0);
    changed_.notify_all();
    return grpc::Status::OK;
  }
  // Waits up to 10 s for `address` to be registered (or not).
  bool wait_registered(const std::string& address, bool want) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, 10s, [&] { return (workers_.count(address) > 0) == want; });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::set<std::string> workers_;
};

struct RegistryServer {
  FakeRegistry service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  RegistryServer() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~RegistryServer() { server->Shutdown(std::chrono::system_clock::now() + 1s); }
};

// Whether `pred` holds within 10 s (the registrations run on their own threads).
template <typename Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(RouterSet, RegistersWithEveryResolvedRouterAndLeavesOnesThatGo) {
  RegistryServer a, b;
  std::mutex mu;
  std::vector<std::string> behind_name = {a.address, b.address};
  RegistrationOptions options;
  options.router = "pdserve-router-registry:50051";
  options.retry_interval = 50ms;
  RouterSet set(
      options,
      [] {
        RegisterRequest r;
        r.set_address("10.0.0.9:50060");
        return r;
      },
      [&](const std::string& name) -> StatusOr<std::vector<std::string>> {
        EXPECT_EQ(name, "pdserve-router-registry:50051");
        std::lock_guard lock(mu);
        return behind_name;
      },
      /*resolve_interval=*/50ms);
  EXPECT_FALSE(set.registered());
  set.start();
  EXPECT_TRUE(a.service.wait_registered("10.0.0.9:50060", true));
  EXPECT_TRUE(b.service.wait_registered("10.0.0.9:50060", true));
  EXPECT_TRUE(eventually([&] { return set.registered(); }));
  {
    std::lock_guard lock(mu);
    behind_name = {b.address};  // Router a's pod went away.
  }
  EXPECT_TRUE(a.service.wait_registered("10.0.0.9:50060", false));
  EXPECT_EQ(set.routers(), std::vector<std::string>{b.address});
  set.stop();
  EXPECT_TRUE(b.service.wait_registered("10.0.0.9:50060", false)) << "stop() deregisters";
  EXPECT_FALSE(set.registered());
}

}  // namespace
}  // namespace pdserve::worker
