// The router's decisions as pure functions over snapshots (worker load, queue depths), so they
// can be table-tested without workers: where a request goes (prefill by queued prompt tokens,
// decode by running sequences among those with room), and whether it runs, waits or is refused.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pdserve::router {

// What placement knows about one worker: its last Info, plus what this router has sent it since.
struct WorkerLoad {
  int index = 0;  // The worker's index in the registry.
  bool up = false;
  int num_blocks = 0;
  int free_blocks = 0;
  int running = 0;
  int waiting = 0;
  int64_t queued_prefill_tokens = 0;
  int tp = 0;  // The worker's ranks.
  uint64_t compat_hash = 0;  // KV geometry fingerprint (model, layout, dtype, block size).
  std::string kv_compat;     // The deployment's KV-compatibility label (--kv-compat).
};

// Whether prefill worker `p` may hand KV to decode worker `d`: the same KV geometry and the
// same deployment label, so the old and new generations of a rolling upgrade never pair.
bool kv_pairable(const WorkerLoad& p, const WorkerLoad& d);

// The up prefill worker with the fewest queued prefill tokens (then fewest running, then lowest
// index), skipping indices in `exclude`; -1 when there is none.
int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude);

// The same, among prefill workers that some decode worker in `decode` (up, not in
// `exclude_decode`, whose cache could ever hold `blocks_needed`) is kv_pairable with; worker
// `preferred` (an index, -1 for none: router/prompt_affinity.h) whenever it is among them.
int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude,
                 const std::vector<WorkerLoad>& decode, int blocks_needed, const std::vector<int>& exclude_decode,
                 int preferred = -1);

// The decode (or aggregated) worker for a request needing `blocks_needed` KV blocks: among up
// workers with that many free blocks, the one running the fewest sequences; when none has room
// now, the one with the most free blocks whose cache could ever hold the request (its engine
// queues it). Skips `exclude`; -1 when no worker could ever serve it.
// With `paired_with` (the chosen prefill worker), only decode workers kv_pairable with it.
// Worker `preferred` (-1 for none) goes first among those with room, and among those without.
int pick_decode(const std::vector<WorkerLoad>& workers, int blocks_needed, const std::vector<int>& exclude,
                const WorkerLoad* paired_with = nullptr, int preferred = -1);

// The index of the worker at `address` among `workers` (registry indices, `address_of` giving
// each one's address); -1 when `address` is empty or not there.
int index_of(const std::vector<WorkerLoad>& workers, const std::string& address,
             const std::function<const std::string&(int)>& address_of);

// KV blocks a request occupies on a decode worker: its whole length, capped to the context.
int blocks_needed(int prompt_len, int max_tokens, int max_context, int block_size);

enum class Admission { kRun, kWait, kReject };

// A new request's fate given the requests running (sent to workers) and waiting at the router.
Admission admit(int running, int waiting, int max_running, int max_waiting);

}  // namespace pdserve::router
