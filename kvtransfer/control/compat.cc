#include "kvtransfer/control/compat.h"

namespace pdserve::kvtransfer {

uint64_t compat_hash(std::string_view model_id, const engine::KvCacheSpec& spec) {
  // FNV-1a over the model id, then a splitmix64 step to mix in the spec fingerprint.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : model_id) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  uint64_t z = h ^ (spec.fingerprint() + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace pdserve::kvtransfer
