// An aggregated worker (pdserve-decode --role aggregated) in its own process, driven over gRPC:
// greedy tokens and text equal the in-process `pdserve generate --json` (and so the published
// output), a cancelled stream frees the request's blocks, bad requests are refused, SIGTERM
// shuts it down cleanly, and its engine steps are reported (Info's step window, /metrics).
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "tests/serving/workers/worker_client.h"
#include "tests/serving/workers/worker_process.h"

namespace pdserve::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

fs::path log_path(const std::string& name) {
  return fs::temp_directory_path() / ("pdserve_worker_" + name + "_" + std::to_string(getpid()) + ".log");
}

class AggregatedWorker : public ::testing::Test {
 protected:
  void SetUp() override {
    worker_ = std::make_unique<WorkerProcess>(
        decode_binary(),
        std::vector<std::string>{"--role", "aggregated", "--model", stories_bin(), "--tp", "2", "--kv-cache-bytes",
                                 "4194304", "--probe-port", "0"},
        log_path("aggregated"));
    ASSERT_TRUE(worker_->wait_ready(30s)) << "see " << worker_->log_path();
    stub_ = connect(worker_->address());
  }
  std::unique_ptr<WorkerProcess> worker_;
  std::unique_ptr<worker::Worker::Stub> stub_;
};

TEST_F(AggregatedWorker, GreedyEqualsInProcessGenerate) {
  const worker::WorkerInfo i = info(*stub_);
  EXPECT_EQ(i.role(), worker::ROLE_AGGREGATED);
  EXPECT_EQ(i.tp(), 2);
  EXPECT_EQ(i.model().name(), "stories260K");
  EXPECT_GT(i.num_blocks(), 0);
  EXPECT_EQ(i.free_blocks(), i.num_blocks());

  for (const auto& [prompt, max_tokens] : std::vector<std::pair<std::string, int>>{{"", 256}, {"Lily had a cat", 64}}) {
    const Reference ref = reference(prompt, max_tokens, 2);
    worker::WorkerGenerateRequest req;
    req.set_request_id("agg-" + std::to_string(max_tokens));
    for (int t : ref.prompt) req.add_prompt(t);
    set_greedy(req.mutable_sampling(), max_tokens);
    const Streamed got = generate(*stub_, req);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, ref.tokens) << "prompt '" << prompt << "'";
    EXPECT_EQ(got.text, ref.text);
    EXPECT_EQ(got.finish_reason, ref.finish_reason);
    if (prompt.empty()) {
      std::ifstream in(stories_dir() + "/greedy_from_bos.txt");
      std::stringstream ss;
      ss << in.rdbuf();
      std::string published = ss.str(), text = got.text;
      while (!published.empty() && published.back() == '\n') published.pop_back();
      while (!text.empty() && text.back() == '\n') text.pop_back();
      EXPECT_EQ(text, published);
    }
  }
  EXPECT_TRUE(wait_all_free(*stub_, 2s));
  EXPECT_EQ(worker_->terminate(10s), 0);
}

TEST_F(AggregatedWorker, CancelledStreamFreesItsBlocks) {
  worker::WorkerGenerateRequest req;
  req.set_request_id("cancel-me");
  req.add_prompt(1);
  set_greedy(req.mutable_sampling(), 400);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  worker::WorkerEvent ev;
  ASSERT_TRUE(reader->Read(&ev));
  ctx.TryCancel();
  while (reader->Read(&ev)) {
  }
  // The tiny model may have finished all 400 tokens before the cancel reached the worker.
  const grpc::StatusCode code = reader->Finish().error_code();
  EXPECT_TRUE(code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::OK) << code;
  EXPECT_TRUE(wait_all_free(*stub_, 5s));
  EXPECT_EQ(info(*stub_).running(), 0);
}

TEST_F(AggregatedWorker, BadRequestsAreRefused) {
  worker::WorkerGenerateRequest req;
  req.set_request_id("bad");
  set_greedy(req.mutable_sampling(), 4);
  EXPECT_EQ(generate(*stub_, req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // No prompt.
  req.add_prompt(1);
  req.set_kv_mode("push");
  EXPECT_EQ(generate(*stub_, req).status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  req.set_kv_mode("");
  req.mutable_sampling()->set_max_tokens(0);
  EXPECT_EQ(generate(*stub_, req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext ctx;
  worker::ReserveResponse r;
  EXPECT_EQ(stub_->Reserve(&ctx, worker::ReserveRequest(), &r).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(wait_all_free(*stub_, 2s));
}

// Info's step window holds each engine step of a request, for a caller that asks for it (the
// tuner's profiler) and only for it: the router's empty InfoRequest gets the count and their
// time alone.
// /metrics counts the same steps.
TEST_F(AggregatedWorker, InfoReportsTheEngineStepsWhenAskedAndMetricsCountThem) {
  worker::InfoRequest with_steps;
  with_steps.set_include_steps(true);
  EXPECT_EQ(info(*stub_, with_steps).steps_size(), 0);  // Nothing ran yet.
  worker::WorkerGenerateRequest req;
  req.set_request_id("steps");
  for (int t : {1, 40, 41, 42, 43}) req.add_prompt(t);
  set_greedy(req.mutable_sampling(), 4);
  req.mutable_sampling()->set_ignore_eos(true);
  ASSERT_TRUE(generate(*stub_, req).status.ok());
  // The last step's sample is published just after its token reached the stream.
  worker::WorkerInfo i;
  for (int tries = 0; tries < 100 && (i = info(*stub_, with_steps)).steps_total() < 4; ++tries)
    std::this_thread::sleep_for(20ms);
  // One prefill of the 5-token prompt, then 3 decodes reading 6, 7 and 8 positions.
  using Shape = std::tuple<int64_t, int, int, int64_t>;
  std::vector<Shape> got;
  for (const worker::StepSample& s : i.steps()) {
    got.emplace_back(s.prefill_tokens(), s.prefill_seqs(), s.decode_seqs(), s.kv_tokens());
    EXPECT_EQ(s.seq(), got.size());
    EXPECT_GT(s.wall_s(), 0);
  }
  EXPECT_EQ(got, (std::vector<Shape>{{5, 1, 0, 0}, {0, 0, 1, 6}, {0, 0, 1, 7}, {0, 0, 1, 8}}));
  EXPECT_EQ(i.steps_total(), 4u);
  // Their time in all (the router's step time, with steps_total).
  double wall = 0;
  for (const worker::StepSample& s : i.steps()) wall += s.wall_s();
  EXPECT_NEAR(i.step_seconds_total(), wall, 1e-9);
  // Their tokens (the router's time per token): 5 prompt tokens and 3 decoded; none running now.
  EXPECT_EQ(i.step_tokens_total(), 8u);
  EXPECT_EQ(i.step_tokens_in_progress(), 0);
  with_steps.set_steps_after(2);
  const worker::WorkerInfo newer = info(*stub_, with_steps);
  ASSERT_EQ(newer.steps_size(), 2);
  EXPECT_EQ(newer.steps(0).seq(), 3u);
  const worker::WorkerInfo load = info(*stub_);
  EXPECT_EQ(load.steps_size(), 0);
  EXPECT_EQ(load.steps_total(), 4u);
  // And the engine's limits (the defaults: the fixture sets neither).
  EXPECT_EQ(load.max_running(), 256);
  EXPECT_EQ(load.max_batch_tokens(), 512);

  httplib::Client http("127.0.0.1", worker_->probe_port());
  http.set_read_timeout(5, 0);
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* line : {"pdserve:worker_steps_total{role=\"aggregated\"} 4\n",
                           "pdserve:worker_step_prefill_tokens_total{role=\"aggregated\"} 5\n",
                           "pdserve:worker_step_decode_sequences_total{role=\"aggregated\"} 3\n",
                           "pdserve:worker_step_seconds_count{role=\"aggregated\"} 4\n",
                           "pdserve:worker_step_seconds_sum{role=\"aggregated\"} "})
    EXPECT_NE(m->body.find(line), std::string::npos) << line << m->body;
}

}  // namespace
}  // namespace pdserve::testing
