#include "worker/worker_main.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "common/logging.h"
#include "engine/engine_loop.h"
#include "worker/decode_role.h"
#include "worker/prefill_role.h"
#include "worker/registration.h"
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
  std::string advertise;  // The address the router dials (default: --host and the bound port).
  int64_t heartbeat_ms = 0;  // 0: the router's advice.
  std::string kv_memory = "auto";
  std::string weight_dtype = "f32";
};

int fail(const std::string& what, const Status& s) {
  std::cerr << "error: " << what << ": " << s.message() << "\n";
  return 1;
}

int serve(WorkerProgram program, const WorkerFlags& f) {
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
  // Signals are taken by sigwait() on the main thread; every thread started later inherits
  // the mask, so none of them is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto model = engine::load_model({f.model, f.tokenizer});
  if (!model.ok()) return fail("model", model.status());
  const std::string model_name = model->name;
  engine::EngineOptions options = f.engine;
  options.weight_dtype = *engine::dtype_from_name(f.weight_dtype);  // Checked by the flag.
  auto created = engine::Engine::create(std::move(*model), options);
  if (!created.ok()) return fail("engine", created.status());
  std::unique_ptr<engine::Engine> eng = std::move(*created);

  KvRanksOptions kv;
  kv.model_id = model_name;
  kv.memory = f.kv_memory == "staged" ? KvMemory::kStaged : KvMemory::kAuto;
  kv.default_lease = std::chrono::milliseconds(f.kv_lease_ms);
  kv.peer_timeout = std::chrono::milliseconds(f.kv_peer_timeout_ms);
  kv.heartbeat_interval = std::min<Duration>(std::chrono::seconds(1), kv.peer_timeout / 4);
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
  loop = std::make_unique<engine::EngineLoop>(std::move(eng));
  if (prefill) prefill->attach(loop.get());

  const std::string role_name = role == ROLE_PREFILL ? "prefill" : role == ROLE_DECODE ? "decode" : "aggregated";
  std::string worker_id = f.id;
  WorkerService service(role, "", *loop, prefill.get(), decode.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.host + ":" + std::to_string(f.port), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "error: cannot listen on " << f.host << ":" << f.port << "\n";
    return 1;
  }
  const std::string address = f.host + ":" + std::to_string(port);
  if (worker_id.empty()) worker_id = role_name + "@" + address;
  service.set_worker_id(worker_id);
  std::cout << "READY grpc=" << address << " role=" << role_name << " tp=" << f.engine.tp << " model=" << model_name
            << std::endl;
  PD_LOG_INFO("{} serving {} on {} (TP {})", worker_id, model_name, address, f.engine.tp);

  std::unique_ptr<RouterRegistration> registration;
  if (!f.router.empty() && f.advertise.empty() && (f.host == "0.0.0.0" || f.host == "::" || f.host == "[::]"))
    PD_LOG_WARN("listening on {} without --advertise: registering as {}, which only this machine can dial", f.host,
                address);
  if (!f.router.empty()) {
    RegistrationOptions ro;
    ro.router = f.router;
    ro.heartbeat_interval = std::chrono::milliseconds(f.heartbeat_ms);
    const std::string advertised = f.advertise.empty() ? address : f.advertise;
    registration = std::make_unique<RouterRegistration>(ro, [&service, advertised, worker_id] {
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
      return r;
    });
    registration->start();
  }

  int sig = 0;
  sigwait(&signals, &sig);
  PD_LOG_INFO("{}: signal {}, shutting down", worker_id, sig);
  // Leave the router first, so that it sends nothing new while we drain.
  if (registration) registration->stop();
  // In-flight RPCs get a moment to finish, then are cancelled (their handlers abort).
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (prefill) prefill->shutdown(std::chrono::seconds(2));
  if (decode) decode->shutdown(std::chrono::seconds(2));
  loop->shutdown();
  server->Wait();
  return 0;
}

}  // namespace

int worker_main(WorkerProgram program, int argc, char** argv) {
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
  app.add_option("--device", f.engine.backend,
      "Compute backend: cpu, or cuda / hip (rank r on GPU r); emulated: the GPU backend on a CPU "
      "emulation of the GPU (tests)")
      ->check(CLI::IsMember({"cpu", "cuda", "hip", "emulated"}))
      ->capture_default_str();
  app.add_option("--weight-dtype", f.weight_dtype,
                 "GEMM weights on a GPU backend: f32, or bf16 (half the memory; exact for bf16 checkpoints)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--kv-memory", f.kv_memory,
                 "KV for transfers: auto (the engine's arena when it is host memory, else a staged host "
                 "mirror) or staged (always the mirror)")
      ->check(CLI::IsMember({"auto", "staged"}))
      ->capture_default_str();
  app.add_option("--block-size", f.engine.block_size, "Tokens per KV block")->capture_default_str();
  app.add_option("--kv-cache-bytes", f.engine.kv_cache_bytes, "KV cache bytes per rank");
  app.add_option("--memory-utilization", f.engine.memory_utilization, "KV cache as a fraction of device memory");
  app.add_option("--max-batch-tokens", f.engine.max_batch_tokens, "Tokens per engine step")->capture_default_str();
  app.add_option("--max-running", f.engine.max_running, "Sequences in flight")->capture_default_str();
  app.add_option("--kv-lease-ms", f.kv_lease_ms, "How long KV transfers and reservations may take")->capture_default_str();
  app.add_option("--kv-peer-timeout-ms", f.kv_peer_timeout_ms, "A silent kvtransfer peer is lost after this")
      ->capture_default_str();
  app.add_option("--router", f.router, "Register with the router at HOST:PORT and heartbeat to it");
  app.add_option("--advertise", f.advertise, "HOST:PORT the router should dial (default: --host and the bound port)");
  app.add_option("--heartbeat-ms", f.heartbeat_ms, "Heartbeat interval (0: as the router asks)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return serve(program, f);
}

}  // namespace pdserve::worker
