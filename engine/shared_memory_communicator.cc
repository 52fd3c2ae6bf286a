// Shared-memory collectives for rank threads in one process. Each collective is two phases
// separated by barriers: ranks publish their buffers, then each rank reduces its own slice of
// the elements (rank order, so the result is deterministic) into shared scratch, then copies
// the whole result out. The barrier that opens the next collective keeps scratch from being
// overwritten while a slow rank still copies.
#include <atomic>
#include <cstring>
#include <vector>

#include "engine/communicator.h"
#include "engine/spin_barrier.h"
#include "engine/tp_shard.h"

namespace pdserve::engine {
namespace {

struct SharedState;
// Runs once per barrier phase, when every rank has arrived (so nobody reads scratch): grows it.
struct GrowScratch {
  SharedState* state;
  void operator()() noexcept;
};

struct SharedState {
  explicit SharedState(int n) : size(n), sync(n, GrowScratch{this}), buffers(n), inputs(n) {}
  int size;
  std::atomic<int64_t> wanted{0};
  SpinBarrier<GrowScratch> sync;
  std::vector<float*> buffers;
  std::vector<const float*> inputs;
  const int* broadcast_from = nullptr;
  std::vector<float> scratch;
};

void GrowScratch::operator()() noexcept {
  const int64_t n = state->wanted.load();
  if (int64_t(state->scratch.size()) < n) state->scratch.resize(n);
}

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(std::shared_ptr<SharedState> state, int rank)
      : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }

  void all_reduce_sum(float* buffer, int64_t count) override {
    if (state_->size == 1) return;
    state_->buffers[rank_] = buffer;
    state_->wanted.store(count);
    state_->sync.arrive_and_wait();
    const Range mine = even_split(int(count), state_->size, rank_);
    float* scratch = state_->scratch.data();
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < state_->size; ++r) sum += state_->buffers[r][i];
      scratch[i] = sum;
    }
    state_->sync.arrive_and_wait();
    std::memcpy(buffer, scratch, sizeof(float) * count);
    // The opening barrier of the next collective protects scratch; a trailing one is needed only
    // when the caller reuses a peer's buffer, which no caller does.
  }

  void all_gather(const float* in, int64_t count, float* out) override {
    if (state_->size == 1) {
      std::memcpy(out, in, sizeof(float) * count);
      return;
    }
    state_->inputs[rank_] = in;
    state_->sync.arrive_and_wait();
    for (int r = 0; r < state_->size; ++r)
      std::memcpy(out + r * count, state_->inputs[r], sizeof(float) * count);
    state_->sync.arrive_and_wait();
  }

  void broadcast(int* buffer, int64_t count, int root) override {
    if (state_->size == 1) return;
    if (rank_ == root) state_->broadcast_from = buffer;
    state_->sync.arrive_and_wait();
    if (rank_ != root) std::memcpy(buffer, state_->broadcast_from, sizeof(int) * count);
    state_->sync.arrive_and_wait();  // The root's buffer is read before its caller changes it.
  }
  void check_async_errors() override {}  // Its collectives are done when they return.
  void barrier() override {
    if (state_->size > 1) state_->sync.arrive_and_wait();
  }

 private:
  std::shared_ptr<SharedState> state_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_shared_memory_group(int size) {
  auto state = std::make_shared<SharedState>(size);
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < size; ++r) group.push_back(std::make_unique<SharedMemoryCommunicator>(state, r));
  return group;
}

}  // namespace pdserve::engine
