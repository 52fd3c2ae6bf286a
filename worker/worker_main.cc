#include "worker/worker_main.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "common/host_port.h"
#include "common/logging.h"
#include "engine/engine_loop.h"
#include "kvevents/kv_event_publisher.h"
#include "kvtransfer/control/curve.h"
#include "kvtransfer/ucx/ucx_resources.h"
#include "worker/decode_role.h"
#include "worker/peer_tier.h"
#include "worker/prefill_role.h"
#include "worker/probe_server.h"
#include "worker/router_set.h"
#include "common/secrets.h"
#include "common/tls.h"
#include "worker/worker_health.h"
#include "worker/worker_service.h"

namespace pdserve::worker {
namespace {

struct WorkerFlags {
  std::string role;
  std::string model = "stories260K";
  std::string tokenizer;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string id;
  engine::EngineOptions engine;
  int64_t kv_lease_ms = 30000;
  int64_t kv_peer_timeout_ms = 10000;
  std::string router;     // Register with this router (HOST:PORT) and heartbeat.
  std::string cluster_token_file;  // The router's cluster token, sent when registering.
  std::string kv_key_file;         // The cluster's kvtransfer key (CURVE on the control channel).
  std::string advertise;  // The address the router dials (default: --host and the bound port).
  int64_t heartbeat_ms = 0;  // 0: the router's advice.
  std::string kv_memory = "auto";
  std::string weight_dtype = "f32";
  std::string kv_dtype = "f32";
  std::string gemm_precision = "exact";
  int probe_port = -1;  // -1: no probe server; 0: any free port.
  int kv_port = 0;      // Rank r's control channel on kv_port + r; 0: any free port.
  bool require_rdma = false;
  double drain_timeout_s = 30;
  std::string kv_compat;
  std::string kv_events_endpoint;  // Empty: no KV events.
  std::string kv_replay_endpoint = "tcp://*:0";
  int64_t kv_events_heartbeat_ms = 1000;
  size_t kv_events_max_batch = 4096;
  size_t kv_events_buffer = 10000;
  TlsFiles tls;
  std::string prefix_caching = "on";
  std::string kv_hash_secret_file;  // Mixed into the prefix cache's block keys.
  int64_t kv_load_timeout_ms = 0;
  bool kv_peer_tier = false;
  int64_t kv_peer_read_timeout_ms = 2000;
};

// A bound ZeroMQ endpoint ("tcp://0.0.0.0:41234") as peers connect to it: on `host`.
std::string connect_endpoint(const std::string& bound, const std::string& host) {
  if (bound.empty()) return "";
  return "tcp://" + bracket_host(host) + bound.substr(bound.rfind(':'));
}

int fail(const std::string& what, const Status& s) {
  std::cerr << "error: " << what << ": " << s.message() << "\n";
  return 1;
}

std::string memlock_limit() {
  rlimit l{};
  if (getrlimit(RLIMIT_MEMLOCK, &l) != 0) return "unknown";
  if (l.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(l.rlim_cur / 1024) + " KiB";
}

// Logs what UCX offers this process and RLIMIT_MEMLOCK (RDMA registers memory by pinning it),
// and tells `health` whether an RDMA transport is among them.
void check_ucx(WorkerHealth& health, bool require_rdma) {
  StatusOr<std::vector<kvtransfer::UcxResource>> found = kvtransfer::query_ucx_resources();
  if (!found.ok()) {
    PD_LOG_WARN("cannot list UCX transports: {}", std::string(found.status().message()));
    health.set_rdma(false, "unknown (" + std::string(found.status().message()) + ")");
    return;
  }
  bool rdma = false;
  for (const kvtransfer::UcxResource& r : *found) rdma = rdma || kvtransfer::is_rdma_transport(r.transport);
  const std::string names = kvtransfer::describe_ucx_resources(*found);
  // Printed whatever the log level: the first thing to look at when KV transfers are slow.
  std::cerr << "UCX transports: " << names << "; RDMA: " << (rdma ? "yes" : "no")
            << "; RLIMIT_MEMLOCK: " << memlock_limit() << std::endl;
  if (require_rdma && !rdma)
    PD_LOG_WARN("--require-rdma: UCX offers no RDMA transport (only {}); staying not ready", names);
  health.set_rdma(rdma, names);
}

// Waits until nothing is in flight (RPCs, transfers, held KV) or `deadline`; whether idle.
bool drain(const WorkerService& service, const PrefillRole* prefill, const DecodeRole* decode,
           std::chrono::steady_clock::time_point deadline) {
  auto busy = [&] {
    return service.in_flight() > 0 || (prefill && prefill->open_jobs() > 0) || (decode && decode->open_jobs() > 0);
  };
  while (busy()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

int serve(WorkerProgram program, const WorkerFlags& f, const WorkerSeams& seams) {
  // Checked before the model loads: a bad token file is a startup error, not one after READY.
  std::string cluster_token;
  if (!f.cluster_token_file.empty()) {
    if (f.router.empty()) {
      std::cerr << "error: --cluster-token-file is sent when registering: it needs --router\n";
      return 2;
    }
    auto tokens = read_secret_file(f.cluster_token_file);
    if (!tokens.ok()) {
      std::cerr << "error: --cluster-token-file: " << tokens.status().message() << "\n";
      return 2;
    }
    cluster_token = tokens->front();
  }
  engine::EngineOptions engine_options = f.engine;
  engine_options.prefix_cache.enabled = f.prefix_caching == "on";
  engine_options.kv_load_timeout = std::chrono::milliseconds(f.kv_load_timeout_ms);
  if (!f.kv_hash_secret_file.empty()) {
    auto secret = read_secret_file(f.kv_hash_secret_file);
    if (!secret.ok()) {
      std::cerr << "error: --kv-hash-secret-file: " << secret.status().message() << "\n";
      return 2;
    }
    engine_options.prefix_cache.secret = secret->front();
  }
  // A worker's TLS is mutual or none: only the router (a certificate of the CA) may drive it.
  auto tls = load_tls(f.tls);
  if (!tls.ok()) {
    std::cerr << "error: " << tls.status().message() << "\n";
    return 2;
  }
  if (tls->mode == TlsMode::kServer) {
    std::cerr << "error: a worker's TLS is mutual: --tls-cert and --tls-key need --tls-ca (whose certificates "
                 "may call it)\n";
    return 2;
  }
  Role role = ROLE_PREFILL;
  if (program == WorkerProgram::kDecode) {
    if (f.role == "aggregated") {
      role = ROLE_AGGREGATED;
    } else if (f.role == "decode" || f.role.empty()) {
      role = ROLE_DECODE;
    } else {
      std::cerr << "error: --role must be decode or aggregated\n";
      return 2;
    }
  } else if (!f.role.empty() && f.role != "prefill") {
    std::cerr << "error: pdserve-prefill serves --role prefill only\n";
    return 2;
  }
  if (role == ROLE_AGGREGATED && (f.require_rdma || f.kv_port != 0 || !f.kv_key_file.empty())) {
    std::cerr << "error: --require-rdma, --kv-port and --kv-key-file apply to the prefill and decode roles (an "
                 "aggregated worker moves no KV)\n";
    return 2;
  }
  if (role == ROLE_PREFILL && f.engine.decode_graphs) {
    std::cerr << "error: --decode-graphs records decode steps, which a prefill worker runs none of: pass it to the "
                 "decode and aggregated workers\n";
    return 2;
  }
  if (role == ROLE_PREFILL && f.engine.async_scheduling) {
    std::cerr << "error: --async-scheduling overlaps decode steps, and a prefill worker's steps wait for each "
                 "layer's KV to be handed on: pass it to the decode and aggregated workers\n";
    return 2;
  }
  if (f.kv_peer_tier && (role == ROLE_AGGREGATED || f.engine.host_kv_bytes == 0)) {
    std::cerr << "error: --kv-peer-tier applies to prefill and decode workers with a host KV tier (--host-kv-bytes): "
                 "it serves that tier to, and reads prefixes from, the other workers of a P/D cluster\n";
    return 2;
  }
  if (f.drain_timeout_s < 0) {
    std::cerr << "error: --drain-timeout-s must be >= 0\n";
    return 2;
  }
  if (f.probe_port < -1 || f.probe_port > 65535) {
    std::cerr << "error: --probe-port must be -1 (none), 0 (any free port) or a port\n";
    return 2;
  }
  if (f.kv_port < 0 || (f.kv_port > 0 && f.kv_port + f.engine.tp - 1 > 65535)) {
    std::cerr << "error: --kv-port must be 0 (any free port) or a port N with N + tp - 1 <= 65535\n";
    return 2;
  }
  if (!f.advertise.empty() && !split_host_port(f.advertise).ok()) {
    std::cerr << "error: --advertise must be HOST:PORT\n";
    return 2;
  }
  const std::string role_name = role == ROLE_PREFILL ? "prefill" : role == ROLE_DECODE ? "decode" : "aggregated";
  // Signals are taken by sigwait() on the main thread; every thread started later inherits
  // the mask, so none of them is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // ZeroMQ and cpp-httplib bind numeric addresses without brackets: a host name (`localhost`) or
  // a bracketed IPv6 address (`[::]`) is made one here.
  std::string numeric_host;
  {
    StatusOr<std::vector<std::string>> numeric = resolve_host_port(f.host + ":0");
    if (!numeric.ok()) return fail("--host", numeric.status());
    numeric_host = split_host_port(numeric->front())->host;  // Resolved: always HOST:PORT.
  }
  // The probes answer from before the model loads (start-up: not yet) to the end of the drain.
  WorkerHealth health(role_name, {.router = !f.router.empty(), .rdma = f.require_rdma});
  std::unique_ptr<ProbeServer> probes;
  if (f.probe_port >= 0) {
    auto started = ProbeServer::start(numeric_host, f.probe_port, health);
    if (!started.ok()) return fail("probes", started.status());
    probes = std::move(*started);
  }
  if (role != ROLE_AGGREGATED) check_ucx(health, f.require_rdma);

  auto model = engine::load_model({f.model, f.tokenizer});
  if (!model.ok()) return fail("model", model.status());
  const std::string model_name = model->name;
  // KV events: bound now, since the engine's prefix cache reports to the publisher from its
  // creation on (EngineOptions::kv_event_sink), and started once the worker has its id.
  // Declared before the engine loop, so that it outlives the engine that calls it.
  std::unique_ptr<kvevents::KvEventPublisher> kv_events;
  if (!f.kv_events_endpoint.empty()) {
    kvevents::KvEventPublisherOptions ko;
    ko.pub_endpoint = f.kv_events_endpoint;
    ko.replay_endpoint = f.kv_replay_endpoint;
    ko.heartbeat_interval = std::chrono::milliseconds(f.kv_events_heartbeat_ms);
    ko.max_batch_events = f.kv_events_max_batch;
    ko.buffer_batches = f.kv_events_buffer;
    auto created = kvevents::KvEventPublisher::create(std::move(ko));
    if (!created.ok()) return fail("--kv-events-endpoint", created.status());
    kv_events = std::move(*created);
  }
  engine::EngineOptions options = engine_options;
  options.prefix_cache.event_sink = kv_events.get();
  options.weight_dtype = *engine::dtype_from_name(f.weight_dtype);  // Checked by the flags.
  options.kv_dtype = *engine::dtype_from_name(f.kv_dtype);
  options.gemm_precision = *engine::gemm_precision_from_name(f.gemm_precision);
  auto created = engine::Engine::create(std::move(*model), options);
  if (!created.ok()) return fail("engine", created.status());
  std::unique_ptr<engine::Engine> eng = std::move(*created);
  const engine::BlockKey kv_key_root = eng->kv_key_root();

  KvRanksOptions kv;
  kv.model_id = model_name;
  kv.test_faults = seams.kv_faults;
  kv.memory = f.kv_memory == "staged" ? KvMemory::kStaged : KvMemory::kAuto;
  kv.default_lease = std::chrono::milliseconds(f.kv_lease_ms);
  kv.peer_timeout = std::chrono::milliseconds(f.kv_peer_timeout_ms);
  kv.heartbeat_interval = std::min<Duration>(std::chrono::seconds(1), kv.peer_timeout / 4);
  kv.bind_host = numeric_host;
  kv.port_base = f.kv_port;
  kv.advertise_host = f.advertise.empty() ? f.host : split_host_port(f.advertise)->host;  // Checked above.
  if (!f.kv_key_file.empty()) {
    auto keys = read_secret_file(f.kv_key_file);
    if (!keys.ok()) return fail("--kv-key-file", keys.status());
    auto key = kvtransfer::parse_curve_key(keys->front());
    if (!key.ok()) return fail("--kv-key-file " + f.kv_key_file, key.status());
    kv.curve_secret_key = key->secret_z85;
  }
  // Declared first so that it is destroyed last: the roles use its engine.
  std::unique_ptr<engine::EngineLoop> loop;
  std::unique_ptr<PrefillRole> prefill;
  std::unique_ptr<DecodeRole> decode;
  if (role == ROLE_PREFILL) {
    auto r = PrefillRole::create(*eng, kv);
    if (!r.ok()) return fail("kvtransfer", r.status());
    prefill = std::move(*r);
  } else if (role == ROLE_DECODE) {
    auto r = DecodeRole::create(*eng, kv);
    if (!r.ok()) return fail("kvtransfer", r.status());
    decode = std::move(*r);
  }
  // Declared after the roles: destroyed before them, while the engine still lives.
  std::unique_ptr<PeerTier> peer;
  if (f.kv_peer_tier) {
    PeerTierOptions po;
    po.kv = kv;
    po.lease = kv.default_lease;
    po.read_timeout = std::chrono::milliseconds(f.kv_peer_read_timeout_ms);
    po.credentials = peer_channel_credentials(*tls);
    auto r = PeerTier::create(*eng, std::move(po));
    if (!r.ok()) return fail("--kv-peer-tier", r.status());
    peer = std::move(*r);
  }
  loop = std::make_unique<engine::EngineLoop>(std::move(eng));
  if (prefill) prefill->attach(loop.get());
  health.set_started([&loop, kv_ranks = prefill ? &prefill->kv() : decode ? &decode->kv() : nullptr] {
    const engine::EngineLoopStats st = loop->stats();
    return WorkerLoadGauges{st.engine.num_blocks,
                            st.engine.free_blocks,
                            st.engine.running,
                            st.engine.waiting,
                            kv_ranks ? kv_ranks->transfer_failures() : 0,
                            st.engine.steps,
                            st.engine.prefill_tokens,
                            st.engine.decode_tokens,
                            st.engine.step_seconds,
                            st.engine.preemptions};
  });
  std::unique_ptr<RouterSet> registration;  // Set once serving, when --router is given.
  // The probe threads outlive the engine (they answer until the end): from here on, every way
  // out of this function first takes the engine and the routers away from them.
  struct DetachHealth {
    WorkerHealth& health;
    ~DetachHealth() { health.detach(); }
  } detach_health{health};

  std::string worker_id = f.id;
  WorkerService service(role, "", *loop, prefill.get(), decode.get(), f.kv_compat);
  service.set_peer_tier(peer.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.host + ":" + std::to_string(f.port), server_credentials(*tls, ClientCerts::kRequired),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "error: cannot listen on " << f.host << ":" << f.port << "\n";
    return 1;
  }
  const std::string address = f.host + ":" + std::to_string(port);
  if (worker_id.empty()) worker_id = role_name + "@" + address;
  service.set_worker_id(worker_id);
  std::string kv_events_endpoint, kv_replay_endpoint;
  if (kv_events) {
    const std::string host = f.advertise.empty() ? f.host : split_host_port(f.advertise)->host;  // Checked above.
    kv_events_endpoint = connect_endpoint(kv_events->pub_endpoint(), host);
    kv_replay_endpoint = connect_endpoint(kv_events->replay_endpoint(), host);
    const KvRanks* kv_ranks = prefill ? &prefill->kv() : decode ? &decode->kv() : nullptr;
    const Status started = kv_events->start({.worker_id = worker_id,
                                             .block_size = uint32_t(f.engine.block_size),
                                             .compat_hash = kv_ranks ? kv_ranks->compat_hash() : 0,
                                             .key_root = kv_key_root});
    if (!started.ok()) return fail("KV events", started);
    service.set_kv_events(kv_events_endpoint, kv_replay_endpoint);
  }
  health.set_serving();
  std::cout << "READY grpc=" << address << " role=" << role_name << " tp=" << f.engine.tp << " model=" << model_name;
  if (probes) std::cout << " probe=" << f.host << ":" << probes->port();
  if (role != ROLE_AGGREGATED) std::cout << " kv-control=" << (kv.curve_secret_key.empty() ? "plaintext" : "curve");
  if (kv_events) std::cout << " kv-events=" << kv_events_endpoint << " kv-replay=" << kv_replay_endpoint;
  if (f.engine.backend == "cpu") std::cout << " cpu-threads=" << f.engine.cpu_threads;
  std::cout << std::endl;
  PD_LOG_INFO("{} serving {} on {} (TP {})", worker_id, model_name, address, f.engine.tp);

  if (!f.router.empty() && f.advertise.empty() && (f.host == "0.0.0.0" || f.host == "::" || f.host == "[::]"))
    PD_LOG_WARN("listening on {} without --advertise: registering as {}, which only this machine can dial", f.host,
                address);
  if (!f.router.empty()) {
    RegistrationOptions ro;
    ro.router = f.router;
    ro.cluster_token = cluster_token;
    ro.credentials = peer_channel_credentials(*tls);
    // The router's certificate names the --router host, not the addresses it resolves to.
    if (StatusOr<HostPort> named = split_host_port(f.router); named.ok() && tls->mode == TlsMode::kMutual)
      ro.tls_server_name = named->host;
    ro.heartbeat_interval = std::chrono::milliseconds(f.heartbeat_ms);
    const std::string advertised = f.advertise.empty() ? address : f.advertise;
    registration = std::make_unique<RouterSet>(ro, [&service, advertised, worker_id] {
      WorkerInfo info;
      InfoRequest none;
      (void)service.Info(nullptr, &none, &info);
      RegisterRequest r;
      r.set_address(advertised);
      r.set_role(info.role());
      r.set_worker_id(worker_id);
      r.set_tp(info.tp());
      r.set_model(info.model().name());
      r.set_num_blocks(info.num_blocks());
      r.set_block_size(info.block_size());
      r.set_compat_hash(info.compat_hash());
      r.set_kv_events_endpoint(info.kv_events_endpoint());
      r.set_kv_replay_endpoint(info.kv_replay_endpoint());
      r.set_host_kv_blocks(info.host_tier().blocks());
      return r;
    });
    registration->start();
    health.set_registration([set = registration.get()] { return set->registered(); });
  }

  int sig = 0;
  sigwait(&signals, &sig);
  // The drain's time counts from the signal: leaving the routers is part of it.
  const auto drain_until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                  std::chrono::duration<double>(f.drain_timeout_s));
  PD_LOG_INFO("{}: signal {}, draining (up to {} s)", worker_id, sig, f.drain_timeout_s);
  // Not ready and out of the routers first, so that nothing new is sent while we drain; what
  // still arrives is refused (the router places it elsewhere), what is in flight finishes.
  health.set_draining();
  service.set_draining();
  if (registration) registration->stop();
  if (drain(service, prefill.get(), decode.get(), drain_until))
    PD_LOG_INFO("{}: drained", worker_id);
  else
    PD_LOG_WARN("{}: drain timeout: cancelling what is still in flight", worker_id);
  // In-flight RPCs get a moment to finish, then are cancelled (their handlers abort).
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (prefill) prefill->shutdown(std::chrono::seconds(2));
  if (decode) decode->shutdown(std::chrono::seconds(2));
  loop->shutdown();
  server->Wait();
  return 0;
}

}  // namespace

int worker_main(WorkerProgram program, int argc, char** argv) { return worker_main(program, argc, argv, WorkerSeams{}); }

int worker_main(WorkerProgram program, int argc, char** argv, const WorkerSeams& seams) {
  init_logging();
  WorkerFlags f;
  CLI::App app{program == WorkerProgram::kPrefill ? "pdserve prefill worker" : "pdserve decode / aggregated worker"};
  app.add_option("--role", f.role,
                 program == WorkerProgram::kPrefill ? "prefill" : "decode (default) or aggregated");
  app.add_option("--model", f.model, "Model path or name")->capture_default_str();
  app.add_option("--tokenizer", f.tokenizer, "Tokenizer file (default: found beside the model)");
  app.add_option("--host", f.host, "gRPC listen address")->capture_default_str();
  app.add_option("--port", f.port, "gRPC port (0: pick one; see the READY line)")->capture_default_str();
  app.add_option("--id", f.id, "Worker id (default: role@host:port)");
  app.add_option("--tp", f.engine.tp, "Tensor-parallel ranks")->capture_default_str();
  app.add_option("--cpu-threads", f.engine.cpu_threads,
                 "Threads each rank computes with on the cpu backend (GEMMs and attention split between them; the "
                 "same tokens on any count)")
      ->check(CLI::Range(1, engine::kMaxCpuThreads))
      ->capture_default_str();
  app.add_option("--device", f.engine.backend,
      "Compute backend: cpu, or cuda / hip (rank r on GPU r); emulated: the GPU backend on a CPU "
      "emulation of the GPU (tests)")
      ->check(CLI::IsMember({"cpu", "cuda", "hip", "emulated"}))
      ->capture_default_str();
  app.add_option("--weight-dtype", f.weight_dtype,
                 "GEMM weights on a GPU backend: f32, or bf16 (half the memory; exact for bf16 checkpoints)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--gemm-precision", f.gemm_precision,
                 "How the GEMMs take their activations: exact (f32), or bf16 (rounded to bf16 for the vendor bf16 "
                 "GEMM and tensor cores, on CUDA prefill attention's products too; needs --weight-dtype bf16; "
                 "within a tolerance of exact, not equal)")
      ->check(CLI::IsMember({"exact", "bf16"}))
      ->capture_default_str();
  app.add_flag("--decode-graphs", f.engine.decode_graphs,
               "Record decode steps once per batch bucket as GPU graphs and replay them (one launch a step); GPU "
               "backends at TP 1");
  app.add_flag("--async-scheduling", f.engine.async_scheduling,
               "Queue each step before reading the previous step's tokens, so that scheduling and streaming overlap "
               "the device's work (a stopping request computes one wasted token); GPU backends");
  app.add_option("--kv-dtype", f.kv_dtype,
                 "The KV cache's elements: f32, or bf16 on a GPU backend (half the bytes; twice the blocks)"
                 "; prefill and decode workers must agree")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--kv-memory", f.kv_memory,
                 "KV for transfers: auto (the engine's arena when it is host memory, else a staged host "
                 "mirror) or staged (always the mirror)")
      ->check(CLI::IsMember({"auto", "staged"}))
      ->capture_default_str();
  app.add_option("--block-size", f.engine.block_size, "Tokens per KV block")->capture_default_str();
  app.add_option("--kv-cache-bytes", f.engine.kv_cache_bytes, "KV cache bytes per rank");
  app.add_option("--host-kv-bytes", f.engine.host_kv_bytes,
                 "Host tier of the KV cache, bytes per rank: blocks the device cache gives up (evicted, or of "
                 "preempted requests) are kept here by their prefix-cache keys and copied back instead of "
                 "recomputed (docs/kv_offload.md; 0: none)")
      ->capture_default_str();
  app.add_option("--kv-offload-dir", f.engine.kv_offload_dir,
                 "Filesystem tier of the KV cache: chunk files of 16 blocks in this directory, stored from the host "
                 "tier and loaded through it, kept across restarts and shareable between workers of the same model "
                 "whatever their TP (needs --host-kv-bytes; docs/kv_offload.md)");
  app.add_option("--kv-offload-dir-bytes", f.engine.kv_offload_dir_bytes,
                 "Bytes the filesystem tier keeps at most (0: no limit)")
      ->capture_default_str();
  app.add_option("--kv-load-timeout-ms", f.kv_load_timeout_ms,
                 "How long one request may wait for its chunk files of the filesystem tier (read off the "
                 "scheduler's thread); past it the request computes the rest of its prompt (0: no limit; needs "
                 "--kv-offload-dir)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  CLI::Option* peer_tier = app.add_flag("--kv-peer-tier", f.kv_peer_tier,
               "Peer tier of the KV cache (P/D workers with --host-kv-bytes): serve this worker's host tier to the "
               "cluster's other workers, and read a prompt's prefix from the worker the router names as holding "
               "more of it before computing it (docs/kv_offload.md)");
  app.add_option("--kv-peer-read-timeout-ms", f.kv_peer_read_timeout_ms,
                 "How long a prefill waits for a peer-tier read before it computes the prefix instead (needs "
                 "--kv-peer-tier)")
      ->needs(peer_tier)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--memory-utilization", f.engine.memory_utilization, "KV cache as a fraction of device memory");
  app.add_option("--max-batch-tokens", f.engine.max_batch_tokens, "Tokens per engine step")->capture_default_str();
  app.add_option("--max-running", f.engine.max_running, "Sequences in flight")->capture_default_str();
  app.add_option("--prefix-caching", f.prefix_caching,
                 "Keep full KV blocks cached after their request and start later requests with the same "
                 "leading tokens from them (docs/prefix_caching.md)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--kv-hash-secret-file", f.kv_hash_secret_file,
                 "File whose first secret line is mixed into every prefix-cache block key (keys unpredictable "
                 "without it)")
      ->check(CLI::ExistingFile);
  app.add_option("--kv-lease-ms", f.kv_lease_ms, "How long KV transfers and reservations may take")->capture_default_str();
  app.add_option("--kv-peer-timeout-ms", f.kv_peer_timeout_ms, "A silent kvtransfer peer is lost after this")
      ->capture_default_str();
  app.add_option("--router", f.router, "Register with the router at HOST:PORT and heartbeat to it");
  app.add_option("--cluster-token-file", f.cluster_token_file,
                 "File holding the router's cluster token (its first secret line), sent when registering")
      ->check(CLI::ExistingFile);
  app.add_option("--kv-key-file", f.kv_key_file,
                 "File holding the cluster's kvtransfer key (`pdserve kv-keygen`): the KV control channel is "
                 "CURVE-encrypted and only workers holding the same key can connect")
      ->check(CLI::ExistingFile);
  app.add_option("--advertise", f.advertise, "HOST:PORT the router should dial (default: --host and the bound port)");
  app.add_option("--heartbeat-ms", f.heartbeat_ms, "Heartbeat interval (0: as the router asks)")->capture_default_str();
  app.add_option("--probe-port", f.probe_port,
                 "HTTP probes on --host: /livez, /startupz, /readyz, /metrics (-1: none; 0: any free port)")
      ->capture_default_str();
  app.add_option("--kv-port", f.kv_port,
                 "Rank r's kvtransfer control channel listens on --host, port N + r (0: any free port)")
      ->capture_default_str();
  app.add_flag("--require-rdma", f.require_rdma,
               "Stay not ready (/readyz 503) while UCX offers no RDMA transport (only tcp, shared memory, self)");
  app.add_option("--drain-timeout-s", f.drain_timeout_s,
                 "On SIGTERM: seconds for in-flight streams and KV transfers to finish before they are cancelled")
      ->capture_default_str();
  app.add_option("--kv-compat", f.kv_compat,
                 "KV-compatibility label; the router pairs prefill and decode workers only when theirs are equal")
      ->envname("PDSERVE_KV_COMPAT");
  app.add_option("--kv-events-endpoint", f.kv_events_endpoint,
                 "Publish KV events on this ZeroMQ bind address, e.g. tcp://*:0 (default: none; docs/kv_events.md)");
  app.add_option("--kv-replay-endpoint", f.kv_replay_endpoint,
                 "The KV events' replay/snapshot socket (with --kv-events-endpoint; empty: none)")
      ->capture_default_str();
  app.add_option("--kv-events-heartbeat-ms", f.kv_events_heartbeat_ms, "KV-event heartbeat interval")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kv-events-max-batch", f.kv_events_max_batch, "Block events per KV-event batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kv-events-buffer", f.kv_events_buffer, "KV-event batches kept for replay")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tls-cert", f.tls.cert,
                 "Mutual TLS (with --tls-key and --tls-ca): serve gRPC over TLS with this PEM certificate (chain), "
                 "presented to the router too");
  app.add_option("--tls-key", f.tls.key, "The PEM private key of --tls-cert");
  app.add_option("--tls-ca", f.tls.ca,
                 "The PEM CA whose certificates alone may call this worker (the router's) and that the router's "
                 "certificate must be signed by");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return serve(program, f, seams);
}

}  // namespace pdserve::worker
