// The tuner's search, validation arithmetic, load-point plumbing and report statistics: pure
// functions, table-tested.
#include "tune/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tune/baselines.h"
#include "tune/load_runner.h"
#include "tune/local_cluster.h"
#include "tune/report.h"
#include "tune/step_slowdown.h"
#include "tune/validate.h"

namespace pdserve::tune {
namespace {

TEST(Search, EnumeratesEveryTopologyWithinTheBudgetBothWays) {
  SearchSpace s;
  s.ranks = 2;
  s.tps = {1, 2};
  std::vector<Topology> t = enumerate_topologies(s);
  // Aggregated: 1×TP1, 2×TP1, 1×TP2; P/D: 1P TP1 + 1D TP1.
  ASSERT_EQ(t.size(), 4u);
  EXPECT_TRUE(t[0].aggregated && t[0].n_d == 1 && t[0].tp_d == 1);
  EXPECT_TRUE(t[1].aggregated && t[1].n_d == 2 && t[1].tp_d == 1);
  EXPECT_TRUE(t[2].aggregated && t[2].n_d == 1 && t[2].tp_d == 2);
  EXPECT_FALSE(t[3].aggregated);
  EXPECT_EQ(t[3].ranks(), 2);

  s.ranks = 4;
  s.modes = {KvMode::kPush, KvMode::kPull};
  t = enumerate_topologies(s);
  int p_gt_d = 0, p_lt_d = 0;
  for (const Topology& x : t) {
    EXPECT_LE(x.ranks(), 4);
    if (!x.aggregated && x.tp_p > x.tp_d) ++p_gt_d;
    if (!x.aggregated && x.tp_p < x.tp_d) ++p_lt_d;
  }
  // 1P TP2 + 1D TP1 and 1P TP1 + 1D TP2, ×2 modes, and with a second TP1 worker on the TP1 side.
  EXPECT_EQ(p_gt_d, 4);
  EXPECT_EQ(p_lt_d, 4);
  // Aggregated: 1..4 × TP1 and 1..2 × TP2. P/D per mode: TP1→TP1 with n_p + n_d ≤ 4 (6),
  // TP1→TP2 (2), TP2→TP1 (2), TP2→TP2 (1); two modes.
  EXPECT_EQ(t.size(), 6u + 2u * (6u + 2u + 2u + 1u));
}

TEST(Search, RanksByGoodputPerRankThenFewerRanksAndMarksThePareto) {
  SearchSpace s;
  s.ranks = 2;
  s.tps = {1, 2};
  const std::vector<Topology> topologies = enumerate_topologies(s);
  // 1×TP1: 10/s on 1 rank; 2×TP1: 20/s on 2 (a tie per rank: fewer ranks first); 1×TP2: 14/s
  // with fast tokens; P/D: nothing meets the SLO.
  std::map<int, std::pair<double, double>> by_index = {{0, {10, 0.01}}, {1, {20, 0.01}}, {2, {14, 0.005}}, {3, {0, 0}}};
  int calls = 0;
  ScoreFn score = [&](const Topology& t) -> StatusOr<std::pair<double, Prediction>> {
    const size_t i = std::find(topologies.begin(), topologies.end(), t) - topologies.begin();
    ++calls;
    Prediction p;
    p.rate = by_index[int(i)].first;
    p.tpot_p50_s = by_index[int(i)].second;
    p.ttft_pq_s = 0.5;
    p.tpot_pq_s = p.tpot_p50_s;
    return std::make_pair(by_index[int(i)].first, p);
  };
  Workload w;
  w.output = {LengthDist::Kind::kFixed, 32, 32, {}};
  Slo slo;
  std::vector<Candidate> r = rank_candidates(topologies, score, w, slo, Objective::kGoodputPerRank, 0);
  EXPECT_EQ(calls, 4);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].topology, topologies[0]);
  EXPECT_EQ(r[1].topology, topologies[1]);
  EXPECT_EQ(r[2].topology, topologies[2]);
  EXPECT_EQ(r[3].bottleneck, Bottleneck::kInfeasible);
  EXPECT_DOUBLE_EQ(r[0].output_tok_s_per_rank, 10 * 32);
  // 1×TP2 has the fastest tokens (200 tok/s/user), 1×TP1 / 2×TP1 the most tok/s per rank.
  EXPECT_TRUE(r[0].on_pareto_front);
  EXPECT_TRUE(r[1].on_pareto_front);
  EXPECT_TRUE(r[2].on_pareto_front);
  EXPECT_FALSE(r[3].on_pareto_front);

  // min-ranks for 15/s: only 2×TP1 (20/s) reaches it... and 1×TP2 does not (14/s).
  r = rank_candidates(topologies, score, w, slo, Objective::kMinRanks, 15);
  EXPECT_EQ(r[0].topology, topologies[1]);
}

TEST(Search, AScoringErrorIsRecordedNotFatal) {
  std::vector<Topology> t(1);
  ScoreFn fail = [](const Topology&) -> StatusOr<std::pair<double, Prediction>> {
    return absl::NotFoundError("no TP2 in the profile");
  };
  std::vector<Candidate> r = rank_candidates(t, fail, Workload{}, Slo{}, Objective::kGoodputPerRank, 0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].goodput_rps, 0);
  EXPECT_EQ(r[0].error, "no TP2 in the profile");
}

TEST(Search, TheBottleneckIsTheCloserObjectivesLargestTerm) {
  Workload w;
  w.output = {LengthDist::Kind::kFixed, 33, 33, {}};
  Slo slo;
  slo.ttft_s = 1;
  slo.tpot_s = 0.05;
  Prediction p;
  p.rate = 1;
  p.ttft_pq_s = 0.9;
  p.tpot_pq_s = 0.01;
  p.prefill_wait_s = 0.5;
  p.prefill_s = 0.3;
  EXPECT_EQ(classify(p, w, slo), Bottleneck::kPrefill);
  p.router_wait_s = 0.6;
  EXPECT_EQ(classify(p, w, slo), Bottleneck::kRouter);
  p.ttft_pq_s = 0.1;
  p.tpot_pq_s = 0.045;
  p.tpot_p50_s = 0.04;
  EXPECT_EQ(classify(p, w, slo), Bottleneck::kDecode);
  p.kv_transfer_s = 0.7;  // 0.7 s over 32 steps: more than half of each token's time.
  EXPECT_EQ(classify(p, w, slo), Bottleneck::kTransfer);
  p.kv_occupancy = 0.97;
  EXPECT_EQ(classify(p, w, slo), Bottleneck::kKvCapacity);
  p.rate = 0;
  EXPECT_EQ(classify(p, w, slo), Bottleneck::kInfeasible);
}

MeasuredPoint at(double rate, double attainment) {
  MeasuredPoint m;
  m.rate = rate;
  m.attainment = attainment;
  return m;
}

TEST(Validate, MeasuredGoodputInterpolatesTheAttainmentMargin) {
  bool bound = false;
  // 0.95 at 8/s, 0.85 at 12/s, target 0.9: the crossing halfway, 10/s.
  EXPECT_NEAR(interpolate_goodput({at(8, 0.95), at(12, 0.85)}, 0.9, &bound), 10, 1e-9);
  EXPECT_FALSE(bound);
  // Two runs at one rate are averaged: (0.96 + 0.92)/2 = 0.94 at 10/s, 0.86 at 12/s → 11/s.
  EXPECT_NEAR(interpolate_goodput({at(10, 0.96), at(12, 0.86), at(10, 0.92)}, 0.9, &bound), 11, 1e-9);
  // Every point meets it: a lower bound at the highest rate.
  EXPECT_EQ(interpolate_goodput({at(8, 0.99), at(12, 0.95)}, 0.9, &bound), 12);
  EXPECT_TRUE(bound);
  // None does: a bound at the lowest.
  EXPECT_EQ(interpolate_goodput({at(8, 0.5), at(12, 0.3)}, 0.9, &bound), 8);
  EXPECT_TRUE(bound);
  EXPECT_EQ(interpolate_goodput({}, 0.9, &bound), -1);
}

// The bench's time limit covers its requests' arrivals: 150 requests (min_requests) at
// 0.665/s arrive over 225.6 s, past the 120 s floor that a 2 s point would otherwise get.
TEST(Validate, ALoadsTimeLimitCoversItsArrivals) {
  EXPECT_NEAR(load_timeout_s(150, 0.665, 2), 3 * 150 / 0.665, 1e-9);
  EXPECT_EQ(load_timeout_s(100, 5, 20), 200);  // 10 points' durations: 20 s of arrivals is less.
  EXPECT_EQ(load_timeout_s(150, 50, 2), 120);  // 3 s of arrivals: the floor.
  EXPECT_EQ(load_timeout_s(150, 0, 2), 120);   // No rate (nothing to load at): the floor.
}

TEST(Validate, APointsAttainmentCountsFailuresAsNotGood) {
  Slo slo;
  slo.ttft_s = 0.1;
  slo.tpot_s = 0.01;
  std::vector<RequestSample> r(4);
  r[0] = {true, 0, 0.05, 0.5, 0.005, 10, 32, 0.001, 0.04, 0.002, {}, "p", "d"};
  r[1] = {true, 0, 0.2, 0.5, 0.005, 10, 32, 0.001, 0.15, 0.002, {}, "p", "d"};  // TTFT over.
  r[2] = {true, 0, 0.05, 0.5, 0.02, 10, 32, 0.001, 0.04, 0.002, {}, "p", "d"};  // TPOT over.
  r[3].ok = false;
  MeasuredPoint m = measure_point(r, slo);
  EXPECT_DOUBLE_EQ(m.attainment, 0.25);
  EXPECT_EQ(m.failed, 1);
  EXPECT_NEAR(m.prefill_s, (0.04 + 0.15 + 0.04) / 3, 1e-12);
  EXPECT_NEAR(m.overhead_s, (0.009 + 0.049 + 0.009) / 3, 1e-12);
  // A one-token request has no TPOT to miss.
  std::vector<RequestSample> one(1);
  one[0].ok = true;
  one[0].ttft_s = 0.05;
  one[0].tpot_s = -1;
  EXPECT_DOUBLE_EQ(attainment(one, slo), 1.0);
}

TEST(LoadRunner, BenchArgumentsAndTheWorkloadMapping) {
  LoadSpec s;
  s.router = "127.0.0.1:5";
  Workload w;
  w.input = {LengthDist::Kind::kUniform, 100, 300, {}};
  w.output = {LengthDist::Kind::kUniform, 16, 48, {}};
  w.arrival = Arrival::kGamma;
  w.gamma_cv = 2;
  w.seed = 7;
  ASSERT_TRUE(apply_workload(w, &s).ok());
  EXPECT_EQ(s.input_len, 200);
  EXPECT_EQ(s.output_len, 32);
  EXPECT_DOUBLE_EQ(s.range_ratio, 0.5);
  EXPECT_DOUBLE_EQ(s.burstiness, 0.25);  // Gamma shape 1/cv².
  s.rate = 12.5;
  const std::vector<std::string> a = bench_arguments(s, "/tmp/r.json");
  auto value = [&](const std::string& flag) {
    auto it = std::find(a.begin(), a.end(), flag);
    return it == a.end() || it + 1 == a.end() ? std::string("<none>") : *(it + 1);
  };
  EXPECT_EQ(value("--request-rate"), "12.5");
  EXPECT_EQ(value("--burstiness"), "0.25");
  EXPECT_EQ(value("--random-range-ratio"), "0.5");
  EXPECT_EQ(value("--seed"), "7");
  EXPECT_NE(std::find(a.begin(), a.end(), "--save-detailed"), a.end());
  EXPECT_NE(std::find(a.begin(), a.end(), "--ignore-eos"), a.end());
  // What bench cannot sample is refused, not approximated.
  w.output = {LengthDist::Kind::kFixed, 32, 32, {}};
  EXPECT_EQ(apply_workload(w, &s).code(), absl::StatusCode::kInvalidArgument);
  w.input = {LengthDist::Kind::kEmpirical, 0, 0, {1, 2}};
  EXPECT_EQ(apply_workload(w, &s).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadRunner, ParsesBenchsDetailedRecords) {
  StatusOr<LoadResult> r = parse_bench_result(R"({"duration": 2.5, "requests": [
      {"ok": true, "start_s": 0.1, "ttft_s": 0.02, "e2e_s": 0.3, "tpot_s": 0.009, "prompt_tokens": 10,
       "output_tokens": 32, "server_queued_s": 0.001, "server_prefill_s": 0.015, "server_kv_transfer_s": 0.003,
       "itl_s": [0.01, 0.009], "prefill_worker": "127.0.0.1:1", "decode_worker": "127.0.0.1:2"},
      {"ok": false, "tpot_s": null}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->duration_s, 2.5);
  ASSERT_EQ(r->requests.size(), 2u);
  EXPECT_TRUE(r->requests[0].ok);
  EXPECT_DOUBLE_EQ(r->requests[0].kv_transfer_s, 0.003);
  EXPECT_EQ(r->requests[0].itl_s.size(), 2u);
  EXPECT_EQ(r->requests[0].decode_worker, "127.0.0.1:2");
  EXPECT_FALSE(r->requests[1].ok);
  EXPECT_EQ(r->requests[1].tpot_s, -1);
  EXPECT_FALSE(parse_bench_result(R"({"duration": 1})").ok());  // Without --save-detailed.
}

TEST(LocalCluster, UpArgumentsAndTheReadyFile) {
  ClusterOptions o;
  o.pdserve = "/bin/pdserve";
  o.model = "stories260K";
  o.device = Device::kHip;
  o.weight_dtype = engine::DType::kBF16;
  o.kv_dtype = engine::DType::kBF16;
  o.gemm_precision = engine::GemmPrecision::kBf16;
  o.max_running = 96;
  Topology t;
  t.n_p = 2;
  t.tp_p = 1;
  t.n_d = 1;
  t.tp_d = 2;
  t.mode = KvMode::kPull;
  const std::vector<std::string> a = up_arguments(t, o);
  const std::string joined = [&] {
    std::string s;
    for (const std::string& x : a) s += x + " ";
    return s;
  }();
  EXPECT_EQ(
      joined,
      "/bin/pdserve up --model stories260K --device hip --port 0 --restart never --prefix-caching off --prefill 2 "
      "--prefill-tp 1 "
      "--decode 1 --decode-tp 2 --kv-mode pull --local-prefill-tokens 0 --weight-dtype bf16 --kv-dtype bf16 "
      "--gemm-precision bf16 --max-running 96 ");
  // On CPU workers neither: up passes no weight dtype to them, and they keep an f32 KV cache.
  o.device = Device::kCpu;
  o.weight_dtype = o.kv_dtype = engine::DType::kF32;
  o.gemm_precision = engine::GemmPrecision::kExact;
  const std::vector<std::string> cpu = up_arguments(t, o);
  EXPECT_EQ(std::count(cpu.begin(), cpu.end(), "--weight-dtype") + std::count(cpu.begin(), cpu.end(), "--kv-dtype") +
                std::count(cpu.begin(), cpu.end(), "--gemm-precision"),
            0);
  StatusOr<ClusterEndpoints> e = parse_ready_file(R"({"router": {"grpc": "127.0.0.1:9", "http": "127.0.0.1:10"},
      "workers": [{"name": "prefill0", "grpc": "127.0.0.1:11", "role": "prefill", "tp": "1"},
                  {"name": "decode0", "grpc": "127.0.0.1:12", "role": "decode", "tp": "2"}]})");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->router, "127.0.0.1:9");
  ASSERT_EQ(e->workers.size(), 2u);
  EXPECT_EQ(e->workers[1].tp, 2);
  EXPECT_FALSE(parse_ready_file(R"({"workers": []})").ok());
  EXPECT_FALSE(parse_ready_file("not json").ok());
}

TEST(Report, KendallTauAndRegret) {
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3}, {10, 20, 30}), 1.0);
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3}, {30, 20, 10}), -1.0);
  EXPECT_NEAR(kendall_tau({1, 2, 3, 4}, {1, 3, 2, 4}), 4.0 / 6.0, 1e-12);
  EXPECT_DOUBLE_EQ(kendall_tau({1}, {1}), 0.0);
  EXPECT_DOUBLE_EQ(regret({10, 8, 5}, 0), 0.0);
  EXPECT_DOUBLE_EQ(regret({10, 8, 5}, 1), 0.2);
  EXPECT_DOUBLE_EQ(relative_error(12, 10), 0.2);
}

TpProfile simple_tp(int tp) {
  TpProfile p;
  p.tp = tp;
  p.prefill = {0.0, 1e-4, 0};  // 0.1 ms per prompt token.
  p.decode.lo = {0.002, 0.0001, 0};  // 2 ms + 0.1 ms per sequence.
  p.kv_tokens = 1 << 20;
  p.max_running = 256;
  p.max_batch_tokens = 512;
  return p;
}

TEST(Baselines, DynamoHasNoQueueAndAicAppliesItsFactors) {
  Profile profile;
  profile.by_tp[1] = simple_tp(1);
  Workload w;
  w.input = {LengthDist::Kind::kFixed, 100, 100, {}};
  w.output = {LengthDist::Kind::kFixed, 10, 10, {}};
  Slo slo;
  slo.ttft_s = 1;
  slo.tpot_s = 0.0021;  // Batch 1 only: 2.1 ms ≥ 2.1 ms at B = 1, 2.2 ms at B = 2.
  Topology t;
  t.n_p = 2;
  t.tp_p = 1;
  t.n_d = 1;
  t.tp_d = 1;
  // Prefill: 10 ms per prompt → 100/s per worker, 200/s for two. Decode: B* = 1 at 2.1 ms, 10
  // tokens each → 1/(10 × 0.0021) = 47.6/s. The decode side limits.
  StatusOr<double> d = baseline_goodput(BaselinePlanner::kDynamo, profile, t, w, slo);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NEAR(*d, 1.0 / (10 * 0.0021), 1e-9);
  // AIC: TPOT × 1.08 misses 2.1 ms already at B = 1: no decode capacity, nothing meets the SLO.
  StatusOr<double> a = baseline_goodput(BaselinePlanner::kAic, profile, t, w, slo);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 0);
  slo.tpot_s = 1;  // Decode no longer binds: AIC's prefill capacity is 0.9 × 200/s.
  slo.ttft_s = 0.1;
  a = baseline_goodput(BaselinePlanner::kAic, profile, t, w, slo);
  ASSERT_TRUE(a.ok());
  EXPECT_NEAR(*a, 0.9 * 200, 1e-6);
  // TTFT × 1.98 over the SLO: refused.
  slo.ttft_s = 0.015;
  EXPECT_EQ(*baseline_goodput(BaselinePlanner::kAic, profile, t, w, slo), 0);
  EXPECT_GT(*baseline_goodput(BaselinePlanner::kDynamo, profile, t, w, slo), 0);
  t.tp_d = 2;
  EXPECT_EQ(baseline_goodput(BaselinePlanner::kDynamo, profile, t, w, slo).status().code(), absl::StatusCode::kNotFound);
}

TEST(StepSlowdown, MedianMeasuredOverPredictedPerKindMixedStepsLeftOut) {
  TpProfile tp = simple_tp(1);  // Prefill 0.1 ms per token; decode 2 ms + 0.1 ms per sequence.
  std::vector<StepSample> steps = {
      {100, 1, 0, 0, 0.010 * 1.5},  // Prefill 100 tokens: 10 ms by the law, ran 1.5×.
      {200, 2, 0, 0, 0.020 * 2.0},
      {50, 1, 0, 0, 0.005 * 1.2},
      {0, 0, 4, 400, 0.0024 * 3.0},  // Decode B = 4: 2.4 ms by the law, ran 3×.
      {0, 0, 8, 800, 0.0028 * 1.0},
      {16, 1, 4, 400, 1.0},  // Mixed: no law of its own, left out.
      {0, 0, 2, 20, 0},      // No time: left out.
  };
  StepSlowdown s = step_slowdown(steps, tp);
  EXPECT_EQ(s.prefill_steps, 3);
  EXPECT_EQ(s.decode_steps, 2);
  EXPECT_NEAR(s.prefill, 1.5, 1e-9);
  EXPECT_NEAR(s.decode, 2.0, 1e-9);  // The median of 3× and 1×.
  // Two workers: their ratios pooled; a worker of an unprofiled TP contributes nothing.
  s = merge_slowdowns({{steps, &tp}, {{{100, 1, 0, 0, 0.010 * 4}}, &tp}, {steps, nullptr}});
  EXPECT_EQ(s.prefill_steps, 4);
  EXPECT_NEAR(s.prefill, (1.5 + 2.0) / 2, 1e-9);
  EXPECT_EQ(step_slowdown({}, tp).prefill, 0);
}

}  // namespace
}  // namespace pdserve::tune
