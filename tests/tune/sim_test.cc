// The discrete-event simulator against the closed forms (P-K, the decode fixed point), and its
// determinism, router admission, goodput search, aggregated engines and TTFT breakdown.
#include "tune/sim.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tune/decode_model.h"
#include "tune/queue_model.h"

namespace pdserve::tune {
namespace {

Profile test_profile() {
  Profile p;
  TpProfile tp;
  tp.tp = 1;
  tp.prefill = {0.01, 1e-4, 0};
  tp.decode.lo = {0.02, 5e-4, 1e-7};
  tp.decode.hi = tp.decode.lo;
  tp.kv_tokens = 1 << 22;
  tp.block_size = 16;
  tp.max_running = 1024;
  tp.max_batch_tokens = 512;
  p.by_tp[1] = tp;
  p.kv.push_back({1, 1, KvMode::kPush, {0.002, 1e-6}, {}});
  p.router_overhead_s = 0.001;
  p.handoff_s = 0.003;
  return p;
}

Workload fixed_workload(int isl, int osl) {
  Workload w;
  w.input = {LengthDist::Kind::kFixed, isl, isl, {}};
  w.output = {LengthDist::Kind::kFixed, osl, osl, {}};
  w.seed = 7;
  return w;
}

const Topology kOneToOne{false, 1, 1, 1, 1, KvMode::kPush};

TEST(SimTest, MeanPrefillWaitMatchesPollaczekKhinchine) {
  // ISL = max_batch_tokens: one prompt per step, so each prefill worker is exactly M/D/1.
  // 10⁵ requests over 3 seeds, but 10⁶ at ρ = 0.9: there one run's mean wait spreads by about
  // 2.2% at 10⁵ (measured over 10 seeds; the estimator's variance grows steeply as ρ → 1), so
  // three runs of 10⁵ miss 2% by chance alone (0.979 with these seeds); at 10⁶ the spread is
  // about 0.7% (3 runs: 0.993).
  const Profile profile = test_profile();
  const Workload w = fixed_workload(512, 2);
  const double service = prefill_service_seconds(profile.by_tp.at(1).prefill, 512, 512);
  for (const double rho : {0.3, 0.5, 0.7, 0.9}) {
    SCOPED_TRACE(rho);
    double wait = 0;
    for (const uint64_t seed : {1, 2, 3}) {
      SimOptions options;
      options.requests = rho < 0.85 ? 100000 : 1000000;
      options.seed = seed;
      auto r = simulate(profile, kOneToOne, w, Slo{}, rho / service, options);
      ASSERT_TRUE(r.ok()) << r.status();
      wait += r->prediction.prefill_wait_s / 3;
      EXPECT_NEAR(r->prediction.prefill_utilization, rho, 0.02);
    }
    const double pk = md1_mean_wait(rho / service, service);
    EXPECT_NEAR(wait, pk, 0.02 * pk);
  }
}

TEST(SimTest, MeanDecodeBatchMatchesTheFixedPoint) {
  const Profile profile = test_profile();
  const TpProfile& tp = profile.by_tp.at(1);
  const Workload w = fixed_workload(32, 64);
  const double context = 32 + 64 / 2.0;
  const auto step = [&](double b) { return tp.decode.step_seconds(b, b * context); };
  for (const double rate : {5.0, 10.0}) {
    SCOPED_TRACE(rate);
    auto fp = solve_decode_fixed_point(step, {rate, 63, 96, tp.kv_tokens, tp.max_running});
    ASSERT_TRUE(fp.ok() && fp->feasible);
    SimOptions options;
    options.requests = 20000;
    auto r = simulate(profile, kOneToOne, w, Slo{}, rate, options);
    ASSERT_TRUE(r.ok()) << r.status();
    // Within 5%: the DES's B is a time average over busy steps, and its contexts vary.
    EXPECT_NEAR(r->prediction.decode_batch, fp->batch, 0.05 * fp->batch);
  }
}

TEST(SimTest, SameSeedSameRunOtherSeedOtherRun) {
  const Profile profile = test_profile();
  Workload w = fixed_workload(0, 0);
  w.input = {LengthDist::Kind::kUniform, 64, 1024, {}};
  w.output = {LengthDist::Kind::kUniform, 8, 64, {}};
  w.arrival = Arrival::kGamma;
  w.gamma_cv = 2;
  SimOptions options;
  options.requests = 3000;
  options.warmup = 100;
  const Topology t{false, 2, 1, 1, 1, KvMode::kPush};
  auto a = simulate(profile, t, w, Slo{}, 8, options);
  auto b = simulate(profile, t, w, Slo{}, 8, options);
  options.seed = 2;
  auto c = simulate(profile, t, w, Slo{}, 8, options);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->requests.size(), 2900u);
  ASSERT_EQ(a->requests.size(), b->requests.size());
  for (size_t i = 0; i < a->requests.size(); ++i) {
    EXPECT_EQ(a->requests[i].arrival_s, b->requests[i].arrival_s);
    EXPECT_EQ(a->requests[i].ttft_s, b->requests[i].ttft_s);
    EXPECT_EQ(a->requests[i].tpot_s, b->requests[i].tpot_s);
  }
  EXPECT_EQ(a->prediction.ttft_pq_s, b->prediction.ttft_pq_s);
  EXPECT_NE(a->prediction.ttft_pq_s, c->prediction.ttft_pq_s);
  // The lengths come from the workload's seed, so another arrival seed sees the same requests.
  EXPECT_EQ(a->requests[5].input_tokens, c->requests[5].input_tokens);
}

TEST(SimTest, TtftIsTheSumOfItsTerms) {
  const Profile profile = test_profile();
  SimOptions options;
  options.requests = 2000;
  options.warmup = 100;
  options.max_running = 4;
  auto r = simulate(profile, kOneToOne, fixed_workload(700, 16), Slo{}, 8, options);
  ASSERT_TRUE(r.ok());
  for (const RequestRecord& rec : r->requests) {
    ASSERT_FALSE(rec.refused);
    EXPECT_NEAR(rec.ttft_s, rec.router_wait_s + rec.prefill_wait_s + rec.prefill_s + rec.overhead_s, 1e-8);
    EXPECT_NEAR(rec.kv_transfer_s, 0.002 + 700e-6, 1e-12);
    EXPECT_EQ(rec.handoff_s, 0.003);
    EXPECT_NEAR(rec.tpot_s * 15, rec.e2e_s - rec.ttft_s, 1e-8);
    // A 700-token prompt takes two steps of 512 + 188 tokens at least.
    EXPECT_GE(rec.prefill_s, 0.01 + 0.0512 + 0.01 + 0.0188 - 1e-8);
  }
  EXPECT_GT(r->prediction.router_wait_s, 0);  // max_running 4 binds at this rate.
}

TEST(SimTest, AdmissionRefusesPastMaxWaitingAndCountsThemNotGood) {
  const Profile profile = test_profile();
  SimOptions options;
  options.requests = 4000;
  options.warmup = 100;
  options.max_running = 2;
  options.max_waiting = 3;
  const Slo loose{100, 100, 90, 0.9};  // Every served request meets it.
  auto r = simulate(profile, kOneToOne, fixed_workload(512, 16), loose, 40, options);
  ASSERT_TRUE(r.ok());
  int refused = 0;
  for (const RequestRecord& rec : r->requests) {
    refused += rec.refused;
    EXPECT_EQ(rec.good, !rec.refused);
  }
  EXPECT_GT(refused, 100);
  EXPECT_NEAR(r->prediction.attainment, 1 - double(refused) / double(r->requests.size()), 1e-12);
  // Unlimited admission refuses nobody.
  options.max_running = options.max_waiting = 0;
  r = simulate(profile, kOneToOne, fixed_workload(512, 16), loose, 10, options);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prediction.attainment, 1);
}

TEST(SimTest, ClosedLoopKeepsConcurrencyRequestsOut) {
  const Profile profile = test_profile();
  Workload w = fixed_workload(256, 8);
  w.arrival = Arrival::kClosed;
  w.concurrency = 4;
  SimOptions options;
  options.requests = 2000;
  options.warmup = 100;
  auto r = simulate(profile, kOneToOne, w, Slo{}, 0, options);
  ASSERT_TRUE(r.ok()) << r.status();
  // Four clients and one prefill worker: each prompt waits behind at most three others.
  const double service = 0.01 + 256e-4;
  for (const RequestRecord& rec : r->requests) EXPECT_LE(rec.prefill_wait_s, 3 * service + 1e-6);
  EXPECT_GT(r->prediction.rate, 0);
  EXPECT_FALSE(simulated_goodput(profile, kOneToOne, w, Slo{}, options).ok());
}

TEST(SimTest, SimulatedGoodputMeetsTheSloAndTwiceItDoesNot) {
  const Profile profile = test_profile();
  const Workload w = fixed_workload(512, 32);
  const Slo slo{0.3, 0.05, 90, 0.9};
  SimOptions options;
  options.requests = 4000;
  options.warmup = 200;
  auto g = simulated_goodput(profile, kOneToOne, w, slo, options, {1, 1e-2, 30});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_GT(*g, 1);
  EXPECT_LT(*g, 1 / 0.0612);  // Below the prefill worker's capacity.
  EXPECT_GE(simulate(profile, kOneToOne, w, slo, *g, options)->prediction.attainment, 0.9);
  EXPECT_LT(simulate(profile, kOneToOne, w, slo, 2 * *g, options)->prediction.attainment, 0.9);
  EXPECT_EQ(*simulated_goodput(profile, kOneToOne, w, slo, options, {1, 1e-2, 30}), *g);
}

TEST(SimTest, AggregatedEngineMixesChunksIntoDecodeSteps) {
  const Profile profile = test_profile();
  const Topology agg{true, 0, 0, 1, 1, KvMode::kPush};
  SimOptions options;
  options.requests = 3000;
  options.warmup = 100;
  // Unloaded: a prompt is one prefill-only step, a token one decode step of batch one.
  auto light = simulate(profile, agg, fixed_workload(256, 16), Slo{}, 0.05, options);
  ASSERT_TRUE(light.ok()) << light.status();
  EXPECT_NEAR(light->prediction.ttft_p50_s, 0.01 + 256e-4 + 0.001, 1e-6);
  EXPECT_NEAR(light->prediction.tpot_p50_s, 0.02 + 5e-4 + 1e-7 * 264, 1e-4);
  EXPECT_EQ(light->prediction.kv_transfer_s, 0);
  // Loaded: steps carry chunks and decodes together; TPOT rises, and the analytic model's
  // mixed-step utilization is near the simulated one.
  auto busy = simulate(profile, agg, fixed_workload(256, 16), Slo{}, 10, options);
  auto model = predict_analytic(profile, agg, fixed_workload(256, 16), Slo{}, 10);
  ASSERT_TRUE(busy.ok() && model.ok());
  EXPECT_GT(busy->prediction.tpot_p50_s, light->prediction.tpot_p50_s + 0.005);
  EXPECT_GT(busy->prediction.decode_batch, 1);
  EXPECT_NEAR(busy->prediction.prefill_utilization, model->prefill_utilization, 0.1);
}

TEST(SimTest, BadInputsAreErrors) {
  const Profile profile = test_profile();
  SimOptions options;
  EXPECT_EQ(simulate(profile, {false, 1, 1, 1, 1, KvMode::kPull}, fixed_workload(8, 8), Slo{}, 1, options)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(simulate(profile, kOneToOne, fixed_workload(8, 8), Slo{}, 0, options).ok());
  options.warmup = options.requests;
  EXPECT_FALSE(simulate(profile, kOneToOne, fixed_workload(8, 8), Slo{}, 1, options).ok());
}

}  // namespace
}  // namespace pdserve::tune
