// The ids of requests an endpoint recently finished or aborted, and why they ended: a bounded
// memory (oldest forgotten first) so that a late message about such a request is told apart
// from one about a request never seen (a stale WRITE_DONE is ignored, a late start of an
// aborted id refused, a checksum request answered with the reason), without growing forever.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <string>

namespace pdserve::kvtransfer {

class FinishedIds {
 public:
  explicit FinishedIds(size_t capacity) : capacity_(capacity) {}

  // Remembers `id` (the first reason given wins); forgets the oldest beyond the capacity.
  void remember(const std::string& id, const std::string& why);
  // Why `id` ended, or null when it is not (or no longer) remembered.
  const std::string* find(const std::string& id) const;
  bool contains(const std::string& id) const { return find(id) != nullptr; }
  size_t size() const { return why_.size(); }

 private:
  size_t capacity_;
  std::map<std::string, std::string> why_;
  std::deque<std::string> order_;  // Oldest first.
};

}  // namespace pdserve::kvtransfer
