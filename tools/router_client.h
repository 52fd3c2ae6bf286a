// A client of a router's Generation API, shared by `pdserve generate --router` and `pdserve
// bench`: connects with a bounded wait, streams a request's responses to a callback, and
// converts the engine's SamplingParams (the CLI's flags) to the API's. It can also talk to one
// aggregated worker's Worker API directly, through the same calls, so that `pdserve bench` can
// measure what the router adds to a request.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "common/tls.h"
#include "engine/sampling/sampler.h"
#include "proto/pdserve.grpc.pb.h"
#include "proto/worker.grpc.pb.h"

namespace pdserve::tools {

class RouterClient {
 public:
  // A client of the router at `address` (HOST:PORT); Unavailable when it does not answer
  // within `wait`. `api_key` (if set) goes with every call as `authorization: Bearer KEY`;
  // `tls`: how to dial (the CLI's --tls / --tls-ca).
  static StatusOr<std::unique_ptr<RouterClient>> connect(const std::string& address, Duration wait,
                                                         const std::string& api_key = "", const ClientTls& tls = {});
  // A client of the aggregated worker at `address` instead of a router (no placement, no
  // queue, no retries: requests go straight to its Worker.Generate).
  static StatusOr<std::unique_ptr<RouterClient>> connect_worker(const std::string& address, Duration wait);

  // The served model.
  StatusOr<v1::ModelInfo> model_info();
  // Runs one request, calling `on_response` for each streamed message; the call's status
  // (DeadlineExceeded when `timeout`, if not zero, passed before the stream ended).
  Status generate(const v1::GenerateRequest& request, const std::function<void(const v1::GenerateResponse&)>& on_response,
                  Duration timeout = Duration::zero());

 private:
  RouterClient() = default;
  // A context for one call, with the API key's metadata.
  void authorize(grpc::ClientContext& ctx) const;
  std::string api_key_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<worker::Worker::Stub> worker_;  // Set instead of stub_ for a direct worker client.
  std::atomic<uint64_t> next_id_{0};      // Worker requests need ids; the router makes its own.
};

// A connected client and the model it serves, for the CLI commands.
struct ConnectedClient {
  std::unique_ptr<RouterClient> client;
  v1::ModelInfo model;
};
// Connects to the router at `router`, or — when `worker` is set instead — to that aggregated
// worker directly, and asks for the model; the first failure's status. `api_key`, `tls` (the
// router's): as connect().
StatusOr<ConnectedClient> connect_and_describe(const std::string& router, const std::string& worker = "",
                                               const std::string& api_key = "", const ClientTls& tls = {});
// The API key a CLI command sends: its --api-key, else $PDSERVE_API_KEY, else none.
std::string api_key_or_env(const std::string& flag);

// grpc.health.v1.Health/Check of the whole server at `address`: OK when SERVING, Unavailable
// (saying why) otherwise.
Status grpc_health_serving(const std::string& address, Duration timeout, const ClientTls& tls = {});

// The API's sampling parameters for the CLI's: proto/engine_sampling.h's wire_sampling (seed -1,
// "random", and logprobs / prompt_logprobs -1, none, are left unset).
v1::SamplingParams to_proto(const engine::SamplingParams& p);

}  // namespace pdserve::tools
