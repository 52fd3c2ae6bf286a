// The engine's device path on a machine without a GPU: a backend whose memory the host cannot
// touch (tests/engine/guarded_backend.h) runs the whole forward pass — uploaded weights, per-step
// metadata, logits read back — and must give the CPU engine's tokens. Any host access to backend
// memory outside the Backend interface would fault, as on a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "engine/engine.h"
#include "engine/model_weights.h"
#include "engine/rank_pool.h"
#include "engine/rank_runner.h"
#include "engine/shard_upload.h"
#include "tests/engine/bf16_checkpoint.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/teacher_forced.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

std::unique_ptr<Engine> make_engine(bool guarded, const std::string& model_path = pdserve::testing::stories_bin(),
                                    DType weight_dtype = DType::kF32,
                                    const std::function<void(EngineOptions&)>& adjust = {}) {
  auto model = load_model({model_path});
  EXPECT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.max_batch_tokens = 96;  // Long prompts take several chunked steps.
  o.weight_dtype = weight_dtype;
  if (guarded)
    o.backend_factory = [](int) -> StatusOr<std::unique_ptr<Backend>> {
      return pdserve::testing::make_guarded_backend();
    };
  if (adjust) adjust(o);
  auto e = Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// Greedy, or for request i seeded sampling with temperature, top-k and top-p varying with i.
SamplingParams greedy(int) { return {}; }
SamplingParams seeded(int i) {
  SamplingParams p;
  p.temperature = 0.6f + 0.2f * float(i % 4);
  p.top_k = std::array{0, 5, 40}[i % 3];
  p.top_p = std::array{1.0f, 0.9f, 0.6f, 0.95f}[i % 4];
  p.seed = 1000 + i;
  return p;
}

// Each prompt as a concurrent request of 40 tokens (EOS ignored) with `params(i)`; their tokens.
std::vector<std::vector<int>> run_all(Engine& e, const std::vector<std::vector<int>>& prompts,
                                      SamplingParams (*params)(int) = greedy) {
  std::vector<std::vector<int>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p = params(int(i));
    p.max_tokens = 40;
    p.ignore_eos = true;
    EXPECT_TRUE(e.add_request({std::to_string(i), prompts[i], p}, [&out, i](const TokenEvent& ev) {
      EXPECT_TRUE(ev.error.ok()) << ev.error;
      if (ev.token >= 0) out[i].push_back(ev.token);
    }).ok());
  }
  EXPECT_TRUE(e.run_until_idle().ok());
  return out;
}

std::vector<std::vector<int>> random_prompts(int count, int max_len, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int> p = {1};
    const int len = 1 + int(rng() % uint32_t(max_len));
    for (int t = 0; t < len; ++t) p.push_back(3 + int(rng() % uint32_t(vocab - 3)));
    prompts.push_back(p);
  }
  return prompts;
}

std::string trimmed(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

TEST(DevicePathDeathTest, TheGuardedBackendsMemoryFaultsOnHostAccess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto engine = make_engine(true);
  EXPECT_FALSE(engine->backend(0).host_memory());
  // The check this suite relies on: were the engine to read its device arena directly, it would die.
  EXPECT_DEATH({ std::printf("%d\n", int(*static_cast<volatile uint8_t*>(engine->kv_arena(0)))); }, "");
}

TEST(DevicePath, GreedyFromBosEqualsPublishedText) {
  auto engine = make_engine(true);
  SamplingParams p;
  p.max_tokens = 256;
  auto got = engine->generate({engine->config().bos_id}, p);
  ASSERT_TRUE(got.ok()) << got.status();
  std::ifstream in(pdserve::testing::stories_dir() + "/greedy_from_bos.txt");
  std::stringstream published;
  published << in.rdbuf();
  EXPECT_EQ(trimmed(got->text), trimmed(published.str()));
}

// Decodes and chunked prefills of many sequences share steps; tokens, positions and block tables
// reach the kernels only through the device copy of the step's metadata.
TEST(DevicePath, ConcurrentRequestsEqualTheCpuEngine) {
  auto device = make_engine(true), cpu = make_engine(false);
  const auto prompts = random_prompts(12, 150, 512, 11);
  EXPECT_EQ(run_all(*device, prompts), run_all(*cpu, prompts));
  EXPECT_EQ(device->stats().free_blocks, device->stats().num_blocks);
}

// Seeded sampling: the guarded backend samples on the device (only tokens come back), the CPU
// engine on the host from the logits, each request drawing from its own generator; the tokens
// must be the same.
TEST(DevicePath, SeededSamplingOnTheBackendEqualsTheHost) {
  auto device = make_engine(true), cpu = make_engine(false);
  const auto prompts = random_prompts(12, 60, 512, 13);
  const auto got = run_all(*device, prompts, seeded);
  EXPECT_EQ(got, run_all(*cpu, prompts, seeded));
  EXPECT_NE(got, run_all(*cpu, prompts));  // Sampling, not greedy.
  EXPECT_EQ(device->stats().free_blocks, device->stats().num_blocks);
}

// At TP 2 the vocabulary is split over the ranks' LM head shards; sampling on the backend
// gathers them on rank 0. Against the same TP 2 engine sampling on the host.
TEST(DevicePath, SamplingOnTheBackendGathersTheVocabularyShards) {
  const auto tp2 = [](EngineOptions::SampleOn on) {
    return [on](EngineOptions& o) {
      o.tp = 2;
      o.sample_on = on;
    };
  };
  auto backend =
      make_engine(false, pdserve::testing::stories_bin(), DType::kF32, tp2(EngineOptions::SampleOn::kBackend));
  auto host = make_engine(false, pdserve::testing::stories_bin(), DType::kF32, tp2(EngineOptions::SampleOn::kHost));
  ASSERT_TRUE(backend && host);
  const auto prompts = random_prompts(8, 60, 512, 14);
  EXPECT_EQ(run_all(*backend, prompts, seeded), run_all(*host, prompts, seeded));
  EXPECT_EQ(run_all(*backend, prompts), run_all(*host, prompts));
}

// The repetition penalty's bitmaps live on the backend between steps (only each step's new ids
// go up): the guarded backend (the GPU code, memory the host cannot touch) and the CPU engine,
// and a TP 2 engine sampling on the backend and on the host, give the same tokens, greedy and
// seeded, penalties above and below 1 in one batch.
SamplingParams penalised_greedy(int i) {
  SamplingParams p;
  p.repetition_penalty = std::array{1.3f, 0.8f, 1.0f, 2.0f}[i % 4];
  return p;
}
SamplingParams penalised_seeded(int i) {
  SamplingParams p = seeded(i);
  p.repetition_penalty = std::array{1.2f, 0.9f, 1.6f}[i % 3];
  return p;
}

TEST(DevicePath, RepetitionPenaltyOnTheBackendEqualsTheHost) {
  auto device = make_engine(true), cpu = make_engine(false);
  const auto prompts = random_prompts(12, 60, 512, 15);
  const auto got = run_all(*device, prompts, penalised_greedy);
  EXPECT_EQ(got, run_all(*cpu, prompts, penalised_greedy));
  EXPECT_NE(got, run_all(*cpu, prompts));  // The penalty changed tokens.
  EXPECT_EQ(run_all(*device, prompts, penalised_seeded), run_all(*cpu, prompts, penalised_seeded));
  const auto tp2 = [](EngineOptions::SampleOn on) {
    return [on](EngineOptions& o) {
      o.tp = 2;
      o.sample_on = on;
    };
  };
  auto backend =
      make_engine(false, pdserve::testing::stories_bin(), DType::kF32, tp2(EngineOptions::SampleOn::kBackend));
  auto host = make_engine(false, pdserve::testing::stories_bin(), DType::kF32, tp2(EngineOptions::SampleOn::kHost));
  EXPECT_EQ(run_all(*backend, prompts, penalised_greedy), got);
  EXPECT_EQ(run_all(*backend, prompts, penalised_seeded), run_all(*host, prompts, penalised_seeded));
}

// A bf16 checkpoint: the CPU widens its weights to f32 exactly; a device keeping them bf16
// (--weight-dtype bf16) multiplies the same values, so the tokens are the CPU's.
TEST(DevicePath, Bf16WeightsOfABf16CheckpointEqualTheCpuEngine) {
  const pdserve::testing::Bf16Checkpoint checkpoint("pdserve_bf16w");
  ASSERT_TRUE(checkpoint.status().ok()) << checkpoint.status();
  auto device = make_engine(true, checkpoint.path(), DType::kBF16), cpu = make_engine(false, checkpoint.path());
  ASSERT_TRUE(device && cpu);
  const auto prompts = random_prompts(6, 120, cpu->config().vocab_size, 12);
  const uint64_t bf16_before = pdserve::testing::guarded_bf16_gemms();
  EXPECT_EQ(run_all(*device, prompts), run_all(*cpu, prompts));
  EXPECT_GT(pdserve::testing::guarded_bf16_gemms(), bf16_before);  // The bf16 path ran.
}

// What the KV budget sets aside for a device's weights (--memory-utilization) is what the upload
// puts there: at TP 1, 2 and 8 (where stories260K's 4 KV heads are replicated) and for f32 and
// bf16 GEMM weights.
TEST(DevicePath, UploadedBytesCountWhatTheUploadPlaces) {
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& config = model->config;
  auto weights = ModelWeightsF32::create(config, *model->weights);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto backend = pdserve::testing::make_guarded_backend();
  for (int tp : {1, 2, 8})
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      auto shard = shard_weights(config, **weights, 0, tp);
      ASSERT_TRUE(shard.ok()) << shard.status();
      auto uploaded = upload_shard(config, *shard, backend.get(), dtype);
      ASSERT_TRUE(uploaded.ok()) << uploaded.status();
      auto counted = uploaded_bytes(config, *shard, dtype);
      ASSERT_TRUE(counted.ok()) << counted.status();
      EXPECT_EQ(*counted, (*uploaded)->bytes) << "TP " << tp << " " << dtype_name(dtype);
      EXPECT_GT(*counted, 0u);
    }
}

TEST(DevicePath, TheCpuBackendRefusesBf16Weights) {
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok());
  EngineOptions o;
  o.weight_dtype = DType::kBF16;
  auto e = Engine::create(std::move(*model), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("f32 weights"), std::string_view::npos) << e.status();
}

// --kv-dtype bf16 where the backend's attention kernels read f32 only (as CPU workers), and f16,
// which no backend keeps: refused when the engine is made, never a cache read as the wrong type.
TEST(DevicePath, KvDtypesABackendCannotKeepAreRefused) {
  for (DType kv : {DType::kBF16, DType::kF16}) {
    auto model = load_model({pdserve::testing::stories_bin()});
    ASSERT_TRUE(model.ok());
    EngineOptions o;
    o.kv_dtype = kv;
    auto e = Engine::create(std::move(*model), o);
    ASSERT_FALSE(e.ok()) << dtype_name(kv);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find(std::string("cannot keep its KV cache in ") + dtype_name(kv)),
              std::string_view::npos)
        << e.status();
  }
}

// stories260K's TP 1 shard on the host, with the model and tensors its pointers point into.
struct StoriesShard {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<ModelWeightsF32> weights;
  StatusOr<RankShard> shard = absl::UnknownError("not loaded");
};
StoriesShard stories_shard() {
  StoriesShard s;
  auto model = load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return s;
  s.model = std::make_unique<LoadedModel>(std::move(*model));
  auto weights = ModelWeightsF32::create(s.model->config, *s.model->weights);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return s;
  s.weights = std::move(*weights);
  s.shard = shard_weights(s.model->config, *s.weights, 0, 1);
  return s;
}

// A cache whose V heads are not as wide as its K heads is refused when a rank is made: the
// forward pass (fused QKV rows, attention's input stage) sizes V heads as K heads.
TEST(DevicePath, ARankRefusesVHeadsOfAnotherWidth) {
  const StoriesShard stories = stories_shard();
  const auto& shard = stories.shard;
  ASSERT_TRUE(shard.ok()) << shard.status();
  const ModelConfig& config = stories.model->config;
  KvCacheSpec spec = config.kv_cache_spec(16);
  spec.layers[1].v_head_dim *= 2;
  auto backend = make_cpu_backend();
  auto comms = make_shared_memory_group(1);
  auto runner = RankRunner::create(config, *shard, spec, 8, 16, backend.get(), comms[0].get());
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string want = "layer 1's V heads are " + std::to_string(2 * spec.layers[0].head_dim) +
                           " wide and its K heads " + std::to_string(spec.layers[0].head_dim);
  EXPECT_NE(runner.status().message().find(want), std::string_view::npos) << runner.status();
  spec.layers[1].v_head_dim = spec.layers[1].head_dim;
  EXPECT_TRUE(RankRunner::create(config, *shard, spec, 8, 16, backend.get(), comms[0].get()).ok());
}

// A placeholder token (-1 - r: the previous step's sampled token of row r, asynchronous
// scheduling) is refused by prepare() when no step of the rank holds row r, and by a pool above
// TP 1 in a forward pass: only a launched step broadcasts rank 0's sampled tokens to the others.
TEST(DevicePath, APlaceholderTokenNoRankCanReadIsRefused) {
  StoriesShard stories = stories_shard();
  ASSERT_TRUE(stories.shard.ok()) << stories.shard.status();
  const ModelConfig& config = stories.model->config;
  const int table[1] = {0};
  const auto batch_of = [&table](int token) {
    ForwardBatch batch;
    batch.tokens = {token};
    batch.positions = {0};
    batch.block_tables = {table};
    batch.logit_rows = {0};
    return batch;
  };
  StepMetadata meta;  // Reused, as a pool reuses its own from step to step.
  auto prepared = [&](int token) {
    auto backend = make_cpu_backend();
    auto comms = make_shared_memory_group(1);
    auto runner =
        RankRunner::create(config, *stories.shard, config.kv_cache_spec(16), 8, 16, backend.get(), comms[0].get());
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return runner.status();
    const ForwardBatch batch = batch_of(token);
    meta.pack(batch, 16);
    return (*runner)->prepare(batch, meta);
  };
  EXPECT_TRUE(prepared(-16).ok());  // Row 15 of a rank of 16 tokens.
  const Status past = prepared(-17);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.message().find("token -17 names no sampled row a step of this rank (TP 1) can hold"),
            std::string_view::npos)
      << past;
  EXPECT_EQ(prepared(std::numeric_limits<int>::min()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(prepared(5).ok());  // A plain token, packed after the refused ones.

  EngineOptions options;
  options.tp = 2;
  options.max_batch_tokens = 16;
  auto pool = RankPool::create(config, *stories.weights, config.kv_cache_spec(16), 8, options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<float> logits(config.vocab_size);
  const Status tp2 = (*pool)->forward(batch_of(-1), {logits.data(), nullptr, nullptr});
  EXPECT_EQ(tp2.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tp2.message().find("token -1 is a sampled token not read yet: above TP 1 only a launched step's"),
            std::string_view::npos)
      << tp2;
  EXPECT_TRUE((*pool)->forward(batch_of(5), {logits.data(), nullptr, nullptr}).ok());
}

// A launch that fails when it is queued (behind another launched step) is withdrawn: the step
// before it is collected whole, with its token, and the pool launches and collects on after it.
TEST(DevicePath, AFailedLaunchIsWithdrawnAndTheStepBeforeItCollected) {
  StoriesShard stories = stories_shard();
  ASSERT_TRUE(stories.shard.ok()) << stories.shard.status();
  const ModelConfig& config = stories.model->config;
  int queued = 0;
  EngineOptions options;
  options.max_batch_tokens = 16;
  options.backend_factory = [&queued](int) -> StatusOr<std::unique_ptr<Backend>> {
    return pdserve::testing::make_guarded_backend(size_t(1) << 30, "guarded:0", true, [&queued] {
      return ++queued == 2 ? absl::InternalError("kernel launch: injected") : absl::OkStatus();
    });
  };
  auto pool = RankPool::create(config, *stories.weights, config.kv_cache_spec(16), 8, options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const int table[1] = {0};
  ForwardBatch batch;
  batch.tokens = {config.bos_id};
  batch.positions = {0};
  batch.block_tables = {table};
  batch.logit_rows = {0};
  batch.samples = {kernels::SampleRow{}};  // Greedy.
  std::vector<float> logits(config.vocab_size);
  ASSERT_TRUE((*pool)->launch(batch, false).ok());
  ForwardBatch other = batch;  // Another token, so that the two steps' samples differ.
  other.tokens = {300};
  const Status failed = (*pool)->launch(other, false);
  EXPECT_EQ(failed.message(), "kernel launch: injected");
  EXPECT_EQ((*pool)->rank(0).launched(), 1);
  int token = -1;
  ASSERT_TRUE((*pool)->collect({nullptr, &token, nullptr}).ok());
  // The first step's token: BOS's greedy successor, as a forward pass samples it.
  int want = -1;
  ASSERT_TRUE((*pool)->forward(batch, {nullptr, &want, nullptr}).ok());
  EXPECT_EQ(token, want);
  EXPECT_GE(want, 0);
  ASSERT_TRUE((*pool)->launch(batch, false).ok());
  token = -1;
  ASSERT_TRUE((*pool)->collect({nullptr, &token, nullptr}).ok());
  EXPECT_EQ(token, want);
  EXPECT_EQ((*pool)->rank(0).launched(), 0);
}

// bf16 GEMM precision multiplies bf16 by bf16: with f32 weights it is refused, by the engine
// (naming the flags) and by a rank made without one (gpu_bench makes its own), never f32
// activations silently kept.
TEST(DevicePath, Bf16GemmPrecisionWithoutBf16WeightsIsRefused) {
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok());
  EngineOptions o;
  o.gemm_precision = GemmPrecision::kBf16;
  o.backend_factory = [](int) -> StatusOr<std::unique_ptr<Backend>> {
    return pdserve::testing::make_guarded_backend();
  };
  auto e = Engine::create(std::move(*model), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("it takes --weight-dtype bf16, not f32"), std::string_view::npos) << e.status();

  StoriesShard stories = stories_shard();
  auto& shard = stories.shard;
  ASSERT_TRUE(shard.ok()) << shard.status();
  const ModelConfig& config = stories.model->config;
  shard->gemm_precision = GemmPrecision::kBf16;
  auto backend = make_cpu_backend();
  auto comms = make_shared_memory_group(1);
  auto runner = RankRunner::create(config, *shard, config.kv_cache_spec(16), 8, 16, backend.get(), comms[0].get());
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("bf16 GEMM precision takes bf16 weights; this shard's are f32"),
            std::string_view::npos)
      << runner.status();
}

// --gemm-precision bf16 on the guarded backend, whose GEMM rounds x to bf16 on the CPU (the
// reference for the GPU kernels' rounding): it changes the log-probabilities (the option is not
// ignored) and stays within a tolerance of the exact engine, teacher-forced.
TEST(DevicePath, Bf16GemmPrecisionFollowsTheExactEngineTeacherForced) {
  const pdserve::testing::Bf16Checkpoint checkpoint("pdserve_bf16gemm");
  ASSERT_TRUE(checkpoint.status().ok()) << checkpoint.status();
  auto exact = make_engine(true, checkpoint.path(), DType::kBF16);
  auto bf16 = make_engine(true, checkpoint.path(), DType::kBF16,
                          [](EngineOptions& o) { o.gemm_precision = GemmPrecision::kBf16; });
  ASSERT_TRUE(exact && bf16);
  SamplingParams text;
  text.max_tokens = 200;
  text.ignore_eos = true;
  auto greedy_text = exact->generate({exact->config().bos_id}, text);
  ASSERT_TRUE(greedy_text.ok()) << greedy_text.status();
  std::vector<int> forced = {exact->config().bos_id};
  forced.insert(forced.end(), greedy_text->token_ids.begin(), greedy_text->token_ids.end());
  const pdserve::testing::ForcedAgreement a = pdserve::testing::teacher_forced(*exact, *bf16, forced);
  EXPECT_GE(a.argmax_agree, int(0.99 * a.positions)) << a.argmax_agree << " of " << a.positions;
  EXPECT_LE(a.max_logprob_diff, 0.02f);
  EXPECT_GT(a.max_logprob_diff, 0.0f) << "bit-identical log-probabilities: the activations were not rounded";
  std::printf("%d of %d argmaxes agree, log-probabilities within %.4f\n", a.argmax_agree, a.positions,
              a.max_logprob_diff);
  EXPECT_LE(pdserve::testing::worst_choice_gap(*exact, *bf16, {forced.begin(), forced.begin() + 20}, 100), 0.05f);
}

}  // namespace
}  // namespace pdserve::engine
