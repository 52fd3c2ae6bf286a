// The router as users run it: `pdserve up` starts real worker processes and a router on
// loopback; requests go through gRPC (`pdserve generate --router`, the Generation stub) and
// HTTP (OpenAI completions, chat, SSE, /metrics). Greedy output must equal in-process
// `pdserve generate --json`. Every wait is bounded and every child is killed on the way out.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cctype>
#include <chrono>
#include <atomic>
#include <filesystem>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "proto/pdserve.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/engine/test_model.h"
#include "tests/serving/cluster_process.h"
#include "tests/serving/metrics_text.h"
#include "tools/router_client.h"

namespace pdserve {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;

using testing::CommandOutput;
using testing::Cluster;
using testing::free_port_pair;
using testing::kBin;
using testing::pdserve;
using testing::Process;

const char* kPrompt = "Once upon a time";
constexpr int kMaxTokens = 60;

// In-process greedy reference, computed once per test process.
const json& reference() {
  static const json ref = [] {
    CommandOutput r = pdserve({"generate", "--model", testing::stories_bin(), "--prompt", kPrompt, "--max-tokens",
                        std::to_string(kMaxTokens), "--json"});
    EXPECT_EQ(r.exit_code, 0);
    return json::parse(r.out, nullptr, false);
  }();
  return ref;
}

std::unique_ptr<v1::Generation::Stub> stub(const std::string& address) {
  auto ch = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  ch->WaitForConnected(std::chrono::system_clock::now() + 10s);
  return v1::Generation::NewStub(ch);
}

struct GrpcResult {
  grpc::Status status;
  std::vector<v1::GenerateResponse> responses;
};

GrpcResult grpc_generate(v1::Generation::Stub& s, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  GrpcResult r;
  auto reader = s.Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) r.responses.push_back(resp);
  r.status = reader->Finish();
  return r;
}

// `generate --router --json` output less where it was served (the workers, how much of the
// prompt their prefix caches held, the KV blocks moved, whether the decode worker prefilled),
// which the in-process reference does not have.
json output_of(json j) {
  EXPECT_TRUE(j.contains("cached_tokens") && j.contains("prefill_worker") && j.contains("decode_worker")) << j;
  EXPECT_TRUE(j.contains("decode_cached_tokens") && j.contains("transferred_blocks") && j.contains("decode_local_prefill"))
      << j;
  EXPECT_GE(j.value("cached_tokens", 0), 0);
  for (const char* k :
       {"cached_tokens", "prefill_worker", "decode_worker", "decode_cached_tokens", "transferred_blocks",
        "decode_local_prefill"})
    j.erase(k);
  return j;
}

v1::GenerateRequest greedy_request(const std::string& text, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

// Greedy through the cluster equals in process: `generate --router --json` and raw gRPC.
void expect_greedy_equal(const Cluster& c) {
  const json& ref = reference();
  ASSERT_FALSE(ref.is_discarded());
  CommandOutput r = pdserve({"generate", "--router", c.grpc(), "--prompt", kPrompt, "--max-tokens", std::to_string(kMaxTokens), "--json"});
  ASSERT_EQ(r.exit_code, 0);
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(output_of(j), ref);

  auto s = stub(c.grpc());
  GrpcResult g = grpc_generate(*s, greedy_request(kPrompt, kMaxTokens));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  std::vector<int> tokens;
  for (const auto& resp : g.responses) tokens.insert(tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
  EXPECT_EQ(json(tokens), ref["token_ids"]);
  const v1::GenerateResponse& last = g.responses.back();
  EXPECT_TRUE(last.finished());
  EXPECT_GT(last.timings().total_s(), 0);
  EXPECT_GT(last.timings().first_token_s(), 0);
  EXPECT_LE(last.timings().first_token_s(), last.timings().total_s());
}

class RouterAggregated : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(std::vector<std::string>{"--aggregated", "1", "--max-running", "2", "--max-waiting", "1"});
    ASSERT_TRUE(cluster_->wait_ready(60s)) << cluster_->log();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", cluster_->http_port());
    http_->set_read_timeout(60, 0);
  }
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(RouterAggregated, GreedyThroughGrpcAndHttpEqualsInProcessAndHealthIsServing) {
  expect_greedy_equal(*cluster_);
  const json& ref = reference();

  json body = {{"prompt", kPrompt}, {"max_tokens", kMaxTokens}, {"temperature", 0}};
  auto res = http_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], ref["text"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], ref["finish_reason"]);
  EXPECT_EQ(j["usage"]["completion_tokens"], ref["token_ids"].size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], ref["prompt_token_ids"].size());

  // SSE: the deltas add up to the same text, then [DONE].
  body["stream"] = true;
  auto sse = http_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(sse);
  ASSERT_EQ(sse->status, 200);
  EXPECT_NE(sse->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::string text, finish;
  int chunks = 0;
  std::istringstream lines(sse->body);
  std::string line, last_data;
  while (std::getline(lines, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    last_data = line.substr(6);
    if (last_data == "[DONE]") break;
    json c = json::parse(last_data);
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    ++chunks;
  }
  EXPECT_EQ(last_data, "[DONE]");
  // One chunk per worker stream message: on a loaded machine every token can come in one (the
  // worker sends what the engine produced since its last write), so only "at least one" holds.
  EXPECT_GE(chunks, 1);
  EXPECT_EQ(text, ref["text"]);
  EXPECT_EQ(finish, ref["finish_reason"]);

  // Chat streaming: a role chunk first, content deltas, a finish reason.
  json chat = {{"messages", {{{"role", "user"}, {"content", "Tell a story"}}}}, {"max_tokens", 8}, {"temperature", 0}, {"stream", true}};
  auto cs = http_->Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(cs);
  ASSERT_EQ(cs->status, 200);
  const size_t first = cs->body.find("data: ");
  json c0 = json::parse(cs->body.substr(first + 6, cs->body.find('\n', first) - first - 6));
  EXPECT_EQ(c0["object"], "chat.completion.chunk");
  EXPECT_EQ(c0["choices"][0]["delta"]["role"], "assistant");
  EXPECT_NE(cs->body.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(cs->body.find("data: [DONE]"), std::string::npos);

  // Chat, not streamed: stories260K (llama2.c, no chat template) gets the plain format, so the
  // answer is the completion of that prompt.
  chat["stream"] = false;
  auto cj = http_->Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(cj);
  ASSERT_EQ(cj->status, 200) << cj->body;
  json chat_reply = json::parse(cj->body);
  EXPECT_EQ(chat_reply["object"], "chat.completion");
  EXPECT_EQ(chat_reply["choices"][0]["message"]["role"], "assistant");
  json plain = {{"prompt", "user: Tell a story\nassistant:"}, {"max_tokens", 8}, {"temperature", 0}};
  auto pj = http_->Post("/v1/completions", plain.dump(), "application/json");
  ASSERT_TRUE(pj);
  ASSERT_EQ(pj->status, 200) << pj->body;
  EXPECT_EQ(chat_reply["choices"][0]["message"]["content"], json::parse(pj->body)["choices"][0]["text"]);
  EXPECT_EQ(chat_reply["usage"]["completion_tokens"], 8);

  auto models = http_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "stories260K");
  auto health = http_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_TRUE(tools::grpc_health_serving(cluster_->grpc(), 10s).ok());
}

TEST_F(RouterAggregated, BadInputGetsClearStatuses) {
  struct HttpCase {
    const char* path;
    std::string body;
    int status;
    const char* mentions;
  } http_cases[] = {
      {"/v1/completions", "{\"prompt\": ", 400, "JSON"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":"many"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"x","top_p":7})", 400, "top_p"},
      {"/v1/completions", R"({"prompt":"x","model":"gpt-9"})", 404, "gpt-9"},
      {"/v1/chat/completions", R"({"messages":"hi"})", 400, "messages"},
      {"/v1/completions", R"({"prompt":"x","max_tokens":0})", 400, "max_tokens"},
  };
  for (const HttpCase& c : http_cases) {
    auto res = http_->Post(c.path, c.body, "application/json");
    ASSERT_TRUE(res) << c.body;
    EXPECT_EQ(res->status, c.status) << c.body << " -> " << res->body;
    json j = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << res->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.mentions), std::string::npos) << res->body;
  }

  auto s = stub(cluster_->grpc());
  v1::GenerateRequest none;
  none.mutable_sampling()->set_max_tokens(4);
  EXPECT_EQ(grpc_generate(*s, none).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest too_long = greedy_request("", 4);
  for (int i = 0; i < 600; ++i) too_long.mutable_token_ids()->add_ids(5);
  GrpcResult tl = grpc_generate(*s, too_long);
  EXPECT_EQ(tl.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(tl.status.error_message().find("context"), std::string::npos) << tl.status.error_message();
  v1::GenerateRequest hot = greedy_request("x", 4);
  hot.mutable_sampling()->set_temperature(-2);
  EXPECT_EQ(grpc_generate(*s, hot).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest other = greedy_request("x", 4);
  other.set_model("llama-70b");
  EXPECT_EQ(grpc_generate(*s, other).status.error_code(), grpc::StatusCode::NOT_FOUND);
  v1::GenerateRequest huge = greedy_request(std::string(20 << 20, 'a'), 4);
  EXPECT_EQ(grpc_generate(*s, huge).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Still serving after all that.
  EXPECT_TRUE(grpc_generate(*s, greedy_request("x", 2)).status.ok());
}

TEST_F(RouterAggregated, OverloadIsRefusedAndMetricsShowTheTraffic) {
  auto s = stub(cluster_->grpc());
  v1::GenerateRequest long_req = greedy_request("", 500);
  long_req.mutable_sampling()->set_ignore_eos(true);
  std::vector<GrpcResult> results(8);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&] { r = grpc_generate(*s, long_req); });
  for (auto& t : threads) t.join();
  int ok = 0, refused = 0;
  for (const auto& r : results) {
    if (r.status.ok()) ++ok;
    if (r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      EXPECT_NE(r.status.error_message().find("overloaded"), std::string::npos);
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1);
  EXPECT_EQ(ok + refused, 8);

  auto m = http_->Get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  for (const char* want : {"pdserve:time_to_first_token_seconds_bucket", "pdserve:time_per_output_token_seconds_count",
                           "pdserve:e2e_request_latency_seconds_sum", "pdserve:num_requests_running 0",
                           "pdserve:num_requests_waiting 0", "pdserve:kv_cache_usage_perc{worker=\"127.0.0.1:",
                           "pdserve:kv_cache_total_blocks{worker=", "pdserve:kv_cache_free_blocks{worker=",
                           "pdserve:request_failure_total{code=\"RESOURCE_EXHAUSTED\"}", "role=\"aggregated\""})
    EXPECT_NE(m->body.find(want), std::string::npos) << want << "\n" << m->body;
  EXPECT_NE(m->body.find("pdserve:e2e_request_latency_seconds_count " + std::to_string(ok)), std::string::npos) << m->body;
}

TEST_F(RouterAggregated, BenchWritesItsResult) {
  const fs::path out = fs::temp_directory_path() / ("pdserve_bench_" + std::to_string(getpid()) + ".json");
  CommandOutput r = pdserve({"bench", "--router", cluster_->grpc(), "--num-prompts", "6", "--random-input-len", "16",
                      "--random-output-len", "8", "--max-concurrency", "2", "--ignore-eos", "--num-warmups", "1",
                      "--request-rate", "200", "--result-file", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("Serving Benchmark Result"), std::string::npos);
  std::ifstream in(out);
  json j = json::parse(in, nullptr, false);
  fs::remove(out);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_output_tokens"], 48);  // --ignore-eos: exactly the output length.
  EXPECT_EQ(j["total_input_tokens"], 96);
  EXPECT_LE(j["peak_concurrency"].get<int>(), 2);
  for (const char* key : {"mean_ttft_ms", "median_tpot_ms", "p90_e2el_ms", "output_throughput"})
    EXPECT_GT(j[key].get<double>(), 0) << key;
  // Inter-token latencies are between stream messages; on a loaded machine a request's tokens can
  // all come in one message, leaving none to measure.
  EXPECT_GE(j["p99_itl_ms"].get<double>(), 0);
  EXPECT_EQ(j["num_ranks"], 1);  // One aggregated worker at TP 1.
  EXPECT_DOUBLE_EQ(j["output_throughput_per_rank"].get<double>(), j["output_throughput"].get<double>());
  EXPECT_FALSE(j.contains("requests")) << "per-request details without --save-detailed";
}

// --abort-fraction: the client gives up that share of the requests at random times (counted as
// abandoned, not failed), so aborts land while queued, prefilling and decoding; the others
// finish equal to the in-process engine's, and every block of the worker comes back. Its own
// cluster, without RouterAggregated's admission limits: a given-up request holds its router slot
// until its abort has gone round, so the next ones could be refused as overloaded.
TEST(RouterBench, AbandonedRequestsGiveEveryBlockBack) {
  Cluster cluster({"--aggregated", "1"});
  ASSERT_TRUE(cluster.wait_ready(60s)) << cluster.log();
  const fs::path out = fs::temp_directory_path() / ("pdserve_bench_abort_" + std::to_string(getpid()) + ".json");
  CommandOutput r = pdserve({"bench", "--router", cluster.grpc(), "--num-prompts", "20", "--random-input-len", "32",
                             "--random-output-len", "300", "--max-concurrency", "2", "--ignore-eos", "--seed", "5",
                             "--abort-fraction", "0.5", "--abort-within-ms", "40", "--verify-model",
                             testing::stories_bin(), "--save-detailed", "--result-file", out.string()});
  std::ifstream in(out);
  json j = json::parse(in, nullptr, false);
  fs::remove(out);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  std::string errors;
  for (const json& q : j["requests"])
    if (!q["ok"].get<bool>()) errors += q["error"].get<std::string>() + "\n";
  ASSERT_EQ(r.exit_code, 0) << r.out << errors;
  EXPECT_EQ(j["failed"], 0) << errors;
  EXPECT_GT(j["abandoned"].get<int>(), 0);
  EXPECT_GT(j["completed"].get<int>(), 0);
  EXPECT_EQ(j["completed"].get<int>() + j["abandoned"].get<int>(), 20);
  EXPECT_EQ(j["mismatched"], 0);
  EXPECT_DOUBLE_EQ(j["abort_fraction"].get<double>(), 0.5);
  double used = -1;
  for (auto deadline = std::chrono::steady_clock::now() + 10s; used != 0 && std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(100ms)) {
    if (const auto text = testing::router_metrics_text(cluster.http_port()))
      used = testing::metric_sum(*text, "pdserve:kv_cache_total_blocks") -
             testing::metric_sum(*text, "pdserve:kv_cache_free_blocks");
  }
  EXPECT_EQ(used, 0) << "blocks not back after the aborts";
  r = pdserve({"bench", "--router", cluster.grpc(), "--abort-fraction", "1.5"});
  EXPECT_EQ(r.exit_code, 2) << "a fraction over 1 is refused\n" << r.out;
}

// The session and trace workloads on one worker, one session (or request) at a time: the
// servers' prefix-cache hits equal the single-cache oracle's exactly (shared system prompts,
// each turn resending the last output), later turns hit, and every turn's output equals the
// in-process engine's. Bad workload flags are refused before anything is sent.
TEST_F(RouterAggregated, BenchSessionAndTraceWorkloadsHitWhatTheOracleSays) {
  const fs::path out = fs::temp_directory_path() / ("pdserve_bench_mt_" + std::to_string(getpid()) + ".json");
  // Agentic siblings run at once: the second may not hit what the first is still computing,
  // which the oracle counts, so only multiturn's hits must equal the oracle's.
  for (const auto& [workload, fanout] : {std::pair<std::string, int>{"multiturn", 1}, {"agentic", 2}}) {
    CommandOutput r = pdserve({"bench", "--router", cluster_->grpc(), "--workload", workload, "--sessions", "3",
                               "--turns", "3", "--shared-prefixes", "2", "--prefix-len", "40", "--turn-len", "10",
                               "--turn-output-len", "6", "--fanout", std::to_string(fanout), "--max-concurrency", "1",
                               // Its own prompts: the oracle starts empty each run, the worker's cache does not.
                               "--seed", std::to_string(10 + fanout), "--ignore-eos",
                               "--verify-model", testing::stories_bin(), "--result-file", out.string()});
    ASSERT_EQ(r.exit_code, 0) << workload << "\n" << r.out;
    EXPECT_NE(r.out.find("Prefix reuse"), std::string::npos) << r.out;
    std::ifstream in(out);
    json j = json::parse(in, nullptr, false);
    ASSERT_FALSE(j.is_discarded());
    EXPECT_EQ(j["completed"], 9 * fanout) << workload;
    EXPECT_EQ(j["mismatched"], 0) << workload;
    EXPECT_EQ(j["workload"], workload);
    const json& p = j["prefix_reuse"];
    EXPECT_GT(p["oracle_hit_rate"].get<double>(), 0.5) << p.dump();
    if (fanout == 1) EXPECT_DOUBLE_EQ(p["hit_rate"].get<double>(), p["oracle_hit_rate"].get<double>()) << p.dump();
    else EXPECT_LE(p["hit_rate"].get<double>(), p["oracle_hit_rate"].get<double>()) << p.dump();
    EXPECT_EQ(p["turn2plus"]["requests"], 6 * fanout);
    EXPECT_GT(p["turn2plus"]["hit_rate"].get<double>(), 0.5) << p.dump();
    EXPECT_GT(p["turn1"]["hit_rate"].get<double>(), 0) << "session 2 shares session 0's system prompt";
  }
  {
    // Every session open at once, one request in flight: the sessions' turns interleave (the
    // cache holds all their histories) and the cap holds.
    CommandOutput r = pdserve({"bench", "--router", cluster_->grpc(), "--workload", "multiturn", "--sessions", "4",
                               "--turns", "3", "--prefix-len", "40", "--turn-len", "10", "--turn-output-len", "6",
                               "--max-inflight", "1", "--seed", "30", "--ignore-eos", "--result-file", out.string()});
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::ifstream in(out);
    json j = json::parse(in, nullptr, false);
    ASSERT_FALSE(j.is_discarded());
    EXPECT_EQ(j["completed"], 12);
    EXPECT_EQ(j["max_inflight"], 1);
    EXPECT_EQ(j["peak_concurrency"], 1);
    EXPECT_DOUBLE_EQ(j["prefix_reuse"]["hit_rate"].get<double>(), j["prefix_reuse"]["oracle_hit_rate"].get<double>());
  }
  const fs::path trace = fs::temp_directory_path() / ("pdserve_trace_" + std::to_string(getpid()) + ".jsonl");
  {
    std::ofstream t(trace);
    t << "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 4, \"hash_ids\": [1, 2, 3]}\n"
      << "{\"timestamp\": 50, \"input_length\": 45, \"output_length\": 4, \"hash_ids\": [1, 2, 4]}\n"
      << "{\"timestamp\": 100, \"input_length\": 30, \"output_length\": 4, \"hash_ids\": [5, 6]}\n";
  }
  CommandOutput r = pdserve({"bench", "--router", cluster_->grpc(), "--workload", "trace", "--trace", trace.string(),
                             "--trace-block-tokens", "16", "--max-concurrency", "1", "--ignore-eos", "--result-file",
                             out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(out);
  json j = json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["total_cached_tokens"], 32) << "the second request reuses hash ids 1 and 2";
  EXPECT_DOUBLE_EQ(j["prefix_reuse"]["hit_rate"].get<double>(), j["prefix_reuse"]["oracle_hit_rate"].get<double>());
  EXPECT_FALSE(j["prefix_reuse"].contains("turn1"));
  fs::remove(out);
  fs::remove(trace);

  EXPECT_EQ(pdserve({"bench", "--router", cluster_->grpc(), "--workload", "chat"}).exit_code, 2);
  EXPECT_EQ(pdserve({"bench", "--router", cluster_->grpc(), "--workload", "trace"}).exit_code, 2);
  EXPECT_EQ(pdserve({"bench", "--router", cluster_->grpc(), "--workload", "multiturn", "--fanout", "0"}).exit_code, 2);
}

// --worker bypasses the router (to measure what it adds): the same requests, straight to the
// aggregated worker's Worker.Generate; a router address there is refused as not a worker.
TEST_F(RouterAggregated, BenchCanTalkToTheWorkerDirectly) {
  const std::string log = cluster_->log();
  const size_t at = log.find("up: grpc=");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string worker = log.substr(at + 9, log.find(' ', at + 9) - (at + 9));
  CommandOutput r = pdserve({"bench", "--worker", worker, "--num-prompts", "4", "--random-input-len", "16",
                      "--random-output-len", "8", "--max-concurrency", "1", "--ignore-eos"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("Successful requests:                    4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Total generated tokens:                 32"), std::string::npos) << r.out;
  CommandOutput both = pdserve({"bench", "--worker", worker, "--router", cluster_->grpc()});
  EXPECT_EQ(both.exit_code, 2) << both.out;
  CommandOutput not_worker = pdserve({"bench", "--worker", cluster_->grpc(), "--num-prompts", "1"});
  EXPECT_EQ(not_worker.exit_code, 1) << not_worker.out;
}

// `up` restarts a worker that dies on its old address; the router finds it again and serves.
TEST_F(RouterAggregated, UpRestartsADeadWorkerOnItsAddress) {
  const std::vector<pid_t> children = cluster_->children();
  ASSERT_EQ(children.size(), 2u);  // The worker and the router.
  ::kill(children.front(), SIGKILL);
  for (int i = 0; i < 1000 && cluster_->log().find("restarting it") == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_NE(cluster_->log().find("aggregated0 killed by signal 9; restarting it on 127.0.0.1:"), std::string::npos)
      << cluster_->log();
  expect_greedy_equal(*cluster_);  // The router waits for the worker to be back up.
  EXPECT_FALSE(cluster_->exited());
}

// The router too, on both of its ports: gRPC and HTTP clients find it again where it was.
TEST_F(RouterAggregated, UpRestartsADeadRouterOnItsPorts) {
  const std::vector<pid_t> children = cluster_->children();
  ASSERT_EQ(children.size(), 2u);  // The worker and the router.
  ::kill(children.back(), SIGKILL);
  for (int i = 0; i < 1000 && cluster_->log().find("router killed by signal 9; restarting it") == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_NE(cluster_->log().find("router killed by signal 9; restarting it"), std::string::npos) << cluster_->log();
  httplib::Client http("127.0.0.1", cluster_->http_port());
  bool healthy = false;
  for (int i = 0; i < 300 && !healthy; ++i) {
    auto r = http.Get("/health");
    healthy = r && r->status == 200;
    if (!healthy) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(healthy) << cluster_->log();
  expect_greedy_equal(*cluster_);
  EXPECT_FALSE(cluster_->exited());
}

TEST(RouterUp, RestartNeverStopsEverythingWhenOneProcessDies) {
  Cluster c({"--aggregated", "1", "--restart", "never"});
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  const std::vector<pid_t> children = c.children();
  ASSERT_EQ(children.size(), 2u);
  ::kill(children.front(), SIGKILL);
  EXPECT_EQ(c.wait_exit(20s), 1) << c.log();
  for (pid_t p : children) EXPECT_NE(::kill(p, 0), 0) << "child " << p << " survived";
}

// With --api-key, HTTP needs Authorization: Bearer KEY (401 with an OpenAI error body without or
// with another key) and gRPC the authorization metadata (UNAUTHENTICATED); /health and /metrics
// stay open; the CLI sends its --api-key.
TEST(RouterAuth, RequestsWithoutTheApiKeyAreRefusedAndWithItServed) {
  Cluster c({"--aggregated", "1", "--api-key", "k-one", "--api-key", "k-two"});
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  httplib::Client http("127.0.0.1", c.http_port());
  http.set_read_timeout(60, 0);
  const std::string body = json{{"prompt", kPrompt}, {"max_tokens", 4}}.dump();
  auto none = http.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key") << none->body;
  auto wrong = http.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer k-three"}}, body, "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto models = http.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto ok = http.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer k-two"}}, body, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(http.Get("/health")->status, 200);
  EXPECT_EQ(http.Get("/metrics")->status, 200);

  auto s = stub(c.grpc());
  GrpcResult refused = grpc_generate(*s, greedy_request(kPrompt, 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.status.error_message();
  CommandOutput without = pdserve({"generate", "--router", c.grpc(), "--prompt", kPrompt, "--max-tokens", "4"});
  EXPECT_NE(without.exit_code, 0);
  CommandOutput with = pdserve({"generate", "--router", c.grpc(), "--prompt", kPrompt, "--max-tokens", std::to_string(kMaxTokens),
                                "--json", "--api-key", "k-one"});
  ASSERT_EQ(with.exit_code, 0) << with.out;
  EXPECT_EQ(output_of(json::parse(with.out, nullptr, false)), reference());
  CommandOutput check = pdserve({"check", "--router", c.grpc(), "--http", "127.0.0.1:" + std::to_string(c.http_port()),
                                 "--api-key", "k-one"});
  EXPECT_EQ(check.exit_code, 0) << check.out;
}

// HTTP clients get as many connections as the router admits: 48 SSE streams run at once with
// --max-running 48 (cpp-httplib's default pool ran 8 and queued the rest invisibly), and one
// more, beyond an empty waiting queue, is refused with 429 at once. Response ids are unique.
TEST(RouterHttp, FortyEightStreamsRunAtOnceAndOneMoreIs429) {
  constexpr int kStreams = 48;
  Cluster c({"--aggregated", "1", "--max-running", std::to_string(kStreams), "--max-waiting", "0"});
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  std::atomic<int> peak{0}, started{0};
  std::atomic<bool> done{false};
  std::thread sampler([&] {  // The router's own count of requests out at the workers.
    httplib::Client http("127.0.0.1", c.http_port());
    while (!done) {
      if (auto m = http.Get("/metrics"); m && m->status == 200) {
        const std::string key = "\npdserve:num_requests_running ";
        if (size_t at = m->body.find(key); at != std::string::npos)
          peak = std::max(peak.load(), std::atoi(m->body.c_str() + at + key.size()));
      }
      std::this_thread::sleep_for(5ms);
    }
  });
  std::vector<std::thread> clients;
  std::vector<int> status(kStreams, -1);
  std::vector<std::string> bodies(kStreams);
  const json body = {{"prompt", kPrompt}, {"max_tokens", 400}, {"ignore_eos", true}, {"temperature", 0}, {"stream", true}};
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client http("127.0.0.1", c.http_port());
      http.set_read_timeout(120, 0);
      ++started;
      auto r = http.Post("/v1/completions", body.dump(), "application/json");
      if (r) {
        status[i] = r->status;
        bodies[i] = r->body;
      } else {
        bodies[i] = "client error: " + httplib::to_string(r.error());
      }
    });
  }
  // Once all are out at the worker, one more finds no room and no queue.
  for (int i = 0; i < 2000 && peak < kStreams; ++i) std::this_thread::sleep_for(5ms);
  httplib::Client extra("127.0.0.1", c.http_port());
  auto refused = extra.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 4}}.dump(), "application/json");
  for (std::thread& t : clients) t.join();
  done = true;
  sampler.join();
  EXPECT_EQ(peak.load(), kStreams) << "HTTP streams were not all running at once";
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429) << refused->body;
  EXPECT_NE(refused->body.find("overloaded"), std::string::npos) << refused->body;
  std::set<std::string> ids;
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(status[i], 200) << bodies[i];
    EXPECT_NE(bodies[i].find("data: [DONE]"), std::string::npos);
    const size_t at = bodies[i].find("\"id\":\"");
    ASSERT_NE(at, std::string::npos) << bodies[i];
    ids.insert(bodies[i].substr(at, bodies[i].find('"', at + 6) - at));
  }
  EXPECT_EQ(ids.size(), size_t(kStreams)) << "response ids repeat";
}

TEST(RouterUp, CtrlCStopsCleanly) {
  Cluster c({"--aggregated", "1"});
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  const std::vector<pid_t> children = c.children();
  EXPECT_EQ(c.stop(20s), 0) << c.log();
  for (pid_t p : children) EXPECT_NE(::kill(p, 0), 0) << "child " << p << " survived";
}

// Processes started one by one (so one can die without `up` stopping the rest): a request sent
// to a prefill worker killed with SIGKILL is placed again on the other one, and the dead one is
// marked down. Polls are made rare so that the router learns of the death from the request.
class RouterFault : public ::testing::TestWithParam<std::string> {};

TEST_P(RouterFault, AKilledPrefillWorkerIsReplacedByTheOther) {
  const std::string dir = PDSERVE_BINARY_DIR;
  auto worker = [&](const std::string& bin, const std::string& role) {
    return std::make_unique<Process>(
        std::vector<std::string>{dir + bin, "--role", role, "--model", testing::stories_bin(), "--port", "0"});
  };
  auto p0 = worker("/prefill_worker/pdserve-prefill", "prefill");
  auto p1 = worker("/prefill_worker/pdserve-prefill", "prefill");
  auto d = worker("/decode_worker/pdserve-decode", "decode");
  for (Process* w : {p0.get(), p1.get(), d.get()}) ASSERT_TRUE(w->wait_ready(60s)) << w->log();
  Process router({dir + "/router/pdserve-router", "--model", testing::stories_bin(), "--port", "0", "--http-port", "0",
                  "--kv-mode", GetParam(), "--prefill", p0->grpc(), "--prefill", p1->grpc(), "--decode", d->grpc(),
                  "--poll-interval-ms", "600000", "--local-prefill-tokens", "0"});
  ASSERT_TRUE(router.wait_ready(30s)) << router.log();
  auto s = stub(router.grpc());
  // One request each (placement balances by queued prompt tokens): the next one goes to p0.
  GrpcResult first = grpc_generate(*s, greedy_request(kPrompt, 4));
  ASSERT_TRUE(first.status.ok()) << router.log();
  EXPECT_EQ(first.responses.back().prefill_worker(), p0->grpc());
  ASSERT_TRUE(grpc_generate(*s, greedy_request(kPrompt, 4)).status.ok()) << router.log();

  ::kill(p0->pid(), SIGKILL);
  EXPECT_EQ(p0->wait_exit(10s), 128 + SIGKILL);
  for (int i = 0; i < 3; ++i) {
    GrpcResult g = grpc_generate(*s, greedy_request(kPrompt, kMaxTokens));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << router.log();
    EXPECT_EQ(g.responses.back().prefill_worker(), p1->grpc());
    std::vector<int> tokens;
    for (const auto& resp : g.responses) tokens.insert(tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    EXPECT_EQ(json(tokens), reference()["token_ids"]);
  }
  EXPECT_NE(router.log().find("migrating it (0 tokens streamed so far"), std::string::npos) << router.log();
}

INSTANTIATE_TEST_SUITE_P(KvModes, RouterFault, ::testing::Values("push", "pull"));

// P/D: prefill and decode workers with the KV moved by push or pull.
class RouterPd : public ::testing::TestWithParam<std::string> {};

TEST_P(RouterPd, GreedyEqualsInProcess) {
  Cluster c({"--prefill", "1", "--decode", "1", "--kv-mode", GetParam()});
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  expect_greedy_equal(c);
  httplib::Client http("127.0.0.1", c.http_port());
  http.set_read_timeout(60, 0);
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("pdserve:kv_transfer_bytes_total{prefill=\"127.0.0.1:"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("pdserve:kv_transfer_seconds_count{prefill="), std::string::npos);

  // `bench --save-detailed` lists every request with the pair of workers that served it.
  const fs::path out = fs::temp_directory_path() / ("pdserve_bench_pd_" + std::to_string(getpid()) + ".json");
  CommandOutput bench = pdserve({"bench", "--router", c.grpc(), "--num-prompts", "5", "--random-input-len", "16",
                                 "--random-output-len", "4", "--ignore-eos", "--save-detailed", "--result-file",
                                 out.string()});
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  std::ifstream in(out);
  const json j = json::parse(in, nullptr, false);
  fs::remove(out);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(j["requests"].size(), 5u);
  int moved = 0;
  for (const json& r : j["requests"]) {
    EXPECT_EQ(r["ok"], true) << r;
    EXPECT_EQ(r["output_tokens"], 4) << r;
    EXPECT_NE(r["prefill_worker"], "") << r;
    EXPECT_NE(r["decode_worker"], "") << r;
    EXPECT_NE(r["prefill_worker"], r["decode_worker"]) << r;
    EXPECT_GT(r["tpot_s"].get<double>(), 0) << r;
    EXPECT_NE(r["request_id"], "") << r;
    // Every prompt block the decode worker lacked moved (blocks of 16 tokens), none prefilled there.
    const int prompt_blocks = (r["prompt_tokens"].get<int>() + 15) / 16;
    EXPECT_EQ(r["transferred_blocks"], prompt_blocks - r["decode_cached_tokens"].get<int>() / 16) << r;
    EXPECT_EQ(r["decode_local_prefill"], false) << r;
    moved += r["transferred_blocks"].get<int>();
  }
  EXPECT_GT(moved, 0);
  EXPECT_EQ(j["total_transferred_blocks"], moved);
  EXPECT_EQ(j["decode_local_prefills"], 0);

  // `pdserve check` (the Helm chart's test pod) passes on it, and fails on a port with no router.
  CommandOutput check = pdserve({"check", "--router", c.grpc(), "--http", "127.0.0.1:" + std::to_string(c.http_port())});
  EXPECT_EQ(check.exit_code, 0) << check.out;
  EXPECT_NE(check.out.find("ok    HTTP 1-token completion"), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("all checks passed"), std::string::npos) << check.out;
  CommandOutput nothing = pdserve({"check", "--router", "127.0.0.1:1"});
  EXPECT_EQ(nothing.exit_code, 1) << nothing.out;
  EXPECT_NE(nothing.out.find("FAIL  gRPC health"), std::string::npos) << nothing.out;
}

// With a cluster key (`pdserve kv-keygen`, `up --kv-key-file`) the workers' KV control channel is
// CURVE-encrypted, and P/D output is still the in-process engine's.
TEST_P(RouterPd, WithAKvKeyFileTheClusterServesTheSameTokens) {
  const std::string dir = ::testing::TempDir() + "/kv-key-" + GetParam() + "-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string key_file = dir + "/kv.key";
  std::filesystem::remove(key_file);
  CommandOutput made = pdserve({"kv-keygen", "--out", key_file});
  ASSERT_EQ(made.exit_code, 0) << made.out;
  EXPECT_EQ(std::filesystem::status(key_file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_NE(pdserve({"kv-keygen", "--out", key_file}).exit_code, 0) << "an existing key file was overwritten";
  // Two threads a rank (`up --cpu-threads`, forwarded to every CPU worker): the same tokens.
  Cluster c(
      {"--prefill", "1", "--decode", "1", "--kv-mode", GetParam(), "--kv-key-file", key_file, "--cpu-threads", "2"});
  ASSERT_TRUE(c.wait_ready(60s)) << c.log();
  expect_greedy_equal(c);
  const std::string log = c.log();
  EXPECT_NE(log.find("role=prefill tp=1 model=stories260K kv-control=curve"), std::string::npos) << log;
  EXPECT_NE(log.find("role=decode tp=1 model=stories260K kv-control=curve"), std::string::npos) << log;
  size_t workers_on_two_threads = 0;
  for (size_t at = log.find(" cpu-threads=2"); at != std::string::npos; at = log.find(" cpu-threads=2", at + 1))
    ++workers_on_two_threads;
  EXPECT_EQ(workers_on_two_threads, 2u) << log;
  std::filesystem::remove_all(dir);
}

// Two prefill workers at TP 2 feeding one decode worker at TP 4: fan-out on the producers,
// two producers for one consumer.
TEST_P(RouterPd, TwoPrefillWorkersFeedOneDecodeWorkerAcrossTp) {
  Cluster c({"--prefill", "2", "--prefill-tp", "2", "--decode", "1", "--decode-tp", "4", "--kv-mode", GetParam()});
  ASSERT_TRUE(c.wait_ready(90s)) << c.log();
  expect_greedy_equal(c);
  expect_greedy_equal(c);
}

// The mixed-geometry preset (separate and interleaved K/V, both in-block orders, KV heads 1-8,
// head dims 4-16, a sliding window, a replicated key-only index cache that picks the attended
// blocks) through P/D at prefill TP 4 → decode TP 2: greedy tokens equal in-process.
TEST_P(RouterPd, MixedGeometryModelEqualsInProcess) {
  const fs::path dir = fs::temp_directory_path() / ("pdserve_router_mixed_" + std::to_string(getpid()));
  ASSERT_EQ(pdserve({"make-model", "--preset", "mixed-geometry", "--seed", "5", "--out", dir.string()}).exit_code, 0);
  const std::string prompt = "The quick brown fox jumps over the lazy dog, again and again, all day long.";
  const std::vector<std::string> gen = {"--prompt", prompt, "--max-tokens", "40", "--ignore-eos", "--json"};
  std::vector<std::string> local = {"generate", "--model", dir.string()};
  local.insert(local.end(), gen.begin(), gen.end());
  CommandOutput ref = pdserve(local);
  ASSERT_EQ(ref.exit_code, 0);
  Process c({kBin, "up", "--model", dir.string(), "--port", std::to_string(free_port_pair()), "--prefill", "1",
             "--prefill-tp", "4", "--decode", "1", "--decode-tp", "2", "--kv-mode", GetParam(),
             "--local-prefill-tokens", "0"});
  ASSERT_TRUE(c.wait_ready(90s)) << c.log();
  std::vector<std::string> remote = {"generate", "--router", c.grpc()};
  remote.insert(remote.end(), gen.begin(), gen.end());
  CommandOutput got = pdserve(remote);
  ASSERT_EQ(got.exit_code, 0);
  const json want = json::parse(ref.out, nullptr, false), have = json::parse(got.out, nullptr, false);
  ASSERT_FALSE(want.is_discarded() || have.is_discarded()) << ref.out << got.out;
  EXPECT_EQ(have["token_ids"], want["token_ids"]);
  EXPECT_EQ(want["token_ids"].size(), 40u);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(KvModes, RouterPd, ::testing::Values("push", "pull"));

// P/D with prefix reuse on the decode side, in push and pull at TP pairs (1,1), (1,2), (2,1): a
// prompt of over 100 tokens sent twice, then a follow-up turn (prompt + output + new text). Each
// send gives the in-process engine's tokens (one request in a fresh process: nothing cached);
// the second finds every full prompt block in the decode worker's cache, and the follow-up a
// hit too; every send moves exactly ceil(prompt / B) − hit blocks — as reported, and as the
// decode worker's own kvtransfer byte counter shows (bytes per block are the first send's).
class RouterPdReuse : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(RouterPdReuse, RepeatedPromptsMoveOnlyTheBlocksTheDecodeWorkerLacks) {
  const auto& [ptp, dtp, mode] = GetParam();
  Cluster c({"--prefill", "1", "--prefill-tp", std::to_string(ptp), "--decode", "1", "--decode-tp",
             std::to_string(dtp), "--kv-mode", mode});
  ASSERT_TRUE(c.wait_ready(90s)) << c.log();
  const std::vector<std::string> gen = {"--max-tokens", "32", "--ignore-eos", "--json"};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.end(), gen.begin(), gen.end());
    CommandOutput r = pdserve(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << c.log();
    return json::parse(r.out, nullptr, false);
  };
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She lived in a small house near the big "
      "forest with her mom, her dad and her dog Max. Every morning Lily and Max ran to the river to "
      "look at the fish and the frogs. One day they found a shiny red ball under a tree. Lily wanted "
      "to play with it, but Max wanted it too.";
  const json first = run({"generate", "--model", testing::stories_bin(), "--prompt", story});
  ASSERT_FALSE(first.is_discarded());
  // The output, as plain words (the CLI runs through a shell; the text may hold quotes or newlines).
  std::string output = first["text"].get<std::string>();
  for (char& ch : output)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != ',') ch = ' ';
  const std::string follow_up = story + output + " Then they went home to eat.";
  const json second = run({"generate", "--model", testing::stories_bin(), "--prompt", follow_up});
  ASSERT_FALSE(second.is_discarded());
  const int block = 16;  // The workers' default --block-size.
  uint64_t bytes_per_block = 0;
  std::unique_ptr<worker::Worker::Stub> decode;
  uint64_t bytes_before = 0;
  auto decode_bytes = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    worker::WorkerInfo info;
    EXPECT_TRUE(decode->Info(&ctx, worker::InfoRequest(), &info).ok());
    return info.kv_transfer_bytes();
  };
  const std::vector<std::pair<std::string, const json*>> sends = {
      {story, &first}, {story, &first}, {follow_up, &second}};
  for (size_t i = 0; i < sends.size(); ++i) {
    const json j = run({"generate", "--router", c.grpc(), "--prompt", sends[i].first});
    ASSERT_FALSE(j.is_discarded());
    EXPECT_EQ(j["token_ids"], (*sends[i].second)["token_ids"]) << "send " << i;
    if (!decode) {
      auto ch = grpc::CreateChannel(j["decode_worker"].get<std::string>(), grpc::InsecureChannelCredentials());
      decode = worker::Worker::NewStub(ch);
      bytes_before = 0;  // Nothing moved before the first send.
    }
    const int prompt = int(j["prompt_token_ids"].size());
    ASSERT_GE(prompt, 100);
    const int cached = j["decode_cached_tokens"].get<int>(), moved = j["transferred_blocks"].get<int>();
    EXPECT_EQ(cached % block, 0);
    const int hit = cached / block;
    EXPECT_EQ(moved, (prompt + block - 1) / block - hit) << "send " << i;
    if (i == 0) {
      EXPECT_EQ(hit, 0);
    } else if (i == 1) {
      EXPECT_EQ(hit, prompt / block) << "every full prompt block hits on the decode side";
    } else {
      EXPECT_GT(hit, 0);
    }
    const uint64_t bytes = decode_bytes();
    const uint64_t delta = bytes - bytes_before;
    bytes_before = bytes;
    if (i == 0) {
      ASSERT_GT(moved, 0);
      ASSERT_EQ(delta % uint64_t(moved), 0u);
      bytes_per_block = delta / uint64_t(moved);
      EXPECT_GT(bytes_per_block, 0u);
    } else {
      EXPECT_EQ(delta, uint64_t(moved) * bytes_per_block) << "send " << i << ": the KV bytes that really moved";
    }
  }
}

using ReuseCase = std::tuple<int, int, std::string>;
INSTANTIATE_TEST_SUITE_P(TpPairs, RouterPdReuse,
                         ::testing::Values(ReuseCase{1, 1, "push"}, ReuseCase{1, 2, "push"}, ReuseCase{2, 1, "push"},
                                           ReuseCase{1, 1, "pull"}, ReuseCase{1, 2, "pull"}, ReuseCase{2, 1, "pull"}),
                         [](const auto& info) {
                           return "P" + std::to_string(std::get<0>(info.param)) + "D" +
                                  std::to_string(std::get<1>(info.param)) + "_" + std::get<2>(info.param);
                         });

// Every prefill TP × decode TP in {1,2,4,8}², push and pull, on stories260K (4 KV heads:
// replicated at TP 8) — greedy through the cluster equals in-process.
class RouterPdMatrix : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(RouterPdMatrix, GreedyEqualsInProcess) {
  const auto& [ptp, dtp, mode] = GetParam();
  Cluster c({"--prefill", "1", "--prefill-tp", std::to_string(ptp), "--decode", "1", "--decode-tp",
             std::to_string(dtp), "--kv-mode", mode});
  ASSERT_TRUE(c.wait_ready(90s)) << c.log();
  CommandOutput r = pdserve({"generate", "--router", c.grpc(), "--prompt", kPrompt, "--max-tokens",
                      std::to_string(kMaxTokens), "--json"});
  ASSERT_EQ(r.exit_code, 0) << c.log();
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["token_ids"], reference()["token_ids"]);
}

// The same matrix on the mixed-geometry preset, where a wrongly placed byte in any cache layer
// (index cache included) changes the tokens.
class RouterPdMixedMatrix : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("pdserve_router_mixed_matrix_" + std::to_string(getpid()));
    ASSERT_EQ(pdserve({"make-model", "--preset", "mixed-geometry", "--seed", "7", "--out", dir_.string()}).exit_code, 0);
    CommandOutput r = pdserve({"generate", "--model", dir_.string(), "--prompt", kMixedPrompt, "--max-tokens", "32",
                        "--ignore-eos", "--json"});
    ASSERT_EQ(r.exit_code, 0);
    reference_ = json::parse(r.out, nullptr, false);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static constexpr const char* kMixedPrompt = "Sixty-four bytes of prompt: enough blocks for the index to choose.";
  static inline fs::path dir_;
  static inline json reference_;
};

TEST_P(RouterPdMixedMatrix, GreedyEqualsInProcess) {
  const auto& [ptp, dtp, mode] = GetParam();
  ASSERT_FALSE(reference_.is_discarded());
  Process c({kBin, "up", "--model", dir_.string(), "--port", std::to_string(free_port_pair()), "--prefill", "1",
             "--prefill-tp", std::to_string(ptp), "--decode", "1", "--decode-tp", std::to_string(dtp), "--kv-mode", mode,
             "--local-prefill-tokens", "0"});
  ASSERT_TRUE(c.wait_ready(90s)) << c.log();
  CommandOutput r = pdserve({"generate", "--router", c.grpc(), "--prompt", kMixedPrompt, "--max-tokens", "32",
                      "--ignore-eos", "--json"});
  ASSERT_EQ(r.exit_code, 0) << c.log();
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["token_ids"], reference_["token_ids"]);
}

const auto kTpPairNames = [](const auto& info) {
  return "P" + std::to_string(std::get<0>(info.param)) + "D" + std::to_string(std::get<1>(info.param)) + "_" +
         std::get<2>(info.param);
};

INSTANTIATE_TEST_SUITE_P(TpPairs, RouterPdMixedMatrix,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8), ::testing::Values(1, 2, 4, 8),
                                            ::testing::Values("push", "pull")),
                         kTpPairNames);

INSTANTIATE_TEST_SUITE_P(TpPairs, RouterPdMatrix,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8), ::testing::Values(1, 2, 4, 8),
                                            ::testing::Values("push", "pull")),
                         kTpPairNames);

}  // namespace
}  // namespace pdserve
