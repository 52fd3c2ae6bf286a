// The router's decisions as pure functions over snapshots (worker load, queue depths), so they
// can be table-tested without workers: where a request goes (prefill by queued prompt tokens,
// decode by running sequences among those with room), and whether it runs, waits or is refused.
#pragma once

#include <cstdint>
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
};

// The up prefill worker with the fewest queued prefill tokens (then fewest running, then lowest
// index), skipping indices in `exclude`; -1 when there is none.
int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude);

// The decode (or aggregated) worker for a request needing `blocks_needed` KV blocks: among up
// workers with that many free blocks, the one running the fewest sequences; when none has room
// now, the one with the most free blocks whose cache could ever hold the request (its engine
// queues it). Skips `exclude`; -1 when no worker could ever serve it.
int pick_decode(const std::vector<WorkerLoad>& workers, int blocks_needed, const std::vector<int>& exclude);

// KV blocks a request occupies on a decode worker: its whole length, capped to the context.
int blocks_needed(int prompt_len, int max_tokens, int max_context, int block_size);

enum class Admission { kRun, kWait, kReject };

// A new request's fate given the requests running (sent to workers) and waiting at the router.
Admission admit(int running, int waiting, int max_running, int max_waiting);

}  // namespace pdserve::router
