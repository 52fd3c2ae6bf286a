#include "engine/tokenizer/byte_trie.h"

namespace pdserve::engine {

void ByteTrie::insert(std::string_view key, int value) {
  uint32_t node = 0;
  for (unsigned char byte : key) {
    const auto [it, added] = edges_.emplace(edge_key(node, byte), uint32_t(values_.size()));
    if (added) values_.push_back(-1);
    node = it->second;
  }
  if (values_[node] < 0) values_[node] = value;
}

}  // namespace pdserve::engine
