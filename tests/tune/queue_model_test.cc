// The queueing closed forms against textbook values, the decode fixed point, and the analytic
// predictor and goodput search built on them.
#include <gtest/gtest.h>

#include <cmath>

#include "tune/analytic.h"
#include "tune/decode_model.h"
#include "tune/queue_model.h"

namespace pdserve::tune {
namespace {

TEST(QueueModelTest, MD1QueueLengthMatchesTextbook) {
  // Lq = λ·Wq = ρ²/(2(1 − ρ)) with unit service.
  for (const auto& [rho, lq] : {std::pair{0.5, 0.25}, {0.8, 1.6}, {0.9, 4.05}}) {
    SCOPED_TRACE(rho);
    EXPECT_NEAR(rho * md1_mean_wait(rho, 1.0), lq, 1e-9);
  }
}

TEST(QueueModelTest, MM1QueueLengthMatchesTextbook) {
  // Lq = ρ²/(1 − ρ).
  for (const auto& [rho, lq] : {std::pair{0.5, 0.5}, {0.8, 3.2}, {0.9, 8.1}}) {
    SCOPED_TRACE(rho);
    EXPECT_NEAR(rho * mm1_mean_wait(rho, 1.0), lq, 1e-9);
  }
}

TEST(QueueModelTest, PollaczekKhinchineWithKnownSecondMoment) {
  // S uniform on [0, 2]: E[S] = 1, E[S²] = 4/3. Wq = λE[S²]/(2(1 − ρ)).
  const ServiceMoments s{1.0, 4.0 / 3};
  EXPECT_NEAR(pk_mean_wait(0.5, s), 2.0 / 3, 1e-12);
  EXPECT_NEAR(pk_mean_wait(0.75, s), 2.0, 1e-12);
  EXPECT_NEAR(s.mean_residual(), 2.0 / 3, 1e-12);
  EXPECT_NEAR(s.cv2(), 1.0 / 3, 1e-12);
  EXPECT_TRUE(std::isinf(pk_mean_wait(1.0, s)));
}

TEST(QueueModelTest, KingmanReducesToPKForPoissonAndVanishesWhenDeterministic) {
  const ServiceMoments s{0.2, 0.05};
  EXPECT_NEAR(kingman_mean_wait(3, s, 1.0), pk_mean_wait(3, s), 1e-12);
  EXPECT_NEAR(kingman_mean_wait(3, {0.2, 0.04}, 0.0), 0.0, 1e-12);  // D/D/1.
  // c_a² = 4 (gamma cv 2), M/D/1 service: (4 + 0)/2 · ρ/(1 − ρ) · E[S] at ρ = 0.5.
  EXPECT_NEAR(kingman_mean_wait(2.5, {0.2, 0.04}, 4.0), 2 * 1 * 0.2, 1e-12);
  Workload w;
  w.arrival = Arrival::kGamma;
  w.gamma_cv = 2;
  EXPECT_EQ(arrival_cv2(w), 4);
  w.arrival = Arrival::kClosed;
  EXPECT_EQ(arrival_cv2(w), 0);
}

TEST(QueueModelTest, WaitQuantileFromTheExponentialTail) {
  struct Case {
    double rho, residual, q, want;
  };
  for (const Case& c : {Case{0.5, 1.0, 0.9, 2 * std::log(5.0)}, Case{0.5, 1.0, 0.4, 0.0},
                        Case{0.9, 0.3, 0.99, 3 * std::log(90.0)}}) {
    SCOPED_TRACE(c.q);
    EXPECT_NEAR(wait_quantile(c.rho, c.residual, c.q), c.want, 1e-9);
  }
  // The tail's CDF inverts its quantile, and its mean is the mean wait it was given.
  const WaitTail tail{0.8, 2.0};
  EXPECT_NEAR(tail.cdf(tail.quantile(0.95)), 0.95, 1e-12);
  EXPECT_NEAR(tail.cdf(0), 0.2, 1e-12);
  EXPECT_EQ(tail.cdf(-1), 0);
}

TEST(QueueModelTest, RhoMaxMatchesTheSpecExample) {
  EXPECT_NEAR(rho_max(1.35, 0.30), 1.35 / 1.65, 1e-12);
  EXPECT_EQ(rho_max(-0.1, 0.30), 0);
}

TEST(QueueModelTest, PrefillServiceUnderChunking) {
  const PrefillLaw law{1.0, 0.01, 0.0};
  EXPECT_NEAR(prefill_service_seconds(law, 1000, 512), (1 + 5.12) + (1 + 4.88), 1e-12);
  EXPECT_NEAR(prefill_service_seconds(law, 1024, 512), 2 * (1 + 5.12), 1e-12);
  EXPECT_NEAR(prefill_service_seconds(law, 100, 512), 2.0, 1e-12);
  EXPECT_EQ(prefill_service_seconds(law, 0, 512), 0);
}

TEST(QueueModelTest, ServiceMomentsOverLengthDistributions) {
  const PrefillLaw law{0.0, 1.0, 0.0};  // S = l seconds, no chunking.
  struct Case {
    LengthDist dist;
    double mean, second;
  };
  LengthDist fixed{LengthDist::Kind::kFixed, 4, 4, {}};
  LengthDist uniform{LengthDist::Kind::kUniform, 1, 3, {}};
  LengthDist empirical{LengthDist::Kind::kEmpirical, 0, 0, {1, 1, 4}};
  for (const Case& c : {Case{fixed, 4, 16}, Case{uniform, 2, 14.0 / 3}, Case{empirical, 2, 6}}) {
    auto m = prefill_moments(law, c.dist, 1 << 20);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_NEAR(m->mean, c.mean, 1e-12);
    EXPECT_NEAR(m->second, c.second, 1e-12);
  }
  // A wide uniform range is summarized by 256 strata, whose mean is still the range's.
  auto wide = mean_length({LengthDist::Kind::kUniform, 64, 1024, {}});
  ASSERT_TRUE(wide.ok());
  EXPECT_NEAR(*wide, 544, 1);
  EXPECT_NEAR(*prefill_service_quantile(law, empirical, 1 << 20, 0.5), 1, 1e-12);
  EXPECT_NEAR(*prefill_service_quantile(law, empirical, 1 << 20, 0.9), 4, 1e-12);
  EXPECT_FALSE(length_points({LengthDist::Kind::kUniform, 5, 3, {}}).ok());
  EXPECT_FALSE(length_points({LengthDist::Kind::kEmpirical, 0, 0, {}}).ok());
}

TEST(DecodeModelTest, FixedPointAndItsLimits) {
  const auto step = [](double b) { return 0.01 + 0.001 * b; };
  // B = 5·10·(0.01 + 0.001B) → B = 0.5/0.95.
  auto fp = solve_decode_fixed_point(step, {5, 10, 100, 1000000, 256});
  ASSERT_TRUE(fp.ok());
  EXPECT_TRUE(fp->feasible);
  EXPECT_NEAR(fp->batch, 0.5 / 0.95, 1e-9);
  EXPECT_NEAR(fp->step_s, step(fp->batch), 1e-12);
  // The same demand with room for 0.4 sequences' reservations, then with 0.4 slots' worth.
  fp = solve_decode_fixed_point(step, {5, 10, 100, 40, 256});
  ASSERT_TRUE(fp.ok());
  EXPECT_FALSE(fp->feasible);
  EXPECT_EQ(fp->bound, DecodeBound::kKv);
  // λ·steps·b = 50·0.001 ≥ 1 per unit of batch: no batch keeps up with 1000 req/s.
  fp = solve_decode_fixed_point(step, {1000, 10, 100, 1000000, 256});
  ASSERT_TRUE(fp.ok());
  EXPECT_FALSE(fp->feasible);
  EXPECT_EQ(fp->bound, DecodeBound::kSlots);
  EXPECT_FALSE(solve_decode_fixed_point(step, {5, 10, 0, 1000, 256}).ok());
}

TEST(DecodeModelTest, PoissonOccupancy) {
  EXPECT_NEAR(poisson_cdf(1, 0), std::exp(-1.0), 1e-12);
  EXPECT_NEAR(poisson_cdf(2, 2), 5 * std::exp(-2.0), 1e-12);
  EXPECT_EQ(poisson_quantile(1, 0.5), 1);
  EXPECT_EQ(poisson_quantile(2, 0.99), 6);
  EXPECT_NEAR(poisson_quantile(400, 0.5), 400, 1);  // No underflow at large means.
}

// A profile where TP1 prefill takes 10 ms + 0.1 ms per token and decode 20 ms + 0.5 ms per
// sequence; KV and hand-off cost a few ms.
Profile test_profile() {
  Profile p;
  TpProfile tp;
  tp.tp = 1;
  tp.prefill = {0.01, 1e-4, 0};
  tp.decode.lo = {0.02, 5e-4, 0};
  tp.decode.hi = tp.decode.lo;
  tp.kv_tokens = 1 << 20;
  tp.max_running = 256;
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
  return w;
}

TEST(AnalyticTest, PdPredictionFillsEveryTerm) {
  const Profile profile = test_profile();
  const Topology t{false, 2, 1, 1, 1, KvMode::kPush};
  const double service = 0.01 + 512 * 1e-4;
  const Slo slo{1.0, 0.1, 90, 0.9};
  auto p = predict_analytic(profile, t, fixed_workload(512, 64), slo, 20);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->stable);
  EXPECT_NEAR(p->prefill_utilization, 10 * service, 1e-12);
  EXPECT_NEAR(p->prefill_wait_s, md1_mean_wait(10, service), 1e-12);
  EXPECT_NEAR(p->prefill_s, service, 1e-12);
  EXPECT_EQ(p->overhead_s, 0.001);
  EXPECT_NEAR(p->kv_transfer_s, 0.002 + 512e-6, 1e-12);
  EXPECT_EQ(p->handoff_s, 0.003);
  EXPECT_GT(p->decode_batch, 0);
  EXPECT_GT(p->kv_occupancy, 0);
  EXPECT_GE(p->ttft_pq_s, p->ttft_p50_s);
  EXPECT_GE(p->ttft_p50_s, service + 0.001);
  EXPECT_GT(p->tpot_p50_s, 0.02);
  EXPECT_GE(p->tpot_pq_s, p->tpot_p50_s);
  EXPECT_GT(p->attainment, 0.5);
  // Past the prefill's capacity the rate is unstable and nothing is good.
  p = predict_analytic(profile, t, fixed_workload(512, 64), slo, 2.1 / service);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->stable);
  EXPECT_EQ(p->attainment, 0);
}

TEST(AnalyticTest, MissingProfilePiecesAreErrors) {
  Profile profile = test_profile();
  EXPECT_EQ(predict_analytic(profile, {false, 1, 1, 1, 2, KvMode::kPush}, fixed_workload(64, 8), Slo{}, 1)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(predict_analytic(profile, {false, 1, 1, 1, 1, KvMode::kPull}, fixed_workload(64, 8), Slo{}, 1)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(predict_analytic(profile, {false, 0, 1, 1, 1, KvMode::kPush}, fixed_workload(64, 8), Slo{}, 1)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AnalyticTest, AggregatedMixedSteps) {
  const Profile profile = test_profile();
  const Topology t{true, 0, 0, 1, 1, KvMode::kPush};
  auto light = predict_analytic(profile, t, fixed_workload(256, 32), Slo{}, 0.01);
  auto busy = predict_analytic(profile, t, fixed_workload(256, 32), Slo{}, 8);
  ASSERT_TRUE(light.ok() && busy.ok());
  EXPECT_TRUE(light->stable && busy->stable);
  EXPECT_EQ(light->kv_transfer_s, 0);
  // Unloaded, a prompt is one prefill-only step and a token one decode step of about one.
  EXPECT_NEAR(light->prefill_s, 0.01 + 256e-4, 1e-4);
  EXPECT_NEAR(light->tpot_p50_s, 0.0205, 1e-3);
  // Loaded, decode steps carry prompt chunks: TPOT and the prefill's share of steps grow.
  EXPECT_GT(busy->tpot_p50_s, light->tpot_p50_s + 0.005);
  EXPECT_GT(busy->prefill_utilization, 0.2);
  EXPECT_GT(busy->decode_batch, light->decode_batch);
}

TEST(GoodputTest, BisectionBracketsTheThreshold) {
  const Slo slo;
  for (const double initial : {0.01, 1.0, 100.0}) {
    int calls = 0;
    auto g = goodput(
        [&](double rate) -> StatusOr<Prediction> {
          ++calls;
          Prediction p;
          p.attainment = rate <= 3.7 ? 0.95 : 0.5;
          return p;
        },
        slo, {initial, 1e-4, 60});
    ASSERT_TRUE(g.ok());
    SCOPED_TRACE(initial);
    EXPECT_LE(*g, 3.7);
    EXPECT_GT(*g, 3.7 * (1 - 2e-4));
    EXPECT_LT(calls, 40);
  }
  // Never attainable: 0; never broken: an error, not an endless search.
  EXPECT_EQ(*goodput([](double) -> StatusOr<Prediction> { return Prediction{}; }, slo), 0);
  EXPECT_FALSE(goodput([](double) -> StatusOr<Prediction> {
                 Prediction p;
                 p.attainment = 1;
                 return p;
               },
               slo)
                   .ok());
}

TEST(GoodputTest, AnalyticGoodputMeetsTheSloAndMoreDoesNot) {
  const Profile profile = test_profile();
  const Topology t{false, 1, 1, 1, 1, KvMode::kPush};
  const Workload w = fixed_workload(512, 64);
  const Slo slo{0.2, 0.05, 90, 0.9};
  const Predictor model = [&](double rate) { return predict_analytic(profile, t, w, slo, rate); };
  auto g = goodput(model, slo);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_GT(*g, 1);
  EXPECT_GE(model(*g)->attainment, 0.9);
  EXPECT_LT(model(*g * 1.01)->attainment, 0.9);
  // Deterministic, and a second prefill worker raises it.
  EXPECT_EQ(*goodput(model, slo), *g);
  const Topology two{false, 2, 1, 1, 1, KvMode::kPush};
  EXPECT_GT(*goodput([&](double rate) { return predict_analytic(profile, two, w, slo, rate); }, slo), *g);
}

}  // namespace
}  // namespace pdserve::tune
