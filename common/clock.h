// An injectable clock, so that leases, deadlines and timeouts are testable without sleeping
// (the Envoy pattern): production code takes a Clock&, tests pass a FakeClock and advance it.
#pragma once

#include <atomic>
#include <chrono>

namespace pdserve {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic now.
  virtual TimePoint now() const = 0;
};

// The steady system clock.
class RealClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  // A process-wide instance for code that has no clock injected.
  static RealClock& instance() {
    static RealClock clock;
    return clock;
  }
};

// A clock that moves only when told to; safe to read from several threads.
class FakeClock final : public Clock {
 public:
  TimePoint now() const override { return TimePoint(Duration(ns_.load())); }
  void advance(Duration d) { ns_ += d.count(); }

 private:
  std::atomic<int64_t> ns_{1'000'000'000};
};

}  // namespace pdserve
