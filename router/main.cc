// pdserve-router: the cluster's front door. Serves the client gRPC API (plus health and
// reflection) and the OpenAI-compatible HTTP API, and drives the workers given by address or
// registered through its Registry service (workers started with --router).
// Prints "READY grpc=HOST:PORT http=HOST:PORT" on stdout once both listen.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <thread>

#include "common/logging.h"
#include "engine/model_loader.h"
#include "common/secrets.h"
#include "common/tls.h"
#include "router/api_keys.h"
#include "router/generation_service.h"
#include "router/http_server.h"
#include "router/kv_routing.h"
#include "router/registry_service.h"
#include "router/router.h"

namespace {

struct Flags {
  std::string model = "stories260K";
  std::string tokenizer;
  std::string host = "127.0.0.1";
  int port = 0;
  int http_port = -1;
  std::vector<std::string> prefill, decode, aggregated;
  std::string kv_mode = "push";
  int max_running = 64;
  int max_waiting = 256;
  double request_timeout_s = 600;
  double drain_timeout_s = 30;  // On SIGTERM, for requests in flight.
  int poll_interval_ms = 200;
  int max_message_bytes = 16 << 20;
  int max_migrations = 3;
  int failure_threshold = 3;
  std::vector<std::string> api_keys;
  std::string api_key_file, cluster_token_file;
  bool metrics_auth = false;
  double stall_timeout_s = 5;
  double worker_wait_s = 30;
  int heartbeat_interval_ms = 1000;
  int heartbeat_timeout_ms = 3000;
  pdserve::TlsFiles tls;
  std::string tls_worker_name;
  pdserve::router::Placement placement = pdserve::router::Placement::kCache;
  double transfer_weight = 1.0;
  int local_prefill_tokens = 512;
  bool local_prefill_given = false;  // --local-prefill-tokens on the command line.
};

int run(const Flags& f) {
  using namespace pdserve;
  using namespace pdserve::router;
  // Workers may be listed here or register themselves later (then --kv-mode picks the mode).
  const bool pd_listed = !f.prefill.empty() || !f.decode.empty();
  if (!f.aggregated.empty() && pd_listed) {
    std::cerr << "error: give either --aggregated workers, or --prefill and --decode workers\n";
    return 2;
  }
  if ((pd_listed && f.kv_mode == "aggregated") || (!f.aggregated.empty() && f.kv_mode != "push" && f.kv_mode != "aggregated")) {
    std::cerr << "error: --kv-mode " << f.kv_mode << " does not match the workers given\n";
    return 2;
  }
  // Signals are taken by sigwait below, never by a random thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto keys = ApiKeys::load(f.api_keys, f.api_key_file, std::getenv("PDSERVE_API_KEY"));
  if (!keys.ok()) {
    std::cerr << "error: " << keys.status().message() << "\n";
    return 2;
  }
  std::vector<std::string> cluster_tokens;
  if (!f.cluster_token_file.empty()) {
    auto tokens = read_secret_file(f.cluster_token_file);
    if (!tokens.ok()) {
      std::cerr << "error: --cluster-token-file: " << tokens.status().message() << "\n";
      return 2;
    }
    cluster_tokens = std::move(*tokens);
  }
  auto tls = load_tls(f.tls);
  if (!tls.ok()) {
    std::cerr << "error: " << tls.status().message() << "\n";
    return 2;
  }
  if (!f.tls_worker_name.empty() && tls->mode != TlsMode::kMutual) {
    std::cerr << "error: --tls-worker-name applies to the workers' certificates: it needs --tls-ca\n";
    return 2;
  }
  auto loaded = engine::load_model({f.model, f.tokenizer});
  if (!loaded.ok()) {
    std::cerr << "error: " << loaded.status().message() << "\n";
    return 1;
  }
  ServedModel model;
  model.name = loaded->name;
  model.aliases = {f.model, loaded->path};
  model.config = loaded->config;
  model.chat_template = loaded->chat_template;
  model.tokenizer = std::move(loaded->tokenizer);

  std::vector<WorkerRegistry::Endpoint> endpoints;
  for (const auto& a : f.prefill) endpoints.push_back({a, worker::ROLE_PREFILL});
  for (const auto& a : f.decode) endpoints.push_back({a, worker::ROLE_DECODE});
  for (const auto& a : f.aggregated) endpoints.push_back({a, worker::ROLE_AGGREGATED});
  RegistryOptions ro;
  ro.poll_interval = std::chrono::milliseconds(f.poll_interval_ms);
  ro.max_message_bytes = f.max_message_bytes;
  ro.heartbeat_interval = std::chrono::milliseconds(f.heartbeat_interval_ms);
  ro.heartbeat_timeout = std::chrono::milliseconds(f.heartbeat_timeout_ms);
  ro.failure_threshold = f.failure_threshold;
  ro.credentials = peer_channel_credentials(*tls);
  ro.tls_server_name = f.tls_worker_name;
  // Declared before the registry, whose polls tell it of the workers' KV events.
  KvRouting kv_routing(RealClock::instance());
  WorkerRegistry registry(endpoints, ro, RealClock::instance());
  registry.set_listener(&kv_routing);
  registry.poll_once();
  registry.start();

  RouterOptions opts;
  opts.kv_mode = *parse_kv_mode(f.aggregated.empty() ? f.kv_mode : "aggregated");  // CLI11 checked the name.
  if (f.local_prefill_given && opts.kv_mode == KvMode::kAggregated) {
    std::cerr << "error: --local-prefill-tokens chooses between a decode worker and a prefill worker: it needs "
                 "--kv-mode push or pull\n";
    return 2;
  }
  std::vector<std::string> model_names = {model.name};
  model_names.insert(model_names.end(), model.aliases.begin(), model.aliases.end());
  opts.max_running = f.max_running;
  opts.max_waiting = f.max_waiting;
  opts.request_timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(f.request_timeout_s));
  opts.max_migrations = f.max_migrations;
  opts.stall_timeout = std::chrono::duration_cast<pdserve::Duration>(std::chrono::duration<double>(f.stall_timeout_s));
  opts.worker_wait = std::chrono::duration_cast<pdserve::Duration>(std::chrono::duration<double>(f.worker_wait_s));
  opts.placement = f.placement;
  opts.transfer_weight = f.transfer_weight;
  opts.local_prefill_tokens = f.local_prefill_tokens;
  RouterMetrics metrics;
  Router router(opts, std::move(model), registry, metrics, RealClock::instance(), &kv_routing);
  GenerationService service(router, *keys);
  const bool mutual_tls = tls->mode == TlsMode::kMutual;
  RegistryService registry_service(registry, model_names, opts.kv_mode, cluster_tokens, mutual_tls);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  // Clients and workers share the port: a client certificate is verified when presented, and
  // the Registry service requires one (mutual TLS).
  builder.AddListeningPort(f.host + ":" + std::to_string(f.port), server_credentials(*tls, ClientCerts::kOptional),
                           &grpc_port);
  builder.SetMaxReceiveMessageSize(f.max_message_bytes);
  builder.RegisterService(&service);
  builder.RegisterService(&registry_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || grpc_port == 0) {
    std::cerr << "error: cannot listen on " << f.host << ":" << f.port << "\n";
    return 1;
  }
  HttpServerOptions http_options;
  http_options.max_body_bytes = size_t(f.max_message_bytes);
  // A thread for every request admission could hold, plus a few for /health, /metrics, /v1/models.
  http_options.threads = size_t(f.max_running) + size_t(f.max_waiting) + 4;
  http_options.api_keys = &*keys;
  http_options.metrics_need_key = f.metrics_auth;
  if (tls->mode != TlsMode::kPlaintext) http_options.tls = &*tls;
  HttpServer http(router, http_options);
  // Default: gRPC port + 1; but a gRPC port the system chose (--port 0) says nothing about the
  // next one, which may be another process's, so then any free one (READY names it).
  const int want_http = f.http_port >= 0 ? f.http_port : (f.port == 0 ? 0 : grpc_port + 1);
  auto http_port = http.bind(f.host, want_http);
  if (!http_port.ok()) {
    std::cerr << "error: " << http_port.status().message() << "\n";
    server->Shutdown();
    return 1;
  }
  http.start();
  std::cout << "READY grpc=" << f.host << ":" << grpc_port << " http=" << f.host << ":" << *http_port << std::endl;
  std::cerr << "router: model " << router.model_info().name() << ", mode " << kv_mode_name(opts.kv_mode) << ", " << endpoints.size()
            << " workers listed; workers may register (heartbeat timeout " << f.heartbeat_timeout_ms << " ms"
            << (cluster_tokens.empty() ? "" : ", cluster token required") << (mutual_tls ? ", mutual TLS" : "")
            << "); " << (tls->mode == TlsMode::kPlaintext ? "plaintext" : "TLS") << " gRPC and HTTP; "
            << (keys->required() ? std::to_string(keys->size()) + " API key(s) required" : "no API key required") << "\n";

  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  const timespec tick{0, 200'000'000};
  while (true) {
    const bool ready = router.ready();
    health->SetServingStatus(ready);
    health->SetServingStatus("pdserve.v1.Generation", ready);
    if (sigtimedwait(&signals, nullptr, &tick) > 0) break;
  }
  // Drain: not serving (readiness fails, so the Service stops sending), new requests refused,
  // those in flight finish for up to --drain-timeout-s.
  std::cerr << "router: draining (up to " << f.drain_timeout_s << " s)\n";
  router.set_draining();
  health->SetServingStatus(false);
  health->SetServingStatus("pdserve.v1.Generation", false);
  const auto drain_until = std::chrono::steady_clock::now() + std::chrono::duration<double>(f.drain_timeout_s);
  while (router.in_flight() > 0 && std::chrono::steady_clock::now() < drain_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::cerr << "router: " << (router.in_flight() == 0 ? "drained" : "drain timeout: aborting what is in flight")
            << "; shutting down\n";
  router.abort_all();
  http.stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  registry.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pdserve::init_logging();
  Flags f;
  CLI::App app{"pdserve-router: client APIs (gRPC, OpenAI HTTP) in front of prefill/decode workers"};
  app.add_option("--model", f.model, "Model path or name (for the tokenizer and limits)")->capture_default_str();
  app.add_option("--tokenizer", f.tokenizer, "Tokenizer file (default: found beside the model)");
  app.add_option("--host", f.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", f.port, "gRPC port (0: any free one)")->capture_default_str();
  app.add_option("--http-port", f.http_port, "HTTP port (default: gRPC port + 1, or any free one with --port 0; 0: any free one)");
  app.add_option("--prefill", f.prefill, "Prefill worker HOST:PORT (repeatable)");
  app.add_option("--decode", f.decode, "Decode worker HOST:PORT (repeatable)");
  app.add_option("--aggregated", f.aggregated, "Aggregated worker HOST:PORT (repeatable)");
  app.add_option("--kv-mode", f.kv_mode,
                 "KV transfer mode between prefill and decode (pull-host: the decode side reads a copy in the "
                 "prefill worker's host KV tier, which frees its device blocks at once; needs --host-kv-bytes there); "
                 "aggregated: serve aggregated workers (implied by --aggregated)")
      ->check(CLI::IsMember({"push", "pull", "pull-host", "aggregated"}))->capture_default_str();
  app.add_option("--max-running", f.max_running, "Requests out at the workers at once")->capture_default_str();
  app.add_option("--max-waiting", f.max_waiting, "Requests queued at the router before refusing (overloaded)")->capture_default_str();
  app.add_option("--request-timeout", f.request_timeout_s, "Per-request timeout in seconds")->capture_default_str();
  app.add_option("--poll-interval-ms", f.poll_interval_ms, "Worker Info poll interval")->capture_default_str();
  app.add_option("--max-message-bytes", f.max_message_bytes, "Largest request accepted (gRPC and HTTP)")->capture_default_str();
  app.add_option("--drain-timeout-s", f.drain_timeout_s,
                 "On SIGTERM: seconds for requests in flight to finish (new ones are refused) before shutdown")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-migrations", f.max_migrations,
                 "Times a request is placed again when its workers fail, die or stall (before or after its first "
                 "token; the stream goes on from the tokens already sent)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--failure-threshold", f.failure_threshold,
                 "Failed requests in a row that mark a worker down (a failed health poll does at once)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--worker-wait-s", f.worker_wait_s,
                 "How long a request waits for a worker when none can take it (all down or full) before it fails")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--stall-timeout-s", f.stall_timeout_s,
                 "A streaming request is migrated when no token came for this long (or, if longer, 50 x its mean "
                 "inter-token time, 50 x its worker's mean step time, or 4 x the expected length of the step its "
                 "worker is running)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--api-key", f.api_keys,
                 "A client API key (repeatable; also --api-key-file and $PDSERVE_API_KEY): requests then need "
                 "Authorization: Bearer KEY (HTTP) or authorization metadata (gRPC)");
  app.add_option("--api-key-file", f.api_key_file, "File of client API keys, one per line")->check(CLI::ExistingFile);
  app.add_flag("--metrics-auth", f.metrics_auth, "/metrics needs an API key too (/health never does)");
  app.add_option("--cluster-token-file", f.cluster_token_file,
                 "File of cluster tokens (one per line): registering workers must send one (their --cluster-token-file)")
      ->check(CLI::ExistingFile);
  app.add_option("--heartbeat-interval-ms", f.heartbeat_interval_ms, "How often registered workers are asked to heartbeat")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", f.heartbeat_timeout_ms, "A registered worker is dropped after this long without a heartbeat")
      ->capture_default_str();
  app.add_option("--tls-cert", f.tls.cert,
                 "Serve gRPC and HTTP over TLS with this PEM certificate (chain); needs --tls-key");
  app.add_option("--tls-key", f.tls.key, "The PEM private key of --tls-cert");
  app.add_option("--tls-ca", f.tls.ca,
                 "Mutual TLS with the workers: dial them over TLS trusting only this PEM CA and presenting "
                 "--tls-cert, and let only workers with a certificate it signed register (clients need none)");
  app.add_option("--tls-worker-name", f.tls_worker_name,
                 "With --tls-ca: the name workers' certificates must carry (default: the host of each worker's "
                 "address, e.g. a pod IP)");
  app.add_option("--placement", f.placement,
                 "cache: place by the workers' cached prefixes (from their KV events) against their load; load: "
                 "by load alone (docs/router.md, Placement)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, pdserve::router::Placement>{{"cache", pdserve::router::Placement::kCache},
                                                            {"load", pdserve::router::Placement::kLoad}}))
      ->default_str("cache");
  app.add_option("--transfer-weight", f.transfer_weight,
                 "Cache placement: a KV block to transfer, in prefill-block equivalents (tau)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--local-prefill-tokens", f.local_prefill_tokens,
                 "P/D: a prompt whose uncached part on the chosen decode worker is at most this many tokens is "
                 "prefilled by that decode worker itself, with no prefill worker or KV transfer (decode-local "
                 "prefill); 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  f.local_prefill_given = app.count("--local-prefill-tokens") > 0;
  return run(f);
}
