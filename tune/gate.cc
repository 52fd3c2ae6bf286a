#include "tune/gate.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "proto/engine_sampling.h"
#include "proto/grpc_status.h"
#include "proto/sampling_defaults.h"
#include "proto/worker.grpc.pb.h"
#include "tools/router_client.h"

namespace pdserve::tune {
namespace {

// What one request of a round came back with.
struct Served {
  Status status;
  std::vector<int> tokens;
  WorkerPair pair;
};

v1::GenerateRequest to_request(const GoldenPrompt& p) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Assign(p.tokens.begin(), p.tokens.end());
  v1::SamplingParams* s = r.mutable_sampling();
  // Explicitly neutral (greedy): the model's generation_config defaults must not move the
  // tokens the reference computes from the same parameters.
  set_neutral_sampling(s);
  s->set_seed(0);
  s->set_max_tokens(p.max_tokens);
  s->set_ignore_eos(true);
  return r;
}

// The whole set at once through the router, one thread per request, so that concurrent
// requests spread over the workers as a loaded topology's do.
std::vector<Served> serve_round(tools::RouterClient& client, const std::vector<GoldenPrompt>& prompts,
                                Duration timeout) {
  std::vector<Served> served(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&client, &prompts, &served, timeout, i] {
      Served& s = served[i];
      s.status = client.generate(
          to_request(prompts[i]),
          [&s](const v1::GenerateResponse& r) {
            s.tokens.insert(s.tokens.end(), r.token_ids().begin(), r.token_ids().end());
            if (!r.prefill_worker().empty()) s.pair = {r.prefill_worker(), r.decode_worker()};
          },
          timeout);
    });
  }
  for (std::thread& t : threads) t.join();
  return served;
}

StatusOr<worker::WorkerInfo> worker_info(worker::Worker::Stub& stub, const std::string& address) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  worker::WorkerInfo info;
  PD_RETURN_IF_ERROR(from_grpc(stub.Info(&ctx, worker::InfoRequest(), &info), "Info of worker " + address));
  return info;
}

std::string describe(const WorkerPair& p) { return absl::StrCat("(", p.first, ", ", p.second, ")"); }

std::string describe(const Divergence& d) {
  return absl::StrCat("prompt ", d.prompt, " (", golden_kind_name(d.kind), ", ", d.prompt_length,
                      " tokens) diverges at output token ", d.position, ": expected ", d.expected, ", got ", d.got);
}

}  // namespace

StatusOr<Reference> compute_reference(const std::string& model_path, const std::vector<GoldenPrompt>& prompts) {
  PD_ASSIGN_OR_RETURN(engine::LoadedModel loaded, engine::load_model({model_path, ""}));
  PD_ASSIGN_OR_RETURN(auto eng, engine::Engine::create(std::move(loaded), {}));
  Reference ref;
  ref.tokens.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    // The very parameters the router gets (to_request), as a worker reads them.
    engine::GenerationRequest g{std::to_string(i), prompts[i].tokens, engine_sampling(to_request(prompts[i]).sampling())};
    std::vector<int>& out = ref.tokens[i];
    PD_RETURN_IF_ERROR(eng->add_request(std::move(g), [&out](const engine::TokenEvent& ev) {
      if (ev.token >= 0) out.push_back(ev.token);
    }));
  }
  PD_RETURN_IF_ERROR(eng->run_until_idle());
  return ref;
}

StatusOr<GateResult> run_gate(const GateOptions& options, const std::vector<GoldenPrompt>& prompts,
                              const Reference& reference) {
  if (prompts.empty()) return absl::InvalidArgumentError("gate: no golden prompts");
  if (reference.tokens.size() != prompts.size())
    return absl::InvalidArgumentError(absl::StrCat("gate: a reference of ", reference.tokens.size(), " outputs for ",
                                                   prompts.size(), " prompts"));
  PD_ASSIGN_OR_RETURN(auto client, tools::RouterClient::connect(options.router, options.connect_timeout));
  std::vector<std::unique_ptr<worker::Worker::Stub>> stubs;
  std::vector<TopologyWorker> topology;
  for (const std::string& address : options.workers) {
    stubs.push_back(worker::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())));
    PD_ASSIGN_OR_RETURN(worker::WorkerInfo info, worker_info(*stubs.back(), address));
    topology.push_back({address, info.role()});
  }
  const std::set<WorkerPair> expected = topology_pairs(topology);
  if (expected.empty()) return absl::InvalidArgumentError("gate: the workers make no (prefill, decode) pair");
  if (options.expected_pairs > 0 && int(expected.size()) != options.expected_pairs)
    return absl::FailedPreconditionError(absl::StrCat("gate: the ", options.workers.size(), " workers make ",
                                                      expected.size(), " pairs, the topology has ",
                                                      options.expected_pairs));

  GateResult result;
  std::vector<std::string> failures;  // In the order found; the first is the reason.
  for (int round = 0; round < options.max_rounds; ++round) {
    const std::vector<Served> served = serve_round(*client, prompts, options.request_timeout);
    ++result.rounds;
    result.prompts += int(served.size());
    std::vector<std::vector<int>> outputs;
    for (size_t i = 0; i < served.size(); ++i) {
      outputs.push_back(served[i].tokens);
      if (!served[i].status.ok()) {
        if (result.failed_requests++ == 0)
          failures.push_back(absl::StrCat("prompt ", i, " (", golden_kind_name(prompts[i].kind), ", ",
                                          prompts[i].tokens.size(), " tokens) failed: ", served[i].status.ToString()));
        continue;
      }
      result.pairs_seen.insert(served[i].pair);
    }
    if (result.failed_requests > 0) break;
    result.divergence = first_divergence(prompts, reference, outputs, options.policy, options.prefix_tokens);
    if (result.divergence) {
      failures.push_back(absl::StrCat("round ", round, ": ", describe(*result.divergence)));
      break;
    }
    if (std::includes(result.pairs_seen.begin(), result.pairs_seen.end(), expected.begin(), expected.end())) break;
  }
  if (failures.empty()) {
    for (const WorkerPair& p : expected)
      if (!result.pairs_seen.count(p)) {
        failures.push_back(absl::StrCat("pair ", describe(p), " never exercised in ", result.rounds, " rounds"));
        break;
      }
  }
  // The drain check runs whatever failed before: a leak is reported alongside.
  const std::function<void()> pause =
      options.pause ? options.pause : [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); };
  for (size_t w = 0; w < stubs.size(); ++w) {
    const std::string& address = options.workers[w];
    PD_ASSIGN_OR_RETURN(BlockCount blocks, wait_for_free_blocks(
                                               [&]() -> StatusOr<BlockCount> {
                                                 PD_ASSIGN_OR_RETURN(worker::WorkerInfo info,
                                                                     worker_info(*stubs[w], address));
                                                 return BlockCount{info.num_blocks(), info.free_blocks()};
                                               },
                                               *options.clock, options.drain_timeout, pause));
    if (blocks.in_use() <= 0) continue;
    result.leaked_blocks[address] = blocks.in_use();
    failures.push_back(absl::StrCat("worker ", address, " still holds ", blocks.in_use(), " of ", blocks.num_blocks,
                                    " KV blocks after the drain"));
  }
  result.pass = failures.empty();
  if (!result.pass) result.reason = failures.front();
  return result;
}

}  // namespace pdserve::tune
