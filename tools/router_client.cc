#include "tools/router_client.h"

#include <grpcpp/grpcpp.h>

namespace pdserve::tools {
namespace {
Status from_grpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}
}  // namespace

StatusOr<std::unique_ptr<RouterClient>> RouterClient::connect(const std::string& address, Duration wait) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::duration_cast<std::chrono::system_clock::duration>(wait)))
    return absl::UnavailableError(absl::StrCat("router ", address, " did not answer"));
  return std::unique_ptr<RouterClient>(new RouterClient(v1::Generation::NewStub(channel)));
}

StatusOr<v1::ModelInfo> RouterClient::model_info() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ModelInfo info;
  PD_RETURN_IF_ERROR(from_grpc(stub_->GetModelInfo(&ctx, v1::ModelInfoRequest(), &info), "GetModelInfo"));
  return info;
}

Status RouterClient::generate(const v1::GenerateRequest& request,
                              const std::function<void(const v1::GenerateResponse&)>& on_response) {
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, request);
  v1::GenerateResponse r;
  while (reader->Read(&r)) on_response(r);
  return from_grpc(reader->Finish(), "Generate");
}

v1::SamplingParams to_proto(const engine::SamplingParams& p) {
  v1::SamplingParams s;
  s.set_temperature(p.temperature);
  s.set_top_k(p.top_k);
  s.set_top_p(p.top_p);
  if (p.seed >= 0) s.set_seed(p.seed);
  s.set_max_tokens(p.max_tokens);
  for (int t : p.stop_token_ids) s.add_stop_token_ids(t);
  for (const std::string& x : p.stop_strings) s.add_stop(x);
  s.set_ignore_eos(p.ignore_eos);
  return s;
}

}  // namespace pdserve::tools
