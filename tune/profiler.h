// Stage 1 of `pdserve tune`: measures the real workers on the target backend. Each TP size is
// brought up once (one aggregated worker behind a router) and driven with prompts of a
// geometric grid of lengths and with decode batches of growing size; the worker's own per-step
// records (WorkerInfo.steps: prompt tokens, sequences decoded, Σ KV tokens, wall time) are what
// the step laws are fitted to. Each (prefill TP → decode TP, kv mode) pair is brought up once
// to fit the KV transfer law and the hand-off; capacity comes exact from the workers' Info.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "tune/local_cluster.h"
#include "tune/step_sample.h"
#include "tune/types.h"

namespace pdserve::tune {

struct ProfileOptions {
  ClusterOptions cluster;
  int ranks = 1;
  std::vector<int> tps = {1};
  std::vector<KvMode> modes = {KvMode::kPush};
  bool disaggregated = true;  // Profile the KV pairs (P/D candidates exist).
  int max_input_len = 256;    // The prefill grid reaches this (capped by the context).
  int typical_input_len = 128;
  uint64_t seed = 0;
};

// One measured KV transfer (push: the part the prefill did not hide).
struct KvPoint {
  int tp_p = 1, tp_d = 1;
  KvMode mode = KvMode::kPush;
  int prompt_tokens = 0;
  double seconds = 0;
};

// The raw measurements behind a profile (for the report's fit plots).
struct ProfileData {
  std::map<int, std::vector<StepSample>> steps;  // By TP.
  std::vector<KvPoint> kv;
};

// Runs the profile; `data` (optional) receives the raw points.
StatusOr<Profile> run_profile(const ProfileOptions& options, ProfileData* data);

// The prefill grid: about `points` prompt lengths, geometric from 16 to `max_len`, distinct.
std::vector<int> geometric_lengths(int min_len, int max_len, int points);

// The worker's step records after `after` (WorkerInfo.steps with InfoRequest.include_steps);
// `*last` gets the newest sequence number seen.
StatusOr<std::vector<StepSample>> read_steps(const std::string& worker, uint64_t after, uint64_t* last);

}  // namespace pdserve::tune
