#include "engine/model/llama2c_checkpoint.h"

#include <cmath>
#include <cstring>

#include "engine/model/mapped_file.h"
#include "tests/model/test_util.h"

namespace pdserve::engine {
namespace {

using testing::bundled_model_dir;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

std::string bundled_bin() { return (bundled_model_dir() / "stories260K.bin").string(); }

TEST(MappedFile, ErrorsNameTheProblem) {
  TempDir dir;
  auto missing = MappedFile::open((dir.path() / "nope.bin").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.bin"), std::string::npos);
  write_file(dir.path() / "empty.bin", "");
  auto empty = MappedFile::open((dir.path() / "empty.bin").string());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);
  auto directory = MappedFile::open(dir.str());
  EXPECT_FALSE(directory.ok());
}

TEST(MappedFile, MapsContents) {
  TempDir dir;
  write_file(dir.path() / "f", "hello");
  auto f = MappedFile::open((dir.path() / "f").string());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->size(), 5u);
  EXPECT_EQ(std::memcmp((*f)->data(), "hello", 5), 0);
}

TEST(Llama2cCheckpoint, LoadsStories260K) {
  auto ckpt = read_llama2c_checkpoint(bundled_bin());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelConfig& c = ckpt->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_EQ(c.rope_style, RopeStyle::kAdjacentPairs);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, std::vector<int>{1});
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);

  const auto& w = *ckpt->weights;
  auto embed = w.tensor("model.embed_tokens.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{512, 64}));
  auto head = w.tensor("lm_head.weight");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->data, embed->data);
  auto k4 = w.tensor("model.layers.4.self_attn.k_proj.weight");
  ASSERT_TRUE(k4.ok());
  EXPECT_EQ(k4->shape, (std::vector<int64_t>{32, 64}));
  auto down = w.tensor("model.layers.0.mlp.down_proj.weight");
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->shape, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(w.tensor("model.layers.5.self_attn.q_proj.weight").status().code(), absl::StatusCode::kNotFound);
  // 1 embed + 9 per layer * 5 + final norm + lm_head.
  EXPECT_EQ(w.names().size(), 48u);

  // The final norm sits right before the RoPE tables: check the offset arithmetic end to end
  // by comparing with the raw bytes at the position the README layout gives.
  std::string raw = read_file(bundled_bin());
  auto norm = w.tensor("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  size_t offset = raw.size() - size_t(512 * 8) * 4 - 64 * 4;
  EXPECT_EQ(std::memcmp(norm->data, raw.data() + offset, 64 * 4), 0);
}

TEST(Llama2cCheckpoint, RandomCheckpointsReadBackAndFollowTheirSeed) {
  TempDir dir;
  // An unshared classifier (negative vocab) and GQA, so every array of the format is written.
  const Llama2cHeader h{16, 40, 2, 4, 2, -30, 8};
  const std::string a = (dir.path() / "a.bin").string(), b = (dir.path() / "b.bin").string(),
                    c = (dir.path() / "c.bin").string();
  ASSERT_TRUE(write_random_llama2c_checkpoint(h, 7, a).ok());
  ASSERT_TRUE(write_random_llama2c_checkpoint(h, 7, b).ok());
  ASSERT_TRUE(write_random_llama2c_checkpoint(h, 8, c).ok());
  EXPECT_EQ(read_file(a), read_file(b));
  EXPECT_NE(read_file(a), read_file(c));
  auto ckpt = read_llama2c_checkpoint(a);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->config.vocab_size, 30);
  EXPECT_FALSE(ckpt->config.tie_embeddings);
  auto norm = ckpt->weights->tensor("model.layers.1.post_attention_layernorm.weight");
  ASSERT_TRUE(norm.ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(static_cast<const float*>(norm->data)[i], 1.0f);
  auto head = ckpt->weights->tensor("lm_head.weight");
  ASSERT_TRUE(head.ok());
  const float* w = static_cast<const float*>(head->data);
  double sum_sq = 0;
  for (int i = 0; i < 30 * 16; ++i) {
    EXPECT_LE(std::abs(w[i]), 0.0347f);
    sum_sq += double(w[i]) * w[i];
  }
  EXPECT_NEAR(std::sqrt(sum_sq / (30 * 16)), 0.02, 0.004);  // Standard deviation 0.02.
  EXPECT_FALSE(write_random_llama2c_checkpoint({16, 40, 2, 3, 3, 30, 8}, 1, a).ok());  // 16 % 3 heads.
}

// A copy of the bundled checkpoint, altered by `edit`, in a scratch directory.
absl::Status load_edited(void (*edit)(std::string&), std::string* message = nullptr) {
  TempDir dir;
  std::string bytes = read_file(bundled_bin());
  edit(bytes);
  write_file(dir.path() / "m.bin", bytes);
  auto r = read_llama2c_checkpoint((dir.path() / "m.bin").string());
  if (message) *message = std::string(r.status().message());
  return r.status();
}

void set_header(std::string& b, int index, int32_t value) { std::memcpy(b.data() + 4 * index, &value, 4); }

TEST(Llama2cCheckpoint, RejectsTruncatedAndExtendedFiles) {
  std::string msg;
  auto s = load_edited([](std::string& b) { b.resize(b.size() - 4); }, &msg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(msg.find("1056540"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1056536"), std::string::npos) << msg;
  s = load_edited([](std::string& b) { b += "junk"; }, &msg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(msg.find("1056544"), std::string::npos) << msg;
  s = load_edited([](std::string& b) { b.resize(10); }, &msg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << msg;
}

TEST(Llama2cCheckpoint, RejectsCorruptHeaders) {
  // Each field set to nonsense: zero, negative, huge, inconsistent.
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 0, 0); }).ok());
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 0, -64); }).ok());
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 0, 0x7fffffff); }).ok());
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 1, -1); }).ok());
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 2, 1 << 30); }).ok());
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 3, 7); }).ok());   // 64 % 7 != 0
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 4, 3); }).ok());   // 8 % 3 != 0
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 4, 16); }).ok());  // kv > heads
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 5, 0); }).ok());
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 5, INT32_MIN); }).ok());
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 6, -512); }).ok());
  // Plausible but different values: caught by the size check.
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 2, 6); }).ok());
  // A negative vocab (separate classifier) without the classifier's bytes.
  std::string msg;
  EXPECT_FALSE(load_edited([](std::string& b) { set_header(b, 5, -512); }, &msg).ok());
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  // Random garbage of the right size never crashes.
  for (int seed = 0; seed < 20; ++seed) {
    TempDir dir;
    std::string bytes = read_file(bundled_bin());
    uint32_t x = 2463534242u + seed;
    for (int i = 0; i < 28; ++i) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      bytes[i] = char(x);
    }
    write_file(dir.path() / "g.bin", bytes);
    EXPECT_FALSE(read_llama2c_checkpoint((dir.path() / "g.bin").string()).ok());
  }
}

TEST(Llama2cCheckpoint, UnsharedClassifierIsReadFromTheEnd) {
  TempDir dir;
  std::string bytes = read_file(bundled_bin());
  set_header(bytes, 5, -512);
  std::string classifier(512 * 64 * 4, '\0');
  float marker = 3.5f;
  std::memcpy(classifier.data(), &marker, 4);
  write_file(dir.path() / "u.bin", bytes + classifier);
  auto ckpt = read_llama2c_checkpoint((dir.path() / "u.bin").string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE(ckpt->config.tie_embeddings);
  auto head = ckpt->weights->tensor("lm_head.weight");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*static_cast<const float*>(head->data), 3.5f);
}

}  // namespace
}  // namespace pdserve::engine
