#include "router/generation_service.h"

#include "router/parallel_samples.h"

namespace pdserve::router {

grpc::Status GenerationService::authorize(grpc::ServerContext* ctx, std::string* client) const {
  if (!keys_.required()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  const auto it = md.find("authorization");
  const std::string_view value = it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  if (std::optional<std::string> tag = keys_.client_of(value)) {
    *client = std::move(*tag);
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      it == md.end() ? "an API key is required: send metadata authorization: Bearer KEY"
                                     : "the API key is not valid");
}

grpc::Status GenerationService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  std::string client;
  if (grpc::Status auth = authorize(ctx, &client); !auth.ok()) return auth;
  const int n = request->sampling().n();
  if (n < 0 || n > kMaxSamples)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("sampling.n must be in [0, ", kMaxSamples, "] (got ", n, ")"));
  // A parent id aborts every sample ("<id>-<i>", sample_requests) while it runs, and the ones
  // not yet started when they start.
  const bool fanned_out = n > 1 && !request->request_id().empty();
  std::shared_ptr<std::atomic<bool>> aborted;
  if (fanned_out) {
    aborted = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard lock(fanouts_mu_);
    fanouts_[{client, request->request_id()}] = Fanout{n, aborted};
  }
  const Status s = generate_samples(
      *request,
      [&](const v1::GenerateRequest& r, const PromptAffinity& affinity, const std::function<bool()>& gone,
          const SampleEmit& emit) {
        PromptAffinity sample = affinity;
        if (aborted) sample.parent_aborted = [aborted] { return aborted->load(); };
        return router_.generate(r, gone, emit, client, sample);
      },
      [ctx] { return ctx->IsCancelled(); }, [writer](const v1::GenerateResponse& r) { return writer->Write(r); });
  if (fanned_out) {
    std::lock_guard lock(fanouts_mu_);
    fanouts_.erase({client, request->request_id()});
  }
  return to_grpc(s);
}

grpc::Status GenerationService::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* request, v1::AbortResponse* response) {
  std::string client;
  if (grpc::Status auth = authorize(ctx, &client); !auth.ok()) return auth;
  if (request->request_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id is required");
  bool found = router_.abort(request->request_id(), client);
  Fanout fanout;
  {
    std::lock_guard lock(fanouts_mu_);
    auto it = fanouts_.find({client, request->request_id()});
    if (it != fanouts_.end()) fanout = it->second;
  }
  // Flagged before the running samples are aborted: a sample that registers after that sees
  // the flag (Router::generate checks it once registered), so none runs on.
  if (fanout.aborted) {
    fanout.aborted->store(true);
    found = true;
  }
  for (int i = 0; i < fanout.samples; ++i) router_.abort(absl::StrCat(request->request_id(), "-", i), client);
  response->set_found(found);
  return grpc::Status::OK;
}

grpc::Status GenerationService::GetModelInfo(grpc::ServerContext* ctx, const v1::ModelInfoRequest*, v1::ModelInfo* response) {
  std::string client;
  if (grpc::Status auth = authorize(ctx, &client); !auth.ok()) return auth;
  *response = router_.model_info();
  return grpc::Status::OK;
}

}  // namespace pdserve::router
