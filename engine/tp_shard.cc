#include "engine/tp_shard.h"

namespace pdserve::engine {

bool kv_heads_divide(int num_heads, int tp) {
  if (num_heads <= 0 || tp <= 0) return false;
  return num_heads >= tp ? num_heads % tp == 0 : tp % num_heads == 0;
}

Range kv_heads_of_rank(int num_heads, int tp, int rank) {
  if (num_heads >= tp) {
    const int per = num_heads / tp;
    return {rank * per, (rank + 1) * per};
  }
  const int replicas = tp / num_heads;
  const int head = rank / replicas;
  return {head, head + 1};
}

Range even_split(int n, int parts, int index) {
  const int base = n / parts, extra = n % parts;
  const int begin = index * base + (index < extra ? index : extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

}  // namespace pdserve::engine
