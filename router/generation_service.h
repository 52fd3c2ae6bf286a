// The client gRPC API (pdserve.v1.Generation) over a Router: Generate streams the router's
// responses (SamplingParams.n > 1: n concurrent samples, router/parallel_samples.h), Abort
// cancels by id (a fanned-out request's id: each of its samples), GetModelInfo describes the served model. With API keys, every
// call needs `authorization: Bearer KEY` metadata (else UNAUTHENTICATED).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "proto/pdserve.grpc.pb.h"
#include "router/api_keys.h"
#include "router/router.h"

namespace pdserve::router {

class GenerationService final : public v1::Generation::Service {
 public:
  // `keys` must outlive the service.
  GenerationService(Router& router, const ApiKeys& keys) : router_(router), keys_(keys) {}

  // Streams one request's responses; the status is the router's.
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  // Aborts a running request; `found` says whether it was running.
  grpc::Status Abort(grpc::ServerContext* ctx, const v1::AbortRequest* request, v1::AbortResponse* response) override;
  // The served model and its limits.
  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const v1::ModelInfoRequest* request, v1::ModelInfo* response) override;

 private:
  // The caller's client tag (ApiKeys::client_of) when the call carries an accepted key (or
  // none is required), else UNAUTHENTICATED.
  grpc::Status authorize(grpc::ServerContext* ctx, std::string* client) const;

  Router& router_;
  const ApiKeys& keys_;
  // A running fanned-out request, for Abort: its sample count, and whether it was aborted (its
  // samples not yet started see it when they start, PromptAffinity::parent_aborted).
  struct Fanout {
    int samples = 0;
    std::shared_ptr<std::atomic<bool>> aborted;
  };
  // By (client, request id).
  std::mutex fanouts_mu_;
  std::map<std::pair<std::string, std::string>, Fanout> fanouts_;
};

}  // namespace pdserve::router
