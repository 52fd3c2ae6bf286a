#include "router/generation_service.h"

namespace pdserve::router {

grpc::Status GenerationService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  return to_grpc(router_.generate(
      *request, [ctx] { return ctx->IsCancelled(); },
      [writer](const v1::GenerateResponse& r) { return writer->Write(r); }));
}

grpc::Status GenerationService::Abort(grpc::ServerContext*, const v1::AbortRequest* request, v1::AbortResponse* response) {
  if (request->request_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id is required");
  response->set_found(router_.abort(request->request_id()));
  return grpc::Status::OK;
}

grpc::Status GenerationService::GetModelInfo(grpc::ServerContext*, const v1::ModelInfoRequest*, v1::ModelInfo* response) {
  *response = router_.model_info();
  return grpc::Status::OK;
}

}  // namespace pdserve::router
