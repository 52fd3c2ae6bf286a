// PhaseProfiler: under it the engine computes exactly what it computes without it, and each
// kernel call lands in its phase once per call while profiling is on, never while it is off.
#include "engine/backends/phase_profiler.h"

#include <gtest/gtest.h>

#include "common/clock.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

// The CPU backend computes from the model's own tensors: seven GEMMs a layer (q, k, v, o, gate,
// up, down), and the engine samples its rows on the host. A device backend's upload fuses q/k/v
// and gate/up: four (qkv, o, gate_up, down); its rows are sampled on the device, once a step.
// With bf16 weights a layer's gate-up GEMM and SwiGLU are one call (Backend::gate_up_silu_bf16, one
// fused GEMV on a GPU up to 8 rows), charged to the GEMMs.
struct Case {
  const char* name;
  const char* backend;
  DType weights;
  int gemms_per_layer;
  int swiglu_calls_per_layer;
  int samplings_per_step;
};

class PhaseProfilerTest : public ::testing::TestWithParam<Case> {};

TEST_P(PhaseProfilerTest, ForwardsEveryCallAndCountsEachStepsKernels) {
  SamplingParams params;
  params.max_tokens = 24;
  params.ignore_eos = true;
  const std::vector<int> prompt = {1, 403, 407, 261};
  EngineOptions plain_options;
  plain_options.weight_dtype = GetParam().weights;
  // The CPU backend takes f32 weights only: a bf16 case's reference is its own backend, unprofiled.
  if (GetParam().weights == DType::kBF16) plain_options.backend = GetParam().backend;
  auto plain = Engine::create(*load_model({pdserve::testing::stories_bin()}), plain_options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const auto want = (*plain)->generate(prompt, params);
  ASSERT_TRUE(want.ok()) << want.status();

  FakeClock clock;  // Never advanced: the test is about what is charged where, not how long.
  PhaseProfiler* profiler = nullptr;
  EngineOptions o;
  o.weight_dtype = GetParam().weights;
  o.backend = plain_options.backend;
  o.backend_factory = [&](int) -> StatusOr<std::unique_ptr<Backend>> {
    PD_ASSIGN_OR_RETURN(auto inner, make_backend(GetParam().backend, 0));
    auto p = std::make_unique<PhaseProfiler>(std::move(inner), /*lm_head_out=*/512, clock);
    profiler = p.get();
    return std::unique_ptr<Backend>(std::move(p));
  };
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig config = model->config;
  ASSERT_EQ(config.vocab_size, 512);
  auto profiled = Engine::create(std::move(*model), o);
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  ASSERT_NE(profiler, nullptr);

  // Off: forwards only.
  auto off = (*profiled)->generate(prompt, params);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->token_ids, want->token_ids);
  for (const PhaseTotal& t : profiler->totals()) EXPECT_EQ(t.calls, 0);

  ASSERT_TRUE(profiler->set_enabled(true).ok());
  auto on = (*profiled)->generate(prompt, params);
  ASSERT_TRUE(profiler->set_enabled(false).ok());
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->token_ids, want->token_ids);
  // One LM head per step: the prompt's step, then one per further token.
  const auto& totals = profiler->totals();
  const int64_t steps = totals[size_t(Phase::kLmHead)].calls;
  EXPECT_EQ(steps, params.max_tokens);
  const int64_t layers = config.n_layers;
  const int gemms = GetParam().gemms_per_layer;
  EXPECT_EQ(totals[size_t(Phase::kGemm)].calls, steps * layers * gemms);
  EXPECT_EQ(totals[size_t(Phase::kAttention)].calls, steps * layers);
  // The embedding and layer 0's norm; per layer attention's input stage, two add+norms (the
  // last layer's second a plain add) and SwiGLU unless fused; the logits rows' norm (gathered, no
  // copy per row).
  EXPECT_EQ(totals[size_t(Phase::kSmallKernels)].calls, steps * (3 + layers * (3 + GetParam().swiglu_calls_per_layer)));
  EXPECT_EQ(totals[size_t(Phase::kSampling)].calls, steps * GetParam().samplings_per_step);
  for (const PhaseTotal& t : totals) EXPECT_EQ(t.time, Duration(0));
  EXPECT_EQ(profiler->per_step()[size_t(Phase::kGemm)].calls, double(layers * gemms));
  profiler->reset();
  for (const PhaseTotal& t : profiler->totals()) EXPECT_EQ(t.calls, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, PhaseProfilerTest,
                         ::testing::Values(Case{"cpu", "cpu", DType::kF32, 7, 1, 0},
                                           Case{"emulated", "emulated", DType::kF32, 4, 1, 1},
                                           Case{"emulated_bf16", "emulated", DType::kBF16, 4, 0, 1}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pdserve::engine
