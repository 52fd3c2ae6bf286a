#include "tune/profiler.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "common/percentile.h"
#include "engine/model_loader.h"
#include "engine/model/sha256.h"
#include "proto/worker.grpc.pb.h"
#include "tune/fit.h"
#include "tune/load_runner.h"

namespace pdserve::tune {
namespace {

double median(std::vector<double> v) { return percentile(std::move(v), 50); }

StatusOr<worker::WorkerInfo> worker_info(const std::string& address, bool include_steps, uint64_t after) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = worker::Worker::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  worker::InfoRequest req;
  req.set_include_steps(include_steps);
  req.set_steps_after(after);
  worker::WorkerInfo info;
  const grpc::Status s = stub->Info(&ctx, req, &info);
  if (!s.ok()) return absl::UnavailableError("Info of " + address + ": " + s.error_message());
  return info;
}

// Runs one profiling load point; a failed request makes the profile untrustworthy.
Status load(const ProfileOptions& o, const std::string& router, const std::string& tag, int prompts, int concurrency,
            int input_len, int output_len, LoadResult* out = nullptr) {
  LoadSpec s;
  s.router = router;
  s.num_prompts = prompts;
  s.max_concurrency = concurrency;
  s.input_len = input_len;
  s.output_len = output_len;
  s.seed = o.seed;
  PD_ASSIGN_OR_RETURN(LoadResult r, run_load(o.cluster.pdserve, s, o.cluster.work_dir, tag, 600));
  for (const RequestSample& q : r.requests)
    if (!q.ok) return absl::InternalError("profile point " + tag + ": a request failed");
  if (out) *out = std::move(r);
  return absl::OkStatus();
}

Status profile_tp(const ProfileOptions& o, int tp, Profile* profile, ProfileData* data) {
  Topology t;
  t.aggregated = true;
  t.n_d = 1;
  t.tp_d = tp;
  const std::string tag = "profile-agg-tp" + std::to_string(tp);
  std::cerr << "tune: profiling TP" << tp << " (one aggregated worker)\n";
  PD_ASSIGN_OR_RETURN(LocalCluster cluster, LocalCluster::start(t, o.cluster, tag));
  const std::string router = cluster.endpoints().router;
  if (cluster.endpoints().workers.size() != 1) return absl::InternalError("expected one worker in " + tag);
  const std::string worker = cluster.endpoints().workers[0].grpc;
  PD_ASSIGN_OR_RETURN(worker::WorkerInfo info, worker_info(worker, false, 0));
  TpProfile tpp;
  tpp.tp = tp;
  tpp.block_size = info.block_size();
  tpp.kv_tokens = int64_t(info.num_blocks()) * info.block_size();
  tpp.max_context = info.model().max_context();
  if (info.max_running() > 0) tpp.max_running = info.max_running();
  if (info.max_batch_tokens() > 0) tpp.max_batch_tokens = info.max_batch_tokens();
  PD_RETURN_IF_ERROR(load(o, router, tag + "-warmup", 4, 1, 16, 4));

  // Router overhead: what a first token costs beyond the prefill's compute, at c=1.
  if (tp == o.tps.front()) {
    LoadResult r;
    PD_RETURN_IF_ERROR(load(o, router, tag + "-overhead", 20, 1, std::min(o.typical_input_len, tpp.max_context / 2), 2, &r));
    std::vector<double> over;
    for (const RequestSample& q : r.requests) over.push_back(std::max(0.0, q.ttft_s - q.prefill_s));
    profile->router_overhead_s = median(over);
  }

  uint64_t after = 0;
  PD_ASSIGN_OR_RETURN(std::vector<StepSample> ignored, read_steps(worker, 0, &after));
  (void)ignored;
  std::vector<StepSample> steps;
  // Prefill: one token out, so every step of these requests computes prompt tokens only.
  const int max_len = std::max(32, std::min(o.max_input_len, tpp.max_context - 8));
  for (int len : geometric_lengths(16, max_len, 8))
    for (int batch : {1, 2, 4}) {
      PD_RETURN_IF_ERROR(load(o, router, tag + "-prefill-" + std::to_string(len) + "x" + std::to_string(batch),
                              3 * batch, batch, len, 1));
      PD_ASSIGN_OR_RETURN(std::vector<StepSample> s, read_steps(worker, after, &after));
      steps.insert(steps.end(), s.begin(), s.end());
    }
  // Decode: batches of B sequences at two context lengths, 32 tokens each.
  const int out_len = 32;
  for (int ctx : {16, std::max(32, max_len / 2)})
    for (int b = 1; b <= std::min(tpp.max_running, 64); b *= 2) {
      if (int64_t(b) * (ctx + out_len) > tpp.kv_tokens) break;
      PD_RETURN_IF_ERROR(load(o, router, tag + "-decode-" + std::to_string(ctx) + "x" + std::to_string(b), b, b, ctx, out_len));
      PD_ASSIGN_OR_RETURN(std::vector<StepSample> s, read_steps(worker, after, &after));
      steps.insert(steps.end(), s.begin(), s.end());
    }
  PD_ASSIGN_OR_RETURN(PrefillFit pf, fit_prefill(steps));
  PD_ASSIGN_OR_RETURN(DecodeFit df, fit_decode(steps));
  tpp.prefill = pf.law;
  tpp.prefill_error = pf.error;
  tpp.decode = df.law;
  tpp.decode_error = df.error;
  profile->by_tp[tp] = tpp;
  if (data) data->steps[tp] = std::move(steps);
  cluster.stop();
  return absl::OkStatus();
}

Status profile_pair(const ProfileOptions& o, int tp_p, int tp_d, KvMode mode, Profile* profile, ProfileData* data,
                    std::vector<double>* overheads, std::vector<double>* handoffs) {
  Topology t;
  t.n_p = 1;
  t.tp_p = tp_p;
  t.n_d = 1;
  t.tp_d = tp_d;
  t.mode = mode;
  const std::string tag = std::string("profile-kv-") + std::to_string(tp_p) + "to" + std::to_string(tp_d) +
                          (mode == KvMode::kPush ? "-push" : "-pull");
  std::cerr << "tune: profiling the KV transfer TP" << tp_p << " -> TP" << tp_d << " "
            << (mode == KvMode::kPush ? "push" : "pull") << "\n";
  PD_ASSIGN_OR_RETURN(LocalCluster cluster, LocalCluster::start(t, o.cluster, tag));
  const std::string router = cluster.endpoints().router;
  PD_RETURN_IF_ERROR(load(o, router, tag + "-warmup", 4, 1, 16, 4));
  const TpProfile& d = profile->by_tp.at(tp_d);
  const int max_len = std::max(32, std::min(o.max_input_len, d.max_context - 8));
  std::vector<std::pair<double, double>> points;
  for (int len : geometric_lengths(16, max_len, 4)) {
    LoadResult r;
    PD_RETURN_IF_ERROR(load(o, router, tag + "-" + std::to_string(len), 6, 1, len, 4, &r));
    for (const RequestSample& q : r.requests) {
      points.emplace_back(q.prompt_tokens, q.kv_transfer_s);
      if (data) data->kv.push_back({tp_p, tp_d, mode, q.prompt_tokens, q.kv_transfer_s});
      overheads->push_back(std::max(0.0, q.ttft_s - q.prefill_s));
      // The second token waits for the transfer, the hand-off and one decode step.
      if (!q.itl_s.empty())
        handoffs->push_back(std::max(0.0, q.itl_s[0] - q.kv_transfer_s -
                                              d.decode.step_seconds(1, q.prompt_tokens + 1)));
    }
  }
  PD_ASSIGN_OR_RETURN(KvFit kf, fit_kv(points));
  KvPairProfile pair;
  pair.tp_p = tp_p;
  pair.tp_d = tp_d;
  pair.mode = mode;
  pair.law = kf.law;
  pair.error = kf.error;
  profile->kv.push_back(pair);
  cluster.stop();
  return absl::OkStatus();
}

}  // namespace

std::vector<int> geometric_lengths(int min_len, int max_len, int points) {
  std::vector<int> out;
  if (max_len < min_len) max_len = min_len;
  for (int i = 0; i < points; ++i) {
    const double f = points == 1 ? 0 : double(i) / (points - 1);
    const int len = int(std::lround(min_len * std::pow(double(max_len) / min_len, f)));
    if (out.empty() || len > out.back()) out.push_back(len);
  }
  return out;
}

StatusOr<std::vector<StepSample>> read_steps(const std::string& worker, uint64_t after, uint64_t* last) {
  PD_ASSIGN_OR_RETURN(worker::WorkerInfo info, worker_info(worker, true, after));
  std::vector<StepSample> out;
  for (const auto& s : info.steps()) {
    StepSample x;
    x.prefill_tokens = s.prefill_tokens();
    x.prefill_seqs = s.prefill_seqs();
    x.decode_seqs = s.decode_seqs();
    x.kv_tokens = s.kv_tokens();
    x.wall_s = s.wall_s();
    out.push_back(x);
    *last = std::max(*last, s.seq());
  }
  return out;
}

StatusOr<Profile> run_profile(const ProfileOptions& o, ProfileData* data) {
  Profile p;
  p.device = o.cluster.device;
  p.dtype = o.cluster.weight_dtype;
  p.kv_dtype = o.cluster.kv_dtype;
  p.gemm_precision = o.cluster.gemm_precision;
  engine::ModelLoadOptions lo;
  lo.model = o.cluster.model;
  PD_ASSIGN_OR_RETURN(engine::LoadedModel model, engine::load_model(lo));
  p.model = model.name;
  // A Hugging Face directory is keyed by its config.json (hashing the weights of a large model
  // would take minutes); a llama2.c checkpoint by the file itself.
  const std::string keyed = std::filesystem::is_directory(model.path) ? model.path + "/config.json" : model.path;
  PD_ASSIGN_OR_RETURN(p.model_sha256, engine::sha256_file(keyed));
  for (int tp : o.tps)
    if (tp <= o.ranks) {
      PD_RETURN_IF_ERROR(profile_tp(o, tp, &p, data));
    }
  std::vector<double> overheads, handoffs;
  if (o.disaggregated)
    for (int tp_p : o.tps)
      for (int tp_d : o.tps)
        for (KvMode mode : o.modes)
          if (tp_p + tp_d <= o.ranks) {
            PD_RETURN_IF_ERROR(profile_pair(o, tp_p, tp_d, mode, &p, data, &overheads, &handoffs));
          }
  p.handoff_s = median(handoffs);
  p.pd_overhead_s = overheads.empty() ? p.router_overhead_s : median(overheads);
  return p;
}

}  // namespace pdserve::tune
