// One worker process of the multi-process kvtransfer tests: a producer (prefill) or consumer
// (decode) worker holding one TP group per size in --tps, each rank a thread with its own
// KvRankEndpoint and arena, as pdserve's workers run them. It prints its endpoints, then takes
// line commands on stdin and prints what happened on stdout (one line per event; see
// kv_session_test.cc for the protocol). Data is filled and verified with kv_fill.h.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "kvtransfer/kv_endpoint.h"
#include "tests/kvtransfer/kv_fill.h"
#include "tests/kvtransfer/kv_sim.h"

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

struct Args {
  bool producer = true;
  std::vector<int> tps{1};
  int blocks = 8;
  std::string model = "kv-test-model";
  // Generous defaults: the matrix runs 16 rank threads per process on small shared machines;
  // the fault tests pass short timeouts explicitly.
  int peer_timeout_ms = 15000, heartbeat_ms = 100, connect_timeout_ms = 10000;
  int quarantine_ms = 500, layer_delay_ms = 0;
  bool checksums = false, drop_notifications = false, corrupt = false;
  std::string mutate;
};

std::mutex out_mu;
template <typename... T>
void say(const char* fmt, T... args) {
  std::lock_guard<std::mutex> lock(out_mu);
  std::printf(fmt, args...);
  std::printf("\n");
  std::fflush(stdout);
}

std::vector<int> ints(const std::string& csv) {
  std::vector<int> out;
  for (auto piece : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(piece, &v)) v = -1;
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> strings(const std::string& csv) {
  if (csv == "-") return {};
  return absl::StrSplit(csv, ',', absl::SkipEmpty());
}

engine::KvCacheSpec mutated(const engine::KvCacheSpec& spec, const std::string& how) {
  engine::KvCacheSpec out = spec;
  for (auto& layer : out.layers) {
    if (how == "order") {
      layer.order = layer.order == engine::KvOrder::kTokenMajor ? engine::KvOrder::kHeadMajor
                                                                : engine::KvOrder::kTokenMajor;
    } else if (how == "layer0") {
      layer = spec.layers[0];
    }
  }
  return out;
}

// What a consumer arena holds before a request: its skipped blocks must still hold it after.
constexpr uint8_t kSentinel = 0xEE;

class Rank {
 public:
  Rank(const Args& args, const engine::KvCacheSpec& spec, int tp, int rank)
      : args_(args), tp_(tp), rank_(rank) {
    const uint64_t bytes =
        engine::KvCacheLayout::create(spec, rank, tp, args.blocks).value().total_bytes();
    arena_.assign(bytes, kSentinel);
    KvEndpointOptions o;
    o.spec = spec;
    o.model_id = args.model;
    o.side = args.producer ? SessionSide::kProducer : SessionSide::kConsumer;
    o.tp = tp;
    o.rank = rank;
    o.arena = arena_.data();
    o.num_blocks = args.blocks;
    o.heartbeat_interval = std::chrono::milliseconds(args.heartbeat_ms);
    o.peer_timeout = std::chrono::milliseconds(args.peer_timeout_ms);
    o.connect_timeout = std::chrono::milliseconds(args.connect_timeout_ms);
    o.quarantine = std::chrono::milliseconds(args.quarantine_ms);
    o.checksums = args.checksums;
    o.name = args.producer ? "producer" : "consumer";
    o.on_release = [this](const std::string& id, std::vector<int> blocks) {
      say("RELEASED %s %d %d %zu", id.c_str(), tp_, rank_, blocks.size());
    };
    o.test_faults.drop_notifications = args.drop_notifications ? 1.0 : 0.0;
    o.test_faults.corrupt_received = args.corrupt;
    if (args.mutate == "order" || args.mutate == "layer0") {
      o.test_faults.planning_spec = mutated(spec, args.mutate);
    } else if (args.mutate == "rotate") {
      o.test_faults.mutate_map = [](RankMap& map) {
        for (auto& entries : map.receives) {
          for (auto& e : entries) e.producer_rank = (e.producer_rank + 1) % map.producer_tp;
        }
      };
    }
    auto endpoint = KvRankEndpoint::create(std::move(o));
    if (!endpoint.ok()) {
      std::fprintf(stderr, "endpoint: %s\n", endpoint.status().ToString().c_str());
      std::exit(2);
    }
    endpoint_ = std::move(*endpoint);
  }

  const std::string& endpoint() const { return endpoint_->control_endpoint(); }

  void start() { thread_ = std::thread([this] { loop(); }); }
  void command(std::vector<std::string> words) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(words));
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    while (!stop_) {
      std::vector<std::string> words;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!queue_.empty()) {
          words = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      if (!words.empty()) run(words);
      pump(2ms);
    }
    const KvEndpointCounters c = endpoint_->counters();
    say("COUNTERS %d %d refused=%llu duplicates=%llu stale=%llu expired=%llu failures=%llu open=%zu",
        tp_, rank_, (unsigned long long)c.refused, (unsigned long long)c.duplicates_ignored,
        (unsigned long long)c.stale_ignored, (unsigned long long)c.leases_expired,
        (unsigned long long)c.failures, endpoint_->open_requests());
  }

  void pump(Duration d) {
    for (const KvTransferEvent& e : endpoint_->progress(d)) {
      const char* kind = e.kind == KvTransferEvent::Kind::kReady      ? "ready"
                         : e.kind == KvTransferEvent::Kind::kComplete ? "complete"
                                                                      : "failed";
      int64_t wrong = -1, kept = -1;
      if (e.kind == KvTransferEvent::Kind::kReady) {
        const std::vector<int>& blocks = blocks_[e.request_id];
        const int skip = skips_[e.request_id];
        wrong = testing::count_wrong(endpoint_->layout(), arena_.data(), blocks,
                                     testing::request_salt(e.request_id), 1, skip);
        // Skipped blocks hold the consumer's own KV (here the sentinel): bytes changed there.
        kept = testing::count_not_sentinel(endpoint_->layout(), arena_.data(),
                                           std::vector<int>(blocks.begin(), blocks.begin() + skip),
                                           kSentinel);
      }
      const std::string first = e.first_token ? std::to_string(*e.first_token) : "-";
      say("EVENT %s %d %d %s wrong=%lld touched=%lld first=%s error=%s", e.request_id.c_str(), tp_,
          rank_, kind, (long long)wrong, (long long)kept, first.c_str(),
          e.error.ok() ? "" : e.error.ToString().c_str());
    }
  }

  void ack(const std::string& id, const Status& st) {
    say("ACK %s %d %d %s", id.c_str(), tp_, rank_, st.ok() ? "OK" : st.ToString().c_str());
  }

  void run(const std::vector<std::string>& w) {
    const std::string& cmd = w[0];
    const std::string& id = w[1];
    auto num = [&](size_t i) { return std::atoi(w.at(i).c_str()); };
    // Optional trailing words: skip=k (skip_blocks), stall=k (push: stop after layer k).
    auto option = [&](const char* name, int none) {
      const std::string prefix = std::string(name) + "=";
      for (size_t i = 6; i < w.size(); ++i) {
        if (w[i].rfind(prefix, 0) == 0) return std::atoi(w[i].c_str() + prefix.size());
      }
      return none;
    };
    const int skip = option("skip", 0);
    if (cmd == "push") {  // push id P C lease eps pblocks cblocks [stall=k] [skip=k]
      PushRequest r{id, num(3), strings(w[5]), ints(w[6]), ints(w[7]),
                    std::chrono::milliseconds(num(4))};
      r.skip_blocks = skip;
      const int stall = option("stall", -1);
      bool in_range = true;
      for (int b : r.producer_blocks) in_range &= b >= 0 && b < args_.blocks;
      if (in_range) {
        testing::fill_request(endpoint_->layout(), arena_.data(), r.producer_blocks,
                              testing::request_salt(id));
      }
      Status st = endpoint_->begin_push(r);
      ack(id, st);
      if (!st.ok()) return;
      for (int l = 0; l < endpoint_->layout().num_layers(); ++l) {
        const Status posted = endpoint_->layer_ready(id, l);
        if (!posted.ok()) return;
        say("POSTED %s %d %d %d", id.c_str(), tp_, rank_, l);
        if (l == stall) return;
        if (args_.layer_delay_ms > 0) {
          const auto until = std::chrono::steady_clock::now() +
                             std::chrono::milliseconds(args_.layer_delay_ms);
          while (std::chrono::steady_clock::now() < until) pump(2ms);
        }
      }
      (void)endpoint_->seal(id, rank_ == 0 ? std::optional<int32_t>(42) : std::nullopt);
    } else if (cmd == "expect") {  // expect id C P lease eps|- cblocks [skip=k]
      blocks_[id] = ints(w[6]);
      skips_[id] = skip;
      std::fill(arena_.begin(), arena_.end(), kSentinel);
      ExpectPushRequest r{id, num(3), blocks_[id], strings(w[5]), std::chrono::milliseconds(num(4))};
      r.skip_blocks = skip;
      ack(id, endpoint_->expect_push(r));
    } else if (cmd == "hold") {  // hold id P C lease pblocks
      HoldRequest r{id, ints(w[5]), num(3), std::chrono::milliseconds(num(4))};
      bool in_range = true;
      for (int b : r.producer_blocks) in_range &= b >= 0 && b < args_.blocks;
      if (in_range) {
        testing::fill_request(endpoint_->layout(), arena_.data(), r.producer_blocks,
                              testing::request_salt(id));
      }
      ack(id, endpoint_->hold(r));
    } else if (cmd == "pull") {  // pull id C P lease eps pblocks cblocks [skip=k]
      blocks_[id] = ints(w[7]);
      skips_[id] = skip;
      std::fill(arena_.begin(), arena_.end(), kSentinel);
      PullRequest r{id, num(3), strings(w[5]), ints(w[6]), blocks_[id], std::chrono::milliseconds(num(4))};
      r.skip_blocks = skip;
      ack(id, endpoint_->pull(r));
    } else if (cmd == "abort") {
      ack(id, endpoint_->abort(id, "asked by the test"));
    }
  }

  const Args& args_;
  const int tp_, rank_;
  std::vector<uint8_t> arena_;
  std::unique_ptr<KvRankEndpoint> endpoint_;
  std::map<std::string, std::vector<int>> blocks_;
  std::map<std::string, int> skips_;  // Consumer: the request's skip_blocks.
  std::mutex mu_;
  std::deque<std::vector<std::string>> queue_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int run(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--role") args.producer = v == "producer";
    else if (k == "--tps") args.tps = ints(v);
    else if (k == "--blocks") args.blocks = std::atoi(v.c_str());
    else if (k == "--model") args.model = v;
    else if (k == "--peer-timeout-ms") args.peer_timeout_ms = std::atoi(v.c_str());
    else if (k == "--connect-timeout-ms") args.connect_timeout_ms = std::atoi(v.c_str());
    else if (k == "--quarantine-ms") args.quarantine_ms = std::atoi(v.c_str());
    else if (k == "--layer-delay-ms") args.layer_delay_ms = std::atoi(v.c_str());
    else if (k == "--checksums") args.checksums = v == "1";
    else if (k == "--drop-notifications") args.drop_notifications = v == "1";
    else if (k == "--corrupt") args.corrupt = v == "1";
    else if (k == "--mutate") args.mutate = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  init_logging();
  const engine::KvCacheSpec spec = testing::mixed_spec();
  std::map<int, std::vector<std::unique_ptr<Rank>>> groups;
  for (int tp : args.tps) {
    for (int r = 0; r < tp; ++r) {
      groups[tp].push_back(std::make_unique<Rank>(args, spec, tp, r));
      say("ENDPOINT %d %d %s", tp, r, groups[tp].back()->endpoint().c_str());
    }
  }
  for (auto& [tp, ranks] : groups) {
    for (auto& rank : ranks) rank->start();
  }
  say("READY");
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    if (words[0] == "quit") break;
    if (words.size() < 3) continue;
    // The group is the one of this process's role: producer commands name P, consumer ones C.
    const int tp = std::atoi(words[2].c_str());
    auto it = groups.find(tp);
    if (it == groups.end()) {
      say("ACK %s %d -1 no group of tp %d", words[1].c_str(), tp, tp);
      continue;
    }
    for (auto& rank : it->second) rank->command(words);
  }
  for (auto& [tp, ranks] : groups) {
    for (auto& rank : ranks) rank->stop();
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::kvtransfer

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  return pdserve::kvtransfer::run(argc, argv);
}
