// Test-side helpers for driving workers over gRPC the way a router does, and the in-process
// engine's output they must equal.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "proto/worker.grpc.pb.h"
#include "tests/engine/test_model.h"

namespace pdserve::testing {

inline std::string decode_binary() { return std::string(PDSERVE_BINARY_DIR) + "/decode_worker/pdserve-decode"; }
inline std::string prefill_binary() { return std::string(PDSERVE_BINARY_DIR) + "/prefill_worker/pdserve-prefill"; }

inline std::unique_ptr<worker::Worker::Stub> connect(const std::string& address) {
  return worker::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

inline std::chrono::system_clock::time_point in(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

inline worker::WorkerInfo info(worker::Worker::Stub& stub, const worker::InfoRequest& request = {}) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(5)));
  worker::WorkerInfo out;
  grpc::Status s = stub.Info(&ctx, request, &out);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return out;
}

// Polls Info until every block is free; false after `timeout`.
inline bool wait_all_free(worker::Worker::Stub& stub, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const worker::WorkerInfo i = info(stub);
    if (i.num_blocks() > 0 && i.free_blocks() == i.num_blocks()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

struct Streamed {
  grpc::Status status;
  std::vector<int> tokens;
  std::string text;
  std::string finish_reason;
  int messages = 0;
  // The final event's (P/D): the decode worker's own hit and the prompt blocks that moved.
  int decode_cached_tokens = 0;
  int transferred_blocks = 0;
};

// Runs a Generate stream to its end.
inline Streamed generate(worker::Worker::Stub& stub, const worker::WorkerGenerateRequest& request,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(timeout));
  Streamed out;
  auto reader = stub.Generate(&ctx, request);
  worker::WorkerEvent ev;
  while (reader->Read(&ev)) {
    ++out.messages;
    out.tokens.insert(out.tokens.end(), ev.token_ids().begin(), ev.token_ids().end());
    out.text += ev.text();
    if (ev.finished()) {
      out.finish_reason = ev.finish_reason();
      out.decode_cached_tokens = ev.decode_cached_tokens();
      out.transferred_blocks = ev.transferred_blocks();
    }
  }
  out.status = reader->Finish();
  return out;
}

struct Reference {
  std::vector<int> prompt;
  std::vector<int> tokens;
  std::string text;
  std::string finish_reason;
};

// The in-process engine's greedy output for `prompt` (encoded with BOS), as `pdserve generate
// --json` prints it.
inline Reference reference(const std::string& prompt, int max_tokens, int tp = 1) {
  auto model = engine::load_model({stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  engine::EngineOptions options;
  options.tp = tp;
  options.kv_cache_bytes = 4 << 20;
  auto e = engine::Engine::create(std::move(*model), options);
  EXPECT_TRUE(e.ok()) << e.status();
  Reference ref;
  ref.prompt = *(*e)->tokenizer().encode(prompt, /*add_bos=*/true);
  engine::SamplingParams params;
  params.max_tokens = max_tokens;
  auto result = (*e)->generate(ref.prompt, params);
  EXPECT_TRUE(result.ok()) << result.status();
  ref.tokens = result->token_ids;
  ref.text = result->text;
  ref.finish_reason = std::string(engine::finish_reason_name(result->finish_reason));
  return ref;
}

inline void set_greedy(v1::SamplingParams* s, int max_tokens) {
  s->set_temperature(0);
  s->set_max_tokens(max_tokens);
}

}  // namespace pdserve::testing
