// RankProgress: where each of a worker's TP ranks stands with one request's KV transfer, for the
// prefill and decode roles (worker/prefill_role.h, worker/decode_role.h). A role posts a command
// to every rank's kvtransfer endpoint and hears back from each on its own thread; a request is
// over for the engine's blocks only when every rank let go of them. One bitset per rank instead
// of parallel per-rank vectors, so a rank's state is read and written in one place.
#pragma once

#include <cstdint>
#include <vector>

namespace pdserve::worker {

class RankProgress {
 public:
  enum Mark : uint8_t {
    kPosted = 1,    // The rank ran the role's command (registered the request, sealed, held).
    kReady = 2,     // Decode: the rank's share of the KV is in its blocks.
    kReleased = 4,  // The rank gave the request's blocks back (or never took them).
  };

  RankProgress() = default;
  explicit RankProgress(int tp) : marks_(size_t(tp), 0) {}

  void mark(int rank, Mark m) { marks_.at(size_t(rank)) |= m; }
  bool has(int rank, Mark m) const { return (marks_.at(size_t(rank)) & m) != 0; }
  // Whether every rank has `m`.
  bool all(Mark m) const {
    for (uint8_t v : marks_)
      if (!(v & m)) return false;
    return true;
  }
  // Whether every rank has one of the marks in `any` (a bitwise or of Marks).
  bool all_of_any(uint8_t any) const {
    for (uint8_t v : marks_)
      if (!(v & any)) return false;
    return true;
  }
  // The blocks are the engine's again: every rank let go of them.
  bool all_released() const { return all(kReleased); }
  int tp() const { return int(marks_.size()); }

 private:
  std::vector<uint8_t> marks_;
};

}  // namespace pdserve::worker
