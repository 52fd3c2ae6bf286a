// How tensor parallelism splits a model: which KV heads, attention heads and MLP columns a
// rank owns. Pure functions, shared by the engine (to shard weights and size caches) and by
// kvtransfer's rank map (to know what each rank holds), so the two can never disagree.
#pragma once

#include "common/status.h"

namespace pdserve::engine {

// A half-open range [begin, end).
struct Range {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// The KV heads rank `rank` of `tp` holds out of `num_heads`. With num_heads >= tp, rank r owns
// [r*H/T, (r+1)*H/T) (requires H % T == 0); otherwise each head is replicated on T/H ranks and
// rank r holds head r / (T/H) (requires T % H == 0).
Range kv_heads_of_rank(int num_heads, int tp, int rank);

// Whether `num_heads` KV heads can be spread over `tp` ranks by the rule above.
bool kv_heads_divide(int num_heads, int tp);

// An even split of `n` items over `parts`: the first n % parts parts get one more. Used for
// MLP columns and vocabulary rows, which need not divide.
Range even_split(int n, int parts, int index);

}  // namespace pdserve::engine
