// GPU forward-pass benchmark on a synthetic model of a preset's shape (default llama-3-8b),
// weights made on the device (no file): decode step time against batch size, prefill
// tokens/s, the vendor BLAS's bf16 GEMM rates at the model's shapes and the portable tiled GEMM's
// (bf16 weights) against them, each as a fraction of a GPU's rooflines (--roofline h200, the
// default: 4.8 TB/s HBM, 989 TFLOP/s dense bf16, 67 TFLOP/s fp32 non-tensor; h100, mi355x;
// datasheets; the first line names it). The forward pass runs with f32 weights (the vendor
// SGEMM; the portable GEMM in a HIP build without hipBLAS), then bf16 GEMM weights as
// --weight-dtype bf16 runs them, with f32 activations (--gemm exact: the portable GEMM) and with
// bf16 ones (--gemm bf16: the vendor bf16 GEMM above 8 rows, as --gemm-precision bf16 runs), each
// with an f32 and a bf16 KV cache (--kv-dtype), and the decode rows eager and replaying recorded
// graphs as --decode-graphs runs them (--graphs off,on: a "graphs" column). The bf16 GEMM rows
// show what the vendor GEMM reaches at the model's shapes on their own. Steps sample on the
// device (temperature 1, top_p 0.95), as the engine does on a GPU; the sampling rows time that
// kernel against the copy of the logits to the host that sampling there would take. The
// prefill_attention rows time one layer's attention over each --prefill prompt alone, the
// CUDA-core kernel against the tensor-core one (--gemm-precision bf16's).
//
// With --breakdown 1 (the default) each eager decode and prefill row is followed by a "breakdown" row:
// the same step with every kernel call waited for, per phase (engine/backends/phase_profiler.h:
// GEMMs, LM head, attention, small kernels, sampling, copies), milliseconds and calls per step,
// and kernel_calls_per_step: the backend's kernel calls, copies aside (at least one launch each:
// split decode attention's merge, the vendor bf16 GEMM's rounding of x, SwiGLU's silu_mul above 8
// rows and cuBLAS's own kernels add more).
// --only and --weights pick parts, so that one item re-measures in a minute or two (the model's
// weights are only made for decode and prefill). One source for CUDA and HIP (the runtime and
// BLAS through gpu_compat.h and gpu_blas.h).
//
//   gpu_bench [--preset llama-3-8b] [--context 1024] [--batches 1,8,32,64,128]
//             [--prefill 512,2048] [--gemm-rows 1,32,128,2048,8192] [--sampling-rows 1,32,128]
//             [--breakdown 1] [--only decode,prefill,sampling,gemm,attention] [--weights f32,bf16]
//             [--kv-dtype f32,bf16] [--gemm exact,bf16] [--graphs off,on] [--roofline h200]
//             [--out results.jsonl]
// gpu_bench_emulated is the same program on the CPU emulation of the GPU (no vendor BLAS), for
// CI's smoke run on a tiny preset (bench/CMakeLists.txt).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend_buffer.h"
#include "engine/backends/gpu/gpu_blas.h"
#include "engine/backends/phase_profiler.h"
#include "engine/gpu_backend.h"
#include "engine/kv_cache_layout.h"
#include "engine/model/make_model.h"
#include "engine/model_tensors.h"
#include "engine/model_weights.h"
#include "engine/rank_runner.h"
#include "kernels/gpu/ops.h"

namespace pdserve {
namespace {

using namespace engine;

// A GPU's peaks, from its datasheet, that the fractions are taken of (--roofline).
struct Roofline {
  double hbm_bytes_per_s;
  double bf16_flop_per_s;  // Dense (no sparsity).
  double f32_flop_per_s;   // Without tensor cores / matrix cores.
};
const std::map<std::string, Roofline>& rooflines() {
  static const std::map<std::string, Roofline> table = {
      {"h100", {3.35e12, 989e12, 67e12}},   // H100 SXM.
      {"h200", {4.8e12, 989e12, 67e12}},
      {"mi355x", {8.0e12, 2.5e15, 157.3e12}},
  };
  return table;
}

// What a run measures (--only): steps of the model (decode, prefill; each with the f32 and/or
// bf16 weights of --weights), the sampling kernel, the GEMMs alone, prefill attention alone.
enum class Part { kDecode, kPrefill, kSampling, kGemm, kAttention };

struct Options {
  std::string preset = "llama-3-8b";
  int context = 1024;
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int> prefill = {512, 2048};
  std::vector<int> gemm_rows = {1, 32, 128, 2048, 8192};  // The portable GEMM's stop at 2048.
  std::vector<int> sampling_rows = {1, 32, 128};
  bool breakdown = true;
  std::vector<Part> only = {Part::kDecode, Part::kPrefill, Part::kSampling, Part::kGemm, Part::kAttention};
  std::vector<DType> weights = {DType::kF32, DType::kBF16};
  std::vector<DType> kv_dtypes = {DType::kF32, DType::kBF16};
  // The bf16-weight rows' GEMM precisions (f32 weights multiply exactly).
  std::vector<GemmPrecision> gemm = {GemmPrecision::kExact, GemmPrecision::kBf16};
  // Decode rows eager (false) and with decode graphs (true; decode rows only, no breakdown).
  std::vector<bool> graphs = {false, true};
  std::string roofline = "h200";
  std::string out;

  bool runs(Part p) const { return std::find(only.begin(), only.end(), p) != only.end(); }
  bool runs(DType d) const { return std::find(weights.begin(), weights.end(), d) != weights.end(); }
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Mean seconds per call of `body` over `iters` calls after one warm-up call, and the device's
// status after them.
template <typename Body>
std::pair<double, gpuError_t> time_calls(Body&& body, int iters) {
  body();
  (void)gpuDeviceSynchronize();
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) body();
  const gpuError_t e = gpuDeviceSynchronize();
  return {(now_s() - t0) / iters, e};
}

// n bf16 values at `dst` from the n f32 values at `src` (device memory): each value's upper half,
// a truncation, by a strided 2D copy.
bool truncate_to_bf16(void* dst, const void* src, int64_t n) {
  return gpuMemcpy2D(dst, 2, static_cast<const char*>(src) + 2, 4, 2, size_t(n), gpuMemcpyDeviceToDevice) ==
         gpuSuccess;
}

// `dst` holds n bf16 values truncated from N(0, stddev) floats made in `f32` (both grown as needed).
bool random_bf16_buffer(Backend* backend, BackendBuffer& dst, BackendBuffer& f32, int64_t n, uint64_t seed,
                        float stddev) {
  if (!dst.reserve(backend, size_t(n) * 2).ok() || !f32.reserve(backend, size_t(n) * 4).ok()) return false;
  kernels::gpu::fill_random(f32.as<float>(), n, seed, stddev, 0.0f, nullptr);
  return truncate_to_bf16(dst.as<void>(), f32.as<void>(), n);
}

// Tensors by name whose data is already in device memory (the synthetic weights).
class DeviceTensorSource final : public WeightSource {
 public:
  StatusOr<TensorView> tensor(std::string_view name) const override {
    auto it = tensors_.find(std::string(name));
    if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("no tensor ", std::string(name)));
    return it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, view] : tensors_) out.push_back(name);
    return out;
  }
  void add(const std::string& name, std::vector<int64_t> shape, const float* data) {
    tensors_[name] = TensorView{DType::kF32, std::move(shape), data};
  }

 private:
  std::map<std::string, TensorView> tensors_;
};

// Random KV "already in place" in `runner`'s arena (never zeros, never NaN): N(0, 1) values in its
// element type, bf16 ones truncated from f32 a chunk at a time through `chunk`.
bool fill_kv_arena(RankRunner& runner, BackendBuffer& chunk, Backend* backend) {
  const uint64_t bytes = runner.kv_layout().total_bytes();
  if (runner.kv_layout().spec().layers[0].dtype == DType::kF32) {
    kernels::gpu::fill_random(reinterpret_cast<float*>(runner.kv_arena()), int64_t(bytes / 4), 99, 1.0f, 0.0f, nullptr);
    return true;
  }
  const int64_t per_chunk = int64_t(1) << 26, total = int64_t(bytes / 2);
  if (!chunk.reserve(backend, size_t(per_chunk) * 4).ok()) return false;
  for (int64_t at = 0; at < total; at += per_chunk) {
    const int64_t n = std::min(per_chunk, total - at);
    kernels::gpu::fill_random(chunk.as<float>(), n, 99 + uint64_t(at / per_chunk), 1.0f, 0.0f, nullptr);
    if (!truncate_to_bf16(static_cast<uint8_t*>(runner.kv_arena()) + at * 2, chunk.as<void>(), n)) return false;
  }
  return true;
}

// One device pointer per model_tensors entry (nullptr for an absent optional one), as the
// ModelWeightsF32 that shard_weights slices.
StatusOr<std::unique_ptr<ModelWeightsF32>> wrap_device_tensors(const ModelConfig& config,
                                                              const std::vector<const float*>& tensors) {
  const std::vector<TensorShape> shapes = model_tensors(config);
  DeviceTensorSource source;
  for (size_t i = 0; i < shapes.size(); ++i)
    if (tensors[i] != nullptr) source.add(shapes[i].name, shapes[i].shape, tensors[i]);
  return ModelWeightsF32::create(config, source);
}

// One JSON line of results; its keys print in the order they are set.
using Row = nlohmann::ordered_json;

// `x` to `decimals` places: a row says what a measurement resolves (the JSON prints the shortest
// form of the rounded value; a non-finite one is null).
double places(double x, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(x * scale) / scale;
}

// Each line is flushed as it is written: a run stopped at its time limit keeps what it measured.
struct Report {
  std::ofstream file;
  void line(const Row& row) {
    const std::string json = row.dump();
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    if (file.is_open()) file << json << std::endl;
  }
};

// Parameters a token's forward pass multiplies by (all but the embedding table).
double matmul_params(const ModelConfig& c) {
  double p = 0;
  for (const TensorShape& t : model_tensors(c)) {
    if (t.name == "model.embed_tokens.weight" || t.shape.size() != 2) continue;
    p += double(t.shape[0]) * double(t.shape[1]);
  }
  if (c.tie_embeddings) p += double(c.vocab_size) * c.dim;
  return p;
}

// Decode steps against batch size and prefill tokens/s of the synthetic model, with f32 GEMM
// weights (the vendor SGEMM) and/or bf16 ones (the portable GEMM), as --only and --weights ask.
bool measure_model(const Options& o, const Roofline& roof, const ModelConfig& c, Backend* backend, Report& report) {
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int max_prefill = *std::max_element(o.prefill.begin(), o.prefill.end());
  // Synthetic weights on the device: N(0, 0.02), norms 1 (as make-model's presets). All in one
  // buffer in model_tensors' order, so that each layer's q/k/v and gate/up projections are back to
  // back: the fused QKV and gate_up GEMMs that upload_shard lays out for the engine.
  const std::vector<TensorShape> shapes = model_tensors(c);
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const TensorShape& t : shapes) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    sizes.push_back(t.optional && c.tie_embeddings ? 0 : n);
    total += sizes.back();
  }
  BackendBuffer arena;
  if (Status s = arena.reserve(backend, size_t(total) * 4); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return false;
  }
  std::vector<const float*> tensors;
  const double weight_bytes = double(total) * 4;
  uint64_t seed = 1;
  float* at = arena.as<float>();
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (sizes[i] == 0) {
      tensors.push_back(nullptr);
      continue;
    }
    const bool norm = shapes[i].name.find("norm") != std::string::npos;
    kernels::gpu::fill_random(at, sizes[i], seed++, norm ? 0.0f : 0.02f, 1.0f, nullptr);
    tensors.push_back(at);
    at += sizes[i];
  }
  if (gpuDeviceSynchronize() != gpuSuccess) {
    std::fprintf(stderr, "making the synthetic weights failed\n");
    return false;
  }
  auto weights = wrap_device_tensors(c, tensors);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return false;
  }
  auto shard = shard_weights(c, **weights, 0, 1);
  if (!shard.ok()) {
    std::fprintf(stderr, "%s\n", std::string(shard.status().message()).c_str());
    return false;
  }
  for (LayerShard& w : shard->layers) {  // TP 1: the shard's pointers are the tensors' starts.
    w.wqkv = w.wq;
    w.w_gate_up = w.w_gate;
  }
  const int block = 16;
  const int per_seq = (std::max(o.context + 1, max_prefill) + block - 1) / block;
  const int blocks = per_seq * std::max(max_batch, 1);
  auto comm = make_shared_memory_group(1);  // One rank: no collective touches memory.
  std::vector<std::vector<int>> tables(max_batch, std::vector<int>(per_seq));
  for (int s = 0; s < max_batch; ++s) std::iota(tables[s].begin(), tables[s].end(), s * per_seq);
  const double params = matmul_params(c);
  report.line(Row{{"kind", "model"},
                  {"preset", o.preset},
                  {"weight_gb", places(weight_bytes / 1e9, 2)},
                  {"matmul_params", params}});

  // Decode against batch size and prefill tokens/s for one shard (f32 or bf16 GEMM weights) and
  // KV dtype; a runner of its own, freed before the next (the KV cache is the largest allocation).
  // With graphs: decode rows only, replaying recorded steps on the backend itself (a profiled
  // backend records none).
  auto measure_with = [&](RankShard rank_shard, DType kv_dtype, bool graphs) -> bool {
    const char* weights_name = dtype_name(rank_shard.weight_dtype);
    const char* kv_name = dtype_name(kv_dtype);
    const char* gemm_name = gemm_precision_name(rank_shard.gemm_precision);
    rank_shard.decode_graphs = graphs;
    // Off except for the breakdown rows' steps.
    PhaseProfiler profiler(backend, c.vocab_size);
    auto runner = RankRunner::create(c, rank_shard, c.kv_cache_spec(block, kv_dtype), blocks,
                                     std::max(max_batch, max_prefill), graphs ? backend : &profiler, comm[0].get());
    if (!runner.ok()) {
      std::fprintf(stderr, "%s\n", std::string(runner.status().message()).c_str());
      return false;
    }
    if (BackendBuffer fill_chunk; !fill_kv_arena(**runner, fill_chunk, backend)) {  // Freed after the fill.
      std::fprintf(stderr, "filling the KV cache failed\n");
      return false;
    }
    std::vector<int> tokens;
    auto time_step = [&](ForwardBatch& batch, int iters) -> double {
      batch.samples.assign(batch.logit_rows.size(), kernels::SampleRow{1.0f, 0, 0.95f, 0.5});
      tokens.resize(batch.logit_rows.size());
      double t0 = 0;
      for (int i = 0; i < iters + 2; ++i) {
        if (i == 2) t0 = now_s();  // After two warm-up steps.
        StepMetadata meta;
        meta.pack(batch, block);
        Status s = (*runner)->prepare(batch, meta);
        if (s.ok()) s = (*runner)->forward(batch, {.tokens = tokens.data()});
        if (!s.ok()) {
          std::fprintf(stderr, "forward of %zu tokens: %s\n", batch.tokens.size(), std::string(s.message()).c_str());
          return -1;
        }
      }
      return (now_s() - t0) / iters;
    };
    // One more step of `batch` with each kernel call waited for, as a "breakdown" row.
    auto breakdown = [&](ForwardBatch& batch, const char* step, int size) -> bool {
      if (!o.breakdown || graphs) return true;
      profiler.reset();
      if (!profiler.set_enabled(true).ok() || time_step(batch, 1) < 0 || !profiler.set_enabled(false).ok())
        return false;
      const auto phases = profiler.per_step();
      Row row{{"kind", "breakdown"}, {"weights", weights_name},
              {"gemm", gemm_name},   {"kv_dtype", kv_name},
              {"step", step},        {"size", size}};
      double calls = 0;
      for (int i = 0; i < kPhases; ++i) {
        const std::string name = phase_name(Phase(i));
        row[name + "_ms"] = places(phases[size_t(i)].ms, 4);
        row[name + "_calls"] = phases[size_t(i)].calls;
        if (Phase(i) != Phase::kCopies) calls += phases[size_t(i)].calls;
      }
      row["kernel_calls_per_step"] = calls;
      report.line(row);
      return true;
    };
    // Decode: every sequence at position `context` (its earlier KV already in place).
    for (int b : o.runs(Part::kDecode) ? o.batches : std::vector<int>{}) {
      ForwardBatch batch;
      for (int s = 0; s < b; ++s) {
        batch.tokens.push_back(s % c.vocab_size);
        batch.positions.push_back(o.context);
        batch.block_tables.push_back(tables[s].data());
        batch.logit_rows.push_back(s);
      }
      const double t = time_step(batch, 10);
      if (t < 0) return false;
      double kv_bytes = 0;
      for (int l = 0; l < c.n_layers; ++l)
        kv_bytes += double(b) * (o.context + 1) * 2 * c.kv_dim(l) * double(dtype_size(kv_dtype));
      const double bytes = params * dtype_size(rank_shard.weight_dtype) + kv_bytes;
      const double flops = 2 * params * b + 4.0 * b * (o.context + 1) * c.q_dim() * c.n_layers;
      report.line(Row{{"kind", "decode"},
                      {"weights", weights_name},
                      {"gemm", gemm_name},
                      {"kv_dtype", kv_name},
                      {"graphs", graphs},
                      {"batch", b},
                      {"context", o.context},
                      {"step_ms", places(t * 1e3, 3)},
                      {"tokens_per_s", places(b / t, 1)},
                      {"hbm_fraction", places(bytes / t / roof.hbm_bytes_per_s, 3)},
                      {"f32_compute_fraction", places(flops / t / roof.f32_flop_per_s, 3)},
                      {"bf16_compute_fraction", places(flops / t / roof.bf16_flop_per_s, 4)}});
      if (!breakdown(batch, "decode", b)) return false;
    }
    // Prefill: one sequence's prompt in one step, logits for its last token.
    for (int p : o.runs(Part::kPrefill) && !graphs ? o.prefill : std::vector<int>{}) {
      ForwardBatch batch;
      for (int i = 0; i < p; ++i) {
        batch.tokens.push_back(i % c.vocab_size);
        batch.positions.push_back(i);
        batch.block_tables.push_back(tables[0].data());
      }
      batch.logit_rows = {p - 1};
      const double t = time_step(batch, 3);
      if (t < 0) return false;
      const double flops = 2 * params * p + 2.0 * double(p) * p * c.q_dim() * c.n_layers;
      report.line(Row{{"kind", "prefill"},
                      {"weights", weights_name},
                      {"gemm", gemm_name},
                      {"kv_dtype", kv_name},
                      {"tokens", p},
                      {"step_ms", places(t * 1e3, 2)},
                      {"tokens_per_s", places(p / t, 0)},
                      {"f32_compute_fraction", places(flops / t / roof.f32_flop_per_s, 3)},
                      {"bf16_compute_fraction", places(flops / t / roof.bf16_flop_per_s, 4)}});
      if (!breakdown(batch, "prefill", p)) return false;
    }
    return true;
  };
  auto measure = [&](const RankShard& rank_shard) {
    for (DType kv : o.kv_dtypes)
      for (bool graphs : o.graphs)
        if ((!graphs || o.runs(Part::kDecode)) && !measure_with(rank_shard, kv, graphs)) return false;
    return true;
  };
  if (o.runs(DType::kF32) && !measure(*shard)) return false;
  if (!o.runs(DType::kBF16)) return true;

  // The same model with bf16 GEMM weights (--weight-dtype bf16): each GEMM tensor (the fused
  // ones whole) truncated to bf16 in a buffer of its own (TP 1: every shard pointer is its
  // tensor's start).
  std::vector<std::unique_ptr<BackendBuffer>> half_buffers;
  RankShard half = *shard;
  half.weight_dtype = DType::kBF16;
  auto to_bf16 = [&](const float*& w, int64_t n) -> bool {
    auto b = std::make_unique<BackendBuffer>();
    if (!b->reserve(backend, size_t(n) * 2).ok() || !truncate_to_bf16(b->as<void>(), w, n)) return false;
    w = b->as<const float>();
    half_buffers.push_back(std::move(b));
    return true;
  };
  bool converted = to_bf16(half.lm_head, int64_t(c.vocab_size) * c.dim);
  for (int l = 0; l < c.n_layers && converted; ++l) {
    LayerShard& w = half.layers[l];
    const int64_t q = c.q_dim(l), kv = c.kv_dim(l), d = c.dim, h = c.hidden_dim;
    converted = to_bf16(w.wqkv, (q + 2 * kv) * d) && to_bf16(w.wo, d * q) && to_bf16(w.w_gate_up, 2 * h * d) &&
                to_bf16(w.w_down, d * h);
    const auto after = [](const float* base, int64_t elements) {  // bf16 elements.
      return reinterpret_cast<const float*>(reinterpret_cast<const uint16_t*>(base) + elements);
    };
    w.wq = w.wqkv;
    w.wk = after(w.wq, q * d);
    w.wv = after(w.wk, kv * d);
    w.w_gate = w.w_gate_up;
    w.w_up = after(w.w_gate, h * d);
    const int64_t index_dim = c.attention(l).index_head_dim;
    if (converted && w.w_index_q != nullptr)
      converted = to_bf16(w.w_index_q, index_dim * d) && to_bf16(w.w_index_k, index_dim * d);
  }
  if (!converted || gpuDeviceSynchronize() != gpuSuccess) {
    std::fprintf(stderr, "bf16 copies of the weights failed\n");
    return false;
  }
  for (GemmPrecision precision : o.gemm) {
    half.gemm_precision = precision;
    if (!measure(half)) return false;
  }
  return true;
}

// Sampling rows of the model's vocabulary on the device against copying them to the host.
bool measure_sampling(const Options& o, const ModelConfig& c, Backend* backend, Report& report) {
  for (int rows : o.sampling_rows) {
    BackendBuffer logits, scratch, params, tokens, logprobs;
    const size_t n = size_t(rows) * c.vocab_size;
    const size_t scratch_bytes = size_t(kernels::sample_scratch_floats(rows, c.vocab_size)) * 4;
    if (!logits.reserve(backend, n * 4).ok() || !scratch.reserve(backend, scratch_bytes).ok() ||
        !params.reserve(backend, rows * sizeof(kernels::SampleRow)).ok() || !tokens.reserve(backend, rows * 4).ok() ||
        !logprobs.reserve(backend, rows * sizeof(kernels::RowLogprobs)).ok()) {
      std::fprintf(stderr, "no memory for sampling %d rows\n", rows);
      return false;
    }
    kernels::gpu::fill_random(logits.as<float>(), int64_t(n), 400 + rows, 3.0f, 0.0f, nullptr);
    std::vector<float> host(n);
    const double copy =
        time_calls([&] { (void)backend->copy_to_host(host.data(), logits.as<void>(), n * 4); }, 20).first;
    // The same rows asking for the sampled token's log-probability and the top 20 (OpenAI's
    // most): what a logprobs request adds to a step.
    const auto with_logprobs = [](kernels::SampleRow row) {
      row.logprobs = kernels::kMaxLogprobs;
      return row;
    };
    const struct {
      const char* name;
      kernels::SampleRow row;
    } modes[] = {{"greedy", {0.0f, 0, 1.0f, 0.0}},
                 {"top_p_0.95", {1.0f, 0, 0.95f, 0.5}},
                 {"top_k_50", {1.0f, 50, 1.0f, 0.5}},
                 {"top_k_50_top_p_0.9", {1.0f, 50, 0.9f, 0.5}},
                 {"temperature_only", {1.0f, 0, 1.0f, 0.5}},
                 {"greedy_logprobs_20", with_logprobs({0.0f, 0, 1.0f, 0.0})},
                 {"top_p_0.95_logprobs_20", with_logprobs({1.0f, 0, 0.95f, 0.5})}};
    for (const auto& m : modes) {
      const std::vector<kernels::SampleRow> rows_params(rows, m.row);
      if (gpuMemcpy(params.as<void>(), rows_params.data(), rows * sizeof(m.row), gpuMemcpyHostToDevice) != gpuSuccess)
        return false;
      const kernels::ShardedLogits view{logits.as<float>(), rows, c.vocab_size, 1};
      const auto [t, e] = time_calls([&] {
        kernels::gpu::sample(tokens.as<int>(), logprobs.as<kernels::RowLogprobs>(), view,
                             params.as<kernels::SampleRow>(), {}, {}, scratch.as<float>(), nullptr);
      }, 20);
      report.line(Row{{"kind", "sampling"},
                      {"mode", m.name},
                      {"rows", rows},
                      {"vocab", c.vocab_size},
                      {"device_us", places(t * 1e6, 1)},
                      {"logits_to_host_us", places(copy * 1e6, 1)},
                      {"vs_copy", places(t / copy, 3)},
                      {"error", e == gpuSuccess ? "" : gpuGetErrorString(e)}});
    }
  }

  return true;
}

// The vendor BLAS's bf16 GEMMs (f32 accumulation; cuBLAS, or hipBLAS where the HIP build has it)
// at the model's projection shapes, and the portable GEMM (GEMV up to 8 rows, tiled beyond) with
// bf16 weights and f32 activations, as --weight-dtype bf16 and a HIP build without hipBLAS run
// it. Inputs are random, never zeros: bf16 values truncated from N(0, 0.02) floats.
bool measure_gemms(const Options& o, const Roofline& roof, const ModelConfig& c, Backend* backend, Report& report) {
  BackendBuffer f32;
  auto random_bf16 = [&](BackendBuffer& dst, int64_t n, uint64_t seed) {
    return random_bf16_buffer(backend, dst, f32, n, seed, 0.02f);
  };
#if defined(PDSERVE_GPU_BLAS)
  gpublasHandle_t h;
  if (gpublasCreate(&h) != GPUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "BLAS handle create failed\n");
    return false;
  }
#endif
  const int shapes[4][2] = {{c.q_dim() + 2 * c.kv_dim(), c.dim}, {c.dim, c.q_dim()}, {2 * c.hidden_dim, c.dim}, {c.dim, c.hidden_dim}};
  const char* names[4] = {"qkv", "o", "gate_up", "down"};
  const int iters = 20;
  // Beyond 2048 rows the vendor GEMM only.
  constexpr bool kVendorBlas =
#if defined(PDSERVE_GPU_BLAS)
      true;
#else
      false;
#endif
  for (int rows : o.gemm_rows)
    for (int s = 0; s < 4 && (kVendorBlas || rows <= 2048); ++s) {
      const int out = shapes[s][0], in = shapes[s][1];
      const double flops = 2.0 * rows * out * in;
      BackendBuffer w, x, y;
      if (!random_bf16(w, int64_t(out) * in, 100 + s) || !random_bf16(x, int64_t(rows) * in, 200 + s) ||
          !y.reserve(backend, size_t(rows) * out * 2).ok()) {
        std::fprintf(stderr, "no memory for the %s GEMM of %d rows\n", names[s], rows);
        return false;
      }
      double vendor_s = 0;  // 0: no vendor BLAS in this build, or its call failed.
#if defined(PDSERVE_GPU_BLAS)
      const float alpha = 1, beta = 0;
      auto vendor_gemm = [&] {
        return gpublasGemmEx(h, GPUBLAS_OP_T, GPUBLAS_OP_N, out, rows, in, &alpha, w.as<void>(), GPUBLAS_R_16BF, in,
                             x.as<void>(), GPUBLAS_R_16BF, in, &beta, y.as<void>(), GPUBLAS_R_16BF, out,
                             GPUBLAS_COMPUTE_32F, GPUBLAS_GEMM_DEFAULT);
      };
      double t = 0;
      gpuError_t e = gpuSuccess;
      // A refused call launches nothing: time it only once the BLAS has taken it.
      const bool taken = vendor_gemm() == GPUBLAS_STATUS_SUCCESS;
      if (taken) std::tie(t, e) = time_calls([&] { (void)vendor_gemm(); }, iters);
      const double bytes = 2.0 * (double(out) * in + double(rows) * (in + out));
      const bool ok = taken && e == gpuSuccess;
      report.line(Row{{"kind", "bf16_gemm"},
                      {"op", names[s]},
                      {"rows", rows},
                      {"out", out},
                      {"in", in},
                      {"us", places(t * 1e6, 1)},
                      {"tflops", ok ? places(flops / t / 1e12, 1) : 0.0},
                      {"bf16_compute_fraction", ok ? places(flops / t / roof.bf16_flop_per_s, 3) : 0.0},
                      {"hbm_fraction", ok ? places(bytes / t / roof.hbm_bytes_per_s, 3) : 0.0},
                      {"error", !taken            ? "the BLAS refused the call"
                                : e == gpuSuccess ? ""
                                                  : gpuGetErrorString(e)}});
      if (ok) vendor_s = t;
#endif
      if (rows > 2048) continue;
      BackendBuffer xf, yf;
      if (!xf.reserve(backend, size_t(rows) * in * 4).ok() || !yf.reserve(backend, size_t(rows) * out * 4).ok()) {
        std::fprintf(stderr, "no memory for the portable %s GEMM of %d rows\n", names[s], rows);
        return false;
      }
      kernels::gpu::fill_random(xf.as<float>(), int64_t(rows) * in, 300 + s, 1.0f, 0.0f, nullptr);
      const auto [tt, portable_error] = time_calls([&] {
        kernels::gpu::matmul_xwt(yf.as<float>(), xf.as<float>(), w.as<void>(), kernels::gpu::Storage::kBF16, rows, out,
                                 in, in, nullptr);
      }, iters);
      const double tbytes = 2.0 * double(out) * in + 4.0 * double(rows) * (in + out);
      report.line(Row{{"kind", "portable_gemm_bf16w"},
                      {"op", names[s]},
                      {"rows", rows},
                      {"out", out},
                      {"in", in},
                      {"us", places(tt * 1e6, 1)},
                      {"tflops", places(flops / tt / 1e12, 2)},
                      {"vs_vendor_bf16", vendor_s > 0 ? Row(places(vendor_s / tt, 3)) : Row(nullptr)},
                      {"hbm_fraction", places(tbytes / tt / roof.hbm_bytes_per_s, 3)},
                      {"error", portable_error == gpuSuccess ? "" : gpuGetErrorString(portable_error)}});
    }
#if defined(PDSERVE_GPU_BLAS)
  gpublasDestroy(h);
#endif
  return true;
}

// Prefill attention alone (--only attention): one layer's heads over one sequence's prompt of each
// --prefill length in one chunk, from a bf16 cache, by the CUDA-core kernel (what
// --gemm-precision exact runs) and the tensor-core one (bf16), in TFLOP/s of causal attention
// (Q·Kᵀ and P·V: 4 · heads · head dim · L(L+1)/2 flops) and as a fraction of the bf16 peak.
bool measure_attention(const Options& o, const Roofline& roof, const ModelConfig& c, Backend* backend, Report& report) {
  const LayerAttention a = c.attention(0);
  const int nq = c.n_heads, nkv = a.n_kv_heads, hd = a.head_dim;
  KvCacheSpec spec;  // One layer of the model's cache, in bf16.
  spec.layers = {{KvKind::kKv, KvSharding::kByHead, nkv, hd, hd, DType::kBF16}};
  for (int len : o.prefill) {
    const int blocks = (len + spec.block_size - 1) / spec.block_size;
    auto layout = KvCacheLayout::create(spec, 0, 1, blocks);
    const int64_t q_elems = int64_t(len) * nq * hd;
    BackendBuffer arena, f32, q, out, ints, table_ptrs;
    // The arena (K and V) random, as bf16 values.
    bool made = layout.ok() && random_bf16_buffer(backend, arena, f32, int64_t(layout->total_bytes() / 2), 500, 1.0f);
    if (!made || !q.reserve(backend, size_t(q_elems) * 4).ok() || !out.reserve(backend, size_t(q_elems) * 4).ok() ||
        !ints.reserve(backend, size_t(len + blocks) * 4).ok() ||
        !table_ptrs.reserve(backend, size_t(len) * sizeof(const int*)).ok()) {
      std::fprintf(stderr, "no memory for prefill attention over %d tokens\n", len);
      return false;
    }
    kernels::gpu::fill_random(q.as<float>(), q_elems, 502, 1.0f, 0.0f, nullptr);
    std::vector<int> host_ints(size_t(len) + blocks);  // Positions, then the block table.
    std::iota(host_ints.begin(), host_ints.begin() + len, 0);
    std::iota(host_ints.begin() + len, host_ints.end(), 0);
    const std::vector<const int*> host_ptrs(len, ints.as<int>() + len);
    // The kernels below run on the default stream, which does not wait for the backend's.
    made =
        made && backend->copy_to_device(ints.as<void>(), host_ints.data(), host_ints.size() * 4).ok() &&
        backend->copy_to_device(table_ptrs.as<void>(), host_ptrs.data(), host_ptrs.size() * sizeof(const int*)).ok() &&
        backend->synchronize().ok();
    if (!made) {
      std::fprintf(stderr, "could not fill prefill attention's inputs\n");
      return false;
    }
    const kernels::PagedLayerView view = layout->view(0, arena.as<uint8_t>());
    const kernels::TokenPlacement tokens{len, ints.as<int>(), table_ptrs.as<const int* const>()};
    const double flops = 4.0 * nq * hd * (double(len) * (len + 1) / 2);
    const float scale = 1.0f / std::sqrt(float(hd));
    double exact_s = 0;
    for (bool tensor_cores : {false, true}) {
      const auto [t, e] = time_calls(
          [&] {
            (tensor_cores ? kernels::gpu::prefill_attention_bf16 : kernels::gpu::prefill_attention)(
                out.as<float>(), q.as<float>(), view, tokens, nq, nq / nkv, 0, scale, nullptr);
          },
          3);
      if (!tensor_cores) exact_s = t;
      report.line(Row{{"kind", "prefill_attention"},
                      {"kernel", tensor_cores ? "bf16_tensor_cores" : "exact"},
                      {"tokens", len},
                      {"heads", nq},
                      {"kv_heads", nkv},
                      {"head_dim", hd},
                      {"ms", places(t * 1e3, 3)},
                      {"tflops", places(flops / t / 1e12, 2)},
                      {"bf16_compute_fraction", places(flops / t / roof.bf16_flop_per_s, 4)},
                      {"speedup_vs_exact", places(exact_s / t, 2)},
                      {"error", e == gpuSuccess ? "" : gpuGetErrorString(e)}});
    }
  }
  return true;
}

int run(const Options& o) {
  auto config_or = make_model_preset_config(o.preset);
  if (!config_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config_or.status().message()).c_str());
    return 1;
  }
  ModelConfig c = *config_or;
  c.max_seq_len = std::max({c.max_seq_len, o.context + 1, *std::max_element(o.prefill.begin(), o.prefill.end())});
  auto backend = make_gpu_backend(0);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  Report report;
  if (!o.out.empty()) report.file.open(o.out);
  const Roofline& roof = rooflines().at(o.roofline);
  report.line(Row{{"kind", "roofline"},
                  {"name", o.roofline},
                  {"backend", (*backend)->name()},
                  {"hbm_bytes_per_s", roof.hbm_bytes_per_s},
                  {"bf16_flop_per_s", roof.bf16_flop_per_s},
                  {"f32_flop_per_s", roof.f32_flop_per_s}});
  if ((o.runs(Part::kDecode) || o.runs(Part::kPrefill)) && !measure_model(o, roof, c, backend->get(), report)) return 1;
  if (o.runs(Part::kSampling) && !measure_sampling(o, c, backend->get(), report)) return 1;
  if (o.runs(Part::kGemm) && !measure_gemms(o, roof, c, backend->get(), report)) return 1;
  if (o.runs(Part::kAttention) && !measure_attention(o, roof, c, backend->get(), report)) return 1;
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  using pdserve::Part;
  using pdserve::engine::DType;
  pdserve::Options o;
  CLI::App app{"pdserve GPU forward-pass benchmark (8B-shape synthetic model against a GPU's rooflines)"};
  app.add_option("--preset", o.preset, "Model shape (make-model preset)");
  app.add_option("--context", o.context, "Decode position of every sequence")->check(CLI::Range(1, 1 << 20));
  app.add_option("--batches", o.batches, "Decode batch sizes")->delimiter(',')->check(CLI::Range(1, 4096));
  app.add_option("--prefill", o.prefill, "Prefill prompt lengths")->delimiter(',')->check(CLI::Range(1, 1 << 20));
  app.add_option("--gemm-rows", o.gemm_rows, "Rows of the GEMM rows")->delimiter(',')->check(CLI::Range(1, 1 << 16));
  app.add_option("--sampling-rows", o.sampling_rows, "Rows of the sampling rows")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  app.add_option("--breakdown", o.breakdown, "1: a per-phase breakdown row after each decode and prefill row")
      ->check(CLI::IsMember({"0", "1"}));
  std::vector<std::string> only = {"decode", "prefill", "sampling", "gemm", "attention"}, weights = {"f32", "bf16"},
                           kv_dtypes = {"f32", "bf16"}, gemm = {"exact", "bf16"}, graphs = {"off", "on"};
  app.add_option("--only", only, "What to measure: decode, prefill, sampling, gemm, attention")
      ->delimiter(',')
      ->check(CLI::IsMember({"decode", "prefill", "sampling", "gemm", "attention"}));
  app.add_option("--weights", weights, "GEMM weights of the decode and prefill rows: f32, bf16")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--kv-dtype", kv_dtypes, "KV cache elements of the decode and prefill rows: f32, bf16")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--gemm", gemm,
                 "GEMM precisions of the bf16-weight decode and prefill rows: exact (f32 activations), bf16")
      ->delimiter(',')
      ->check(CLI::IsMember({"exact", "bf16"}));
  app.add_option("--graphs", graphs, "Decode rows eager (off) and replaying recorded graphs (on)")
      ->delimiter(',')
      ->check(CLI::IsMember({"off", "on"}));
  app.add_option("--roofline", o.roofline, "The GPU whose datasheet peaks the fractions are of")
      ->check(CLI::IsMember({"h100", "h200", "mi355x"}));
  app.add_option("--out", o.out, "Also write the JSON lines to this file");
  CLI11_PARSE(app, argc, argv);
  const std::map<std::string, Part> parts = {{"decode", Part::kDecode},
                                             {"prefill", Part::kPrefill},
                                             {"sampling", Part::kSampling},
                                             {"gemm", Part::kGemm},
                                             {"attention", Part::kAttention}};
  o.only.clear();
  for (const std::string& name : only) o.only.push_back(parts.at(name));
  // An option given for a part --only leaves out would change nothing: refused, not ignored.
  const std::vector<std::pair<const char*, std::vector<Part>>> serves = {
      {"--context", {Part::kDecode}},
      {"--batches", {Part::kDecode}},
      {"--prefill", {Part::kPrefill, Part::kAttention}},
      {"--breakdown", {Part::kDecode, Part::kPrefill}},
      {"--weights", {Part::kDecode, Part::kPrefill}},
      {"--kv-dtype", {Part::kDecode, Part::kPrefill}},
      {"--gemm", {Part::kDecode, Part::kPrefill}},
      {"--graphs", {Part::kDecode}},
      {"--gemm-rows", {Part::kGemm}},
      {"--sampling-rows", {Part::kSampling}},
      {"--roofline", {Part::kDecode, Part::kPrefill, Part::kGemm, Part::kAttention}}};
  for (const auto& [option, served] : serves) {
    if (app.count(option) == 0) continue;
    if (std::none_of(served.begin(), served.end(), [&](Part p) { return o.runs(p); })) {
      std::fprintf(stderr, "%s measures nothing that --only runs\n", option);
      return 1;
    }
  }
  o.weights.clear();
  for (const std::string& name : weights) o.weights.push_back(*pdserve::engine::dtype_from_name(name));
  o.kv_dtypes.clear();
  for (const std::string& name : kv_dtypes) o.kv_dtypes.push_back(*pdserve::engine::dtype_from_name(name));
  if (app.count("--gemm") > 0 && !o.runs(DType::kBF16)) {
    std::fprintf(stderr, "--gemm sets the bf16-weight rows' precision: --weights has no bf16\n");
    return 1;
  }
  o.gemm.clear();
  for (const std::string& name : gemm) o.gemm.push_back(*pdserve::engine::gemm_precision_from_name(name));
  o.graphs.clear();
  for (const std::string& name : graphs) o.graphs.push_back(name == "on");
  return pdserve::run(o);
}
