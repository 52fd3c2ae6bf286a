#include "kvtransfer/finished_ids.h"

namespace pdserve::kvtransfer {

void FinishedIds::remember(const std::string& id, const std::string& why) {
  if (!why_.emplace(id, why).second) return;
  order_.push_back(id);
  while (order_.size() > capacity_) {
    why_.erase(order_.front());
    order_.pop_front();
  }
}

const std::string* FinishedIds::find(const std::string& id) const {
  auto it = why_.find(id);
  return it == why_.end() ? nullptr : &it->second;
}

}  // namespace pdserve::kvtransfer
