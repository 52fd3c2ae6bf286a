#include "tune/decode_batch.h"

namespace pdserve::tune {

void DecodeBatch::join(int id, int prompt, int steps) {
  ++batch_;
  context_ += prompt + 1;
  // Each step adds a token to its context, so after its last it is prompt + 1 + steps.
  finishing_.push({step_ + steps - 1, id, int64_t(prompt) + steps + 1});
}

std::vector<int> DecodeBatch::end_step() {
  context_ += batch_;
  std::vector<int> done;
  while (!finishing_.empty() && finishing_.top().step == step_) {
    const Finish f = finishing_.top();
    finishing_.pop();
    --batch_;
    context_ -= f.final_context;
    done.push_back(f.id);
  }
  return done;
}

}  // namespace pdserve::tune
