// The GPU backend on a device: its GEMM against the CPU's, the kernel library's architectures,
// and the whole forward pass of the bundled model on the GPU engine against the CPU engine and
// the published greedy text. Tests needing a device skip when there is none. Built for the CPU
// emulation of the GPU too (kernels/gpu/emulation/simt.h), where the backend is linked in and
// runs the emulated kernels.
#include "engine/gpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_split.h"
#include "engine/decode_graphs.h"
#include "engine/engine.h"
#include "engine/model/float_convert.h"
#include "engine/model_loader.h"
#include "kernels/cpu/ops.h"
#include "tests/engine/bf16_checkpoint.h"
#include "tests/engine/teacher_forced.h"
#include "tests/engine/temp_files.h"
#include "tests/engine/test_model.h"
#include "tests/gpu/kernel_test_util.h"

namespace pdserve::kernels {
namespace {

TEST(GpuBackend, MatmulColumnSliceMatchesCpu) {
  REQUIRE_GPU();
  auto backend = engine::make_gpu_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int rows = 7, out = 33, in = 64, ldw = 80;
  std::vector<float> w = random_vec(out * ldw, 10), x = random_vec(rows * in, 11), want(rows * out);
  cpu::matmul_xwt(want.data(), x.data(), w.data() + 5, rows, out, in, ldw);
  Dev<float> dw(w), dx(x), dy(rows * out);
  (*backend)->matmul_xwt(dy.get(), dx.get(), dw.get() + 5, rows, out, in, ldw);
  ASSERT_TRUE((*backend)->synchronize().ok());
  EXPECT_LE(rel_error(dy.host(), want), kF32Tol);
}

// GemmPrecision::kBf16 through the backend: up to 8 rows the portable GEMV, above the vendor bf16
// GEMM (cuBLAS, hipBLAS; the portable tiled kernel on the emulation, which has no BLAS), each
// rounding x to bf16.
// Against the CPU on the same rounded x and w, so only the order of the f32 sums differs; and
// measurably away from the unrounded x's products, so the rounding is not skipped.
TEST(GpuBackend, Bf16GemmPrecisionMatchesCpuOnRoundedActivations) {
  REQUIRE_GPU();
  auto backend = engine::make_gpu_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int out = 72, in = 264, ldw = 272;  // ldw > in: a column slice, as a TP shard's.
  // The vendor GEMM's bf16 copy of x, as a rank sizes it.
  ASSERT_TRUE((*backend)->reserve_gemm_scratch(engine::GemmPrecision::kBf16, 130, in).ok());
  for (int rows : {1, 5, 8, 9, 64, 130}) {
    std::vector<float> w = random_vec(size_t(out) * ldw, 40 + rows), x = random_vec(size_t(rows) * in, 50 + rows);
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = engine::f32_to_bf16(w[i]);
      w[i] = engine::bf16_to_f32(w16[i]);
    }
    std::vector<float> rounded_x = x, want(size_t(rows) * out), unrounded(want.size());
    for (float& v : rounded_x) v = engine::bf16_to_f32(engine::f32_to_bf16(v));
    cpu::matmul_xwt(want.data(), rounded_x.data(), w.data(), rows, out, in, ldw);
    cpu::matmul_xwt(unrounded.data(), x.data(), w.data(), rows, out, in, ldw);
    Dev<uint16_t> dw(w16);
    Dev<float> dx(x), dy(want.size()), dy_exact(want.size());
    (*backend)->matmul_xwt_bf16(dy.get(), dx.get(), dw.get(), rows, out, in, ldw, engine::GemmPrecision::kBf16);
    (*backend)->matmul_xwt_bf16(dy_exact.get(), dx.get(), dw.get(), rows, out, in, ldw, engine::GemmPrecision::kExact);
    ASSERT_TRUE((*backend)->synchronize().ok());
    EXPECT_LE(rel_error(dy.host(), want), kF32Tol) << rows << " rows";
    EXPECT_LE(rel_error(dy_exact.host(), unrounded), kF32Tol) << rows << " rows";
    EXPECT_GT(rel_error(dy.host(), unrounded), 10 * kF32Tol) << rows << " rows: x was not rounded";
  }
}

// make_gpu_group queues a rank's collectives on its backend's stream (R9): a one-rank group's
// all-gather reads what a kernel queued before it on that stream wrote, with no wait between, and
// a rank that is not a GPU backend of its device is refused. Skipped where the build has no
// NCCL/RCCL (the emulation; the engine's TP over two GPUs is Stories.GpuEngineTensorParallel…).
TEST(GpuBackend, CollectivesRunOnTheRankBackendsStream) {
  REQUIRE_GPU();
  auto made = engine::make_gpu_backend(0);
  ASSERT_TRUE(made.ok()) << made.status();
  engine::Backend& b = **made;
  auto group = engine::make_gpu_group({&b});
  if (group.status().code() == absl::StatusCode::kUnimplemented) GTEST_SKIP() << group.status();
  ASSERT_TRUE(group.ok()) << group.status();
  const std::unique_ptr<engine::Backend> cpu = engine::make_cpu_backend();
  EXPECT_EQ(engine::make_gpu_group({cpu.get()}).status().code(), absl::StatusCode::kInvalidArgument);
  const int n = 1 << 20;  // Enough that an unordered all-gather would read x before the add ends.
  const std::vector<float> x = random_vec(n, 80), y = random_vec(n, 81);
  Dev<float> dx(x), dy(y), dout(n);
  ASSERT_EQ(gpuDeviceSynchronize(), gpuSuccess);  // The backend's stream does not wait for the default one.
  std::vector<float> want(n), got(n);
  const std::vector<float> zeros(n, 0.0f);
  for (int i = 0; i < n; ++i) want[i] = x[i] + y[i];
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(b.copy_to_device(dout.get(), zeros.data(), size_t(n) * 4).ok());  // No earlier round's result.
    ASSERT_TRUE(b.copy_to_device(dx.get(), x.data(), size_t(n) * 4).ok());
    b.add_inplace(dx.get(), dy.get(), n);
    (*group)[0]->all_gather(dx.get(), n, dout.get());
    (*group)[0]->all_reduce_sum(dout.get(), n);  // One rank: the sum is its own buffer.
    ASSERT_TRUE(b.copy_to_host(got.data(), dout.get(), size_t(n) * 4).ok());
    EXPECT_EQ(got, want) << "round " << round;
  }
  (*group)[0]->barrier();
}

// A recorded graph (Backend::begin_capture) runs nothing while recording, and each replay computes
// what the same calls run eagerly compute from the inputs' contents at that replay.
TEST(GpuBackend, RecordedGraphReplaysTheEagerCallsOnNewInputs) {
  REQUIRE_GPU();
  auto made = engine::make_gpu_backend(0);
  ASSERT_TRUE(made.ok()) << made.status();
  engine::Backend& b = **made;
  const int rows = 5, out = 24, in = 48;
  const std::vector<float> w = random_vec(size_t(out) * in, 60), norm_w = random_vec(in, 61),
                           bias = random_vec(rows * out, 62);
  Dev<float> dw(w), dnorm(norm_w), dbias(bias), dx(size_t(rows) * in), dxn(size_t(rows) * in), dy(size_t(rows) * out);
  auto step = [&] {
    b.rms_norm(dxn.get(), dx.get(), dnorm.get(), rows, in, 1e-5f);
    b.matmul_xwt(dy.get(), dxn.get(), dw.get(), rows, out, in, in);
    b.add_inplace(dy.get(), dbias.get(), int64_t(rows) * out);
  };
  ASSERT_TRUE(b.begin_capture().ok());
  step();
  auto graph = b.end_capture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(dy.host(), std::vector<float>(size_t(rows) * out, 0.0f)) << "recording ran the calls";
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> x = random_vec(size_t(rows) * in, 70 + round);
    ASSERT_TRUE(b.copy_to_device(dx.get(), x.data(), x.size() * sizeof(float)).ok());
    ASSERT_TRUE((*graph)->replay().ok());
    ASSERT_TRUE(b.synchronize().ok());
    const std::vector<float> replayed = dy.host();
    step();
    ASSERT_TRUE(b.synchronize().ok());
    EXPECT_EQ(replayed, dy.host()) << "round " << round;
    std::vector<float> xn(x.size()), want(size_t(rows) * out);
    cpu::rms_norm(xn.data(), x.data(), norm_w.data(), rows, in, 1e-5f);
    cpu::matmul_xwt(want.data(), xn.data(), w.data(), rows, out, in, in);
    for (size_t i = 0; i < want.size(); ++i) want[i] += bias[i];
    EXPECT_LE(rel_error(replayed, want), kF32Tol) << "round " << round;
  }
}

// A call that waits or allocates while recording spoils the graph with a clear error, and the
// backend runs calls again after it; the CPU backend records none.
TEST(GpuBackend, ACallAGraphCannotHoldSpoilsTheRecording) {
  REQUIRE_GPU();
  auto made = engine::make_gpu_backend(0);
  ASSERT_TRUE(made.ok()) << made.status();
  engine::Backend& b = **made;
  Dev<float> dx(std::vector<float>(64, 1.0f)), dy(64);
  ASSERT_TRUE(b.begin_capture().ok());
  EXPECT_FALSE(b.begin_capture().ok()) << "a second recording at once";
  b.add_inplace(dy.get(), dx.get(), 64);
  EXPECT_FALSE(b.synchronize().ok());
  auto spoiled = b.end_capture();
  ASSERT_FALSE(spoiled.ok());
  EXPECT_NE(spoiled.status().message().find("graph"), std::string_view::npos) << spoiled.status();
  ASSERT_TRUE(b.begin_capture().ok());
  EXPECT_FALSE(b.allocate(256).ok());
  EXPECT_FALSE(b.end_capture().ok());
  b.add_inplace(dy.get(), dx.get(), 64);  // Eager again.
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(dy.host(), std::vector<float>(64, 1.0f));
  auto cpu_backend = engine::make_cpu_backend();
  EXPECT_EQ(cpu_backend->begin_capture().code(), absl::StatusCode::kUnimplemented);
}

// Another thread's copy while a graph is being recorded (a host-tier load beside a decode step)
// waits for the recording to end and stays out of the graph: a GPU records every thread's work on
// a capturing stream, and a replay must not copy another request's KV again.
TEST(GpuBackend, AnotherThreadsCopyStaysOutOfARecording) {
  REQUIRE_GPU();
  auto made = engine::make_gpu_backend(0);
  ASSERT_TRUE(made.ok()) << made.status();
  engine::Backend& b = **made;
  const std::vector<float> ones(64, 1.0f), twos(64, 2.0f), zeros(64, 0.0f);
  Dev<float> dx(ones), dy(64), dz(64);
  ASSERT_TRUE(b.begin_capture().ok());
  std::atomic<bool> started{false};
  std::thread other([&] {
    started = true;
    EXPECT_TRUE(b.copy_to_device(dz.get(), twos.data(), twos.size() * sizeof(float)).ok());
  });
  while (!started) std::this_thread::yield();
  // Time for the copy to reach the backend while the recording runs (with the lock it then waits;
  // without, it would be recorded): the test passes either way when the backend is right.
  for (int i = 0; i < 10000; ++i) std::this_thread::yield();
  b.add_inplace(dy.get(), dx.get(), 64);
  auto graph = b.end_capture();
  other.join();
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(dz.host(), twos) << "the other thread's copy did not run";
  ASSERT_TRUE(b.copy_to_device(dz.get(), zeros.data(), zeros.size() * sizeof(float)).ok());
  ASSERT_TRUE((*graph)->replay().ok());
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_EQ(dz.host(), zeros) << "the other thread's copy was recorded into the graph";
  EXPECT_EQ(dy.host(), ones);
}

#if !defined(PDSERVE_GPU_EMULATION)
// The architecture field of a device-code ELF for `arch`, as the configured list spells it:
// CUDA's "90", "100" or "90-real" give the SM version (bits 8-15 of e_flags); HIP's "gfx90a",
// "gfx942" or "gfx950" (a ":xnack-" suffix allowed) give EF_AMDGPU_MACH (bits 0-7), -1 if unknown.
int wanted_arch_code(const std::string& arch) {
#if defined(PDSERVE_GPU_HIP)
  static const std::pair<const char*, int> kMach[] = {
      {"gfx908", 0x030}, {"gfx90a", 0x03f}, {"gfx940", 0x040}, {"gfx941", 0x04b},
      {"gfx942", 0x04c}, {"gfx950", 0x04f}};
  const std::string name = arch.substr(0, arch.find(':'));
  for (const auto& [gfx, mach] : kMach)
    if (name == gfx) return mach;
  return -1;
#else
  return std::atoi(arch.c_str());
#endif
}

// Runs without a device. Each kernel object embeds a fat binary (CUDA) or offload bundle (HIP)
// whose device code is ELF: for the CUDA machine (e_machine 190) with the SM version in bits 8-15
// of e_flags, or for AMDGPU (e_machine 224) with the processor in bits 0-7. Every configured
// architecture must have one, or the build silently shipped no code for that GPU.
TEST(GpuArtifacts, KernelLibraryHoldsCodeForEveryConfiguredArch) {
  std::ifstream in(PDSERVE_GPU_KERNELS_LIB, std::ios::binary);
  // The build tree's library: absent where the tests travel without it (the GPU machine's bundle).
  if (!in) GTEST_SKIP() << PDSERVE_GPU_KERNELS_LIB << " is not here";
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
#if defined(PDSERVE_GPU_HIP)
  constexpr uint16_t kMachine = 224;
  auto arch_code = [](uint32_t flags) { return int(flags & 0xff); };
#else
  constexpr uint16_t kMachine = 190;
  auto arch_code = [](uint32_t flags) { return int((flags >> 8) & 0xff); };
#endif
  std::set<int> found;
  for (size_t at = bytes.find("\x7f" "ELF"); at != std::string::npos; at = bytes.find("\x7f" "ELF", at + 4)) {
    if (at + 0x34 > bytes.size() || bytes[at + 4] != 2) continue;  // ELF64 only.
    uint16_t machine = 0;
    uint32_t flags = 0;
    std::memcpy(&machine, bytes.data() + at + 0x12, sizeof(machine));
    std::memcpy(&flags, bytes.data() + at + 0x30, sizeof(flags));
    if (machine == kMachine) found.insert(arch_code(flags));
  }
  for (const std::string& arch : std::vector<std::string>(absl::StrSplit(PDSERVE_GPU_ARCHS, ','))) {
    const int want = wanted_arch_code(arch);
    ASSERT_NE(want, -1) << "unknown architecture " << arch << ": add its ELF code to wanted_arch_code";
    EXPECT_TRUE(found.count(want)) << "no " << arch << " code in " << PDSERVE_GPU_KERNELS_LIB;
  }
  EXPECT_FALSE(found.empty());
}
#endif

}  // namespace
}  // namespace pdserve::kernels

namespace pdserve::testing {
namespace {

using namespace pdserve::engine;

std::string trimmed(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::string published_text() {
  std::ifstream in(stories_dir() + "/greedy_from_bos.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  return trimmed(ss.str());
}

// `model` in an engine on `backend` (EngineOptions::backend), as the workers make it.
std::unique_ptr<Engine> engine_on(const std::string& model_path, const std::string& backend, int tp = 1,
                                  DType weights = DType::kF32, EngineOptions options = {}) {
  auto model = load_model({model_path});
  EXPECT_TRUE(model.ok()) << model.status();
  options.backend = backend;
#if defined(PDSERVE_GPU_EMULATION)
  // The emulated GPU backend is linked in, not a library the engine loads.
  if (backend == gpu_backend_kind()) {
    options.backend = "cpu";  // Collectives: one rank needs none.
    options.backend_factory = [](int rank) { return make_gpu_backend(rank); };
  }
#endif
  options.tp = tp;
  options.weight_dtype = weights;
  auto engine = Engine::create(std::move(*model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

std::unique_ptr<Engine> stories_engine(const std::string& backend, int tp = 1) {
  return engine_on(stories_bin(), backend, tp);
}

std::string gpu_kind() { return std::string(gpu_backend_kind()); }

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  return p;
}

// BOS and the `engine`'s greedy text from it (n tokens, past EOS): a stream to score
// teacher-forced.
std::vector<int> cpu_greedy_text(Engine& engine, int n) {
  SamplingParams params = greedy(n);
  params.ignore_eos = true;
  auto text = engine.generate({engine.config().bos_id}, params);
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<int> forced = {engine.config().bos_id};
  if (text.ok()) forced.insert(forced.end(), text->token_ids.begin(), text->token_ids.end());
  return forced;
}

// Runs `prompts` as concurrent requests (mixed prefill chunks and decodes in one step) and
// returns each one's tokens.
std::vector<std::vector<int>> run_batch(Engine& engine, const std::vector<std::vector<int>>& prompts, int max_tokens) {
  std::vector<std::vector<int>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.id = std::to_string(i);
    r.prompt = prompts[i];
    r.params = greedy(max_tokens);
    EXPECT_TRUE(engine.add_request(std::move(r), [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[i].push_back(ev.token);
      EXPECT_TRUE(ev.error.ok()) << ev.error;
    }).ok());
  }
  EXPECT_TRUE(engine.run_until_idle().ok());
  return out;
}

TEST(Stories, UnknownOrMissingBackendIsAClearError) {
  auto model = load_model({stories_bin()});
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions options;
  options.backend = "tpu";
  auto engine = Engine::create(std::move(*model), options);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("unknown backend"), std::string_view::npos) << engine.status();
}

// The KV cache's host tier on the GPU engine (docs/kv_offload.md): a device cache too small to
// keep earlier prompts, so the second round loads them back from the host tier through the
// backend's copies on its stream, which must give the CPU engine's tokens and cached counts. On
// the emulation also with each block's threads run last to first (EmulatedReversed).
TEST(Stories, GpuEngineHostTierEqualsCpu) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  EngineOptions tiers;
  tiers.kv_cache_bytes = 8 * 16 * 1280;  // 8 blocks: two of the prompts below (the emulation is slow).
  tiers.host_kv_bytes = 64 * 16 * 1280;
  auto gpu = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, tiers);
  auto cpu = engine_on(stories_bin(), "cpu", 1, DType::kF32, tiers);
  ASSERT_TRUE(gpu && cpu);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i) {
      std::vector<int> prompt = {1};
      for (int t = 1; t < 40; ++t) prompt.push_back(3 + (t * 37 + i * 101) % 500);
      auto want = cpu->generate(prompt, greedy(2));
      auto got = gpu->generate(prompt, greedy(2));
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(got->token_ids, want->token_ids) << "round " << round << " prompt " << i;
      EXPECT_EQ(got->cached_tokens, want->cached_tokens) << "round " << round << " prompt " << i;
      if (round == 1) {
        EXPECT_EQ(got->cached_tokens, 32) << i;  // Both full blocks, from the host tier.
      }
    }
  }
  EXPECT_GT(gpu->stats().host_loaded_blocks, 0u);
  EXPECT_EQ(gpu->stats().free_blocks, gpu->stats().num_blocks);
}

// The host tier with a bf16 KV cache: blocks copied out to host memory and back must come back
// bit for bit, so an engine that reloads them gives exactly the tokens, log-probabilities and
// cached counts of one whose device cache kept them — same dtype, same chunking, same kernels.
TEST(Stories, GpuEngineHostTierKeepsBf16BlocksExactly) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  EngineOptions tiers, kept;
  tiers.kv_dtype = kept.kv_dtype = DType::kBF16;
  // 8 bf16 blocks: the six prompts' twelve full blocks do not fit, so the second round reloads
  // each prompt's blocks into device blocks other prompts have written since.
  tiers.kv_cache_bytes = 8 * 16 * 640;
  tiers.host_kv_bytes = 64 * 16 * 640;
  auto reloads = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, tiers);
  auto keeps = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, kept);
  ASSERT_TRUE(reloads && keeps);
  ASSERT_EQ(reloads->stats().num_blocks, 8);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 6; ++i) {
      std::vector<int> prompt = {1};
      for (int t = 1; t < 40; ++t) prompt.push_back(3 + (t * 37 + i * 101) % 500);
      SamplingParams params = greedy(4);
      params.logprobs = 0;  // Each token's log-probability: equal bits, or the KV differed.
      auto want = keeps->generate(prompt, params);
      auto got = reloads->generate(prompt, params);
      ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " " << got.status();
      EXPECT_EQ(got->token_ids, want->token_ids) << "round " << round << " prompt " << i;
      EXPECT_EQ(got->cached_tokens, want->cached_tokens) << "round " << round << " prompt " << i;
      ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
      for (size_t t = 0; t < got->logprobs.size(); ++t)
        EXPECT_EQ(got->logprobs[t].logprob, want->logprobs[t].logprob) << "round " << round << " prompt " << i;
    }
  }
  EXPECT_EQ(reloads->stats().host_loaded_blocks, 12u);
  EXPECT_EQ(reloads->stats().free_blocks, reloads->stats().num_blocks);
}

// The filesystem tier with a bf16 KV cache: chunk files one engine wrote serve a new engine on
// the same directory (its device and host tiers empty) with the bits of an engine that never
// gave its blocks up; an f32 engine on that directory reads none of them (the KV geometry's
// fingerprint names the element type) and computes its own.
TEST(Stories, GpuEngineFsTierKeepsBf16BlocksExactly) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  EngineOptions files, kept;
  files.kv_dtype = kept.kv_dtype = DType::kBF16;
  files.host_kv_bytes = 64 * 16 * 640;
  files.kv_offload_dir = pdserve::testing::fresh_dir("gpu-bf16-fs-tier");
  files.kv_offload_chunk_blocks = 2;  // A 40-token prompt's two full blocks: one file.
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back({1});
    for (int t = 1; t < 40; ++t) prompts.back().push_back(3 + (t * 53 + i * 89) % 500);
  }
  SamplingParams params = greedy(4);
  params.logprobs = 0;  // Each token's log-probability: equal bits, or the KV differed.
  {
    auto writer = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, files);
    ASSERT_TRUE(writer);
    for (const auto& prompt : prompts) ASSERT_TRUE(writer->generate(prompt, params).ok());
  }  // Destroyed: its queued writes finish.
  ASSERT_EQ(pdserve::testing::files_in(files.kv_offload_dir, ".kvc").size(), prompts.size());
  auto reader = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, files);
  auto keeps = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, kept);
  ASSERT_TRUE(reader && keeps);
  // The engine that keeps its blocks serves each prompt once first, so that both compute the same
  // 8 uncached tokens over the same 32 cached ones (a different split computes other bits).
  for (const auto& prompt : prompts) ASSERT_TRUE(keeps->generate(prompt, params).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto want = keeps->generate(prompts[i], params);
    auto got = reader->generate(prompts[i], params);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " " << got.status();
    EXPECT_EQ(want->cached_tokens, 32) << "prompt " << i;
    EXPECT_EQ(got->cached_tokens, 32) << "prompt " << i;
    EXPECT_EQ(got->token_ids, want->token_ids) << "prompt " << i;
    ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
    for (size_t t = 0; t < got->logprobs.size(); ++t)
      EXPECT_EQ(got->logprobs[t].logprob, want->logprobs[t].logprob) << "prompt " << i;
  }
  EXPECT_EQ(reader->stats().disk_loaded_chunks, prompts.size());
  EXPECT_EQ(reader->stats().free_blocks, reader->stats().num_blocks);

  EngineOptions f32_files = files;
  f32_files.kv_dtype = DType::kF32;
  auto f32 = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, f32_files);
  auto f32_kept = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, {});
  ASSERT_TRUE(f32 && f32_kept);
  auto got = f32->generate(prompts[0], params);
  auto want = f32_kept->generate(prompts[0], params);
  ASSERT_TRUE(got.ok() && want.ok()) << got.status() << " " << want.status();
  EXPECT_EQ(got->cached_tokens, 0);
  EXPECT_EQ(got->token_ids, want->token_ids);
  EXPECT_EQ(f32->stats().disk_hit_tokens, 0u);
}

TEST(Stories, GpuEngineGreedyFromBosEqualsPublishedText) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  auto engine = stories_engine(gpu_kind());
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->backend(0).name(), gpu_kind() + ":0");
  auto got = engine->generate({engine->config().bos_id}, greedy(256));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(trimmed(got->text), published_text());
}

TEST(Stories, GpuEngineLongPromptPrefillEqualsCpu) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  auto cuda = stories_engine(gpu_kind());
  auto cpu = stories_engine("cpu");
  ASSERT_TRUE(cuda && cpu);
  // A 60-token prompt in one step takes the prefill attention kernel.
  auto prompt = cpu->tokenizer().encode(published_text().substr(0, 250), true);
  ASSERT_TRUE(prompt.ok());
  prompt->resize(std::min<size_t>(prompt->size(), 60));
  auto want = cpu->generate(*prompt, greedy(60));
  auto got = cuda->generate(*prompt, greedy(60));
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " " << got.status();
  EXPECT_EQ(got->token_ids, want->token_ids);
}

// Sixteen requests at once (six on the emulation): decode tokens and prefill chunks of many
// sequences share steps, and the per-step token budget splits long prompts across steps.
TEST(Stories, GpuEngineConcurrentRequestsEqualCpu) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  auto cuda = stories_engine(gpu_kind());
  auto cpu = stories_engine("cpu");
  ASSERT_TRUE(cuda && cpu);
  std::mt19937 rng(7);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < (pdserve::kernels::kEmulated ? 6 : 16); ++i) {
    std::vector<int> p = {cpu->config().bos_id};
    const int len = 1 + int(rng() % 120);
    for (int t = 0; t < len; ++t) p.push_back(3 + int(rng() % (cpu->config().vocab_size - 3)));
    prompts.push_back(p);
  }
  const int tokens = pdserve::kernels::kEmulated ? 24 : 48;
  EXPECT_EQ(run_batch(*cuda, prompts, tokens), run_batch(*cpu, prompts, tokens));
}

// --weight-dtype bf16 on a bf16 checkpoint: the GPU multiplies the checkpoint's own values (the
// portable GEMM, f32 accumulation), as the CPU does after widening them.
TEST(Stories, GpuEngineBf16WeightsOfABf16CheckpointEqualCpu) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  const Bf16Checkpoint checkpoint("pdserve_gpu_bf16w");
  ASSERT_TRUE(checkpoint.status().ok()) << checkpoint.status();
  auto gpu = engine_on(checkpoint.path(), gpu_kind(), 1, DType::kBF16), cpu = engine_on(checkpoint.path(), "cpu");
  ASSERT_TRUE(gpu && cpu);
  std::mt19937 rng(3);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int> p = {1};
    for (int t = 0, len = 1 + int(rng() % 100); t < len; ++t) p.push_back(3 + int(rng() % 250));
    prompts.push_back(p);
  }
  EXPECT_EQ(run_batch(*gpu, prompts, 32), run_batch(*cpu, prompts, 32));
}

// --kv-dtype bf16: each K and V element is rounded once where it is written, so the logits move
// in their low bits and the tokens are no longer the CPU's by construction. Checked teacher-forced
// (research note R4/R5): the CPU's greedy text as a prompt, scored by prompt log-probabilities on
// the f32-KV and the bf16-KV GPU engine (prefill attention over bf16 blocks); then the bf16
// engine's own greedy continuation (decode attention over bf16 blocks) scored by the f32 engine,
// where every token it chose must be the f32 engine's choice or a near-tie. (On the emulation:
// all 120 argmaxes agree, the log-probabilities differ by at most 0.017.)
TEST(Stories, GpuEngineBf16KvFollowsTheF32KvEngineTeacherForced) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  EngineOptions bf16_kv;
  bf16_kv.kv_dtype = DType::kBF16;
  auto cpu = stories_engine("cpu");
  auto f32 = stories_engine(gpu_kind());
  auto bf16 = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, bf16_kv);
  ASSERT_TRUE(cpu && f32 && bf16);
  EXPECT_EQ(bf16->stats().kv_bytes_per_rank * 2, f32->stats().kv_bytes_per_rank);
  const std::vector<int> forced = cpu_greedy_text(*cpu, pdserve::kernels::kEmulated ? 120 : 250);
  const ForcedAgreement a = teacher_forced(*f32, *bf16, forced);
  EXPECT_GE(a.argmax_agree, int(0.99 * a.positions)) << a.argmax_agree << " of " << a.positions;
  EXPECT_LE(a.max_logprob_diff, 0.05f);
  EXPECT_GT(a.max_logprob_diff, 0.0f) << "bit-identical log-probabilities: the bf16 cache is not in use";
  // Decode: the bf16 engine's continuation of a prompt, every token a choice the f32 engine makes
  // or nearly makes.
  EXPECT_LE(
      worst_choice_gap(*f32, *bf16, {forced.begin(), forced.begin() + 20}, pdserve::kernels::kEmulated ? 48 : 200),
      0.05f);
  EXPECT_EQ(bf16->stats().free_blocks, bf16->stats().num_blocks);
}

// --gemm-precision bf16: every GEMM's activations rounded to bf16 (issue 18's R5a), so the logits
// move in their low bits. Against the exact engine on the same bf16 checkpoint (whose tokens are
// the CPU's), teacher-forced: the prompt in chunks of 8 tokens (the GEMV) and of 256 (the vendor
// bf16 GEMM on a device), then the bf16 engine's own greedy continuation (decode GEMVs).
TEST(Stories, GpuEngineBf16GemmFollowsTheExactEngineTeacherForced) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  const Bf16Checkpoint checkpoint("pdserve_gpu_bf16gemm");
  ASSERT_TRUE(checkpoint.status().ok()) << checkpoint.status();
  auto cpu = engine_on(checkpoint.path(), "cpu");
  ASSERT_TRUE(cpu);
  const std::vector<int> forced = cpu_greedy_text(*cpu, pdserve::kernels::kEmulated ? 120 : 250);
  for (int chunk : {8, 256}) {
    EngineOptions exact_options, bf16_options;
    exact_options.max_batch_tokens = bf16_options.max_batch_tokens = chunk;
    bf16_options.gemm_precision = GemmPrecision::kBf16;
    auto exact = engine_on(checkpoint.path(), gpu_kind(), 1, DType::kBF16, exact_options);
    auto bf16 = engine_on(checkpoint.path(), gpu_kind(), 1, DType::kBF16, bf16_options);
    ASSERT_TRUE(exact && bf16);
    const ForcedAgreement a = teacher_forced(*exact, *bf16, forced);
    EXPECT_GE(a.argmax_agree, int(0.99 * a.positions)) << a.argmax_agree << " of " << a.positions;
    EXPECT_LE(a.max_logprob_diff, 0.02f) << "chunks of " << chunk;
    EXPECT_GT(a.max_logprob_diff, 0.0f) << "bit-identical log-probabilities: the activations were not rounded";
    std::printf("chunks of %d: %d of %d argmaxes agree, log-probabilities within %.4f\n", chunk, a.argmax_agree,
                a.positions, a.max_logprob_diff);
    if (chunk == 8) {
      EXPECT_LE(worst_choice_gap(*exact, *bf16, {forced.begin(), forced.begin() + 20},
                                 pdserve::kernels::kEmulated ? 48 : 200),
                0.05f);
    }
  }
}

// Seeded sampling through the engine: the GPU samples on the device, the CPU from its logits on
// the host, each request drawing from its own generator. The logits differ in their last bits,
// which moves a token only for a draw at a boundary's edge.
TEST(Stories, GpuEngineSeededSamplingEqualsCpu) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  auto gpu = stories_engine(gpu_kind());
  auto cpu = stories_engine("cpu");
  ASSERT_TRUE(gpu && cpu);
  const auto run = [](Engine& engine) {
    std::vector<std::vector<int>> out(pdserve::kernels::kEmulated ? 4 : 8);
    for (int i = 0; i < int(out.size()); ++i) {
      GenerationRequest r;
      r.id = std::to_string(i);
      r.prompt = {engine.config().bos_id, 3 + 17 * i};
      r.params.temperature = 0.7f + 0.1f * float(i % 3);
      r.params.top_k = i % 2 ? 40 : 0;
      r.params.top_p = i % 4 < 2 ? 0.9f : 1.0f;
      r.params.seed = 100 + i;
      r.params.max_tokens = pdserve::kernels::kEmulated ? 32 : 48;
      EXPECT_TRUE(engine.add_request(std::move(r), [&out, i](const TokenEvent& ev) {
        if (ev.token >= 0) out[i].push_back(ev.token);
      }).ok());
    }
    EXPECT_TRUE(engine.run_until_idle().ok());
    return out;
  };
  EXPECT_EQ(run(*gpu), run(*cpu));
}

// --decode-graphs (engine/decode_graphs.h): decode steps recorded once per batch bucket and
// replayed, padded up to it, give the eager engine's tokens bit for bit (the same kernels; each
// token's attention its own, whatever its batch and the launch) — with bf16 weights, whose
// portable GEMM computes a row the same at any row count (a vendor GEMM may pick another kernel
// for the bucket's rows). One request alone (bucket 1, recorded first), then six of different
// lengths, greedy and seeded, as the batch shrinks across buckets (8, 4, 2, 1: bucket 8's first
// step grows the split scratch that bucket 1's graph read), then one alone again (replaying);
// steps that also prefill run eagerly. And greedy from BOS on f32 weights (bucket 1: the same
// GEMMs) is still the published text.
TEST(Stories, GpuEngineDecodeGraphsEqualEager) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  EngineOptions graphs;
  graphs.decode_graphs = true;
  auto eager = engine_on(stories_bin(), gpu_kind(), 1, DType::kBF16),
       replaying = engine_on(stories_bin(), gpu_kind(), 1, DType::kBF16, graphs);
  ASSERT_TRUE(eager && replaying);
  // Each request's tokens, the requests run together.
  const auto run_all = [](Engine& engine, std::vector<GenerationRequest> requests) {
    std::vector<std::vector<int>> out(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_TRUE(engine
                      .add_request(std::move(requests[i]),
                                   [&out, i](const TokenEvent& ev) {
                                     if (ev.token >= 0) out[i].push_back(ev.token);
                                   })
                      .ok());
    }
    EXPECT_TRUE(engine.run_until_idle().ok());
    return out;
  };
  const auto run = [&](Engine& engine, int requests) {
    std::vector<GenerationRequest> batch(requests);
    for (int i = 0; i < requests; ++i) {
      GenerationRequest& r = batch[size_t(i)];
      r.id = std::to_string(i);
      r.prompt = {engine.config().bos_id, 3 + 29 * i, 5 + 11 * i};
      r.params.max_tokens = 6 + 5 * i;
      r.params.ignore_eos = true;
      if (i % 2) {
        r.params.temperature = 0.8f;
        r.params.top_p = 0.9f;
        r.params.seed = 7 + i;
      }
    }
    return run_all(engine, std::move(batch));
  };
  for (int requests : {1, 6, 1}) EXPECT_EQ(run(*replaying, requests), run(*eager, requests)) << requests;
  // A step with more logits rows than the largest bucket — a prompt chunk's 256 log-probability
  // rows beside another request's row — grows the logits buffers the recorded graphs write: they
  // are dropped, and the buckets that follow recorded anew. (A chunk holds up to
  // kMaxPromptLogprobRows rows, which must reach the largest bucket, within max_batch_tokens.)
  static_assert(Engine::kMaxPromptLogprobRows >= kMaxDecodeGraphBatch);
  ASSERT_GE(replaying->max_batch_tokens(), kMaxDecodeGraphBatch + 3);  // The chunk and the 3-token prompt.
  const auto scored_run = [&](Engine& engine) {
    std::vector<GenerationRequest> batch(2);
    for (int i = 0; i < 2; ++i) {
      GenerationRequest& r = batch[size_t(i)];
      r.id = "scored" + std::to_string(i);
      r.prompt = {engine.config().bos_id};
      for (int t = 1; t < (i == 0 ? kMaxDecodeGraphBatch + 2 : 3); ++t) r.prompt.push_back(3 + (37 * t + i) % 500);
      r.params = greedy(4);
      if (i == 0) r.params.prompt_logprobs = 0;
    }
    return run_all(engine, std::move(batch));
  };
  const EngineStats before = replaying->stats();
  EXPECT_EQ(scored_run(*replaying), scored_run(*eager));
  EXPECT_GT(replaying->stats().graphs_recorded, before.graphs_recorded) << "no bucket was recorded anew";
  EXPECT_EQ(run(*replaying, 1), run(*eager, 1)) << "after the logits buffers moved";
  EXPECT_GT(replaying->stats().graph_steps, 10u) << "the decode steps did not replay graphs";
  EXPECT_EQ(eager->stats().graph_steps, 0u);
  auto f32 = engine_on(stories_bin(), gpu_kind(), 1, DType::kF32, graphs);
  ASSERT_TRUE(f32);
  auto text = f32->generate({f32->config().bos_id}, greedy(pdserve::kernels::kEmulated ? 64 : 256));
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string got = trimmed(text->text);
  EXPECT_EQ(published_text().substr(0, got.size()), got);
  EXPECT_GT(f32->stats().graph_steps, 50u);
}

// --async-scheduling on the GPU backend: step N+1 is queued before step N's tokens are read
// (its decode tokens embedded from the device's sampled ones, the results through pinned slots
// and events), eagerly and replaying decode graphs, and at TP 2 (rank 0 broadcasting the sampled
// tokens over NCCL, or shared memory in emulation): the synchronous engine's tokens and text,
// requests stopping by string and by length at different steps.
TEST(Stories, GpuEngineAsyncSchedulingEqualsSynchronous) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (const auto& [graphs, tp] : {std::pair{false, 1}, {true, 1}, {false, 2}}) {
    if (tp > gpu_device_count()) continue;
    EngineOptions sync_options, async_options;
    sync_options.decode_graphs = async_options.decode_graphs = graphs;
    async_options.async_scheduling = true;
    auto sync = engine_on(stories_bin(), gpu_kind(), tp, DType::kBF16, sync_options),
         async = engine_on(stories_bin(), gpu_kind(), tp, DType::kBF16, async_options);
    ASSERT_TRUE(sync && async);
    const auto run = [](Engine& engine) {
      std::vector<std::string> out(5);
      for (int i = 0; i < 5; ++i) {
        GenerationRequest r;
        r.id = std::to_string(i);
        r.prompt = {engine.config().bos_id, 3 + 29 * i, 5 + 11 * i};
        r.params.max_tokens = 8 + 4 * i;
        if (i % 2) {
          r.params.temperature = 0.8f;
          r.params.seed = 7 + i;
        }
        if (i == 3) r.params.stop_strings = {" "};
        EXPECT_TRUE(engine
                        .add_request(std::move(r),
                                     [&out, i](const TokenEvent& ev) {
                                       out[i] += ev.text +
                                                 (ev.finished ? "|" + std::string(finish_reason_name(ev.reason)) : "");
                                     })
                        .ok());
      }
      EXPECT_TRUE(engine.run_until_idle().ok());
      return out;
    };
    EXPECT_EQ(run(*async), run(*sync)) << (graphs ? "graphs" : "eager") << ", TP " << tp;
    EXPECT_GT(async->stats().overlapped_steps, 5u);
    if (graphs) EXPECT_GT(async->stats().graph_steps, 5u);
  }
}

// Where decode graphs cannot be recorded, --decode-graphs is refused, not ignored: on the CPU
// backend, and at TP 2 (the collectives wait on the host).
TEST(Stories, DecodeGraphsOnTheCpuOrAtTp2AreRefused) {
  for (const auto& [backend, tp] : {std::pair<std::string, int>{"cpu", 1}, {gpu_kind(), 2}}) {
    if (backend != "cpu" && gpu_device_count() < 2) continue;
    auto model = load_model({stories_bin()});
    ASSERT_TRUE(model.ok()) << model.status();
    EngineOptions options;
    options.backend = backend;
    options.tp = tp;
    options.decode_graphs = true;
    auto engine = Engine::create(std::move(*model), options);
    ASSERT_FALSE(engine.ok()) << backend << " TP " << tp;
    EXPECT_NE(engine.status().message().find("graphs"), std::string_view::npos) << engine.status();
  }
}

TEST(Stories, GpuEngineTensorParallelOverNcclEqualsCpu) {
  if (gpu_device_count() < 2) GTEST_SKIP() << "TP 2 needs two GPUs";
  auto cuda = stories_engine(gpu_kind(), 2);
  auto cpu = stories_engine("cpu", 2);
  ASSERT_TRUE(cuda && cpu);
  auto got = cuda->generate({cuda->config().bos_id}, greedy(256));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(trimmed(got->text), published_text());
}

}  // namespace
}  // namespace pdserve::testing