#include "router/generation_service.h"

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
  return to_grpc(router_.generate(
      *request, [ctx] { return ctx->IsCancelled(); },
      [writer](const v1::GenerateResponse& r) { return writer->Write(r); }, client));
}

grpc::Status GenerationService::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* request, v1::AbortResponse* response) {
  std::string client;
  if (grpc::Status auth = authorize(ctx, &client); !auth.ok()) return auth;
  if (request->request_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id is required");
  response->set_found(router_.abort(request->request_id(), client));
  return grpc::Status::OK;
}

grpc::Status GenerationService::GetModelInfo(grpc::ServerContext* ctx, const v1::ModelInfoRequest*, v1::ModelInfo* response) {
  std::string client;
  if (grpc::Status auth = authorize(ctx, &client); !auth.ok()) return auth;
  *response = router_.model_info();
  return grpc::Status::OK;
}

}  // namespace pdserve::router
