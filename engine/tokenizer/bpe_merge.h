// The merge loop shared by the BPE tokenizers (llama2.c's by score, tokenizer.json's by
// rank): repeatedly merge the adjacent pair with the highest priority (leftmost on ties)
// until no pair can merge. A heap over the live pairs
// with lazy invalidation makes this O(n log n) rather than the naive rescan's O(n^2) per text.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace pdserve::engine {

struct MergeCandidate {
  double priority;  // Higher merges first: a piece score, or minus a merge rank.
  int merged_id;
};

// `lookup(left_id, right_id)` returns the merge of that pair, if any.
template <typename PairLookup>
std::vector<int> merge_symbols(const std::vector<int>& symbols, const PairLookup& lookup) {
  struct Node {
    int id;
    int prev;
    int next;
    uint32_t generation;  // Bumped when the node's id changes, to spot stale heap entries.
    bool alive;
  };
  struct Entry {
    double priority;
    int left;
    int right;
    uint32_t left_generation;
    uint32_t right_generation;
    int merged_id;
    // Max-heap order: higher priority first, then the leftmost pair (node index = position).
    bool operator<(const Entry& other) const {
      if (priority != other.priority) return priority < other.priority;
      return left > other.left;
    }
  };
  const int n = static_cast<int>(symbols.size());
  std::vector<Node> nodes(n);
  for (int i = 0; i < n; ++i) nodes[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1, 0, true};
  std::priority_queue<Entry> heap;
  const auto push_pair = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::optional<MergeCandidate> merge = lookup(nodes[left].id, nodes[right].id);
    if (!merge) return;
    heap.push({merge->priority, left, right, nodes[left].generation, nodes[right].generation,
               merge->merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i, i + 1);
  while (!heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    Node& left = nodes[top.left];
    Node& right = nodes[top.right];
    if (!left.alive || !right.alive || left.next != top.right ||
        left.generation != top.left_generation || right.generation != top.right_generation) {
      continue;
    }
    left.id = top.merged_id;
    ++left.generation;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) nodes[right.next].prev = top.left;
    push_pair(left.prev, top.left);
    push_pair(top.left, left.next);
  }
  std::vector<int> merged;
  for (int i = n > 0 ? 0 : -1; i >= 0; i = nodes[i].next) merged.push_back(nodes[i].id);
  return merged;
}

}  // namespace pdserve::engine
