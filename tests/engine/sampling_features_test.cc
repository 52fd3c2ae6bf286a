// Issue 15's sampling features end to end on the bundled model, each against a plain
// computation on the reference implementation's logits: logit_bias (added to the logit),
// frequency and presence penalties (over the output's counts), min_tokens (stop ids masked),
// logprobs and prompt_logprobs (log_softmax of the raw logits, the prompt's over a chunked
// prefill), skip_special_tokens; sampling on the host and on a backend whose memory the host
// cannot touch (tests/engine/guarded_backend.h) giving the same tokens; and the features
// carried across a P/D split and a migration exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "engine/engine.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/kv_copy.h"
#include "tests/engine/reference_llama.h"
#include "tests/engine/test_model.h"

namespace pdserve::engine {
namespace {

using pdserve::testing::ReferenceLlama;
using pdserve::testing::stories_bin;

// Sampling on the host; on a backend whose memory the host cannot touch (TP 1 only: the
// shared-memory collectives read host memory); on the CPU backend (host memory, the backend's
// sampling path, with TP 2 its gathered logits).
enum class Where { kHost, kGuarded, kCpuBackend };
const char* name(Where w) {
  return w == Where::kHost ? "host" : w == Where::kGuarded ? "guarded backend" : "CPU backend";
}
// The backend sampling to compare with the host's at `tp`.
Where backend_for(int tp) { return tp == 1 ? Where::kGuarded : Where::kCpuBackend; }

std::unique_ptr<Engine> make_engine(Where where, int tp = 1, int max_batch_tokens = 512) {
  auto model = load_model({stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  EngineOptions o;
  o.tp = tp;
  o.kv_cache_bytes = 8 << 20;
  o.max_batch_tokens = max_batch_tokens;
  o.sample_on = where == Where::kHost ? EngineOptions::SampleOn::kHost : EngineOptions::SampleOn::kBackend;
  if (where == Where::kGuarded) {
    o.backend_factory = [](int) -> StatusOr<std::unique_ptr<Backend>> {
      return pdserve::testing::make_guarded_backend();
    };
  }
  auto e = Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

std::vector<int> encode(const Engine& e, const std::string& text) {
  auto ids = e.tokenizer().encode(text, true);
  EXPECT_TRUE(ids.ok());
  return *ids;
}

std::vector<int> story_prompt(const Engine& e) {
  return encode(e, "Lily had a red ball. She played with the ball every day and");
}

// The first maximum (-inf never wins over a finite logit).
int argmax(const std::vector<float>& logits) {
  int best = 0;
  for (int i = 1; i < int(logits.size()); ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

// Greedy on the reference: at each step the raw logits, `edit`ed (given the output so far),
// then the argmax; stops after `max_new` tokens or at a token `stops` says ends it (not output).
std::vector<int> greedy_by_hand(ReferenceLlama& ref, const std::vector<int>& prompt, int max_new,
                                const std::function<void(std::vector<float>&, const std::vector<int>&)>& edit,
                                const std::function<bool(int token, int generated)>& stops = {}) {
  std::vector<int> tokens = prompt, out;
  for (size_t pos = 0; pos + 1 < tokens.size(); ++pos) ref.forward(tokens[pos], int(pos));
  while (int(out.size()) < max_new) {
    std::vector<float> logits = ref.forward(tokens.back(), int(tokens.size()) - 1);
    edit(logits, out);
    const int best = argmax(logits);
    if (stops && stops(best, int(out.size()))) break;
    tokens.push_back(best);
    out.push_back(best);
  }
  return out;
}

// log_softmax in double of the reference's raw logits.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, double(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - max);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - max - std::log(sum);
  return out;
}

// `got` is token `token`'s entry of a row whose raw logits are `logits`: its log-probability
// and the `k` most likely ids in order (the lower id first among equals), within `tol`.
void expect_logprob(const TokenLogprob& got, int token, const std::vector<float>& logits, int k,
                    const std::string& where) {
  // The engine's and the reference's logits differ by float rounding (another summation
  // order), so the log-probabilities agree to 1e-5 relative (for those near -1 and above, absolute).
  const auto tol = [](double expected) { return 1e-5 * std::max(1.0, std::abs(expected)); };
  const std::vector<double> lp = log_softmax(logits);
  EXPECT_EQ(got.token, token) << where;
  EXPECT_NEAR(got.logprob, lp[token], tol(lp[token])) << where;
  std::vector<int> order(lp.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lp[a] > lp[b]; });
  ASSERT_EQ(int(got.top.size()), k) << where;
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(got.top[i].first, order[i]) << where << ", top " << i;
    EXPECT_NEAR(got.top[i].second, lp[order[i]], tol(lp[order[i]])) << where << ", top " << i;
  }
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(SamplingFeatures, LogitBiasForcesAndForbidsTokens) {
  ReferenceLlama ref(stories_bin());
  for (Where where : {Where::kHost, Where::kGuarded}) {
    auto engine = make_engine(where);
    const std::vector<int> prompt = story_prompt(*engine);
    const std::vector<int> plain = engine->generate(prompt, greedy(24))->token_ids;
    SamplingParams forced = greedy(24);
    forced.logit_bias = {{300, 100.0f}};
    EXPECT_EQ(engine->generate(prompt, forced)->token_ids, std::vector<int>(24, 300)) << name(where);
    // Banning the greedy first token (and a second entry the model never picks, and a
    // duplicate of the first whose last value wins) changes the output as the definition says.
    SamplingParams banned = greedy(24);
    banned.logit_bias = {{plain[0], 5.0f}, {plain[0], -100.0f}, {7, -3.0f}};
    const std::vector<int> got = engine->generate(prompt, banned)->token_ids;
    EXPECT_NE(got[0], plain[0]) << name(where);
    EXPECT_EQ(got, greedy_by_hand(ref, prompt, 24,
                                  [&](std::vector<float>& l, const std::vector<int>&) {
                                    l[plain[0]] += -100.0f;
                                    l[7] += -3.0f;
                                  }))
        << name(where);
  }
}

TEST(SamplingFeatures, LogitBiasOutsideTheVocabularyIsRefused) {
  auto engine = make_engine(Where::kHost);
  SamplingParams p = greedy(4);
  p.logit_bias = {{3, 1.0f}, {engine->config().vocab_size, 1.0f}};
  const Status s = engine->add_request({"x", {1}, p}, {});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find(std::to_string(engine->config().vocab_size)), std::string::npos) << s;
}

// vLLM's definitions: logit -= frequency * count + presence * (count > 0), over the output's
// ids only (not the prompt's), after the repetition penalty (which sees both).
TEST(SamplingFeatures, FrequencyAndPresencePenaltiesEqualTheDefinitionByHand) {
  ReferenceLlama ref(stories_bin());
  struct Case {
    float frequency, presence, repetition;
  };
  for (int tp : {1, 2})
    for (Where where : {Where::kHost, backend_for(tp)}) {
      auto engine = make_engine(where, tp);
      const std::vector<int> prompt = story_prompt(*engine);
      const std::vector<int> plain = engine->generate(prompt, greedy(60))->token_ids;
      for (const Case& c : {Case{0.7f, 0.0f, 1.0f}, Case{0.0f, 1.2f, 1.0f}, Case{1.5f, -0.5f, 1.0f},
                            Case{-0.8f, 0.0f, 1.0f}, Case{0.4f, 0.6f, 1.3f}}) {
        SamplingParams p = greedy(60);
        p.frequency_penalty = c.frequency;
        p.presence_penalty = c.presence;
        p.repetition_penalty = c.repetition;
        const std::vector<int> got = engine->generate(prompt, p)->token_ids;
        const std::vector<int> expected =
            greedy_by_hand(ref, prompt, 60, [&](std::vector<float>& l, const std::vector<int>& out) {
              std::vector<int> seen(prompt.begin(), prompt.end());
              seen.insert(seen.end(), out.begin(), out.end());
              if (c.repetition != 1.0f)
                for (int id : std::set<int>(seen.begin(), seen.end()))
                  l[id] = l[id] > 0 ? l[id] / c.repetition : l[id] * c.repetition;
              std::map<int, int> counts;
              for (int id : out) ++counts[id];
              for (const auto& [id, n] : counts)
                l[id] = float(double(l[id]) - (double(c.frequency) * n + double(c.presence)));
            });
        const std::string what = std::string(name(where)) + ", TP " + std::to_string(tp) + ", frequency " +
                                 std::to_string(c.frequency) + ", presence " + std::to_string(c.presence);
        EXPECT_EQ(got, expected) << what;
        EXPECT_NE(got, plain) << what << " changed nothing";
      }
    }
}

// A prompt whose greedy continuation ends with EOS (llama2.c's: BOS) well within the context.
struct EarlyEos {
  std::vector<int> prompt;
  std::vector<int> plain;  // Its tokens before EOS.
};
EarlyEos early_eos(Engine& engine) {
  EarlyEos e;
  e.prompt = encode(engine, "They all lived happily ever after.");
  SamplingParams p;
  p.max_tokens = 300;
  auto r = engine.generate(e.prompt, p);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  EXPECT_LT(r->token_ids.size(), 200u);
  e.plain = r->token_ids;
  return e;
}

bool is_eos(const Engine& e, int token) {
  const std::vector<int>& eos = e.config().eos_ids;
  return std::find(eos.begin(), eos.end(), token) != eos.end();
}

TEST(SamplingFeatures, MinTokensMasksEosUntilReached) {
  ReferenceLlama ref(stories_bin());
  for (Where where : {Where::kHost, Where::kGuarded}) {
    auto engine = make_engine(where);
    const EarlyEos e = early_eos(*engine);
    const int n = int(e.plain.size());
    // At n EOS may come where it did (the n+1-th token); after, it cannot until min_tokens.
    for (int min_tokens : {n, n + 1, n + 25}) {
      SamplingParams p;
      p.max_tokens = 300;
      p.min_tokens = min_tokens;
      auto r = engine->generate(e.prompt, p);
      ASSERT_TRUE(r.ok());
      ASSERT_GE(int(r->token_ids.size()), min_tokens) << name(where);
      EXPECT_TRUE(std::equal(e.plain.begin(), e.plain.end(), r->token_ids.begin())) << name(where);
      const std::vector<int> expected = greedy_by_hand(
          ref, e.prompt, 300,
          [&](std::vector<float>& l, const std::vector<int>& out) {
            if (int(out.size()) < min_tokens)
              for (int id : engine->config().eos_ids) l[id] = -std::numeric_limits<float>::infinity();
          },
          [&](int token, int) { return is_eos(*engine, token); });
      EXPECT_EQ(r->token_ids, expected) << name(where) << ", min_tokens " << min_tokens;
      for (int t : r->token_ids) EXPECT_FALSE(is_eos(*engine, t));
    }
    // stop_token_ids are masked too: the plain run's 3rd token as a stop id, min_tokens 5.
    SamplingParams p;
    p.max_tokens = 30;
    p.ignore_eos = true;
    p.stop_token_ids = {e.plain[2]};
    EXPECT_EQ(engine->generate(e.prompt, p)->token_ids.size(), 2u) << name(where);
    p.min_tokens = 5;
    const std::vector<int> got = engine->generate(e.prompt, p)->token_ids;
    ASSERT_GE(got.size(), 5u) << name(where);
    for (int i = 0; i < 5; ++i) EXPECT_NE(got[i], e.plain[2]) << name(where) << ", token " << i;
  }
}

// Each generated token's log-probability and top alternatives are log_softmax of the raw
// logits: before the bias that forces the token and the penalty, and at temperature 1.
TEST(SamplingFeatures, LogprobsAreTheRawLogSoftmax) {
  ReferenceLlama ref(stories_bin());
  for (Where where : {Where::kHost, Where::kGuarded}) {
    auto engine = make_engine(where);
    const std::vector<int> prompt = story_prompt(*engine);
    for (int k : {0, 5, kernels::kMaxLogprobs}) {
      SamplingParams p = greedy(20);
      p.logprobs = k;
      p.frequency_penalty = 0.5f;
      p.temperature = 0.7f;
      p.seed = 11;
      p.logit_bias = {{300, 8.0f}};
      auto r = engine->generate(prompt, p);
      ASSERT_TRUE(r.ok());
      ASSERT_EQ(r->logprobs.size(), r->token_ids.size());
      SamplingParams without = p;
      without.logprobs = -1;
      EXPECT_EQ(engine->generate(prompt, without)->token_ids, r->token_ids) << "logprobs changed the tokens";
      std::vector<int> tokens = prompt;
      for (size_t pos = 0; pos + 1 < tokens.size(); ++pos) ref.forward(tokens[pos], int(pos));
      for (size_t i = 0; i < r->token_ids.size(); ++i) {
        const std::vector<float> logits = ref.forward(tokens.back(), int(tokens.size()) - 1);
        expect_logprob(r->logprobs[i], r->token_ids[i], logits, k,
                       std::string(name(where)) + ", k " + std::to_string(k) + ", token " + std::to_string(i));
        tokens.push_back(r->token_ids[i]);
      }
    }
  }
}

// Every prompt token after the first gets log_softmax at the position before it, over a
// prompt that takes several chunked steps; the generated tokens are those of a run without.
TEST(SamplingFeatures, PromptLogprobsOverAChunkedPrefill) {
  ReferenceLlama ref(stories_bin());
  for (Where where : {Where::kHost, Where::kGuarded}) {
    auto engine = make_engine(where, 1, /*max_batch_tokens=*/16);
    std::vector<int> prompt = {1};
    for (int i = 0; i < 44; ++i) prompt.push_back(3 + (i * 53) % 500);
    SamplingParams p = greedy(8);
    p.prompt_logprobs = 4;
    p.logprobs = 1;
    // Another request decoding in the same steps.
    std::vector<int> other_tokens;
    ASSERT_TRUE(engine
                    ->add_request({"other", story_prompt(*engine), greedy(30)},
                                  [&](const TokenEvent& ev) {
                                    if (ev.token >= 0) other_tokens.push_back(ev.token);
                                    EXPECT_TRUE(ev.prompt_logprobs.empty());
                                  })
                    .ok());
    ASSERT_TRUE(engine->step().ok());
    int events = 0;
    GenerationResult r;
    ASSERT_TRUE(engine
                    ->add_request({"r", prompt, p},
                                  [&](const TokenEvent& ev) {
                                    if (events++ > 0) {
                                      EXPECT_TRUE(ev.prompt_logprobs.empty()) << "only the first event carries them";
                                    }
                                    if (ev.token >= 0) r.token_ids.push_back(ev.token);
                                    r.prompt_logprobs.insert(r.prompt_logprobs.end(), ev.prompt_logprobs.begin(),
                                                             ev.prompt_logprobs.end());
                                  })
                    .ok());
    ASSERT_TRUE(engine->run_until_idle().ok());
    ASSERT_EQ(r.prompt_logprobs.size(), prompt.size() - 1) << name(where);
    for (size_t i = 1; i < prompt.size(); ++i) {
      const std::vector<float> logits = ref.forward(prompt[i - 1], int(i - 1));
      expect_logprob(r.prompt_logprobs[i - 1], prompt[i], logits, 4,
                     std::string(name(where)) + ", prompt token " + std::to_string(i));
    }
    SamplingParams without = greedy(8);
    EXPECT_EQ(r.token_ids, engine->generate(prompt, without)->token_ids) << name(where);
    EXPECT_EQ(other_tokens, engine->generate(story_prompt(*engine), greedy(30))->token_ids) << name(where);
    // The same through generate, and on a prefill-only request (the P/D prefill side).
    EXPECT_EQ(engine->generate(prompt, p)->prompt_logprobs.size(), prompt.size() - 1);
    GenerationRequest req{"p", prompt, p};
    req.handoff.prefill_only = true;
    std::vector<TokenLogprob> handed;
    std::vector<int> blocks;
    ASSERT_TRUE(engine
                    ->add_request(req,
                                  [&](const TokenEvent& ev) {
                                    handed.insert(handed.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
                                    if (ev.finished) blocks = ev.blocks;
                                  })
                    .ok());
    ASSERT_TRUE(engine->run_until_idle().ok());
    ASSERT_TRUE(engine->release_blocks(blocks).ok());
    ASSERT_EQ(handed.size(), prompt.size() - 1);
    for (size_t i = 1; i < prompt.size(); ++i)
      expect_logprob(handed[i - 1], prompt[i], ref.forward(prompt[i - 1], int(i - 1)), 4,
                     std::string(name(where)) + ", prefill-only, prompt token " + std::to_string(i));
  }
}

// A prompt longer than a step's cap on prompt-log-probability rows (Engine::kMaxPromptLogprobRows)
// is prefilled in chunks of at most that many rows, even with the token budget for all of it,
// and its log-probabilities are complete and right across the chunk boundary.
TEST(SamplingFeatures, PromptLogprobRowsPerStepAreCapped) {
  ReferenceLlama ref(stories_bin());
  auto engine = make_engine(Where::kHost, 1, /*max_batch_tokens=*/512);
  std::vector<int> prompt = {1};
  for (int i = 0; i < 299; ++i) prompt.push_back(3 + (i * 37) % 500);
  SamplingParams p = greedy(2);
  p.prompt_logprobs = 1;
  auto r = engine->generate(prompt, p);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompt_logprobs.size(), prompt.size() - 1);
  std::vector<int64_t> prefill_chunks;
  for (const StepSample& s : engine->steps_after(0))
    if (s.prefill_tokens > 0) prefill_chunks.push_back(s.prefill_tokens);
  EXPECT_EQ(prefill_chunks, (std::vector<int64_t>{Engine::kMaxPromptLogprobRows, 300 - Engine::kMaxPromptLogprobRows}));
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<float> logits = ref.forward(prompt[i - 1], int(i - 1));
    expect_logprob(r->prompt_logprobs[i - 1], prompt[i], logits, 1, "prompt token " + std::to_string(i));
  }
  EXPECT_EQ(r->token_ids, engine->generate(prompt, greedy(2))->token_ids);
}

// A mixed batch, every feature on some request, seeded sampling: sampling on the host and on
// the guarded backend give the same tokens and log-probabilities, at TP 1 and 2.
TEST(SamplingFeatures, HostAndBackendSamplingAgreeOnAMixedBatch) {
  for (int tp : {1, 2}) {
    std::vector<std::vector<GenerationResult>> results;
    for (Where where : {Where::kHost, backend_for(tp)}) {
      auto engine = make_engine(where, tp, 24);
      const EarlyEos e = early_eos(*engine);
      std::vector<GenerationResult> got(5);
      for (int i = 0; i < 5; ++i) {
        SamplingParams p;
        p.max_tokens = 40;
        p.temperature = i == 0 ? 0.0f : 0.8f;
        p.top_p = 0.9f;
        p.seed = 100 + i;
        p.frequency_penalty = 0.3f * float(i % 3);
        p.presence_penalty = i == 2 ? 0.9f : 0.0f;
        p.repetition_penalty = i == 3 ? 1.2f : 1.0f;
        if (i % 2 == 1) p.logit_bias = {{e.plain[1], -100.0f}, {300, 2.0f}};
        p.min_tokens = i == 4 ? 35 : 0;
        p.logprobs = i;
        p.prompt_logprobs = i == 1 ? 3 : -1;
        std::vector<int> prompt = i % 2 ? e.prompt : story_prompt(*engine);
        ASSERT_TRUE(engine
                        ->add_request({std::to_string(i), prompt, p},
                                      [&got, i](const TokenEvent& ev) {
                                        if (ev.token >= 0) got[i].token_ids.push_back(ev.token);
                                        if (ev.logprob) got[i].logprobs.push_back(*ev.logprob);
                                        got[i].prompt_logprobs.insert(got[i].prompt_logprobs.end(),
                                                                      ev.prompt_logprobs.begin(),
                                                                      ev.prompt_logprobs.end());
                                      })
                        .ok());
      }
      ASSERT_TRUE(engine->run_until_idle().ok());
      results.push_back(std::move(got));
    }
    for (int i = 0; i < 5; ++i) {
      const GenerationResult &host = results[0][i], &backend = results[1][i];
      EXPECT_EQ(host.token_ids, backend.token_ids) << "TP " << tp << ", request " << i;
      EXPECT_FALSE(host.token_ids.empty());
      ASSERT_EQ(host.logprobs.size(), host.token_ids.size());
      ASSERT_EQ(host.logprobs.size(), backend.logprobs.size());
      for (size_t t = 0; t < host.logprobs.size(); ++t) {
        EXPECT_EQ(host.logprobs[t].logprob, backend.logprobs[t].logprob) << i << " " << t;
        EXPECT_EQ(host.logprobs[t].top, backend.logprobs[t].top) << i << " " << t;
      }
      ASSERT_EQ(host.prompt_logprobs.size(), backend.prompt_logprobs.size()) << i;
      for (size_t t = 0; t < host.prompt_logprobs.size(); ++t)
        EXPECT_EQ(host.prompt_logprobs[t].top, backend.prompt_logprobs[t].top) << i << " " << t;
    }
    EXPECT_GE(results[0][4].token_ids.size(), 35u);
    EXPECT_FALSE(results[0][1].prompt_logprobs.empty());
  }
}

// Every feature at once: the parameters of the P/D and migration tests. EOS is biased up so
// that it comes as soon as min_tokens lets it (so an off-by-one in either shows), and another
// token so that it is the first and would come back if its count were missed.
SamplingParams all_features(Engine& engine, const EarlyEos& e, float temperature) {
  SamplingParams p;
  p.max_tokens = 80;
  p.min_tokens = 40;
  p.temperature = temperature;
  p.seed = 2024;
  p.frequency_penalty = 1.5f;
  p.presence_penalty = 0.5f;
  p.repetition_penalty = 1.1f;
  p.logit_bias = {{e.plain[0], -100.0f}, {300, 8.0f}, {engine.config().eos_ids[0], 15.0f}};
  SamplingParams free = p;
  free.min_tokens = 0;
  auto free_run = engine.generate(e.prompt, free);
  EXPECT_TRUE(free_run.ok());
  EXPECT_EQ(free_run->finish_reason, FinishReason::kStop);
  EXPECT_LT(int(free_run->token_ids.size()), p.min_tokens);
  return p;
}

// The prefill side samples the first token (bias, min_tokens' mask, the prompt's repetition
// penalty); the decode side counts that handed-over token as output for the frequency and
// presence penalties and min_tokens: the tokens are the undivided run's.
TEST(SamplingFeatures, AllFeaturesContinueAcrossThePdSplit) {
  // Host engines: copy_kv reads and writes the arenas from the host.
  for (int tp : {1, 2})
    for (float temperature : {0.0f, 0.8f}) {
      auto whole_engine = make_engine(Where::kHost, tp);
      const EarlyEos e = early_eos(*whole_engine);
      const SamplingParams params = all_features(*whole_engine, e, temperature);
      const std::vector<int> whole = whole_engine->generate(e.prompt, params)->token_ids;
      SamplingParams plain_seeded;
      plain_seeded.max_tokens = params.max_tokens;
      plain_seeded.temperature = temperature;
      plain_seeded.seed = 2024;
      EXPECT_NE(whole, whole_engine->generate(e.prompt, plain_seeded)->token_ids);
      ASSERT_GE(int(whole.size()), params.min_tokens);
      auto prefill = make_engine(Where::kHost, tp), decode = make_engine(Where::kHost, tp);
      const auto [first, handed] = pdserve::testing::run_prefill_only(*prefill, e.prompt, params);
      ASSERT_EQ(first, whole[0]) << "TP " << tp;
      auto reserved = decode->reserve_cached_blocks({}, "", int(e.prompt.size()) + params.max_tokens);
      ASSERT_TRUE(reserved.ok());
      pdserve::testing::copy_kv(*prefill, handed, *decode, reserved->blocks, int((e.prompt.size() + 15) / 16));
      ASSERT_TRUE(prefill->release_blocks(handed).ok());
      // The decode side streams the handed-over first token too (first_token_streamed unset).
      EXPECT_EQ(pdserve::testing::decode_preloaded(*decode, e.prompt, params, reserved->blocks, first), whole)
          << "TP " << tp << ", temperature " << temperature;
    }
}

// A migrated request (prompt + the k tokens already streamed, resumed_tokens k): the resumed
// tokens count as output for the penalties and min_tokens, so the rest is the undivided run's.
TEST(SamplingFeatures, AllFeaturesContinueAcrossAMigration) {
  for (Where where : {Where::kHost, Where::kGuarded})
    for (float temperature : {0.0f, 0.8f}) {
      auto engine = make_engine(where);
      const EarlyEos e = early_eos(*engine);
      const SamplingParams params = all_features(*engine, e, temperature);
      const std::vector<int> whole = engine->generate(e.prompt, params)->token_ids;
      ASSERT_GE(int(whole.size()), params.min_tokens);
      // Cut early, and just before min_tokens (the resumed tokens count towards it).
      for (int k : std::set<int>{1, params.min_tokens / 2, params.min_tokens - 2}) {
        std::vector<int> prompt = e.prompt;
        prompt.insert(prompt.end(), whole.begin(), whole.begin() + k);
        SamplingParams rest = params;
        rest.max_tokens = params.max_tokens - k;  // min_tokens counts the resumed output too.
        GenerationRequest req{"m", prompt, rest};
        req.resumed_tokens = k;
        std::vector<int> got(whole.begin(), whole.begin() + k);
        const Status added = engine->add_request(req, [&](const TokenEvent& ev) {
          if (ev.token >= 0) got.push_back(ev.token);
        });
        ASSERT_TRUE(added.ok()) << added << ", resumed after " << k << " of " << whole.size();
        ASSERT_TRUE(engine->run_until_idle().ok());
        EXPECT_EQ(got, whole) << name(where) << ", temperature " << temperature << ", resumed after " << k;
      }
    }
}

// skip_special_tokens off: a special token the model generates (EOS, ignored as a stop) shows
// its text; on (the default), none; the tokens are the same.
TEST(SamplingFeatures, SkipSpecialTokensOffShowsTheirText) {
  auto engine = make_engine(Where::kHost);
  const EarlyEos e = early_eos(*engine);
  SamplingParams p;
  p.max_tokens = int(e.plain.size()) + 3;
  p.ignore_eos = true;
  auto skipped = engine->generate(e.prompt, p);
  p.skip_special_tokens = false;
  auto shown = engine->generate(e.prompt, p);
  ASSERT_TRUE(skipped.ok() && shown.ok());
  EXPECT_EQ(skipped->token_ids, shown->token_ids);
  const int eos = shown->token_ids[e.plain.size()];
  ASSERT_TRUE(is_eos(*engine, eos));
  const std::string special = engine->tokenizer().special_token_text(eos);
  EXPECT_EQ(special, "<s>");  // llama2.c's EOS is BOS; its piece without the export's newlines.
  EXPECT_EQ(skipped->text.find(special), std::string::npos) << skipped->text;
  EXPECT_NE(shown->text.find(special), std::string::npos) << shown->text;
  EXPECT_EQ(shown->text.size(), skipped->text.size() + special.size()) << shown->text;
}

}  // namespace
}  // namespace pdserve::engine
