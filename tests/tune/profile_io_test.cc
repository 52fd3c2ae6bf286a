// profile.json: every field survives the round trip, the file's bytes are deterministic, a bad
// file is refused naming the key, and the synthetic fixture profiles load with the magnitudes
// the offline-planning tests rely on.
#include "tune/profile_io.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "tests/tune/fixtures.h"

namespace pdserve::tune {
namespace {

using nlohmann::json;
using testing::fixture_path;

// Distinct values everywhere, so a field written into another's key shows.
Profile sample_profile() {
  Profile p;
  p.model = "synthetic-100m";
  p.model_sha256 = "ab12";
  p.device = Device::kHip;
  p.device_model = "AMD Instinct MI355X";
  p.dtype = engine::DType::kBF16;
  p.kv_dtype = engine::DType::kBF16;
  p.gemm_precision = engine::GemmPrecision::kBf16;
  p.pdserve_version = "15cb056";
  TpProfile t1;
  t1.tp = 1;
  t1.prefill = {0.001, 2e-5, 3e-10};
  t1.decode.lo = {0.004, 5e-6, 6e-9};
  t1.decode.hi = {0.007, 8e-6, 9e-9};
  t1.decode.split = 32;
  t1.prefill_error = {30, 7, 0.01, 0.02};
  t1.decode_error = {31, 8, 0.03, 0.04};
  t1.kv_tokens = 123456;
  t1.block_size = 32;
  t1.max_running = 96;
  t1.max_batch_tokens = 4096;
  t1.max_context = 8192;
  TpProfile t2 = t1;
  t2.tp = 2;
  t2.prefill.a = 0.0015;
  t2.decode.split = std::numeric_limits<double>::infinity();  // One regime: written as null.
  t2.kv_tokens = 246912;
  p.by_tp = {{1, t1}, {2, t2}};
  p.kv = {{1, 2, KvMode::kPush, {0.0005, 1e-6}, {9, 2, 0.05, 0.06}}, {2, 1, KvMode::kPull, {0.0009, 3e-6}, {10, 3, 0.07, 0.08}}};
  p.router_overhead_s = 0.0011;
  p.pd_overhead_s = 0.0019;
  p.handoff_s = 0.0021;
  return p;
}

void expect_same_error(const FitError& a, const FitError& b) {
  EXPECT_EQ(a.points, b.points);
  EXPECT_EQ(a.held_out, b.held_out);
  EXPECT_EQ(a.median_abs_rel, b.median_abs_rel);
  EXPECT_EQ(a.p90_abs_rel, b.p90_abs_rel);
}

void expect_same_profile(const Profile& a, const Profile& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.model_sha256, b.model_sha256);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.device_model, b.device_model);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.kv_dtype, b.kv_dtype);
  EXPECT_EQ(a.gemm_precision, b.gemm_precision);
  EXPECT_EQ(a.pdserve_version, b.pdserve_version);
  EXPECT_EQ(a.router_overhead_s, b.router_overhead_s);
  EXPECT_EQ(a.pd_overhead_s, b.pd_overhead_s);
  EXPECT_EQ(a.handoff_s, b.handoff_s);
  ASSERT_EQ(a.by_tp.size(), b.by_tp.size());
  for (const auto& [tp, x] : a.by_tp) {
    ASSERT_TRUE(b.by_tp.count(tp)) << "tp " << tp;
    const TpProfile& y = b.by_tp.at(tp);
    SCOPED_TRACE("tp " + std::to_string(tp));
    EXPECT_EQ(x.tp, y.tp);
    EXPECT_EQ(x.prefill.a, y.prefill.a);
    EXPECT_EQ(x.prefill.b, y.prefill.b);
    EXPECT_EQ(x.prefill.c, y.prefill.c);
    for (auto [rx, ry] : {std::pair{x.decode.lo, y.decode.lo}, std::pair{x.decode.hi, y.decode.hi}}) {
      EXPECT_EQ(rx.a, ry.a);
      EXPECT_EQ(rx.b, ry.b);
      EXPECT_EQ(rx.c, ry.c);
    }
    EXPECT_EQ(x.decode.split, y.decode.split);
    expect_same_error(x.prefill_error, y.prefill_error);
    expect_same_error(x.decode_error, y.decode_error);
    EXPECT_EQ(x.kv_tokens, y.kv_tokens);
    EXPECT_EQ(x.block_size, y.block_size);
    EXPECT_EQ(x.max_running, y.max_running);
    EXPECT_EQ(x.max_batch_tokens, y.max_batch_tokens);
    EXPECT_EQ(x.max_context, y.max_context);
  }
  ASSERT_EQ(a.kv.size(), b.kv.size());
  for (size_t i = 0; i < a.kv.size(); ++i) {
    SCOPED_TRACE("kv " + std::to_string(i));
    EXPECT_EQ(a.kv[i].tp_p, b.kv[i].tp_p);
    EXPECT_EQ(a.kv[i].tp_d, b.kv[i].tp_d);
    EXPECT_EQ(a.kv[i].mode, b.kv[i].mode);
    EXPECT_EQ(a.kv[i].law.alpha, b.kv[i].law.alpha);
    EXPECT_EQ(a.kv[i].law.per_token, b.kv[i].law.per_token);
    expect_same_error(a.kv[i].error, b.kv[i].error);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ProfileIo, DeviceAndKvModeNamesRoundTrip) {
  const std::pair<Device, const char*> devices[] = {
      {Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}, {Device::kHip, "hip"}, {Device::kEmulated, "emulated"}};
  for (const auto& [device, name] : devices) {
    EXPECT_EQ(device_name(device), name);
    auto parsed = parse_device(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, device);
  }
  for (const char* bad : {"gpu", "CUDA", "rocm", ""}) EXPECT_FALSE(parse_device(bad).ok()) << bad;
  for (const auto& [mode, name] : {std::pair{KvMode::kPush, "push"}, std::pair{KvMode::kPull, "pull"}}) {
    EXPECT_EQ(kv_mode_name(mode), name);
    auto parsed = parse_kv_mode(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, mode);
  }
  for (const char* bad : {"aggregated", "Push", ""}) EXPECT_FALSE(parse_kv_mode(bad).ok()) << bad;
}

TEST(ProfileIo, JsonRoundTripKeepsEveryField) {
  const Profile p = sample_profile();
  const json j = profile_to_json(p);
  EXPECT_EQ(j["schema"], "pdserve.tune.profile/v1");
  EXPECT_EQ(j["device"], "hip");
  EXPECT_TRUE(j["tp"][1]["decode"]["split"].is_null());  // +inf, which JSON cannot hold.
  EXPECT_EQ(j["kv"][1]["mode"], "pull");
  auto back = profile_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status();
  expect_same_profile(p, *back);
  EXPECT_TRUE(std::isinf(back->by_tp.at(2).decode.split));
}

TEST(ProfileIo, FileRoundTripWritesTheSameBytes) {
  const std::string first = ::testing::TempDir() + "/profile_io_first.json";
  const std::string second = ::testing::TempDir() + "/profile_io_second.json";
  ASSERT_TRUE(save_profile(first, sample_profile()).ok());
  auto loaded = load_profile(first);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  expect_same_profile(sample_profile(), *loaded);
  ASSERT_TRUE(save_profile(second, *loaded).ok());
  const std::string bytes = read_file(first);
  EXPECT_EQ(bytes, read_file(second));
  // Keys in a fixed (sorted) order, indent 2, one trailing newline.
  EXPECT_EQ(bytes.rfind("{\n  \"device\": \"hip\",\n  \"device_model\": ", 0), 0u) << bytes.substr(0, 80);
  EXPECT_EQ(bytes.back(), '\n');
}

TEST(ProfileIo, RefusesAnotherSchema) {
  json j = profile_to_json(sample_profile());
  j["schema"] = "pdserve.tune.profile/v2";
  auto r = profile_from_json(j);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'pdserve.tune.profile/v2'"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("'pdserve.tune.profile/v1'"), std::string::npos) << r.status();
  j.erase("schema");
  EXPECT_NE(profile_from_json(j).status().message().find("missing key schema"), std::string::npos);
}

TEST(ProfileIo, RefusesABadFileNamingTheKey) {
  struct Case {
    const char* what;
    std::function<void(json&)> corrupt;
    const char* message;  // Part of the error, naming the key.
  };
  const Case cases[] = {
      {"unknown device", [](json& j) { j["device"] = "rocm"; },
       "device: device must be cpu, cuda, hip or emulated, not 'rocm'"},
      {"unknown kv mode", [](json& j) { j["kv"][0]["mode"] = "aggregated"; },
       "kv[0].mode: kv mode must be push or pull"},
      {"missing coefficient", [](json& j) { j["tp"][0]["decode"]["lo"].erase("a"); }, "missing key tp[0].decode.lo.a"},
      {"missing top-level key", [](json& j) { j.erase("handoff_s"); }, "missing key handoff_s"},
      {"negative kv capacity", [](json& j) { j["tp"][1]["kv_tokens"] = -16; }, "tp[1].kv_tokens must be at least 1"},
      {"zero max running", [](json& j) { j["tp"][0]["max_running"] = 0; }, "tp[0].max_running must be at least 1"},
      {"negative max context", [](json& j) { j["tp"][0]["max_context"] = -1; }, "tp[0].max_context must be at least 0"},
      {"negative coefficient", [](json& j) { j["tp"][0]["prefill"]["b"] = -1e-5; },
       "tp[0].prefill.b must not be negative"},
      {"negative split", [](json& j) { j["tp"][0]["decode"]["split"] = -2; },
       "tp[0].decode.split must not be negative"},
      {"negative kv law", [](json& j) { j["kv"][1]["law"]["per_token"] = -1e-6; },
       "kv[1].law.per_token must not be negative"},
      {"fractional integer", [](json& j) { j["tp"][0]["block_size"] = 16.5; }, "tp[0].block_size must be an integer"},
      {"string for a number", [](json& j) { j["router_overhead_s"] = "1ms"; }, "router_overhead_s must be a number"},
      {"misspelt key", [](json& j) { j["tp"][0]["max_runing"] = 8; }, "unknown key tp[0].max_runing"},
      {"duplicate tp", [](json& j) { j["tp"][1]["tp"] = 1; }, "tp[1].tp 1 appears twice"},
      {"no tp at all",
       [](json& j) {
         j["tp"] = json::array();
         j["kv"] = json::array();
       },
       "tp must list at least one TP size"},
      {"kv between unprofiled sizes", [](json& j) { j["kv"][0]["tp_d"] = 4; },
       "kv[0].tp_d 4 is not a profiled TP size"},
      {"duplicate kv pair", [](json& j) { j["kv"][1] = j["kv"][0]; }, "kv[1]: TP 1 -> 2 push appears twice"},
      {"not an object", [](json& j) { j["tp"][0]["decode"] = 3; }, "tp[0].decode must be an object"},
      {"note not text", [](json& j) { j["note"] = 1; }, "note must be a string"},
      {"unknown kv dtype", [](json& j) { j["kv_dtype"] = "fp8"; }, "kv_dtype must be f32 or bf16, not 'fp8'"},
      {"unknown gemm precision", [](json& j) { j["gemm_precision"] = "tf32"; },
       "gemm_precision must be exact or bf16, not 'tf32'"},
      {"unknown weight dtype", [](json& j) { j["dtype"] = "f16"; }, "dtype must be f32 or bf16, not 'f16'"},
  };
  for (const Case& c : cases) {
    json j = profile_to_json(sample_profile());
    ASSERT_TRUE(profile_from_json(j).ok()) << c.what;
    c.corrupt(j);
    auto r = profile_from_json(j);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << c.what << ": " << r.status();
  }
}

TEST(ProfileIo, LoadReportsTheFile) {
  const std::string missing = ::testing::TempDir() + "/no_such_profile.json";
  EXPECT_EQ(load_profile(missing).status().code(), absl::StatusCode::kNotFound);
  const std::string garbage = ::testing::TempDir() + "/garbage_profile.json";
  std::ofstream(garbage) << "{\"schema\": ";
  auto r = load_profile(garbage);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(garbage), std::string::npos) << r.status();
}

TEST(ProfileIo, KeyNamesWhatWasMeasured) {
  EXPECT_EQ(profile_key(sample_profile()),
            "model=ab12 device=hip device_model=\"AMD Instinct MI355X\" dtype=bf16 kv_dtype=bf16 gemm=bf16 tp=1,2 "
            "pdserve=15cb056");
}

// kv_dtype came after the first profiles: one without it kept an f32 KV cache, and an f32
// profile is written without it (so readers from before the key still read it).
TEST(ProfileIo, AProfileWithoutAKvDtypeKeptAnF32KvCache) {
  json j = profile_to_json(sample_profile());
  j.erase("kv_dtype");
  auto p = profile_from_json(j);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kv_dtype, engine::DType::kF32);
  EXPECT_FALSE(profile_to_json(*p).contains("kv_dtype"));
}

// gemm_precision likewise: a profile without it was measured with exact GEMMs, and an exact
// profile is written without it.
TEST(ProfileIo, AProfileWithoutAGemmPrecisionRanExactGemms) {
  json j = profile_to_json(sample_profile());
  EXPECT_EQ(j.value("gemm_precision", ""), "bf16");
  j.erase("gemm_precision");
  auto p = profile_from_json(j);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->gemm_precision, engine::GemmPrecision::kExact);
  EXPECT_FALSE(profile_to_json(*p).contains("gemm_precision"));
}

// The fixtures are SYNTHETIC (their "note" says so): shaped like an 8B bf16 model on the GPU,
// with magnitudes in the range published for it, so offline planning sees realistic trade-offs.
TEST(ProfileIo, SyntheticFixtureProfilesLoad) {
  struct Fixture {
    const char* file;
    Device device;
    const char* device_model;
  };
  for (const Fixture& f : {Fixture{"profile_cuda_h200.json", Device::kCuda, "NVIDIA H200"},
                           Fixture{"profile_hip_mi355x.json", Device::kHip, "AMD Instinct MI355X"}}) {
    SCOPED_TRACE(f.file);
    const std::string path = fixture_path(f.file);
    auto p = load_profile(path);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NE(read_file(path).find("\"note\": \"SYNTHETIC: not measured."), std::string::npos);
    EXPECT_EQ(p->device, f.device);
    EXPECT_EQ(p->device_model, f.device_model);
    EXPECT_EQ(p->dtype, engine::DType::kBF16);
    std::vector<int> tps;
    for (const auto& [tp, unused] : p->by_tp) tps.push_back(tp);
    EXPECT_EQ(tps, (std::vector<int>{1, 2, 4, 8}));
    EXPECT_EQ(p->kv.size(), 4u * 4u * 2u);  // Every (TP_p, TP_d) pair, push and pull.
    const TpProfile& tp1 = p->by_tp.at(1);
    const double decode_ms = 1e3 * tp1.decode.step_seconds(1, 1024);
    EXPECT_GT(decode_ms, 5.0);
    EXPECT_LT(decode_ms, 9.0);
    const double prefill_tok_s = 2048 / tp1.prefill.step_seconds(2048);
    EXPECT_GT(prefill_tok_s, 8000);
    EXPECT_LT(prefill_tok_s, 15000);
    // More ranks: faster steps and more KV.
    EXPECT_LT(p->by_tp.at(8).decode.step_seconds(1, 1024), tp1.decode.step_seconds(1, 1024));
    EXPECT_LT(p->by_tp.at(8).prefill.step_seconds(2048), tp1.prefill.step_seconds(2048));
    EXPECT_GT(p->by_tp.at(8).kv_tokens, tp1.kv_tokens);
  }
}

}  // namespace
}  // namespace pdserve::tune
