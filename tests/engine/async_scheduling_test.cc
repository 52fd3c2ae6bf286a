// Asynchronous scheduling (EngineOptions::async_scheduling): the engine launches step N+1 before
// it reads step N's tokens, feeding N's sampled tokens to N+1 where the backend left them. What a
// client sees must be the synchronous engine's, event for event — tokens, text, log-probabilities,
// prompt log-probabilities, finish reasons — for a mixed workload (greedy and seeded sampling,
// stop strings and tokens, min_tokens, logit bias, penalties, chunked prompts), on the CPU
// backend and on the guarded device backend, with preemption and with aborts, leaking no block.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "engine/engine.h"
#include "tests/engine/client_events.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/kv_copy.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

enum class Where { kCpu, kGuarded };
// Where an engine runs: its backend and its tensor parallelism (the guarded backend's memory is
// out of the host's reach, so the shared-memory collectives of TP > 1 run on the CPU backend).
struct Ranks {
  Where where = Where::kCpu;
  int tp = 1;
};

// `kv_blocks` blocks of stories260K's KV per rank, whatever the TP.
std::unique_ptr<Engine> make_engine(bool async, Ranks ranks = {}, int kv_blocks = 409) {
  auto model = load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.async_scheduling = async;
  o.sample_on = EngineOptions::SampleOn::kBackend;
  o.tp = ranks.tp;
  o.kv_cache_bytes = uint64_t(kv_blocks) * 16 * 1280 / uint64_t(ranks.tp);
  o.max_batch_tokens = 48;  // Long prompts take several chunks, beside decoding sequences.
  if (ranks.where == Where::kGuarded)
    o.backend_factory = [](int) -> StatusOr<std::unique_ptr<Backend>> {
      return pdserve::testing::make_guarded_backend();
    };
  auto e = Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

using pdserve::testing::Request;
using pdserve::testing::Seen;

// Twelve requests: prompts short and chunked, greedy and seeded; stops by EOS, stop strings,
// stop tokens and max_tokens at different steps; min_tokens, logit bias, logprobs, prompt
// logprobs; three with penalties (whose sampled tokens join their seen slots on the backend).
std::vector<Request> workload() {
  std::vector<Request> out;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.prompt = {1};
    const int len = i % 4 == 0 ? 1 : 10 + 13 * i;
    for (int t = 1; t < len; ++t) r.prompt.push_back(3 + (t * 31 + i * 7) % 500);
    SamplingParams& p = r.params;
    p.max_tokens = 20 + 9 * i;
    if (i % 2 == 1) {
      p.temperature = 0.8f;
      p.top_p = 0.9f;
      p.seed = 50 + i;
    }
    if (i % 3 == 0) p.stop_strings = {i % 2 ? " the" : "."};
    if (i == 5) p.stop_token_ids = {261, 262};
    if (i == 2) {
      // The end token (llama2.c's is BOS, id 1) pushed up: it comes the moment min_tokens lets it,
      // so that an off-by-one in the mask behind a token not yet read shows.
      p.min_tokens = 30;
      p.logit_bias = {{1, 100.0f}};
    }
    if (i == 7) p.logit_bias = {{300, 3.0f}};
    if (i % 4 == 1) p.logprobs = 2;
    if (i == 6) p.prompt_logprobs = 1;
    if (i == 9) p.frequency_penalty = 0.5f;
    if (i == 10) p.repetition_penalty = 1.3f;
    if (i == 4) p.presence_penalty = 0.8f;
    if (i == 11) p.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

// Runs `requests` on `e` step by step to the end, calling `at_step(e, step)` before each step.
std::map<std::string, Seen> run_all(Engine& e, const std::vector<Request>& requests,
                                    const std::function<void(Engine&, size_t)>& at_step = {}) {
  std::map<std::string, Seen> seen;
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    Seen* s = &seen[id];
    const TokenCallback record = pdserve::testing::record_into(s);
    EXPECT_TRUE(e.add_request({id, requests[i].prompt, requests[i].params}, [record](const TokenEvent& ev) {
                   EXPECT_TRUE(ev.error.ok()) << ev.error;
                   record(ev);
                 }).ok());
  }
  for (size_t step = 0; e.has_work(); ++step) {
    if (at_step) at_step(e, step);
    EXPECT_TRUE(e.step().ok());
  }
  return seen;
}

void expect_no_block_held(const Engine& e) {
  const EngineStats s = e.stats();
  EXPECT_EQ(s.free_blocks, s.num_blocks) << "blocks leaked";
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
}

class AsyncScheduling : public ::testing::TestWithParam<Ranks> {};

TEST_P(AsyncScheduling, EventsEqualTheSynchronousEngine) {
  // With penalties on three requests, and without.
  for (bool penalties : {true, false}) {
    std::vector<Request> requests = workload();
    if (!penalties)
      for (Request& r : requests) {
        r.params.frequency_penalty = 0.0f;
        r.params.presence_penalty = 0.0f;
        r.params.repetition_penalty = 1.0f;
      }
    auto sync = make_engine(false, GetParam());
    auto async = make_engine(true, GetParam());
    const auto want = run_all(*sync, requests);
    const auto got = run_all(*async, requests);
    for (const auto& [id, seen] : want) {
      EXPECT_EQ(got.at(id), seen) << id << (penalties ? " with penalties" : "");
      EXPECT_NE(seen.reason, FinishReason::kNone) << id;
    }
    // The workload stops by string, token and length, so that the stops land at many steps.
    std::map<FinishReason, int> reasons;
    for (const auto& [id, seen] : want) ++reasons[seen.reason];
    EXPECT_GT(reasons[FinishReason::kStop], 1);
    EXPECT_GT(reasons[FinishReason::kLength], 1);
    const EngineStats s = async->stats(), base = sync->stats();
    EXPECT_GT(s.overlapped_steps, 0u);
    // Every step but the first is launched behind another (and those after the engine ran dry of
    // steps to launch), penalised rows' too: the next step's penalties find their tokens in the
    // slots on the backend.
    EXPECT_GE(s.overlapped_steps + 3, s.steps) << "the steps were not launched ahead";
    EXPECT_EQ(base.overlapped_steps, 0u);
    EXPECT_EQ(base.wasted_tokens, 0u);
    // One wasted token at most per request that stopped on a token or string it sampled.
    EXPECT_LE(s.wasted_tokens, uint64_t(reasons[FinishReason::kStop]));
    EXPECT_EQ(s.decode_tokens, base.decode_tokens + s.wasted_tokens);
    expect_no_block_held(*sync);
    expect_no_block_held(*async);
  }
}

// A pool too small for the workload: a step whose growth preempts a sequence first collects the
// step out (which may feed that sequence, and free blocks), so the output is the one of a pool
// that never runs short.
TEST_P(AsyncScheduling, PreemptionChangesNoOutput) {
  std::vector<Request> requests = workload();
  for (Request& r : requests) {
    r.params.max_tokens = 200;
    r.params.ignore_eos = true;
    r.params.stop_strings.clear();
  }
  auto roomy = make_engine(false, GetParam());
  auto tight = make_engine(true, GetParam(), 40);
  const auto want = run_all(*roomy, requests);
  const auto got = run_all(*tight, requests);
  for (const auto& [id, seen] : want) EXPECT_EQ(got.at(id), seen) << id;
  EXPECT_GT(tight->stats().preemptions, 0u);
  EXPECT_EQ(roomy->stats().preemptions, 0u);
  expect_no_block_held(*tight);
}

// Aborts at every stage (waiting, mid-prompt, decoding with a step out): the others' output is
// unchanged and every block comes back.
TEST_P(AsyncScheduling, AbortsWhileStepsAreOutLeakNothing) {
  const std::vector<Request> requests = workload();
  std::vector<std::string> aborts(40);
  aborts[0] = "r3";
  aborts[2] = "r8";
  aborts[5] = "r1";
  aborts[7] = "r9";  // Penalised: its seen slot freed while a step that adds to it is out.
  aborts[9] = "r11";
  aborts[17] = "r6";
  auto sync = make_engine(false, GetParam());
  auto async = make_engine(true, GetParam());
  const auto want = run_all(*sync, requests);
  const auto got = run_all(*async, requests, [&aborts](Engine& e, size_t step) {
    if (step < aborts.size() && !aborts[step].empty()) e.abort(aborts[step]);
  });
  for (const auto& [id, seen] : got) {
    if (seen.reason == FinishReason::kAbort) continue;
    EXPECT_EQ(seen, want.at(id)) << id;
  }
  EXPECT_EQ(got.at("r3").reason, FinishReason::kAbort);
  expect_no_block_held(*async);
}

INSTANTIATE_TEST_SUITE_P(Backends, AsyncScheduling,
                         ::testing::Values(Ranks{Where::kCpu, 1}, Ranks{Where::kGuarded, 1}, Ranks{Where::kCpu, 2},
                                           Ranks{Where::kCpu, 4}),
                         [](const auto& info) {
                           return (info.param.where == Where::kCpu ? "cpu_tp" : "guarded_tp") +
                                  std::to_string(info.param.tp);
                         });

// The decode side of P/D under asynchronous scheduling: a reservation taken while a step is out
// (it waits for the steps launched before it, one of which may still write a block a stop has
// just freed), filled with a prefill engine's KV and decoded as a preloaded request beside the
// running ones, gives an undivided run's tokens and changes no other request's events. The CPU
// backend runs a step when it is launched, so the race that wait guards cannot show here; the
// bookkeeping around it can.
TEST(AsyncSchedulingHandoff, AReservationWhileAStepIsOutEqualsTheWholeRun) {
  const std::vector<Request> requests = workload();
  std::vector<int> prompt = {1};
  for (int i = 0; i < 37; ++i) prompt.push_back(3 + (i * 53) % 500);
  SamplingParams params;
  params.max_tokens = 40;
  params.ignore_eos = true;
  params.frequency_penalty = 0.7f;  // The handed-over first token counts as output.
  auto sync = make_engine(false);
  const auto want = run_all(*sync, requests);
  const auto whole = sync->generate(prompt, params);
  ASSERT_TRUE(whole.ok()) << whole.status();

  auto prefill = make_engine(false);
  const pdserve::testing::PrefillHandoff handoff = pdserve::testing::run_prefill_only(*prefill, prompt, params);
  ASSERT_GE(handoff.first_token, 0);
  const int prompt_blocks = int((prompt.size() + 15) / 16);

  auto decode = make_engine(true);
  std::vector<int> handed_off;
  bool reserved_with_a_step_out = false;
  const auto got = run_all(*decode, requests, [&](Engine& e, size_t step) {
    if (step != 4) return;
    reserved_with_a_step_out = e.stats().step_tokens_in_progress > 0;  // Live: nonzero while a step is out.
    auto reserved = e.reserve_cached_blocks({}, "", int(prompt.size()) + params.max_tokens);
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    pdserve::testing::copy_kv(*prefill, handoff.blocks, e, reserved->blocks, prompt_blocks);
    ASSERT_TRUE(prefill->release_blocks(handoff.blocks).ok());
    GenerationRequest req{"handoff", prompt, params};
    req.handoff.preloaded_blocks = reserved->blocks;
    req.handoff.first_token = handoff.first_token;
    EXPECT_TRUE(e.add_request(req, [&handed_off](const TokenEvent& ev) {
                   EXPECT_TRUE(ev.error.ok()) << ev.error;
                   if (ev.token >= 0) handed_off.push_back(ev.token);
                 }).ok());
  });
  EXPECT_TRUE(reserved_with_a_step_out);
  EXPECT_EQ(handed_off, whole->token_ids);
  for (const auto& [id, seen] : want) EXPECT_EQ(got.at(id), seen) << id;
  expect_no_block_held(*decode);
}

// A step whose launch fails (the backend reports a failed launch when it is queued, behind
// another step) fails its own sequences with that error and is withdrawn: the step launched
// before it is still collected whole, and the engine serves what comes next as a fresh one would.
TEST(AsyncSchedulingFailure, AFailedLaunchFailsItsStepAndLeavesTheRanksInStep) {
  auto model = load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok());
  EngineOptions o;
  o.async_scheduling = true;
  o.sample_on = EngineOptions::SampleOn::kBackend;
  o.kv_cache_bytes = 8 << 20;
  o.max_batch_tokens = 48;
  auto launches = std::make_shared<int>(0);
  o.backend_factory = [launches](int) -> StatusOr<std::unique_ptr<Backend>> {
    return pdserve::testing::make_guarded_backend(size_t(1) << 30, "guarded:0", true, [launches] {
      return ++*launches == 8 ? absl::InternalError("kernel launch: injected") : absl::OkStatus();
    });
  };
  auto e = Engine::create(std::move(*model), o);
  ASSERT_TRUE(e.ok()) << e.status();
  Engine& async = **e;
  std::map<std::string, std::string> failed;
  std::map<std::string, Seen> seen;
  std::vector<Request> requests = workload();
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    const TokenCallback record = pdserve::testing::record_into(&seen[id]);
    ASSERT_TRUE(async
                    .add_request({id, requests[i].prompt, requests[i].params},
                                 [record, &failed, id](const TokenEvent& ev) {
                                   if (!ev.error.ok()) failed[id] = std::string(ev.error.message());
                                   record(ev);
                                 })
                    .ok());
  }
  while (async.has_work()) (void)async.step();  // The failed step's status, and the others'.
  ASSERT_FALSE(failed.empty()) << "no step failed";
  for (const auto& [id, message] : failed) {
    EXPECT_EQ(message, "kernel launch: injected") << id;
    EXPECT_EQ(seen[id].reason, FinishReason::kAbort) << id;
  }
  EXPECT_GT(async.stats().overlapped_steps, 0u);
  expect_no_block_held(async);
  // The same requests again: what a synchronous engine gives, event for event.
  auto sync = make_engine(false);
  const auto want = run_all(*sync, requests);
  const auto got = run_all(async, requests);
  for (const auto& [id, w] : want) EXPECT_EQ(got.at(id), w) << id;
  expect_no_block_held(async);
}

// Sampling on the host (the CPU backend's default, or asked for) is refused: the next step reads
// the tokens where the backend samples them. Any TP is accepted.
TEST(AsyncSchedulingOptions, WhatItCannotHonourIsRefused) {
  for (auto sample_on : {EngineOptions::SampleOn::kAuto, EngineOptions::SampleOn::kHost}) {
    auto model = load_model({pdserve::testing::stories_bin()});
    ASSERT_TRUE(model.ok());
    EngineOptions o;
    o.async_scheduling = true;
    o.kv_cache_bytes = 8 << 20;
    o.sample_on = sample_on;
    auto e = Engine::create(std::move(*model), o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("samples on the backend"), std::string::npos) << e.status();
  }
  EXPECT_NE(make_engine(true, {Where::kCpu, 2}), nullptr);
}

}  // namespace
}  // namespace pdserve::engine
