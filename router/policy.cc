#include "router/policy.h"

#include <algorithm>
#include <functional>
#include <tuple>

namespace pdserve::router {
namespace {
bool excluded(const std::vector<int>& exclude, int index) {
  return std::find(exclude.begin(), exclude.end(), index) != exclude.end();
}

int pick_prefill_if(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude,
                    const std::function<bool(const WorkerLoad&)>& eligible, int preferred = -1) {
  const WorkerLoad* best = nullptr;
  for (const WorkerLoad& w : workers) {
    if (!w.up || excluded(exclude, w.index) || !eligible(w)) continue;
    if (w.index == preferred) return w.index;
    if (!best || std::tie(w.queued_prefill_tokens, w.running, w.index) <
                     std::tie(best->queued_prefill_tokens, best->running, best->index))
      best = &w;
  }
  return best ? best->index : -1;
}

}  // namespace

bool kv_pairable(const WorkerLoad& p, const WorkerLoad& d) {
  return p.compat_hash == d.compat_hash && p.kv_compat == d.kv_compat;
}

int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude) {
  return pick_prefill_if(workers, exclude, [](const WorkerLoad&) { return true; });
}

int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude,
                 const std::vector<WorkerLoad>& decode, int blocks_needed, const std::vector<int>& exclude_decode,
                 int preferred) {
  return pick_prefill_if(
      workers, exclude,
      [&](const WorkerLoad& p) {
        return std::any_of(decode.begin(), decode.end(), [&](const WorkerLoad& d) {
          return d.up && !excluded(exclude_decode, d.index) && d.num_blocks >= blocks_needed && kv_pairable(p, d);
        });
      },
      preferred);
}

int pick_decode(const std::vector<WorkerLoad>& workers, int blocks_needed, const std::vector<int>& exclude,
                const WorkerLoad* paired_with, int preferred) {
  const WorkerLoad* with_room = nullptr;
  const WorkerLoad* fallback = nullptr;
  auto other = [preferred](const WorkerLoad& w) { return w.index != preferred; };
  for (const WorkerLoad& w : workers) {
    if (!w.up || excluded(exclude, w.index) || w.num_blocks < blocks_needed) continue;
    if (paired_with && !kv_pairable(*paired_with, w)) continue;
    if (w.free_blocks >= blocks_needed) {
      if (!with_room || std::make_tuple(other(w), w.running, w.waiting, w.index) <
                            std::make_tuple(other(*with_room), with_room->running, with_room->waiting, with_room->index))
        with_room = &w;
    } else if (!fallback || std::make_tuple(other(w), -w.free_blocks, w.running, w.index) <
                                std::make_tuple(other(*fallback), -fallback->free_blocks, fallback->running,
                                                fallback->index)) {
      fallback = &w;
    }
  }
  if (with_room) return with_room->index;
  return fallback ? fallback->index : -1;
}

int index_of(const std::vector<WorkerLoad>& workers, const std::string& address,
             const std::function<const std::string&(int)>& address_of) {
  if (address.empty()) return -1;
  for (const WorkerLoad& w : workers)
    if (address_of(w.index) == address) return w.index;
  return -1;
}

int blocks_needed(int prompt_len, int max_tokens, int max_context, int block_size) {
  if (block_size <= 0) return 0;
  const int64_t tokens = std::min<int64_t>(int64_t(prompt_len) + max_tokens, max_context);
  return int((tokens + block_size - 1) / block_size);
}

Admission admit(int running, int waiting, int max_running, int max_waiting) {
  // Waiting requests go first, so a newcomer runs only when nobody is queued ahead of it.
  if (running < max_running && waiting == 0) return Admission::kRun;
  if (waiting < max_waiting) return Admission::kWait;
  return Admission::kReject;
}

}  // namespace pdserve::router
