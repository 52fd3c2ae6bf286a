// Engine throughput: single-sequence decode, aggregate decode at several batch sizes, and
// prefill, per model, TP size and scheduling (synchronous, or asynchronous with --async off,on),
// on the CPU or a GPU backend (--device). Prints a table (and JSON with --json FILE). Figures are
// also given as a ratio to TP 1, and asynchronous rows to the synchronous ones, measured in the
// same run, since the machine is shared and noisy.
// --breakdown B adds where a decode step at batch B spends its time, phase by phase
// (engine/backends/phase_profiler.h), on rank 0.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include "common/logging.h"
#include "engine/backends/phase_profiler.h"
#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "engine/tp_shard.h"

namespace pdserve::bench {
namespace {

using engine::Engine;
using Clock = std::chrono::steady_clock;

// A row's ratio `key` as "x1.23", or "-" where it was not measured (a batch size left out).
std::string ratio_text(const nlohmann::json& row, const std::string& key) {
  if (!row.contains(key)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "x%.2f", row[key].get<double>());
  return text;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int> random_prompt(int len, int vocab, std::mt19937& rng) {
  std::vector<int> p = {1};
  while (int(p.size()) < len) p.push_back(3 + int(rng() % uint32_t(vocab - 3)));
  return p;
}

// Tokens per second of decoding `batch` sequences together (prefill excluded); `at_decode` runs
// once every sequence has its first token, before the timed decode steps.
double decode_rate(Engine& e, int batch, int prompt_len, int new_tokens, std::mt19937& rng,
                   const std::function<void()>& at_decode = [] {}) {
  std::vector<int> counts(batch, 0);
  for (int i = 0; i < batch; ++i) {
    engine::SamplingParams p;
    p.max_tokens = new_tokens;
    p.ignore_eos = true;
    Status s = e.add_request({std::to_string(i), random_prompt(prompt_len, e.config().vocab_size, rng), p},
                             [&counts, i](const engine::TokenEvent& ev) { counts[i] += ev.token >= 0; });
    if (!s.ok()) return 0;
  }
  auto all_started = [&] {
    for (int c : counts)
      if (c == 0) return false;
    return true;
  };
  while (!all_started() && e.has_work()) (void)e.step();
  int before = 0;
  for (int c : counts) before += c;
  at_decode();
  const auto t0 = Clock::now();
  (void)e.run_until_idle();
  int after = 0;
  for (int c : counts) after += c;
  return (after - before) / seconds_since(t0);
}

double prefill_rate(Engine& e, int prompts, int prompt_len, std::mt19937& rng) {
  engine::SamplingParams p;
  p.max_tokens = 1;
  for (int i = 0; i < prompts; ++i)
    (void)e.add_request({std::to_string(i), random_prompt(prompt_len, e.config().vocab_size, rng), p}, nullptr);
  const auto t0 = Clock::now();
  (void)e.run_until_idle();
  return prompts * prompt_len / seconds_since(t0);
}

// Greedy decode of one sequence from BOS as llama2.c's run.c does it (`-t 0 -n steps`): `steps`
// positions at most, stopping early at an EOS (BOS for llama2.c checkpoints), timed from the first
// token to the last (run.c starts its clock after the first forward pass).
struct FromBos {
  double tok_s = 0;
  int tokens = 0;
};

FromBos decode_from_bos(Engine& e, int steps) {
  engine::SamplingParams p;
  p.max_tokens = steps;
  std::vector<Clock::time_point> at;
  Status s = e.add_request({"from-bos", {e.config().bos_id}, p}, [&at](const engine::TokenEvent& ev) {
    if (ev.token >= 0) at.push_back(Clock::now());
  });
  if (!s.ok() || !e.run_until_idle().ok() || at.size() < 2) return {};
  return {double(at.size() - 1) / std::chrono::duration<double>(at.back() - at.front()).count(), int(at.size())};
}

// Decodes `batch` sequences with every rank's profiler on during the decode steps; prints and
// returns rank 0's phases per step (its LM head runs once a step).
nlohmann::json decode_breakdown(Engine& e, const std::vector<engine::PhaseProfiler*>& profilers, int batch,
                                int prompt_len, int new_tokens, std::mt19937& rng) {
  (void)decode_rate(e, batch, prompt_len, new_tokens, rng, [&profilers] {
    for (engine::PhaseProfiler* p : profilers) {
      p->reset();
      (void)p->set_enabled(true);
    }
  });
  for (engine::PhaseProfiler* p : profilers) (void)p->set_enabled(false);
  const auto phases = profilers.front()->per_step();
  double all = 0;
  for (const engine::PhasePerStep& p : phases) all += p.ms;
  nlohmann::json out;
  std::printf("  decode step at batch %d, rank 0, per step (each call waited for):\n", batch);
  for (int i = 0; i < engine::kPhases; ++i) {
    const engine::PhasePerStep& p = phases[size_t(i)];
    const double share = all > 0 ? p.ms / all : 0;
    const char* name = engine::phase_name(engine::Phase(i));
    std::printf("    %-14s %7.1f calls %9.3f ms %6.1f%%\n", name, p.calls, p.ms, 100 * share);
    out[name] = {{"calls_per_step", p.calls}, {"ms_per_step", p.ms}, {"share", share}};
  }
  return out;
}

long peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  using namespace pdserve;
  init_logging();
  CLI::App app{"pdserve engine benchmark"};
  std::vector<std::string> models = {"stories260K", "synthetic-100m"};
  std::vector<int> tps = {1, 2};
  std::vector<int> cpu_threads = {1};
  std::vector<int> batches = {1, 8, 32, 128};
  int new_tokens = 32, prompt_len = 16, prefill_len = 256, prefill_prompts = 4;
  int from_bos_steps = 0;
  int breakdown_batch = 0;
  std::string json_out;
  std::string device = "cpu", weight_dtype = "f32";
  std::vector<std::string> async_modes = {"off"};
  app.add_option("--models", models, "Model names/paths; 'synthetic-100m' is generated if absent");
  app.add_option("--tp", tps, "TP sizes");
  app.add_option("--cpu-threads", cpu_threads, "Threads per rank of the cpu backend (each TP size runs with each)")
      ->check(CLI::Range(1, engine::kMaxCpuThreads));
  app.add_option("--batches", batches, "Decode batch sizes");
  app.add_option("--new-tokens", new_tokens, "Tokens decoded per sequence");
  app.add_option("--prefill-len", prefill_len, "Prompt length for the prefill measurement");
  app.add_option("--from-bos-steps", from_bos_steps,
                 "Only time greedy decode of one sequence from BOS over this many positions, as run.c -t 0 -n N does "
                 "(bench/cpu_vs_runc.sh)")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--breakdown", breakdown_batch,
                 "Also profile a decode step at this batch size phase by phase (GEMMs, LM head, attention, small "
                 "kernels, sampling, copies)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--json", json_out, "Write results as JSON to this file");
  app.add_option("--device", device, "Backend: cpu, or a GPU backend this build has (cuda, hip, emulated)")
      ->capture_default_str();
  app.add_option("--weight-dtype", weight_dtype, "GEMM weights on a GPU backend: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--async", async_modes,
                 "Scheduling: off (synchronous), on (--async-scheduling: GPU backends), or off,on for both "
                 "and their ratio")
      ->check(CLI::IsMember({"off", "on"}))
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  nlohmann::json results = nlohmann::json::array();
  if (from_bos_steps == 0)
    std::printf("%-16s %3s %3s %5s %10s %12s %12s %12s %12s %12s %9s\n", "model", "tp", "thr", "async", "decode-1",
                "agg-b1", "agg-b8", "agg-b32", "agg-b128", "prefill", "rss-MiB");
  for (const std::string& name : models) {
    std::string path = name;
    if (name == "synthetic-100m") {
      path = "/tmp/pdserve-bench-synthetic-100m";
      if (!std::ifstream(path + "/config.json")) {
        std::fprintf(stderr, "writing %s ...\n", path.c_str());
        Status s = engine::make_model({"synthetic-100m", 1, path, "", engine::DType::kF32});
        if (!s.ok()) {
          std::fprintf(stderr, "make-model: %s\n", std::string(s.message()).c_str());
          return 1;
        }
      }
    }
    // This model's rows so far, by (TP, threads, async).
    std::map<std::tuple<int, int, std::string>, nlohmann::json> model_rows;
    for (int tp : tps)
      for (int threads : cpu_threads)
        for (const std::string& async : async_modes) {
          auto model = engine::load_model({path});
          if (!model.ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(model.status().message()).c_str());
            return 1;
          }
          // With --breakdown every rank's backend is the CPU backend under a PhaseProfiler (off
          // until the breakdown runs).
          std::vector<engine::PhaseProfiler*> profilers(tp);
          const int vocab = model->config.vocab_size;
          engine::EngineOptions opts;
          if (breakdown_batch > 0)
            opts.backend_factory = [&profilers, vocab, tp, threads,
                                    &device](int rank) -> StatusOr<std::unique_ptr<engine::Backend>> {
              // The rank's LM head slice of the vocabulary, as the engine shards it.
              PD_ASSIGN_OR_RETURN(auto backend, engine::make_backend(device, rank, {threads, tp * threads}));
              auto profiler = std::make_unique<engine::PhaseProfiler>(std::move(backend),
                                                                      engine::even_split(vocab, tp, rank).size());
              profilers[size_t(rank)] = profiler.get();
              return std::unique_ptr<engine::Backend>(std::move(profiler));
            };
          opts.tp = tp;
          if (breakdown_batch == 0) opts.cpu_threads = threads;  // Else the factory's.
          opts.backend = device;
          opts.weight_dtype = weight_dtype == "bf16" ? engine::DType::kBF16 : engine::DType::kF32;
          opts.async_scheduling = async == "on";
          opts.max_running = 256;
          opts.max_batch_tokens = 512;
          auto eng = engine::Engine::create(std::move(*model), opts);
          if (!eng.ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(eng.status().message()).c_str());
            return 1;
          }
          nlohmann::json row = {
              {"model", name}, {"tp", tp}, {"cpu_threads", threads}, {"device", device}, {"async", async == "on"}};
          if (from_bos_steps > 0) {
            const bench::FromBos r = bench::decode_from_bos(**eng, from_bos_steps);
            if (r.tokens < 2) {
              std::fprintf(stderr, "%s: decoding from BOS failed or gave fewer than 2 tokens\n", name.c_str());
              return 1;
            }
            row["from_bos_tok_s"] = r.tok_s;
            row["from_bos_tokens"] = r.tokens;
            std::printf("%-16s %3d %3d %10.1f tok/s from BOS (%d tokens)\n", name.c_str(), tp, threads, r.tok_s,
                        r.tokens);
            results.push_back(row);
            continue;
          }
          std::mt19937 rng(7);
          const double single = bench::decode_rate(**eng, 1, prompt_len, new_tokens * 2, rng);
          row["decode_single_tok_s"] = single;
          std::printf("%-16s %3d %3d %5s %10.1f", name.c_str(), tp, threads, async.c_str(), single);
          for (int b : {1, 8, 32, 128}) {
            const bool wanted = std::find(batches.begin(), batches.end(), b) != batches.end();
            const double r = wanted ? bench::decode_rate(**eng, b, prompt_len, new_tokens, rng) : 0;
            row["decode_batch_" + std::to_string(b) + "_tok_s"] = r;
            std::printf(" %12.1f", r);
          }
          const double pre = bench::prefill_rate(**eng, prefill_prompts, prefill_len, rng);
          row["prefill_tok_s"] = pre;
          row["peak_rss_mib"] = bench::peak_rss_mib();
          std::printf(" %12.1f %9ld\n", pre, bench::peak_rss_mib());
          if (breakdown_batch > 0)
            row["breakdown_batch_" + std::to_string(breakdown_batch)] =
                bench::decode_breakdown(**eng, profilers, breakdown_batch, prompt_len, new_tokens, rng);
          // Ratios to this model's row at the first TP, the first thread count and the first
          // scheduling (the other two the same), measured earlier in this run.
          const nlohmann::json measured = row;
          const auto ratios_to = [&row, &measured](const nlohmann::json& base, const std::string& suffix) {
            for (const auto& [figure, v] : base.items())
              if (v.is_number_float() && v.get<double>() > 0 && measured.contains(figure))
                row[figure + suffix] = measured[figure].get<double>() / v.get<double>();
          };
          if (tp != tps.front())
            ratios_to(model_rows.at({tps.front(), threads, async}), "_vs_tp" + std::to_string(tps.front()));
          if (threads != cpu_threads.front())
            ratios_to(model_rows.at({tp, cpu_threads.front(), async}),
                      "_vs_threads" + std::to_string(cpu_threads.front()));
          if (async != async_modes.front())
            ratios_to(model_rows.at({tp, threads, async_modes.front()}), "_vs_async_" + async_modes.front());
          model_rows[{tp, threads, async}] = measured;
          results.push_back(row);
        }
  }
  // Each row's ratios (`suffix`: the ratios_to keys above) to the row it was compared with.
  const auto print_ratios = [&results](const std::string& title, const std::string& suffix) {
    std::printf("\nratio %s (same run):\n", title.c_str());
    for (const auto& r : results)
      if (r.contains("decode_single_tok_s" + suffix))
        std::printf("%-16s tp=%d thr=%d async=%s decode-1 %s  agg-b1 %s  agg-b32 %s  agg-b128 %s  prefill %s\n",
                    r["model"].get<std::string>().c_str(), r["tp"].get<int>(), r["cpu_threads"].get<int>(),
                    r["async"].get<bool>() ? "on" : "off", bench::ratio_text(r, "decode_single_tok_s" + suffix).c_str(),
                    bench::ratio_text(r, "decode_batch_1_tok_s" + suffix).c_str(),
                    bench::ratio_text(r, "decode_batch_32_tok_s" + suffix).c_str(),
                    bench::ratio_text(r, "decode_batch_128_tok_s" + suffix).c_str(),
                    bench::ratio_text(r, "prefill_tok_s" + suffix).c_str());
  };
  if (from_bos_steps == 0) {
    if (async_modes.size() > 1)
      print_ratios("of async " + async_modes.back() + " to async " + async_modes.front(),
                   "_vs_async_" + async_modes.front());
    if (tps.size() > 1) print_ratios("vs TP " + std::to_string(tps.front()), "_vs_tp" + std::to_string(tps.front()));
    if (cpu_threads.size() > 1)
      print_ratios("vs " + std::to_string(cpu_threads.front()) + " thread(s) a rank",
                   "_vs_threads" + std::to_string(cpu_threads.front()));
  }
  if (!json_out.empty()) std::ofstream(json_out) << results.dump(2) << "\n";
  return 0;
}
