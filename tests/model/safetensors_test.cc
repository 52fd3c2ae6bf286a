#include "engine/model/safetensors.h"

#include <cmath>
#include <cstring>

#include "engine/model/float_convert.h"
#include "engine/model/safetensors_writer.h"
#include "tests/model/test_util.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

float element(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::kF32: return static_cast<const float*>(v.data)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
  }
  return NAN;
}

TEST(FloatConvert, RoundTripsAndRounds) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.15625f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(f)), f) << f;
  for (float f : {0.0f, 1.0f, -2.5f, 3.0e38f, 1.0e-30f}) EXPECT_NEAR(bf16_to_f32(f32_to_bf16(f)), f, std::fabs(f) / 128);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e-9f), 0);
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 4096), f32_to_f16(1.0f));  // tie rounds to even
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  // Every half value survives half -> float -> half.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
}

class SafetensorsRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(SafetensorsRoundTrip, WritesAndReadsBack) {
  const DType dtype = GetParam();
  TempDir dir;
  std::vector<TensorSpec> specs = {{"a", dtype, {3, 5}}, {"empty", dtype, {0, 4}}, {"b", dtype, {7}}, {"scalar", dtype, {}}};
  auto w = SafetensorsWriter::create((dir.path() / "model.safetensors").string(), specs, {{"format", "pt"}});
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> values(15 + 7 + 1);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * float(i) - 2.0f;
  // Chunks that straddle tensor boundaries.
  ASSERT_TRUE((*w)->write_floats(values.data(), 10).ok());
  ASSERT_TRUE((*w)->write_floats(values.data() + 10, 9).ok());
  EXPECT_EQ((*w)->finish().code(), absl::StatusCode::kFailedPrecondition);  // 4 values missing
  ASSERT_TRUE((*w)->write_floats(values.data() + 19, 4).ok());
  EXPECT_EQ((*w)->write_floats(values.data(), 1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*w)->finish().ok());
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors.tmp"));

  auto table = read_safetensors_dir(dir.str());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->names(), (std::vector<std::string>{"a", "b", "empty", "scalar"}));
  auto a = (*table)->tensor("a");
  auto b = (*table)->tensor("b");
  auto s = (*table)->tensor("scalar");
  ASSERT_TRUE(a.ok() && b.ok() && s.ok());
  EXPECT_EQ(a->dtype, dtype);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ((*table)->tensor("empty")->numel(), 0);
  EXPECT_EQ(s->shape, std::vector<int64_t>{});
  for (int i = 0; i < 15; ++i) EXPECT_EQ(element(*a, i), values[i]);  // exact in all three dtypes
  for (int i = 0; i < 7; ++i) EXPECT_EQ(element(*b, i), values[15 + i]);
  EXPECT_EQ(element(*s, 0), values[22]);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 8, 0u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SafetensorsRoundTrip, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16));

TEST(Safetensors, UnfinishedWriterLeavesNoFile) {
  TempDir dir;
  {
    auto w = SafetensorsWriter::create((dir.path() / "x.safetensors").string(), {{"a", DType::kF32, {4}}});
    ASSERT_TRUE(w.ok());
    float v = 1;
    ASSERT_TRUE((*w)->write_floats(&v, 1).ok());
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// Writes a safetensors file with the given raw header and data bytes.
void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::string len(8, '\0');
  uint64_t n = header.size();
  std::memcpy(len.data(), &n, 8);
  write_file(p, len + header + data);
}

TEST(Safetensors, UnalignedDataIsCopied) {
  TempDir dir;
  std::string header = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";  // 53 bytes: unaligned
  float v[2] = {1.5f, -2.0f};
  write_raw(dir.path() / "model.safetensors", header, std::string(reinterpret_cast<char*>(v), 8));
  auto table = read_safetensors_dir(dir.str());
  ASSERT_TRUE(table.ok()) << table.status();
  auto t = (*table)->tensor("t");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 4, 0u);
  EXPECT_EQ(static_cast<const float*>(t->data)[1], -2.0f);
}

TEST(Safetensors, RejectsCorruptFiles) {
  struct Case {
    const char* what;
    std::string header;
    size_t data_bytes;
  };
  const Case cases[] = {
      {"offsets past the end", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8},
      {"offsets reversed", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8},
      {"size mismatch", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8},
      {"negative shape", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8},
      {"huge shape", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8},
      {"bad json", R"({"t":{"dtype":"F32",)", 8},
      {"not an object", R"([1,2])", 8},
      {"unsupported dtype", R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8},
      {"missing fields", R"({"t":{"dtype":"F32"}})", 8},
      {"offsets not numbers", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})", 8},
  };
  for (const Case& c : cases) {
    TempDir dir;
    write_raw(dir.path() / "model.safetensors", c.header, std::string(c.data_bytes, '\0'));
    auto r = read_safetensors_dir(dir.str());
    EXPECT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.status().message().find("model.safetensors"), std::string::npos) << r.status();
  }
  TempDir dir;
  write_file(dir.path() / "model.safetensors", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10));
  EXPECT_FALSE(read_safetensors_dir(dir.str()).ok());
  write_file(dir.path() / "model.safetensors", "abc");
  EXPECT_FALSE(read_safetensors_dir(dir.str()).ok());
  TempDir empty;
  EXPECT_EQ(read_safetensors_dir(empty.str()).status().code(), absl::StatusCode::kNotFound);
}

Status write_shard(const fs::path& p, const std::vector<std::string>& names, float base) {
  std::vector<TensorSpec> specs;
  for (const auto& n : names) specs.push_back({n, DType::kBF16, {2, 2}});
  PD_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::create(p.string(), specs));
  for (size_t i = 0; i < names.size() * 4; ++i) {
    float v = base + float(i);
    PD_RETURN_IF_ERROR(w->write_floats(&v, 1));
  }
  return w->finish();
}

TEST(Safetensors, ShardedIndex) {
  TempDir dir;
  ASSERT_TRUE(write_shard(dir.path() / "model-00001-of-00002.safetensors", {"x", "y"}, 0).ok());
  ASSERT_TRUE(write_shard(dir.path() / "model-00002-of-00002.safetensors", {"z"}, 100).ok());
  write_file(dir.path() / "model.safetensors.index.json", R"({"metadata":{"total_size":24},"weight_map":{
      "x":"model-00001-of-00002.safetensors","y":"model-00001-of-00002.safetensors",
      "z":"model-00002-of-00002.safetensors"}})");
  auto table = read_safetensors_dir(dir.str());
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->names().size(), 3u);
  auto z = (*table)->tensor("z");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(element(*z, 3), 103.0f);
  EXPECT_EQ(element(*(*table)->tensor("y"), 0), 4.0f);

  // A tensor the index names but no shard holds.
  write_file(dir.path() / "model.safetensors.index.json",
             R"({"weight_map":{"x":"model-00001-of-00002.safetensors","w":"model-00002-of-00002.safetensors"}})");
  auto missing = read_safetensors_dir(dir.str());
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(" w "), std::string::npos) << missing.status();
  // A missing shard, a shard outside the directory, a broken index.
  write_file(dir.path() / "model.safetensors.index.json", R"({"weight_map":{"x":"model-00003.safetensors"}})");
  EXPECT_EQ(read_safetensors_dir(dir.str()).status().code(), absl::StatusCode::kNotFound);
  write_file(dir.path() / "model.safetensors.index.json", R"({"weight_map":{"x":"../elsewhere.safetensors"}})");
  EXPECT_EQ(read_safetensors_dir(dir.str()).status().code(), absl::StatusCode::kInvalidArgument);
  write_file(dir.path() / "model.safetensors.index.json", R"({"weight_map":)");
  EXPECT_EQ(read_safetensors_dir(dir.str()).status().code(), absl::StatusCode::kInvalidArgument);
  write_file(dir.path() / "model.safetensors.index.json", R"({"weight_map":{"x":3}})");
  EXPECT_EQ(read_safetensors_dir(dir.str()).status().code(), absl::StatusCode::kInvalidArgument);
  // The same tensor in two shards.
  ASSERT_TRUE(write_shard(dir.path() / "model-00002-of-00002.safetensors", {"x"}, 100).ok());
  write_file(dir.path() / "model.safetensors.index.json", R"({"weight_map":{
      "x":"model-00001-of-00002.safetensors","z":"model-00002-of-00002.safetensors"}})");
  EXPECT_FALSE(read_safetensors_dir(dir.str()).ok());
}

}  // namespace
}  // namespace pdserve::engine
