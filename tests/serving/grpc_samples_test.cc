// gRPC Generate with SamplingParams.n > 1 on a `pdserve up` P/D cluster: the samples fanned out
// by router/parallel_samples.h, each message tagged with its index, sample i equal to a single
// request with seed + i; n beyond the limit refused; the samples of one prompt compute it once.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <vector>

#include "proto/pdserve.grpc.pb.h"
#include "tests/serving/cluster_process.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;

struct Samples {
  grpc::Status status;
  std::map<int, std::vector<int>> tokens;  // By index.
  std::map<int, int> finished;
  std::map<int, v1::GenerateResponse> last;  // Each sample's final message.
};

Samples generate(v1::Generation::Stub& s, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  Samples out;
  auto reader = s.Generate(&ctx, req);
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
    out.tokens[r.index()].insert(out.tokens[r.index()].end(), r.token_ids().begin(), r.token_ids().end());
    out.finished[r.index()] += r.finished();
    if (r.finished()) out.last[r.index()] = r;
  }
  out.status = reader->Finish();
  return out;
}

TEST(GrpcSamples, NSeededSamplesEqualSingleRequestsWithSeedPlusIndex) {
  Cluster c({"--prefill", "1", "--decode", "1", "--kv-mode", "push"});
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  auto ch = grpc::CreateChannel(c.grpc(), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(ch->WaitForConnected(std::chrono::system_clock::now() + 10s));
  auto stub = v1::Generation::NewStub(ch);

  v1::GenerateRequest r;
  r.set_text("Once upon a time");
  r.set_request_id("fan");
  r.mutable_sampling()->set_max_tokens(12);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(40);
  r.mutable_sampling()->set_n(4);
  const Samples all = generate(*stub, r);
  ASSERT_TRUE(all.status.ok()) << all.status.error_message();
  ASSERT_EQ(all.tokens.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(all.finished.at(i), 1) << i;  // Each sample has its own final message.
    v1::GenerateRequest single = r;
    single.mutable_sampling()->set_n(0);
    single.mutable_sampling()->set_seed(40 + i);
    single.set_request_id("single-" + std::to_string(i));
    const Samples one = generate(*stub, single);
    ASSERT_TRUE(one.status.ok()) << one.status.error_message();
    EXPECT_EQ(all.tokens.at(i), one.tokens.at(0)) << "sample " << i;
  }
  EXPECT_NE(all.tokens.at(0), all.tokens.at(1));  // Different seeds: different samples.

  r.mutable_sampling()->set_n(17);
  EXPECT_EQ(generate(*stub, r).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Abort by the request's id reaches every sample: each ends with "abort".
  v1::GenerateRequest longer = r;
  longer.set_request_id("fan-abort");
  longer.mutable_sampling()->set_n(2);
  longer.mutable_sampling()->set_max_tokens(500);  // Near the context (512): ~100x an Abort round trip of work left.
  longer.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub->Generate(&ctx, longer);
  v1::GenerateResponse m;
  std::map<int, std::string> finish;
  ASSERT_TRUE(reader->Read(&m));  // Running.
  {
    grpc::ClientContext actx;
    v1::AbortRequest a;
    a.set_request_id("fan-abort");
    v1::AbortResponse ar;
    ASSERT_TRUE(stub->Abort(&actx, a, &ar).ok());
    EXPECT_TRUE(ar.found());
  }
  do {
    if (m.finished()) finish[m.index()] = m.finish_reason();
  } while (reader->Read(&m));
  reader->Finish();
  EXPECT_EQ(finish, (std::map<int, std::string>{{0, "abort"}, {1, "abort"}}));
}

// The samples of one prompt compute it once, in every mode, on a cluster of two workers per
// role: the first is placed by load; the others start once its prompt is computed, on its
// workers, and find the prompt's full blocks in that prefill worker's cache. Their tokens still
// equal single requests with their seeds.
struct ShareCase {
  const char* name;
  std::vector<std::string> args;
};
class GrpcSamplesShare : public ::testing::TestWithParam<ShareCase> {};

TEST_P(GrpcSamplesShare, SamplesComputeTheirPromptOnce) {
  std::vector<std::string> args = GetParam().args;
  args.insert(args.end(), {"--block-size", "16"});
  Cluster c(args);
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  auto ch = grpc::CreateChannel(c.grpc(), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(ch->WaitForConnected(std::chrono::system_clock::now() + 10s));
  auto stub = v1::Generation::NewStub(ch);

  constexpr int kPrompt = 100, kBlock = 16;
  v1::GenerateRequest r;
  for (int i = 0; i < kPrompt; ++i) r.mutable_token_ids()->add_ids(3 + (i * 37) % 400);
  r.mutable_sampling()->set_max_tokens(8);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(7);
  r.mutable_sampling()->set_n(4);
  const Samples all = generate(*stub, r);
  ASSERT_TRUE(all.status.ok()) << all.status.error_message();
  ASSERT_EQ(all.last.size(), 4u);
  EXPECT_EQ(all.last.at(0).cached_tokens(), 0) << "the first sample computes the prompt";
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(all.last.at(i).prefill_worker(), all.last.at(0).prefill_worker()) << i;
    EXPECT_EQ(all.last.at(i).decode_worker(), all.last.at(0).decode_worker()) << i;
    EXPECT_EQ(all.last.at(i).cached_tokens(), (kPrompt - 1) / kBlock * kBlock) << "sample " << i;
  }
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest single = r;
    single.mutable_sampling()->set_n(0);
    single.mutable_sampling()->set_seed(7 + i);
    const Samples one = generate(*stub, single);
    ASSERT_TRUE(one.status.ok()) << one.status.error_message();
    EXPECT_EQ(all.tokens.at(i), one.tokens.at(0)) << "sample " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GrpcSamplesShare,
                         ::testing::Values(ShareCase{"aggregated", {"--aggregated", "2"}},
                                         ShareCase{"push", {"--prefill", "2", "--decode", "2", "--kv-mode", "push"}},
                                         ShareCase{"pull", {"--prefill", "2", "--decode", "2", "--kv-mode", "pull"}}),
                         [](const ::testing::TestParamInfo<ShareCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace pdserve
