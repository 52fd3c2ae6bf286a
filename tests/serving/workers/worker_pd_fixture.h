// A prefill worker and a decode worker on loopback, and a test client that plays the router:
// push (Reserve with the prompt → Prefill skipping the decode worker's hit, beside Generate) and
// pull (Prefill → Generate from the kv_source, which reads only what the decode worker lacks).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/serving/workers/worker_client.h"
#include "tests/serving/workers/worker_process.h"

namespace pdserve::testing {

inline std::filesystem::path worker_log(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("pdserve_worker_" + name + "_" + std::to_string(getpid()) + ".log");
}

struct PdResult {
  grpc::Status prefill;
  worker::PrefillResponse prefill_response;
  Streamed decode;
  worker::ReserveResponse reserved;  // Push.
};

class PdPair {
 public:
  PdPair(int prefill_tp, int decode_tp, std::vector<std::string> extra_prefill = {},
         std::vector<std::string> extra_decode = {}) {
    const std::string tag = std::to_string(prefill_tp) + "_" + std::to_string(decode_tp);
    std::vector<std::string> p = {"--model", stories_bin(), "--tp", std::to_string(prefill_tp), "--kv-cache-bytes",
                                  "2097152"};
    std::vector<std::string> d = {"--role", "decode", "--model", stories_bin(), "--tp", std::to_string(decode_tp),
                                  "--kv-cache-bytes", "2097152"};
    p.insert(p.end(), extra_prefill.begin(), extra_prefill.end());
    d.insert(d.end(), extra_decode.begin(), extra_decode.end());
    prefill_ = std::make_unique<WorkerProcess>(prefill_binary(), p, worker_log("prefill_" + tag));
    decode_ = std::make_unique<WorkerProcess>(decode_binary(), d, worker_log("decode_" + tag));
    ready_ = prefill_->wait_ready(std::chrono::seconds(30)) && decode_->wait_ready(std::chrono::seconds(30));
    if (!ready_) return;
    prefill_stub_ = connect(prefill_->address());
    decode_stub_ = connect(decode_->address());
    const worker::WorkerInfo pi = info(*prefill_stub_);
    prefill_tp_ = pi.tp();
    prefill_kv_ = pi.kv_endpoint();
    max_context_ = pi.model().max_context();
  }

  bool ready() const { return ready_; }
  std::string logs() const { return prefill_->log_path().string() + ", " + decode_->log_path().string(); }
  worker::Worker::Stub& prefill() { return *prefill_stub_; }
  worker::Worker::Stub& decode() { return *decode_stub_; }
  WorkerProcess& prefill_process() { return *prefill_; }
  WorkerProcess& decode_process() { return *decode_; }

  worker::ReserveRequest reserve_request(const std::string& id, const std::vector<int>& prompt, int max_tokens) const {
    worker::ReserveRequest r;
    r.set_request_id(id);
    r.set_num_tokens(std::min<int>(int(prompt.size()) + max_tokens, max_context_));
    r.set_prompt_len(int(prompt.size()));
    r.set_producer_tp(prefill_tp_);
    r.set_kv_producer(prefill_kv_);
    for (int t : prompt) r.add_prompt(t);
    return r;
  }

  // Push: Reserve on the decode worker, then Prefill and Generate side by side.
  PdResult push(const std::string& id, const std::vector<int>& prompt, int max_tokens) {
    PdResult out;
    grpc::ClientContext rctx;
    rctx.set_deadline(in(std::chrono::seconds(10)));
    worker::ReserveResponse reserved;
    grpc::Status rs = decode().Reserve(&rctx, reserve_request(id, prompt, max_tokens), &reserved);
    if (!rs.ok()) {
      out.prefill = rs;
      out.decode.status = rs;
      return out;
    }
    worker::PrefillRequest preq;
    preq.set_request_id(id);
    for (int t : prompt) preq.add_prompt(t);
    set_greedy(preq.mutable_sampling(), max_tokens);
    preq.set_kv_mode("push");
    preq.set_kv_target(reserved.kv_target());
    *preq.mutable_target_blocks() = reserved.block_ids();
    preq.set_skip_blocks(reserved.cached_prefix_blocks());
    out.reserved = reserved;
    std::thread prefill_call([&] {
      grpc::ClientContext pctx;
      pctx.set_deadline(in(std::chrono::seconds(30)));
      out.prefill = prefill().Prefill(&pctx, preq, &out.prefill_response);
    });
    worker::WorkerGenerateRequest dreq;
    dreq.set_request_id(id);
    for (int t : prompt) dreq.add_prompt(t);
    set_greedy(dreq.mutable_sampling(), max_tokens);
    dreq.set_kv_mode("push");
    *dreq.mutable_reserved_blocks() = reserved.block_ids();
    out.decode = generate(decode(), dreq);
    prefill_call.join();
    return out;
  }

  // Pull: Prefill holds the KV, Generate reads it.
  PdResult pull(const std::string& id, const std::vector<int>& prompt, int max_tokens) {
    PdResult out;
    worker::PrefillRequest preq;
    preq.set_request_id(id);
    for (int t : prompt) preq.add_prompt(t);
    set_greedy(preq.mutable_sampling(), max_tokens);
    preq.set_kv_mode("pull");
    grpc::ClientContext pctx;
    pctx.set_deadline(in(std::chrono::seconds(30)));
    out.prefill = prefill().Prefill(&pctx, preq, &out.prefill_response);
    if (!out.prefill.ok()) return out;
    worker::WorkerGenerateRequest dreq;
    dreq.set_request_id(id);
    for (int t : prompt) dreq.add_prompt(t);
    set_greedy(dreq.mutable_sampling(), max_tokens);
    dreq.set_kv_mode("pull");
    dreq.set_kv_source(out.prefill_response.kv_source());
    dreq.set_first_token(out.prefill_response.first_token());
    out.decode = generate(decode(), dreq);
    return out;
  }

 private:
  std::unique_ptr<WorkerProcess> prefill_, decode_;
  std::unique_ptr<worker::Worker::Stub> prefill_stub_, decode_stub_;
  bool ready_ = false;
  int prefill_tp_ = 0;
  int max_context_ = 0;
  std::string prefill_kv_;
};

}  // namespace pdserve::testing
