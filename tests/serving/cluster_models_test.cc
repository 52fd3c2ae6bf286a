// The architectures and positions beyond the bundled llama2.c model through a real P/D cluster:
// `pdserve up` serves a make-model Llama-3.1-shaped model (rope_scaling llama3) and a Qwen3-shaped
// one (per-head q/k RMSNorm) with a TP 2 prefill worker feeding a TP 1 decode worker, push and
// pull. Every streamed request's tokens must equal the in-process engine's (whose logits the
// engine tests hold to the plain reference implementation), with prompts long enough to reach
// the rotary dimensions that the scaling changes.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "engine/model_loader.h"
#include "proto/pdserve.grpc.pb.h"
#include "tests/serving/generation_stub.h"
#include "tests/model/test_util.h"
#include "tests/serving/cluster_process.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;

struct ModelCase {
  std::string preset;
  std::string kv_mode;
};

class ClusterModels : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ClusterModels, StreamsTheInProcessTokensAcrossHeterogeneousTp) {
  const ModelCase& param = GetParam();
  engine::testing::TempDir dir;
  ASSERT_TRUE(engine::make_model({.preset = param.preset, .seed = 11, .out_dir = dir.str()}).ok());
  testing::Cluster cluster({"--prefill", "1", "--prefill-tp", "2", "--decode", "1", "--decode-tp", "1", "--kv-mode",
                            param.kv_mode},
                           dir.str());

  auto loaded = engine::load_model({dir.str(), ""});
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  auto created = engine::Engine::create(std::move(*loaded), {});
  ASSERT_TRUE(created.ok()) << created.status().message();
  const engine::ModelConfig config = (*created)->config();
  // Prompts of 20 to 200 random ids (past the presets' original context, where the scaled and
  // unscaled frequency bands both matter) and 8 to 24 new tokens, greedy.
  std::mt19937 rng(7);
  std::vector<std::vector<int>> prompts(6);
  std::vector<int> max_tokens;
  std::vector<engine::GenerationResult> want;
  for (auto& prompt : prompts) {
    const int len = 20 + int(rng() % 180);
    for (int i = 0; i < len; ++i) prompt.push_back(int(rng() % uint32_t(config.vocab_size)));
    max_tokens.push_back(8 + int(rng() % 17));
    engine::SamplingParams p;
    p.temperature = 0;
    p.max_tokens = max_tokens.back();
    p.ignore_eos = true;
    auto r = (*created)->generate(prompt, p);
    ASSERT_TRUE(r.ok()) << r.status().message();
    want.push_back(*r);
  }
  created->reset();

  ASSERT_TRUE(cluster.wait_ready(90s)) << cluster.log();
  auto stub = testing::connected_generation_stub(cluster.grpc());
  ASSERT_TRUE(stub != nullptr);
  std::vector<std::vector<int>> got(prompts.size());
  std::vector<std::string> errors(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      v1::GenerateRequest req;
      for (int t : prompts[i]) req.mutable_token_ids()->add_ids(t);
      req.mutable_sampling()->set_temperature(0);
      req.mutable_sampling()->set_max_tokens(max_tokens[i]);
      req.mutable_sampling()->set_ignore_eos(true);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 60s);
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse r;
      while (reader->Read(&r)) got[i].insert(got[i].end(), r.token_ids().begin(), r.token_ids().end());
      const grpc::Status s = reader->Finish();
      if (!s.ok()) errors[i] = s.error_message();
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(errors[i], "") << cluster.log();
    EXPECT_EQ(got[i], want[i].token_ids) << param.preset << " request " << i << ", prompt " << prompts[i].size();
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ClusterModels,
                         ::testing::Values(ModelCase{"tiny-llama31", "push"}, ModelCase{"tiny-llama31", "pull"},
                                           ModelCase{"tiny-qwen3", "push"}, ModelCase{"tiny-qwen3", "pull"}),
                         [](const auto& info) {
                           std::string name = info.param.preset + "_" + info.param.kv_mode;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace pdserve
