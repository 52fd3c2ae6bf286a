// The router's decisions as pure functions over snapshots (worker load, cached prefix, queue
// depths), so they can be table-tested without workers: where a request goes (by load alone:
// prefill by queued prompt tokens, decode by running sequences among those with room; or by
// cache: the cost formulas below, docs/router.md "Placement"), and whether it runs, waits or
// is refused.
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
  int block_size = 0;        // Tokens per KV block.
  int cached_blocks = 0;     // Leading blocks of the request's prompt in its prefix cache (KvRouting).
  // When placement last chose it, as a sequence number (0: never), and when it last chose it
  // together with the prefill worker WorkerRegistry::loads was given (0: never, or no prefill
  // worker given). Equal loads go to the least recently paired, then the least recently chosen:
  // idle workers take turns (a burst whose prompts finish faster than they arrive does not all
  // land on the first one), and each prefill worker hands its KV to each decode worker in turn.
  uint64_t last_chosen = 0;
  uint64_t last_paired = 0;
};

// Cache-aware placement's terms (docs/router.md, "Placement"), in blocks. With them, placement
// weighs each worker's cached prefix (WorkerLoad::cached_blocks) against its load:
//   credit(w)       = min(cached_blocks(w), n), or 0 when the imbalance guard holds
//   prefill_cost(p) = max(queued_prefill_blocks(p) + n - credit(p), 0)
//   decode_cost(d)  = active_decode_blocks(d) + need_new(d) + tau * (n - credit(d)),
//                     need_new(d) = blocks_needed - credit(d)
// The guard is per candidate: no credit for a worker whose load exceeds both min_load +
// guard_blocks and guard_ratio * min_load (min over the candidates), so a hot prefix cannot
// pile every request onto one worker. When no candidate holds any of the prompt, placement is
// by load, exactly as without the terms.
struct CacheTerms {
  int prompt_blocks = 0;       // n: the prompt's full blocks.
  double transfer_weight = 1;  // tau: a block to transfer, in prefill-block equivalents.
  int64_t guard_blocks = 64;   // A (SGLang's default, in blocks).
  double guard_ratio = 1.5;    // R.
};

// Queued prompt tokens in blocks (rounded up); its load as a prefill worker.
int64_t queued_prefill_blocks(const WorkerLoad& w);
// Blocks in use (num_blocks - free_blocks); its load as a decode worker.
int64_t active_decode_blocks(const WorkerLoad& w);
// The cache credit of a worker with load `load` among candidates whose least is `min_load`.
int64_t cache_credit(const WorkerLoad& w, int64_t load, int64_t min_load, const CacheTerms& terms);
int64_t prefill_cost(const WorkerLoad& p, int64_t min_load, const CacheTerms& terms);
double decode_cost(const WorkerLoad& d, int blocks_needed, int64_t min_load, const CacheTerms& terms);
// The prefill tokens a dispatch of a `prompt_tokens` prompt adds to `p`'s queue as placement
// counts it (until the next Info poll): by load alone the whole prompt; with `cache` the full
// blocks it must compute (n - cached_blocks), as a queued request computing the same prefix
// shares them. So a burst of one prefix keeps tying, and staying, on the worker that has it.
int64_t dispatched_prefill_tokens(int prompt_tokens, const WorkerLoad& p, const CacheTerms* cache);

// Whether prefill worker `p` may hand KV to decode worker `d`: the same KV geometry and the
// same deployment label, so the old and new generations of a rolling upgrade never pair.
bool kv_pairable(const WorkerLoad& p, const WorkerLoad& d);

// The up prefill worker with the fewest queued prefill tokens (then fewest running, then least
// recently chosen, then lowest index), skipping indices in `exclude`; -1 when there is none.
int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude);

// The same, among prefill workers that some decode worker in `decode` (up, not in
// `exclude_decode`, whose cache could ever hold `blocks_needed`) is kv_pairable with; worker
// `preferred` (an index, -1 for none: router/prompt_affinity.h) whenever it is among them.
// With `cache`: the least prefill_cost instead of the fewest queued tokens; equal costs go to
// the larger credit, then as before.
int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude,
                 const std::vector<WorkerLoad>& decode, int blocks_needed, const std::vector<int>& exclude_decode,
                 int preferred = -1, const CacheTerms* cache = nullptr);

// The decode (or aggregated) worker for a request needing `blocks_needed` KV blocks: among up
// workers with that many free blocks, the one running the fewest sequences; when none has room
// now, the one with the most free blocks whose cache could ever hold the request (its engine
// queues it). Ties among those with room: fewest waiting, then least recently paired, least
// recently chosen, lowest index; among those without: fewest running, then the same. Skips
// `exclude`; -1 when no worker could ever serve it.
// With `paired_with` (the chosen prefill worker), only decode workers kv_pairable with it.
// Worker `preferred` (-1 for none) goes first among those with room, and among those without.
// With `cache`: among those with room, the least decode_cost instead of the fewest running.
int pick_decode(const std::vector<WorkerLoad>& workers, int blocks_needed, const std::vector<int>& exclude,
                const WorkerLoad* paired_with = nullptr, int preferred = -1, const CacheTerms* cache = nullptr);

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
