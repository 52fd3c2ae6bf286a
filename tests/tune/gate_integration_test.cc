// The correctness gate against real clusters of stories260K worker and router processes, started
// by hand so that a prefill worker can be the mutant binary: with the rank map corrupted the gate
// fails on a diverging output every time, and the same test passes with the real binary (the
// mutation proof of docs/tune.md §6.5); a 2P×1D topology is passed only once both pairs served.
#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tests/engine/test_model.h"
#include "tests/serving/cluster_process.h"
#include "tools/router_client.h"
#include "tune/gate.h"

namespace pdserve::tune {
namespace {

using namespace std::chrono_literals;
using testing::Process;

const std::string kPrefill = "/prefill_worker/pdserve-prefill";
const std::string kMutantPrefill = "/tests/tune/pdserve-prefill-mutant";
constexpr int kMaxBatchTokens = 64;  // Small, so that the chunk-boundary prompt fits the context.

// Hand-started prefill and decode workers (push mode) and the router over them.
struct PdCluster {
  std::vector<std::unique_ptr<Process>> prefill, decode;
  std::unique_ptr<Process> router;
  std::vector<std::string> worker_addresses() const {
    std::vector<std::string> out;
    for (const auto* group : {&prefill, &decode})
      for (const auto& w : *group) out.push_back(w->grpc());
    return out;
  }
};

std::unique_ptr<Process> start_worker(const std::string& bin, const std::string& role) {
  return std::make_unique<Process>(std::vector<std::string>{
      std::string(PDSERVE_BINARY_DIR) + bin, "--role", role, "--model", testing::stories_bin(), "--port", "0",
      "--max-batch-tokens", std::to_string(kMaxBatchTokens)});
}

// n_p prefill workers of `prefill_bin` and n_d decode workers; ASSERTs that all serve.
void start_cluster(const std::string& prefill_bin, int n_p, int n_d, PdCluster* c) {
  for (int i = 0; i < n_p; ++i) c->prefill.push_back(start_worker(prefill_bin, "prefill"));
  for (int i = 0; i < n_d; ++i) c->decode.push_back(start_worker("/decode_worker/pdserve-decode", "decode"));
  std::vector<std::string> args = {std::string(PDSERVE_BINARY_DIR) + "/router/pdserve-router", "--model",
                                   testing::stories_bin(), "--port", "0", "--http-port", "0", "--kv-mode", "push",
                                   "--local-prefill-tokens", "0"};
  for (const auto* group : {&c->prefill, &c->decode}) {
    for (const auto& w : *group) {
      ASSERT_TRUE(w->wait_ready(60s)) << w->log();
      args.insert(args.end(), {group == &c->prefill ? "--prefill" : "--decode", w->grpc()});
    }
  }
  c->router = std::make_unique<Process>(args);
  ASSERT_TRUE(c->router->wait_ready(30s)) << c->router->log();
}

// The golden set for stories260K as the cluster serves it (the model from the router, the
// geometry from the workers' flags).
std::vector<GoldenPrompt> stories_golden_set(const std::string& router) {
  auto client = tools::RouterClient::connect(router, 10s);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return {};
  auto model = (*client)->model_info();
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  GoldenShape shape;
  shape.vocab_size = model->vocab_size();
  shape.bos_id = model->bos_id();
  shape.eos_ids.assign(model->eos_ids().begin(), model->eos_ids().end());
  shape.max_context = model->max_context();
  shape.block_size = 16;
  shape.max_batch_tokens = kMaxBatchTokens;
  return golden_prompts(shape);
}

GateOptions gate_options(const PdCluster& c) {
  GateOptions o;
  o.router = c.router->grpc();
  o.workers = c.worker_addresses();
  o.expected_pairs = int(c.prefill.size() * c.decode.size());
  return o;
}

struct RankMapCase {
  std::string name;
  std::string prefill_bin;
  bool corrupted;
};

// GoogleTest prints a parameter by its name (not its bytes).
void PrintTo(const RankMapCase& c, std::ostream* os) { *os << c.name; }

class GateMutationTest : public ::testing::TestWithParam<RankMapCase> {};

// Three gate runs on one cluster: with the corrupted rank map each fails on a diverging output
// (and on nothing else: no request fails, no block leaks); with the real one each passes.
TEST_P(GateMutationTest, FailsExactlyWhenTheRankMapIsCorrupted) {
  PdCluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(GetParam().prefill_bin, 1, 1, &c));
  const std::vector<GoldenPrompt> prompts = stories_golden_set(c.router->grpc());
  ASSERT_EQ(prompts.size(), 8u);
  const StatusOr<Reference> reference = compute_reference(testing::stories_bin(), prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int run = 0; run < 3; ++run) {
    const StatusOr<GateResult> r = run_gate(gate_options(c), prompts, *reference);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->failed_requests, 0) << r->reason;
    EXPECT_TRUE(r->leaked_blocks.empty()) << r->reason;
    EXPECT_EQ(r->pairs_seen, (std::set<WorkerPair>{{c.prefill[0]->grpc(), c.decode[0]->grpc()}}));
    if (GetParam().corrupted) {
      EXPECT_FALSE(r->pass) << "run " << run;
      std::cerr << "run " << run << ": " << r->reason << "\n";
      ASSERT_TRUE(r->divergence) << "run " << run << ": " << r->reason;
      EXPECT_NE(r->reason.find("diverges at output token"), std::string::npos) << r->reason;
      EXPECT_NE(r->divergence->expected, r->divergence->got);
    } else {
      EXPECT_TRUE(r->pass) << "run " << run << ": " << r->reason;
      EXPECT_FALSE(r->divergence);
      EXPECT_EQ(r->rounds, 1);
      EXPECT_EQ(r->prompts, 8);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RankMaps, GateMutationTest,
                         ::testing::Values(RankMapCase{"Real", kPrefill, false},
                                           RankMapCase{"Layer1NamesLayer0", kMutantPrefill, true}),
                         [](const auto& info) { return info.param.name; });

// 2 prefill × 1 decode: the gate passes only once requests have come back from both prefill
// workers, as the final responses name them; a worker list that misses one is refused.
TEST(GateCoverageTest, TwoPrefillOneDecodeSeesBothPairs) {
  PdCluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(kPrefill, 2, 1, &c));
  const std::vector<GoldenPrompt> prompts = stories_golden_set(c.router->grpc());
  const StatusOr<Reference> reference = compute_reference(testing::stories_bin(), prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const StatusOr<GateResult> r = run_gate(gate_options(c), prompts, *reference);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->pass) << r->reason;
  EXPECT_EQ(r->pairs_seen, (std::set<WorkerPair>{{c.prefill[0]->grpc(), c.decode[0]->grpc()},
                                                 {c.prefill[1]->grpc(), c.decode[0]->grpc()}}));

  GateOptions missing_one = gate_options(c);
  missing_one.workers.erase(missing_one.workers.begin());
  EXPECT_EQ(run_gate(missing_one, prompts, *reference).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A prefill worker the router was not given is part of the topology the gate checks, but no
// request can reach it: its pair is never exercised, and the gate fails saying so.
TEST(GateCoverageTest, APairNoRequestReachesFailsTheGate) {
  PdCluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(kPrefill, 1, 1, &c));
  const std::unique_ptr<Process> stray = start_worker(kPrefill, "prefill");
  ASSERT_TRUE(stray->wait_ready(60s)) << stray->log();
  const std::vector<GoldenPrompt> prompts = stories_golden_set(c.router->grpc());
  const StatusOr<Reference> reference = compute_reference(testing::stories_bin(), prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  GateOptions o = gate_options(c);
  o.workers.push_back(stray->grpc());
  o.expected_pairs = 2;
  o.max_rounds = 2;
  const StatusOr<GateResult> r = run_gate(o, prompts, *reference);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->pass);
  EXPECT_EQ(r->rounds, 2);
  EXPECT_EQ(r->reason, "pair (" + stray->grpc() + ", " + c.decode[0]->grpc() + ") never exercised in 2 rounds");
}

}  // namespace
}  // namespace pdserve::tune
