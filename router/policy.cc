#include "router/policy.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <tuple>

namespace pdserve::router {
namespace {
bool excluded(const std::vector<int>& exclude, int index) {
  return std::find(exclude.begin(), exclude.end(), index) != exclude.end();
}

bool any_cached(const std::vector<const WorkerLoad*>& workers) {
  return std::any_of(workers.begin(), workers.end(), [](const WorkerLoad* w) { return w->cached_blocks > 0; });
}

int pick_prefill_if(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude,
                    const std::function<bool(const WorkerLoad&)>& eligible, int preferred = -1,
                    const CacheTerms* cache = nullptr) {
  std::vector<const WorkerLoad*> candidates;
  for (const WorkerLoad& w : workers) {
    if (!w.up || excluded(exclude, w.index) || !eligible(w)) continue;
    if (w.index == preferred) return w.index;
    candidates.push_back(&w);
  }
  if (!any_cached(candidates)) cache = nullptr;  // Nothing cached anywhere: by load, as without.
  int64_t min_load = std::numeric_limits<int64_t>::max();
  for (const WorkerLoad* w : candidates) min_load = std::min(min_load, queued_prefill_blocks(*w));
  // Load alone: every cost is 0 and the ties decide.
  // Equal costs go to the larger credit: a burst of one prefix stays where its blocks are (or
  // are being computed), rather than computing them again elsewhere for the same cost.
  auto cost = [&](const WorkerLoad& w) {
    if (!cache) return std::pair<int64_t, int64_t>(0, 0);
    return std::pair(prefill_cost(w, min_load, *cache),
                     -cache_credit(w, queued_prefill_blocks(w), min_load, *cache));
  };
  const WorkerLoad* best = nullptr;
  std::pair<int64_t, int64_t> best_cost;
  for (const WorkerLoad* w : candidates) {
    const std::pair<int64_t, int64_t> c = cost(*w);
    if (!best || std::tie(c, w->queued_prefill_tokens, w->running, w->last_chosen, w->index) <
                     std::tie(best_cost, best->queued_prefill_tokens, best->running, best->last_chosen, best->index)) {
      best = w;
      best_cost = c;
    }
  }
  return best ? best->index : -1;
}

}  // namespace

int64_t queued_prefill_blocks(const WorkerLoad& w) {
  if (w.block_size <= 0) return 0;
  return (w.queued_prefill_tokens + w.block_size - 1) / w.block_size;
}

int64_t active_decode_blocks(const WorkerLoad& w) { return std::max(w.num_blocks - w.free_blocks, 0); }

int64_t cache_credit(const WorkerLoad& w, int64_t load, int64_t min_load, const CacheTerms& terms) {
  if (load > min_load + terms.guard_blocks && double(load) > terms.guard_ratio * double(min_load)) return 0;
  return std::clamp<int64_t>(w.cached_blocks, 0, terms.prompt_blocks);
}

int64_t prefill_cost(const WorkerLoad& p, int64_t min_load, const CacheTerms& terms) {
  const int64_t load = queued_prefill_blocks(p);
  return std::max<int64_t>(load + terms.prompt_blocks - cache_credit(p, load, min_load, terms), 0);
}

double decode_cost(const WorkerLoad& d, int blocks_needed, int64_t min_load, const CacheTerms& terms) {
  const int64_t load = active_decode_blocks(d);
  const int64_t credit = cache_credit(d, load, min_load, terms);
  const int64_t need_new = std::max<int64_t>(blocks_needed - credit, 0);
  return double(load + need_new) + terms.transfer_weight * double(terms.prompt_blocks - credit);
}

int64_t dispatched_prefill_tokens(int prompt_tokens, const WorkerLoad& p, const CacheTerms* cache) {
  if (!cache || p.block_size <= 0) return prompt_tokens;
  return int64_t(cache->prompt_blocks - std::clamp(p.cached_blocks, 0, cache->prompt_blocks)) * p.block_size;
}

bool kv_pairable(const WorkerLoad& p, const WorkerLoad& d) {
  return p.compat_hash == d.compat_hash && p.kv_compat == d.kv_compat;
}

int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude) {
  return pick_prefill_if(workers, exclude, [](const WorkerLoad&) { return true; });
}

int pick_prefill(const std::vector<WorkerLoad>& workers, const std::vector<int>& exclude,
                 const std::vector<WorkerLoad>& decode, int blocks_needed, const std::vector<int>& exclude_decode,
                 int preferred, const CacheTerms* cache) {
  return pick_prefill_if(
      workers, exclude,
      [&](const WorkerLoad& p) {
        return std::any_of(decode.begin(), decode.end(), [&](const WorkerLoad& d) {
          return d.up && !excluded(exclude_decode, d.index) && d.num_blocks >= blocks_needed && kv_pairable(p, d);
        });
      },
      preferred, cache);
}

int pick_decode(const std::vector<WorkerLoad>& workers, int blocks_needed, const std::vector<int>& exclude,
                const WorkerLoad* paired_with, int preferred, const CacheTerms* cache) {
  std::vector<const WorkerLoad*> room, no_room;
  for (const WorkerLoad& w : workers) {
    if (!w.up || excluded(exclude, w.index) || w.num_blocks < blocks_needed) continue;
    if (paired_with && !kv_pairable(*paired_with, w)) continue;
    (w.free_blocks >= blocks_needed ? room : no_room).push_back(&w);
  }
  auto other = [preferred](const WorkerLoad& w) { return w.index != preferred; };
  if (!any_cached(room)) cache = nullptr;  // Nothing cached anywhere: by load, as without.
  int64_t min_load = std::numeric_limits<int64_t>::max();
  for (const WorkerLoad* w : room) min_load = std::min(min_load, active_decode_blocks(*w));
  // Load alone: every cost is 0 and the running sequences decide.
  auto cost = [&](const WorkerLoad& w) { return cache ? decode_cost(w, blocks_needed, min_load, *cache) : 0.0; };
  const WorkerLoad* with_room = nullptr;
  double best_cost = 0;
  for (const WorkerLoad* w : room) {
    const double c = cost(*w);
    if (!with_room || std::make_tuple(other(*w), c, w->running, w->waiting, w->last_paired, w->last_chosen, w->index) <
                          std::make_tuple(other(*with_room), best_cost, with_room->running, with_room->waiting,
                                          with_room->last_paired, with_room->last_chosen, with_room->index)) {
      with_room = w;
      best_cost = c;
    }
  }
  if (with_room) return with_room->index;
  const WorkerLoad* fallback = nullptr;
  for (const WorkerLoad* w : no_room) {
    if (!fallback || std::make_tuple(other(*w), -w->free_blocks, w->running, w->last_paired, w->last_chosen, w->index) <
                         std::make_tuple(other(*fallback), -fallback->free_blocks, fallback->running,
                                         fallback->last_paired, fallback->last_chosen, fallback->index))
      fallback = w;
  }
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
