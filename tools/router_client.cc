#include "tools/router_client.h"

#include <grpcpp/generic/generic_stub.h>

#include <cstdlib>
#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "proto/engine_sampling.h"
#include "proto/grpc_status.h"

namespace pdserve::tools {
namespace {
StatusOr<std::shared_ptr<grpc::Channel>> open_channel(const std::string& address, Duration wait, const char* what,
                                                      const ClientTls& tls = {}) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // A restarted router is found again within a second (gRPC's default back-off grows to 2 min).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(address, client_channel_credentials(tls), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::duration_cast<std::chrono::system_clock::duration>(wait)))
    return absl::UnavailableError(absl::StrCat(what, " ", address, " did not answer"));
  return channel;
}

}  // namespace

StatusOr<std::unique_ptr<RouterClient>> RouterClient::connect(const std::string& address, Duration wait,
                                                              const std::string& api_key, const ClientTls& tls) {
  PD_ASSIGN_OR_RETURN(auto channel, open_channel(address, wait, "router", tls));
  std::unique_ptr<RouterClient> client(new RouterClient());
  client->stub_ = v1::Generation::NewStub(channel);
  client->api_key_ = api_key;
  return client;
}

void RouterClient::authorize(grpc::ClientContext& ctx) const {
  if (!api_key_.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key_);
}

std::string api_key_or_env(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("PDSERVE_API_KEY");
  if (env == nullptr) return "";
  const absl::string_view key = absl::StripAsciiWhitespace(env);  // A Secret's trailing newline.
  return std::string(key.data(), key.size());
}

StatusOr<std::unique_ptr<RouterClient>> RouterClient::connect_worker(const std::string& address, Duration wait) {
  PD_ASSIGN_OR_RETURN(auto channel, open_channel(address, wait, "worker"));
  std::unique_ptr<RouterClient> client(new RouterClient());
  client->worker_ = worker::Worker::NewStub(channel);
  return client;
}

StatusOr<v1::ModelInfo> RouterClient::model_info() {
  grpc::ClientContext ctx;
  authorize(ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (worker_) {
    worker::WorkerInfo info;
    PD_RETURN_IF_ERROR(from_grpc(worker_->Info(&ctx, worker::InfoRequest(), &info), "Info"));
    if (info.role() != worker::ROLE_AGGREGATED) {
      return absl::FailedPreconditionError("a direct worker client needs an aggregated worker");
    }
    v1::ModelInfo model = info.model();
    model.set_num_ranks(info.tp());
    return model;
  }
  v1::ModelInfo info;
  PD_RETURN_IF_ERROR(from_grpc(stub_->GetModelInfo(&ctx, v1::ModelInfoRequest(), &info), "GetModelInfo"));
  return info;
}

Status RouterClient::generate(const v1::GenerateRequest& request,
                              const std::function<void(const v1::GenerateResponse&)>& on_response, Duration timeout) {
  grpc::ClientContext ctx;
  authorize(ctx);
  if (timeout > Duration::zero())
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout));
  if (worker_) {
    if (!request.has_token_ids()) return absl::InvalidArgumentError("a direct worker request needs token ids");
    worker::WorkerGenerateRequest w;
    w.set_request_id(absl::StrCat("direct-", next_id_++));
    w.mutable_prompt()->CopyFrom(request.token_ids().ids());
    *w.mutable_sampling() = request.sampling();
    auto reader = worker_->Generate(&ctx, w);
    worker::WorkerEvent e;
    while (reader->Read(&e)) {
      v1::GenerateResponse r;
      r.mutable_token_ids()->CopyFrom(e.token_ids());
      r.mutable_logprobs()->CopyFrom(e.logprobs());
      r.mutable_prompt_logprobs()->CopyFrom(e.prompt_logprobs());
      r.set_text(e.text());
      on_response(r);
    }
    return from_grpc(reader->Finish(), "Worker.Generate");
  }
  auto reader = stub_->Generate(&ctx, request);
  v1::GenerateResponse r;
  while (reader->Read(&r)) on_response(r);
  return from_grpc(reader->Finish(), "Generate");
}

StatusOr<ConnectedClient> connect_and_describe(const std::string& router, const std::string& worker,
                                               const std::string& api_key, const ClientTls& tls) {
  constexpr Duration kWait = std::chrono::seconds(10);
  ConnectedClient c;
  PD_ASSIGN_OR_RETURN(c.client, worker.empty() ? RouterClient::connect(router, kWait, api_key, tls)
                                               : RouterClient::connect_worker(worker, kWait));
  PD_ASSIGN_OR_RETURN(c.model, c.client->model_info());
  return c;
}

v1::SamplingParams to_proto(const engine::SamplingParams& p) { return wire_sampling(p); }

Status grpc_health_serving(const std::string& address, Duration timeout, const ClientTls& tls) {
  // Debian ships no health.proto: the generic stub, an empty request, and SERVING is a
  // response whose field 1 is 1.
  grpc::GenericStub generic(grpc::CreateChannel(address, client_channel_credentials(tls)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(timeout));
  grpc::CompletionQueue cq;
  grpc::Slice nothing;
  grpc::ByteBuffer request(&nothing, 1), response;
  auto call = generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return absl::UnavailableError(absl::StrCat("health check: ", status.error_message()));
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes != std::string("\x08\x01", 2)) return absl::UnavailableError("health: NOT_SERVING (no worker of some needed role is up)");
  return absl::OkStatus();
}

}  // namespace pdserve::tools
