#include "tools/generate_command.h"

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "proto/sampling_defaults.h"
#include "tools/router_client.h"
#include "tools/sampling_flags.h"
#include "worker/sampling_params.h"
#include "worker/token_logprobs.h"

namespace pdserve::tools {
namespace {

struct GenerateFlags {
  std::string model = "stories260K";
  std::string tokenizer;
  std::string prompt;
  engine::SamplingParams params;
  // Which of the defaultable flags were given: the others take the model's defaults.
  bool temperature_given = false, top_k_given = false, top_p_given = false, repetition_penalty_given = false;
  engine::EngineOptions engine;
  int64_t kv_load_timeout_ms = 0;
  std::string weight_dtype = "f32";
  std::string kv_dtype = "f32";
  std::string gemm_precision = "exact";
  bool json = false;
  std::string router;  // HOST:PORT: generate through a running router instead of in process.
  std::string api_key;
  bool tls = false;    // --tls: the router serves TLS (system CAs).
  std::string tls_ca;  // --tls-ca: ... signed by this CA.
};

// The request's sampling: the flags given, and unset what the model's defaults are for.
v1::SamplingParams requested_sampling(const GenerateFlags& f) {
  v1::SamplingParams s = to_proto(f.params);
  if (!f.temperature_given) s.clear_temperature();
  if (!f.top_k_given) s.clear_top_k();
  if (!f.top_p_given) s.clear_top_p();
  if (!f.repetition_penalty_given) s.clear_repetition_penalty();
  return s;
}

// The sampling a request ran with, for --json.
nlohmann::json sampling_json(const engine::SamplingParams& p) {
  nlohmann::json bias = nlohmann::json::object();
  for (const auto& [id, b] : p.logit_bias) bias[std::to_string(id)] = b;
  return {{"temperature", p.temperature},
          {"top_k", p.top_k},
          {"top_p", p.top_p},
          {"repetition_penalty", p.repetition_penalty},
          {"frequency_penalty", p.frequency_penalty},
          {"presence_penalty", p.presence_penalty},
          {"logit_bias", bias},
          {"min_tokens", p.min_tokens},
          {"logprobs", p.logprobs},
          {"prompt_logprobs", p.prompt_logprobs},
          {"skip_special_tokens", p.skip_special_tokens}};
}

// --json's form of log-probabilities: {"token_id", "logprob", "top": [[id, logprob], ...]}.
nlohmann::json logprobs_json(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& lps) {
  nlohmann::json out = nlohmann::json::array();
  for (const v1::TokenLogprob& lp : lps) {
    nlohmann::json top = nlohmann::json::array();
    for (int i = 0; i < std::min(lp.top_ids_size(), lp.top_logprobs_size()); ++i)
      top.push_back({lp.top_ids(i), lp.top_logprobs(i)});
    out.push_back({{"token_id", lp.token_id()}, {"logprob", lp.logprob()}, {"top", std::move(top)}});
  }
  return out;
}

// Adds the log-probabilities --json prints, when the request asked for them.
void add_logprobs_json(const engine::SamplingParams& p, const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& lps,
                       const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& prompt_lps, nlohmann::json* j) {
  if (p.logprobs >= 0) (*j)["logprobs"] = logprobs_json(lps);
  if (p.prompt_logprobs >= 0) (*j)["prompt_logprobs"] = logprobs_json(prompt_lps);
}

// The same run through a router: the same output, the text streamed or the same JSON object.
int run_generate_remote(const GenerateFlags& f) {
  if (Status s = f.params.validate(); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  auto tls = load_client_tls(f.tls, f.tls_ca);
  if (!tls.ok()) {
    std::cerr << "error: " << tls.status().message() << "\n";
    return 2;
  }
  auto connected = connect_and_describe(f.router, "", api_key_or_env(f.api_key), *tls);
  if (!connected.ok()) {
    std::cerr << "error: " << connected.status().message() << "\n";
    return 1;
  }
  RouterClient* client = connected->client.get();
  const v1::ModelInfo* info = &connected->model;
  v1::GenerateRequest req;
  req.set_text(f.prompt);
  *req.mutable_sampling() = requested_sampling(f);
  // What the router will run it with (it applies the same defaults), for --json.
  v1::SamplingParams resolved = req.sampling();
  apply_sampling_defaults(info->sampling_defaults(), &resolved);
  auto effective = worker::to_engine_params(resolved);
  if (!effective.ok()) {
    std::cerr << "error: " << effective.status().message() << "\n";
    return 1;
  }
  std::vector<int> prompt_ids, token_ids;
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> logprobs, prompt_logprobs;
  std::string text, finish;
  v1::GenerateResponse last;
  Status s = client->generate(req, [&](const v1::GenerateResponse& r) {
    prompt_ids.insert(prompt_ids.end(), r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    token_ids.insert(token_ids.end(), r.token_ids().begin(), r.token_ids().end());
    logprobs.MergeFrom(r.logprobs());
    prompt_logprobs.MergeFrom(r.prompt_logprobs());
    text += r.text();
    if (!f.json) {
      std::fwrite(r.text().data(), 1, r.text().size(), stdout);
      std::fflush(stdout);
    }
    if (r.finished()) last = r;
  });
  if (!s.ok()) {
    std::cerr << "\nerror: " << s.message() << "\n";
    return 1;
  }
  if (f.json) {
    nlohmann::json j;
    j["model"] = info->name();
    j["prompt_token_ids"] = prompt_ids;
    j["token_ids"] = token_ids;
    j["text"] = text;
    j["finish_reason"] = last.finish_reason();
    j["cached_tokens"] = last.cached_tokens();
    j["decode_cached_tokens"] = last.timings().decode_cached_tokens();
    j["transferred_blocks"] = last.timings().transferred_blocks();
    j["decode_local_prefill"] = last.timings().decode_local_prefill();
    j["prefill_worker"] = last.prefill_worker();
    j["decode_worker"] = last.decode_worker();
    j["sampling"] = sampling_json(*effective);
    add_logprobs_json(*effective, logprobs, prompt_logprobs, &j);
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "\n";
  }
  const v1::Timings& t = last.timings();
  std::cerr << "prompt " << prompt_ids.size() << " tokens, generated " << token_ids.size() << " tokens, finish "
            << last.finish_reason() << ", " << last.cached_tokens() << " prompt tokens cached; prefill "
            << last.prefill_worker() << ", decode " << last.decode_worker() << " ("
            << last.timings().decode_cached_tokens() << " tokens cached there, " << last.timings().transferred_blocks()
            << " KV blocks moved" << (t.decode_local_prefill() ? "; prefilled there" : "") << ")"
            << "; queued " << t.queued_s() << " s, prefill " << t.prefill_s() << " s, KV transfer " << t.kv_transfer_s()
            << " s, first token " << t.first_token_s() << " s, total " << t.total_s() << " s\n";
  return 0;
}

int run_generate(const GenerateFlags& f) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  if (Status s = f.params.validate(); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  auto model = engine::load_model({f.model, f.tokenizer});
  if (!model.ok()) {
    std::cerr << "error: " << model.status().message() << "\n";
    return 1;
  }
  const std::string name = model->name;
  // The same defaults a router applies to a request (proto/sampling_defaults.h).
  v1::SamplingParams resolved = requested_sampling(f);
  apply_sampling_defaults(sampling_defaults_proto(model->config.generation_defaults), &resolved);
  auto params = worker::to_engine_params(resolved);
  if (!params.ok()) {
    std::cerr << "error: " << params.status().message() << "\n";
    return 1;
  }
  engine::EngineOptions options = f.engine;
  options.kv_load_timeout = std::chrono::milliseconds(f.kv_load_timeout_ms);
  options.weight_dtype = *engine::dtype_from_name(f.weight_dtype);  // Checked by the flags.
  options.kv_dtype = *engine::dtype_from_name(f.kv_dtype);
  options.gemm_precision = *engine::gemm_precision_from_name(f.gemm_precision);
  auto eng = engine::Engine::create(std::move(*model), options);
  if (!eng.ok()) {
    std::cerr << "error: " << eng.status().message() << "\n";
    return 1;
  }
  engine::Engine& e = **eng;
  auto prompt = e.tokenizer().encode(f.prompt, /*add_bos=*/true);
  if (!prompt.ok()) {
    std::cerr << "error: prompt: " << prompt.status().message() << "\n";
    return 1;
  }
  const auto stats = e.stats();
  std::cerr << "model " << name << " (" << e.config().n_layers << " layers, dim " << e.config().dim
            << "), TP " << f.engine.tp << " on " << e.backend(0).name() << ", KV cache " << e.kv_capacity_tokens() << " tokens ("
            << (stats.kv_bytes_per_rank >> 20) << " MiB per rank), load "
            << std::chrono::duration<double>(Clock::now() - t0).count() << " s\n";

  engine::GenerationResult result;
  result.prompt_token_ids = *prompt;
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> logprobs, prompt_logprobs;
  Status error;
  const auto t1 = Clock::now();
  Status added = e.add_request({"cli", *prompt, *params}, [&](const engine::TokenEvent& ev) {
    if (ev.token >= 0) result.token_ids.push_back(ev.token);
    if (ev.logprob) *logprobs.Add() = worker::to_wire(*ev.logprob);
    worker::append_wire(ev.prompt_logprobs, &prompt_logprobs);
    result.text += ev.text;
    if (!f.json) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev.finished) {
      result.finish_reason = ev.reason;
      error = ev.error;
    }
  });
  if (added.ok()) added = e.run_until_idle();
  if (added.ok()) added = error;
  if (!added.ok()) {
    std::cerr << "\nerror: " << added.message() << "\n";
    return 1;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t1).count();
  if (f.json) {
    nlohmann::json j;
    j["model"] = name;
    j["prompt_token_ids"] = result.prompt_token_ids;
    j["token_ids"] = result.token_ids;
    j["text"] = result.text;
    j["finish_reason"] = engine::finish_reason_name(result.finish_reason);
    j["sampling"] = sampling_json(*params);
    add_logprobs_json(*params, logprobs, prompt_logprobs, &j);
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "\n";
  }
  std::cerr << "prompt " << result.prompt_token_ids.size() << " tokens, generated "
            << result.token_ids.size() << " tokens in " << secs << " s ("
            << (secs > 0 ? result.token_ids.size() / secs : 0) << " tokens/s), finish "
            << engine::finish_reason_name(result.finish_reason) << "\n";
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<GenerateFlags>();
  flags->params.max_tokens = 256;
  CLI::App* cmd = app.add_subcommand("generate", "Generate text in process, or through a router (--router)");
  cmd->add_option("--model", flags->model, "Model path or name (stories260K)")->capture_default_str();
  cmd->add_option("--tokenizer", flags->tokenizer, "Tokenizer file (default: found beside the model)");
  cmd->add_option("--prompt", flags->prompt, "Prompt text; empty means BOS alone");
  cmd->add_option("--max-tokens", flags->params.max_tokens, "Most tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", flags->params.temperature, "0 = greedy (default: the model's, else 0)");
  cmd->add_option("--top-k", flags->params.top_k, "0 = off (default: the model's, else 0)");
  cmd->add_option("--top-p", flags->params.top_p, "Nucleus mass in (0, 1] (default: the model's, else 1)");
  cmd->add_option("--repetition-penalty", flags->params.repetition_penalty,
                  "> 0, 1 = off: seen tokens' logits divided (positive) or multiplied (default: the model's, else 1)");
  cmd->add_option("--seed", flags->params.seed, "Sampling seed (-1 = random)");
  cmd->add_option("--stop", flags->params.stop_strings, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", flags->params.ignore_eos, "Keep generating past EOS");
  add_output_sampling_flags(cmd, &flags->params);
  // The in-process engine's options, one group, so that --router refuses every one of them.
  CLI::Option_group* engine = cmd->add_option_group("Engine", "The in-process engine (not with --router)");
  engine->add_option("--tp", flags->engine.tp, "Tensor-parallel ranks")->capture_default_str();
  engine
      ->add_option("--cpu-threads", flags->engine.cpu_threads,
                   "Threads each rank computes with on the cpu backend (GEMMs and attention split between them; the "
                   "same tokens on any count)")
      ->check(CLI::Range(1, engine::kMaxCpuThreads))
      ->capture_default_str();
  engine
      ->add_option("--device", flags->engine.backend,
                   "Compute backend: cpu, or cuda / hip (rank r on GPU r); emulated: the GPU backend on a CPU "
                   "emulation of the GPU (tests)")
      ->check(CLI::IsMember({"cpu", "cuda", "hip", "emulated"}))
      ->capture_default_str();
  engine
      ->add_option("--weight-dtype", flags->weight_dtype,
                   "GEMM weights on a GPU backend: f32, or bf16 (half the memory; exact for bf16 checkpoints)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  engine
      ->add_option("--gemm-precision", flags->gemm_precision,
                   "How the GEMMs take their activations: exact (f32), or bf16 (rounded to bf16 for the vendor bf16 "
                   "GEMM and tensor cores, on CUDA prefill attention's products too; needs --weight-dtype bf16; "
                   "within a tolerance of exact, not equal)")
      ->check(CLI::IsMember({"exact", "bf16"}))
      ->capture_default_str();
  engine->add_flag("--decode-graphs", flags->engine.decode_graphs,
                   "Record decode steps once per batch bucket as GPU graphs and replay them (one launch a step); GPU "
                   "backends at TP 1");
  engine->add_flag("--async-scheduling", flags->engine.async_scheduling,
                   "Queue each step before reading the previous step's tokens, so that scheduling and streaming "
                   "overlap the device's work (a stopping request computes one wasted token); GPU backends");
  engine
      ->add_option("--kv-dtype", flags->kv_dtype,
                   "The KV cache's elements: f32, or bf16 on a GPU backend (half the bytes; twice the blocks)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  engine->add_option("--block-size", flags->engine.block_size, "Tokens per KV block")->capture_default_str();
  engine->add_option("--kv-cache-bytes", flags->engine.kv_cache_bytes, "KV cache bytes per rank");
  engine->add_option("--host-kv-bytes", flags->engine.host_kv_bytes, "Host tier of the KV cache, bytes per rank");
  engine->add_option("--kv-offload-dir", flags->engine.kv_offload_dir, "Filesystem tier of the KV cache (a directory)");
  engine->add_option("--kv-offload-dir-bytes", flags->engine.kv_offload_dir_bytes,
                     "Bytes the filesystem tier keeps at most");
  engine
      ->add_option("--kv-load-timeout-ms", flags->kv_load_timeout_ms,
                   "How long a request may read the filesystem tier before computing the rest (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  engine->add_option("--memory-utilization", flags->engine.memory_utilization,
                     "KV cache as a fraction of device memory");
  cmd->add_flag("--json", flags->json,
                "Print one JSON object instead of streaming text (with \"logprobs\" / \"prompt_logprobs\" when asked)");
  cmd->add_option("--router", flags->router, "Generate through the router at HOST:PORT instead of in process");
  cmd->add_option("--api-key", flags->api_key, "API key for the router (default: $PDSERVE_API_KEY)");
  cmd->add_flag("--tls", flags->tls, "Connect to the router over TLS, trusting the system's CAs");
  cmd->add_option("--tls-ca", flags->tls_ca, "Connect to the router over TLS, trusting only this PEM CA");
  cmd->callback([cmd, engine, flags, exit_code] {
    flags->temperature_given = cmd->count("--temperature") > 0;
    flags->top_k_given = cmd->count("--top-k") > 0;
    flags->top_p_given = cmd->count("--top-p") > 0;
    flags->repetition_penalty_given = cmd->count("--repetition-penalty") > 0;
    if (!flags->router.empty()) {
      // The router's workers have their own engines: an engine option here would change nothing.
      for (const CLI::Option* engine_option : engine->get_options()) {
        if (engine_option->count() > 0) {
          std::cerr << "error: " << engine_option->get_name() << " sets up the in-process engine; with --router the "
                    << "workers' own flags decide it\n";
          *exit_code = 2;
          return;
        }
      }
    }
    *exit_code = flags->router.empty() ? run_generate(*flags) : run_generate_remote(*flags);
  });
}

}  // namespace pdserve::tools
