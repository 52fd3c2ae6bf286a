#include "engine/prefix/prefix_index.h"

#include <algorithm>

namespace pdserve::engine {

PrefixIndex::PrefixIndex(int num_blocks, int block_size, KvEventSink* sink, KvTier tier)
    : block_size_(block_size), sink_(sink), tier_(tier), meta_(size_t(num_blocks)), tokens_(size_t(num_blocks) * block_size) {}

std::span<const int32_t> PrefixIndex::tokens_of(int block) const {
  return {tokens_.data() + size_t(block) * block_size_, size_t(block_size_)};
}

bool PrefixIndex::valid(const CachedLink& link) const {
  return link.block >= 0 && link.block < int(meta_.size()) && meta_[size_t(link.block)].cached &&
         meta_[size_t(link.block)].generation == link.generation;
}

bool PrefixIndex::same_content(const Meta& m, int block, const std::optional<CachedLink>& parent,
                               const BlockKey& ns_root, std::span<const int32_t> tokens) const {
  if (parent) {
    if (!valid(*parent) || m.parent != parent->block) return false;
  } else if (m.parent != -1 || m.ns_root != ns_root) {
    return false;
  }
  const auto have = tokens_of(block);
  return tokens.size() == have.size() && std::equal(tokens.begin(), tokens.end(), have.begin());
}

std::optional<CachedLink> PrefixIndex::match(const BlockKey& key, const std::optional<CachedLink>& parent,
                                             const BlockKey& ns_root, std::span<const int32_t> tokens) {
  const auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  const int b = it->second;
  if (!same_content(meta_[size_t(b)], b, parent, ns_root, tokens)) {
    ++collisions_;
    return std::nullopt;
  }
  return CachedLink{b, meta_[size_t(b)].generation};
}

std::optional<CachedLink> PrefixIndex::insert(int block, const BlockKey& key, const std::optional<CachedLink>& parent,
                                              const BlockKey& ns_root, uint32_t index,
                                              std::span<const int32_t> tokens) {
  if (parent && !valid(*parent)) return std::nullopt;
  if (int(tokens.size()) != block_size_) return std::nullopt;
  if (const auto it = map_.find(key); it != map_.end()) {
    const int b = it->second;
    if (same_content(meta_[size_t(b)], b, parent, ns_root, tokens)) return CachedLink{b, meta_[size_t(b)].generation};
    ++collisions_;
    return std::nullopt;
  }
  Meta& m = meta_[size_t(block)];
  if (m.cached) return std::nullopt;  // Cached under another key: not this content's block.
  m.cached = true;
  m.key = key;
  m.ns_root = ns_root;
  m.parent = parent ? parent->block : -1;
  m.children.clear();
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + int64_t(block) * block_size_);
  map_.emplace(key, block);
  std::optional<BlockKey> parent_key;
  if (parent) {
    meta_[size_t(parent->block)].children.push_back(block);
    parent_key = meta_[size_t(parent->block)].key;
  }
  if (sink_) sink_->stored(tier_, parent_key, std::span<const BlockKey>(&m.key, 1), index, tokens);
  return CachedLink{block, m.generation};
}

void PrefixIndex::uncache(int block, std::vector<int>* uncached) {
  if (!meta_[size_t(block)].cached) return;
  if (const int p = meta_[size_t(block)].parent; p >= 0) std::erase(meta_[size_t(p)].children, block);
  std::vector<BlockKey> keys;
  std::vector<int> stack{block};
  while (!stack.empty()) {
    const int b = stack.back();
    stack.pop_back();
    Meta& m = meta_[size_t(b)];
    m.cached = false;
    ++m.generation;
    map_.erase(m.key);
    keys.push_back(m.key);
    uncached->push_back(b);
    stack.insert(stack.end(), m.children.begin(), m.children.end());
    m.children.clear();
    m.parent = -1;
  }
  if (sink_) sink_->removed(tier_, keys);
}

void PrefixIndex::clear(std::vector<int>* uncached) {
  for (int b = 0; b < int(meta_.size()); ++b) {
    Meta& m = meta_[size_t(b)];
    if (!m.cached) continue;
    m.cached = false;
    ++m.generation;
    m.children.clear();
    m.parent = -1;
    uncached->push_back(b);
  }
  map_.clear();
  if (sink_) sink_->cleared(tier_);
}

std::vector<BlockKey> PrefixIndex::keys() const {
  std::vector<BlockKey> out;
  out.reserve(map_.size());
  for (const auto& [key, block] : map_) out.push_back(key);
  return out;
}

bool PrefixIndex::consistent() const {
  size_t cached = 0;
  for (int b = 0; b < int(meta_.size()); ++b) {
    const Meta& m = meta_[size_t(b)];
    if (!m.cached) {
      if (!m.children.empty()) return false;
      continue;
    }
    ++cached;
    const auto it = map_.find(m.key);
    if (it == map_.end() || it->second != b) return false;
    if (m.parent >= 0) {
      const Meta& p = meta_[size_t(m.parent)];
      if (!p.cached || std::count(p.children.begin(), p.children.end(), b) != 1) return false;
    }
    for (int c : m.children)
      if (!meta_[size_t(c)].cached || meta_[size_t(c)].parent != b) return false;
  }
  return cached == map_.size();
}

}  // namespace pdserve::engine
