// Disaggregated serving across processes: a prefill worker and a decode worker, driven by a
// test client that plays the router, produce exactly the in-process greedy tokens for every
// TP pair in push and pull mode, and every block returns to both free pools; cancelling a
// request, aborting a reservation or a held KV, or letting a reservation's lease run out frees
// the blocks on both sides. A prompt sent again moves only the blocks the decode worker's own
// prefix cache lacks.
#include <gtest/gtest.h>

#include "tests/serving/workers/worker_pd_fixture.h"

namespace pdserve::testing {
namespace {

using namespace std::chrono_literals;

class PdTopology : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(PdTopology, PushAndPullEqualInProcess) {
  const auto [ptp, dtp] = GetParam();
  PdPair pd(ptp, dtp);
  ASSERT_TRUE(pd.ready()) << "see " << pd.logs();
  EXPECT_EQ(info(pd.prefill()).role(), worker::ROLE_PREFILL);
  EXPECT_EQ(info(pd.decode()).role(), worker::ROLE_DECODE);
  EXPECT_EQ(info(pd.prefill()).compat_hash(), info(pd.decode()).compat_hash());

  // 40 prompt tokens: several blocks, the last one partly filled.
  const Reference ref = reference("Once upon a time, there was a little dog named Max. Max liked to run in the park", 48);
  ASSERT_GT(ref.prompt.size(), 17u);
  const std::string tag = std::to_string(ptp) + "x" + std::to_string(dtp);
  for (const std::string mode : {"push", "pull"}) {
    const PdResult r = mode == "push" ? pd.push(mode + tag, ref.prompt, 48) : pd.pull(mode + tag, ref.prompt, 48);
    ASSERT_TRUE(r.prefill.ok()) << mode << ": " << r.prefill.error_message() << " (see " << pd.logs() << ")";
    ASSERT_TRUE(r.decode.status.ok()) << mode << ": " << r.decode.status.error_message() << " (see " << pd.logs() << ")";
    EXPECT_EQ(r.prefill_response.first_token(), ref.tokens.at(0)) << mode;
    EXPECT_EQ(r.decode.tokens, ref.tokens) << mode << " P TP " << ptp << " D TP " << dtp;
    EXPECT_EQ(r.decode.text, ref.text) << mode;
    EXPECT_EQ(r.decode.finish_reason, ref.finish_reason) << mode;
  }
  EXPECT_TRUE(wait_all_free(pd.prefill(), 5s));
  EXPECT_TRUE(wait_all_free(pd.decode(), 5s));
}

INSTANTIATE_TEST_SUITE_P(TpPairs, PdTopology,
                         ::testing::Values(std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 4},
                                           std::pair{4, 2}),
                         [](const auto& info) {
                           return "P" + std::to_string(info.param.first) + "D" + std::to_string(info.param.second);
                         });

// Every prompt as a push and as a pull request at once (concurrent RPCs batch in both engines);
// each must give the in-process greedy tokens.
void expect_concurrent_push_and_pull_equal(PdPair& pd, const std::vector<std::string>& prompts, const std::string& tag) {
  std::vector<Reference> refs;
  for (const std::string& p : prompts) refs.push_back(reference(p, 32));
  std::vector<PdResult> results(2 * prompts.size());
  std::vector<std::thread> calls;
  for (size_t i = 0; i < prompts.size(); ++i) {
    calls.emplace_back([&, i] { results[2 * i] = pd.push(tag + "p" + std::to_string(i), refs[i].prompt, 32); });
    calls.emplace_back([&, i] { results[2 * i + 1] = pd.pull(tag + "l" + std::to_string(i), refs[i].prompt, 32); });
  }
  for (auto& t : calls) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].prefill.ok()) << i << ": " << results[i].prefill.error_message() << " (see " << pd.logs() << ")";
    ASSERT_TRUE(results[i].decode.status.ok()) << i << ": " << results[i].decode.status.error_message();
    EXPECT_EQ(results[i].decode.tokens, refs[i / 2].tokens) << "request " << i;
  }
}

// A worker whose KV the transport cannot reach (a GPU's arena over a UCX without device
// memory support) moves it through a pinned host mirror. --kv-memory staged forces that path on
// the CPU backend, whose copies are the calls a GPU backend queues: on the prefill side, the
// decode side or both, tokens stay equal in push and pull, the copies show in Info, and every
// block comes back.
struct StagedCase {
  int prefill_tp, decode_tp;
  bool prefill_staged, decode_staged;
};
class PdStaged : public ::testing::TestWithParam<StagedCase> {};

TEST_P(PdStaged, PushAndPullThroughHostMirrorsEqualInProcess) {
  const StagedCase c = GetParam();
  auto args = [](bool staged) { return std::vector<std::string>{"--kv-memory", staged ? "staged" : "auto"}; };
  PdPair pd(c.prefill_tp, c.decode_tp, args(c.prefill_staged), args(c.decode_staged));
  ASSERT_TRUE(pd.ready()) << "see " << pd.logs();
  EXPECT_EQ(info(pd.prefill()).kv_memory(), c.prefill_staged ? "staged" : "host");
  EXPECT_EQ(info(pd.decode()).kv_memory(), c.decode_staged ? "staged" : "host");
  EXPECT_EQ(info(pd.decode()).backend(), "cpu");

  expect_concurrent_push_and_pull_equal(
      pd, {"Once upon a time, there was a little dog named Max. Max liked to run", "Lily had a cat", "The sun was hot"},
      "s");
  const worker::WorkerInfo p = info(pd.prefill()), d = info(pd.decode());
  EXPECT_EQ(p.kv_staged_to_host_bytes() > 0, c.prefill_staged);
  EXPECT_EQ(p.kv_staged_to_device_bytes(), 0u);
  EXPECT_EQ(d.kv_staged_to_device_bytes() > 0, c.decode_staged);
  EXPECT_EQ(d.kv_staged_to_host_bytes(), 0u);
  EXPECT_TRUE(wait_all_free(pd.prefill(), 5s));
  EXPECT_TRUE(wait_all_free(pd.decode(), 5s));
}

INSTANTIATE_TEST_SUITE_P(Sides, PdStaged,
                         ::testing::Values(StagedCase{2, 1, true, false}, StagedCase{1, 2, false, true},
                                           StagedCase{2, 4, true, true}),
                         [](const auto& info) {
                           const StagedCase& c = info.param;
                           return "P" + std::to_string(c.prefill_tp) + (c.prefill_staged ? "staged" : "host") + "D" +
                                  std::to_string(c.decode_tp) + (c.decode_staged ? "staged" : "host");
                         });

TEST(PdWorkers, ConcurrentRequestsBatchAndStayEqual) {
  PdPair pd(2, 1);
  ASSERT_TRUE(pd.ready()) << "see " << pd.logs();
  expect_concurrent_push_and_pull_equal(pd, {"Lily had a cat", "The sun was hot", "Tom and Sue went to the sea"}, "c");
  EXPECT_TRUE(wait_all_free(pd.prefill(), 5s));
  EXPECT_TRUE(wait_all_free(pd.decode(), 5s));
}

// The in-process engine's greedy tokens for a prompt given as token ids.
std::vector<int> reference_tokens(const std::vector<int>& prompt, int max_tokens) {
  auto model = engine::load_model({stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  engine::EngineOptions options;
  options.kv_cache_bytes = 4 << 20;
  auto e = engine::Engine::create(std::move(*model), options);
  EXPECT_TRUE(e.ok()) << e.status();
  engine::SamplingParams params;
  params.max_tokens = max_tokens;
  auto result = (*e)->generate(prompt, params);
  EXPECT_TRUE(result.ok()) << result.status();
  return result->token_ids;
}

// P/D with prefix reuse on the decode side: a prompt sent again finds its full blocks in the
// decode worker's cache (Reserve returns them, a pull Generate finds them), only the others
// move — none at all for a prompt of whole blocks — and the tokens stay the in-process ones. A
// reservation holds its hit (those blocks are not free meanwhile) and gives back exactly its
// references on abort and on lease expiry: the pool is whole again and the hit still cached.
TEST(PdWorkers, DecodeWorkerReusesItsCacheAndReleasesExactlyItsReferences) {
  for (auto [ptp, dtp] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
    PdPair pd(ptp, dtp, {"--kv-lease-ms", "1500"}, {"--kv-lease-ms", "1500"});
    ASSERT_TRUE(pd.ready()) << "see " << pd.logs();
    const int block = info(pd.decode()).block_size();
    ASSERT_EQ(block, 16);
    const std::string tag = "P" + std::to_string(ptp) + "D" + std::to_string(dtp);
    const Reference ref = reference("Once upon a time, there was a little girl named Lily. She lived in a small house "
                                    "near the big forest with her mom, her dad and her dog Max. Every morning Lily and "
                                    "Max ran to the river to look at the fish and the frogs.",
                                    24);
    ASSERT_GE(ref.prompt.size(), 40u);
    const std::vector<int> whole_blocks(ref.prompt.begin(), ref.prompt.begin() + 32);  // Exactly 2 blocks.
    const std::vector<int> whole_ref = reference_tokens(whole_blocks, 24);
    // The second prompt is the first one's 2 leading blocks: all of it is cached on the decode
    // side from its first send on, so no block moves at all.
    const std::vector<std::pair<std::vector<int>, std::vector<int>>> cases = {{ref.prompt, ref.tokens},
                                                                               {whole_blocks, whole_ref}};
    for (size_t c = 0; c < cases.size(); ++c) {
      const auto& [prompt, tokens] = cases[c];
      const int n = int(prompt.size() + 15) / 16, full = int(prompt.size()) / 16;
      ASSERT_GE(full, 2);
      const std::string id = tag + "n" + std::to_string(prompt.size());
      for (int send = 0; send < 3; ++send) {
        const bool push = send < 2;  // A first push, a second one, then a pull.
        const PdResult r = push ? pd.push(id + "s" + std::to_string(send), prompt, 24)
                                : pd.pull(id + "s" + std::to_string(send), prompt, 24);
        ASSERT_TRUE(r.prefill.ok()) << r.prefill.error_message() << " (see " << pd.logs() << ")";
        ASSERT_TRUE(r.decode.status.ok()) << r.decode.status.error_message() << " (see " << pd.logs() << ")";
        EXPECT_EQ(r.decode.tokens, tokens) << id << " send " << send;
        const int hit = c == 0 && send == 0 ? 0 : full;
        if (push) {
          EXPECT_EQ(r.reserved.cached_prefix_blocks(), hit) << id << " send " << send;
        }
        EXPECT_EQ(r.decode.decode_cached_tokens, hit * block) << id << " send " << send;
        EXPECT_EQ(r.decode.transferred_blocks, n - hit) << id << " send " << send;
      }
      EXPECT_TRUE(wait_all_free(pd.prefill(), 5s));
      EXPECT_TRUE(wait_all_free(pd.decode(), 5s));
    }
    // Reservations that never get their KV: one aborted, one left to expire.
    for (const char* end : {"abort", "expire"}) {
      const std::string id = tag + end;
      grpc::ClientContext rctx;
      worker::ReserveResponse reserved;
      ASSERT_TRUE(pd.decode().Reserve(&rctx, pd.reserve_request(id, ref.prompt, 24), &reserved).ok());
      EXPECT_EQ(reserved.cached_prefix_blocks(), int(ref.prompt.size()) / 16);
      const worker::WorkerInfo held = info(pd.decode());
      // The hit blocks are held, not evictable: none of the reservation's blocks counts as free.
      EXPECT_EQ(held.free_blocks(), held.num_blocks() - reserved.block_ids_size()) << end;
      if (std::string(end) == "abort") {
        grpc::ClientContext actx;
        worker::WorkerAbortRequest abort;
        abort.set_request_id(id);
        worker::WorkerAbortResponse aborted;
        ASSERT_TRUE(pd.decode().Abort(&actx, abort, &aborted).ok());
        EXPECT_TRUE(aborted.found());
      }
      EXPECT_TRUE(wait_all_free(pd.decode(), 5s)) << end;
    }
    // The hit is still cached; another namespace shares none of it; a prompt whose length
    // disagrees with prompt_len is refused.
    {
      worker::ReserveRequest again = pd.reserve_request(tag + "again", ref.prompt, 24);
      again.set_cache_salt("tenant-b");
      grpc::ClientContext rctx;
      worker::ReserveResponse reserved;
      ASSERT_TRUE(pd.decode().Reserve(&rctx, again, &reserved).ok());
      EXPECT_EQ(reserved.cached_prefix_blocks(), 0);
      grpc::ClientContext actx;
      worker::WorkerAbortRequest abort;
      abort.set_request_id(tag + "again");
      worker::WorkerAbortResponse aborted;
      ASSERT_TRUE(pd.decode().Abort(&actx, abort, &aborted).ok());
      worker::ReserveRequest bad = pd.reserve_request(tag + "bad", ref.prompt, 24);
      bad.add_prompt(5);
      grpc::ClientContext bctx;
      EXPECT_EQ(pd.decode().Reserve(&bctx, bad, &reserved).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_TRUE(wait_all_free(pd.decode(), 5s));
    }
  }
}

TEST(PdWorkers, CancelAndAbortFreeBlocksOnBothSides) {
  PdPair pd(1, 2, {"--kv-lease-ms", "4000"}, {"--kv-lease-ms", "4000"});
  ASSERT_TRUE(pd.ready()) << "see " << pd.logs();
  const std::vector<int> prompt = {1, 400, 300, 200, 100, 50, 60, 70, 80, 90, 99, 98, 97, 96, 95, 94, 93, 92};

  // A decode stream cancelled by its client.
  {
    grpc::ClientContext rctx;
    worker::ReserveResponse reserved;
    ASSERT_TRUE(pd.decode().Reserve(&rctx, pd.reserve_request("c1", prompt, 400), &reserved).ok());
    worker::PrefillRequest preq;
    preq.set_request_id("c1");
    for (int t : prompt) preq.add_prompt(t);
    set_greedy(preq.mutable_sampling(), 400);
    preq.mutable_sampling()->set_ignore_eos(true);
    preq.set_kv_mode("push");
    preq.set_kv_target(reserved.kv_target());
    *preq.mutable_target_blocks() = reserved.block_ids();
    grpc::ClientContext pctx;
    worker::PrefillResponse presp;
    ASSERT_TRUE(pd.prefill().Prefill(&pctx, preq, &presp).ok());
    worker::WorkerGenerateRequest dreq;
    dreq.set_request_id("c1");
    for (int t : prompt) dreq.add_prompt(t);
    set_greedy(dreq.mutable_sampling(), 400);
    dreq.mutable_sampling()->set_ignore_eos(true);
    dreq.set_kv_mode("push");
    grpc::ClientContext dctx;
    auto reader = pd.decode().Generate(&dctx, dreq);
    worker::WorkerEvent ev;
    ASSERT_TRUE(reader->Read(&ev)) << reader->Finish().error_message();
    dctx.TryCancel();
    while (reader->Read(&ev)) {
    }
    // The tiny model may have finished all 400 tokens before the cancel reached the worker.
    const grpc::StatusCode code = reader->Finish().error_code();
    EXPECT_TRUE(code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::OK) << code;
    EXPECT_TRUE(wait_all_free(pd.decode(), 5s));
    EXPECT_TRUE(wait_all_free(pd.prefill(), 5s));
  }
  // A decode stream cancelled while it waits for KV that never comes.
  {
    grpc::ClientContext rctx;
    worker::ReserveResponse reserved;
    ASSERT_TRUE(pd.decode().Reserve(&rctx, pd.reserve_request("c0", prompt, 40), &reserved).ok());
    worker::WorkerGenerateRequest dreq;
    dreq.set_request_id("c0");
    for (int t : prompt) dreq.add_prompt(t);
    set_greedy(dreq.mutable_sampling(), 40);
    dreq.set_kv_mode("push");
    grpc::ClientContext dctx;
    dctx.set_deadline(in(300ms));
    auto reader = pd.decode().Generate(&dctx, dreq);
    worker::WorkerEvent ev;
    EXPECT_FALSE(reader->Read(&ev));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_TRUE(wait_all_free(pd.decode(), 3s));
  }
  // A reservation aborted before any KV arrived.
  {
    grpc::ClientContext rctx;
    worker::ReserveResponse reserved;
    ASSERT_TRUE(pd.decode().Reserve(&rctx, pd.reserve_request("c2", prompt, 40), &reserved).ok());
    EXPECT_LT(info(pd.decode()).free_blocks(), info(pd.decode()).num_blocks());
    grpc::ClientContext actx;
    worker::WorkerAbortRequest abort;
    abort.set_request_id("c2");
    worker::WorkerAbortResponse aborted;
    ASSERT_TRUE(pd.decode().Abort(&actx, abort, &aborted).ok());
    EXPECT_TRUE(aborted.found());
    EXPECT_TRUE(wait_all_free(pd.decode(), 5s));
  }
  // KV held for a pull that never comes, aborted on the prefill side.
  {
    worker::PrefillRequest preq;
    preq.set_request_id("c3");
    for (int t : prompt) preq.add_prompt(t);
    set_greedy(preq.mutable_sampling(), 40);
    preq.set_kv_mode("pull");
    grpc::ClientContext pctx;
    worker::PrefillResponse presp;
    ASSERT_TRUE(pd.prefill().Prefill(&pctx, preq, &presp).ok());
    EXPECT_FALSE(presp.kv_source().empty());
    EXPECT_LT(info(pd.prefill()).free_blocks(), info(pd.prefill()).num_blocks());
    grpc::ClientContext actx;
    worker::WorkerAbortRequest abort;
    abort.set_request_id("c3");
    worker::WorkerAbortResponse aborted;
    ASSERT_TRUE(pd.prefill().Abort(&actx, abort, &aborted).ok());
    EXPECT_TRUE(aborted.found());
    EXPECT_TRUE(wait_all_free(pd.prefill(), 8s));
  }
  // A reservation nobody claims expires with its lease.
  {
    grpc::ClientContext rctx;
    worker::ReserveResponse reserved;
    ASSERT_TRUE(pd.decode().Reserve(&rctx, pd.reserve_request("c4", prompt, 40), &reserved).ok());
    EXPECT_LT(info(pd.decode()).free_blocks(), info(pd.decode()).num_blocks());
    EXPECT_TRUE(wait_all_free(pd.decode(), 8s));
    worker::WorkerGenerateRequest dreq;
    dreq.set_request_id("c4");
    for (int t : prompt) dreq.add_prompt(t);
    set_greedy(dreq.mutable_sampling(), 40);
    dreq.set_kv_mode("push");
    EXPECT_EQ(generate(pd.decode(), dreq).status.error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

}  // namespace
}  // namespace pdserve::testing
