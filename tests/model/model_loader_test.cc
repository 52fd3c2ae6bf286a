#include "engine/model_loader.h"

#include <nlohmann/json.hpp>

#include "engine/model/make_model.h"
#include "tests/model/test_util.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;
using testing::bundled_model_dir;
using testing::read_file;
using testing::ScopedEnv;
using testing::TempDir;
using testing::write_file;

TEST(ModelLoader, LoadsStories260KByFileDirectoryAndName) {
  ScopedEnv path("PDSERVE_MODEL_PATH", bundled_model_dir().parent_path().string());
  ScopedEnv base("PDSERVE_MODEL_BASE_URL", "http://127.0.0.1:1");
  for (const std::string& model : {(bundled_model_dir() / "stories260K.bin").string(),
                                   bundled_model_dir().string(), bundled_model_dir().string() + "/",
                                   std::string("stories260K")}) {
    auto m = load_model({.model = model});
    ASSERT_TRUE(m.ok()) << model << ": " << m.status();
    EXPECT_EQ(m->format, "llama2c");
    EXPECT_EQ(m->name, "stories260K") << model;
    EXPECT_EQ(m->config.n_layers, 5);
    EXPECT_EQ(m->tokenizer->vocab_size(), 512);
    EXPECT_TRUE(m->weights->tensor("lm_head.weight").ok());
  }
}

TEST(ModelLoader, LoadsANameFromTheCache) {
  TempDir cache;
  ScopedEnv xdg("XDG_CACHE_HOME", cache.str());
  ScopedEnv path("PDSERVE_MODEL_PATH", "");
  ScopedEnv base("PDSERVE_MODEL_BASE_URL", "http://127.0.0.1:1");
  EXPECT_EQ(load_model({.model = "stories260K", .allow_download = false}).status().code(),
            absl::StatusCode::kNotFound);
  const fs::path dir = cache.path() / "pdserve" / "models" / "stories260K";
  fs::create_directories(dir);
  for (const char* f : {"stories260K.bin", "tok512.bin"}) fs::copy_file(bundled_model_dir() / f, dir / f);
  auto m = load_model({.model = "stories260K", .allow_download = false});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "stories260K");
  EXPECT_EQ(m->path, (dir / "stories260K.bin").string());
}

TEST(ModelLoader, LoadsMadeModels) {
  for (const char* preset : {"tiny", "tiny-mha", "tiny-qwen2", "tiny-llama31", "tiny-qwen3", "tiny-yarn"}) {
    TempDir dir;
    ASSERT_TRUE(make_model({.preset = preset, .seed = 3, .out_dir = dir.str()}).ok());
    auto m = load_model({.model = dir.str()});
    ASSERT_TRUE(m.ok()) << preset << ": " << m.status();
    EXPECT_EQ(m->format, "hf");
    EXPECT_EQ(m->config.vocab_size, 300);
    EXPECT_EQ(m->tokenizer->vocab_size(), 258);
    EXPECT_EQ(m->tokenizer->bos_id(), 256);
    EXPECT_EQ(m->tokenizer->eos_id(), 257);
    // One token per byte, ids equal to the byte values.
    auto ids = m->tokenizer->encode("hi \xc3\xa9", /*add_bos=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, (std::vector<int>{256, 'h', 'i', ' ', 0xc3, 0xa9})) << preset;
    auto head = m->weights->tensor("lm_head.weight");
    ASSERT_TRUE(head.ok());
    EXPECT_EQ(head->shape, (std::vector<int64_t>{300, 64}));
  }
}

TEST(ModelLoader, LoadsExportedStories) {
  TempDir dir;
  ASSERT_TRUE(make_model({.out_dir = dir.str(), .from = (bundled_model_dir() / "stories260K.bin").string()}).ok());
  auto m = load_model({.model = dir.str()});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format, "hf");
  EXPECT_EQ(m->config.rope_style, RopeStyle::kRotateHalf);
  EXPECT_EQ(m->tokenizer->vocab_size(), 512);
  EXPECT_EQ(m->weights->tensor("lm_head.weight")->data, m->weights->tensor("model.embed_tokens.weight")->data);
}

// The chat template comes from tokenizer_config.json; llama2.c models and HF directories
// without a template (or with one that does not compile) get the plain format, saying why.
TEST(ModelLoader, ReadsTheChatTemplateFromTokenizerConfig) {
  auto stories = load_model({.model = (bundled_model_dir() / "stories260K.bin").string()});
  ASSERT_TRUE(stories.ok()) << stories.status();
  EXPECT_EQ(stories->chat_template.format(), ChatFormat::kPlain);
  EXPECT_NE(stories->chat_template.fallback_reason().find("no tokenizer_config.json"), std::string::npos);

  TempDir dir;
  ASSERT_TRUE(make_model({.preset = "tiny-qwen2", .seed = 3, .out_dir = dir.str()}).ok());
  auto plain = load_model({.model = dir.str()});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->chat_template.format(), ChatFormat::kPlain);
  EXPECT_NE(plain->chat_template.fallback_reason().find("has no chat_template"), std::string::npos);

  const fs::path config_path = dir.path() / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::parse(read_file(config_path));
  config["chat_template"] = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>'}}{% endfor %}";
  write_file(config_path, config.dump());
  auto chatml = load_model({.model = dir.str()});
  ASSERT_TRUE(chatml.ok()) << chatml.status();
  EXPECT_EQ(chatml->chat_template.format(), ChatFormat::kJinja);
  ChatRequest request;
  request.messages.push_back({.role = "user", .content = std::string("Hi")});
  auto text = chatml->chat_template.render(request, std::chrono::system_clock::now());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|im_start|>user\nHi<|im_end|>");

  config["chat_template"] = "{% extends 'base.jinja' %}";
  write_file(config_path, config.dump());
  auto broken = load_model({.model = dir.str()});
  ASSERT_TRUE(broken.ok()) << broken.status();
  EXPECT_EQ(broken->chat_template.format(), ChatFormat::kPlain);
  EXPECT_NE(broken->chat_template.fallback_reason().find("the 'extends' tag is not supported"), std::string::npos)
      << broken->chat_template.fallback_reason();
}

TEST(ModelLoader, ShapeMismatchNamesTheTensor) {
  TempDir dir;
  ASSERT_TRUE(make_model({.preset = "tiny", .out_dir = dir.str()}).ok());
  auto config = nlohmann::json::parse(read_file(dir.path() / "config.json"));
  config["intermediate_size"] = 96;
  write_file(dir.path() / "config.json", config.dump());
  auto m = load_model({.model = dir.str()});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("mlp.gate_proj.weight"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("[96, 64]"), std::string::npos) << m.status();
}

TEST(ModelLoader, MissingPiecesAreClearErrors) {
  TempDir dir;
  // A checkpoint with no tokenizer beside it.
  fs::copy_file(bundled_model_dir() / "stories260K.bin", dir.path() / "model.bin");
  auto m = load_model({.model = (dir.path() / "model.bin").string()});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("--tokenizer"), std::string::npos) << m.status();
  // Two checkpoints: which one is meant?
  fs::copy_file(bundled_model_dir() / "stories260K.bin", dir.path() / "other.bin");
  EXPECT_EQ(load_model({.model = dir.str()}).status().code(), absl::StatusCode::kInvalidArgument);
  // An empty directory, a non-.bin file, a corrupt checkpoint, nothing at all.
  TempDir empty;
  EXPECT_EQ(load_model({.model = empty.str()}).status().code(), absl::StatusCode::kNotFound);
  write_file(dir.path() / "notes.txt", "hi");
  EXPECT_FALSE(load_model({.model = (dir.path() / "notes.txt").string()}).ok());
  write_file(dir.path() / "bad.bin", "garbage");
  auto bad = load_model({.model = (dir.path() / "bad.bin").string()});
  EXPECT_NE(bad.status().message().find("bad.bin"), std::string::npos) << bad.status();
  EXPECT_FALSE(load_model({.model = (dir.path() / "absent" / "x.bin").string()}).ok());
  EXPECT_FALSE(load_model({}).ok());
}

TEST(ModelLoader, TokenizerLargerThanModelIsRejected) {
  TempDir dir;
  ASSERT_TRUE(make_model({.preset = "tiny", .out_dir = dir.str()}).ok());
  // tok512.bin has 512 tokens; the tiny model only 300.
  auto m = load_model({.model = dir.str(), .tokenizer = (bundled_model_dir() / "tok512.bin").string()});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("512"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace pdserve::engine
