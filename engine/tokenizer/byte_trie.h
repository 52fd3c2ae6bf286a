// A trie over the bytes of a set of strings, for "which of them start here" queries: the
// Unigram model's lattice (every vocabulary piece at each position) and the added-token
// matcher (the longest added token at each position). One hash map of edges keeps a
// 262k-piece vocabulary compact.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pdserve::engine {

class ByteTrie {
 public:
  // Adds `key` with `value` (>= 0); a key added twice keeps the first value.
  void insert(std::string_view key, int value);
  // Calls `found(length, value)` for every key that is a prefix of `text`, shortest first.
  template <typename Found>
  void for_each_prefix(std::string_view text, const Found& found) const {
    uint32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto it = edges_.find(edge_key(node, static_cast<unsigned char>(text[i])));
      if (it == edges_.end()) return;
      node = it->second;
      if (values_[node] >= 0) found(i + 1, values_[node]);
    }
  }

 private:
  static uint64_t edge_key(uint32_t node, unsigned char byte) {
    return (static_cast<uint64_t>(node) << 8) | byte;
  }
  std::unordered_map<uint64_t, uint32_t> edges_;
  std::vector<int> values_{-1};  // Per node: the value of the key ending there, or -1.
};

}  // namespace pdserve::engine
