// The sequences one simulated engine is decoding (tune/sim.cc): how many (B), their context
// tokens in all (ΣK, what DecodeLaw is timed on), and who produces its last token at which step,
// kept so a step costs O(log B) for the ones that finish instead of O(B) for every sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace pdserve::tune {

class DecodeBatch {
 public:
  // Starts the next step; sequences join only between begin_step() and the step's timing.
  void begin_step() { ++step_; }
  // Adds sequence `id` (prompt `prompt` tokens, `steps` > 0 decode steps to run) to the step
  // just begun: it attends to its prompt and the first token, prompt + 1 tokens.
  void join(int id, int prompt, int steps);
  // Ends the step: every sequence gained one token; returns those that produced their last.
  std::vector<int> end_step();

  int batch() const { return batch_; }
  int64_t context_tokens() const { return context_; }

 private:
  struct Finish {
    int64_t step;
    int id;
    int64_t final_context;  // Its context after its last step.
    bool operator>(const Finish& o) const { return step != o.step ? step > o.step : id > o.id; }
  };
  int64_t step_ = 0;
  int batch_ = 0;
  int64_t context_ = 0;
  std::priority_queue<Finish, std::vector<Finish>, std::greater<>> finishing_;
};

}  // namespace pdserve::tune
