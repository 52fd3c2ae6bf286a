// splitmix64 (Steele, Lea and Flood, 2014): a 64-bit finaliser that turns nearby inputs (seeds
// 1, 2, 3; a layer and a position) into unrelated outputs. The one copy that seeded generators,
// workloads and test patterns share.
#pragma once

#include <cstdint>

namespace pdserve {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace pdserve
