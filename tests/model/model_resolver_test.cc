#include "engine/model/model_resolver.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "engine/model/sha256.h"
#include "tests/model/test_util.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::ScopedEnv;
using testing::TempDir;
using testing::write_file;

std::string sha256_of(const std::string& s) {
  Sha256 h;
  h.update(s.data(), s.size());
  return h.hex_digest();
}

// A loopback port nothing listens on: bound, then released.
int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Serves `files` (URL path -> body) on 127.0.0.1; "/moved/..." redirects to "/fake/...".
class FileServer {
 public:
  explicit FileServer(std::map<std::string, std::string> files) : files_(std::move(files)) {
    server_.Get(R"(/fake/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      ++requests_;
      auto it = files_.find(req.matches[1]);
      if (it == files_.end()) {
        res.status = 404;
        return;
      }
      res.set_content(it->second, "application/octet-stream");
    });
    server_.Get(R"(/moved/(.+))", [](const httplib::Request& req, httplib::Response& res) {
      res.set_redirect(absl::StrCat("/fake/", std::string(req.matches[1])));
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FileServer() {
    server_.stop();
    thread_.join();
  }
  std::string url(const std::string& prefix = "fake") const {
    return absl::StrCat("http://127.0.0.1:", port_, "/", prefix);
  }
  int requests() const { return requests_; }

 private:
  std::map<std::string, std::string> files_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> requests_{0};
};

// A scratch cache plus a registry with one small fake model, "fake", of two files.
struct Fixture {
  TempDir cache;
  ScopedEnv xdg{"XDG_CACHE_HOME", cache.str()};
  ScopedEnv model_path{"PDSERVE_MODEL_PATH", ""};
  std::string a = "first file", b = std::string(100000, 'b');
  ModelRegistry registry;
  Fixture() {
    // Its home is unreachable: tests reach it only through PDSERVE_MODEL_BASE_URL.
    registry.add({"fake", absl::StrCat("http://127.0.0.1:", closed_port()), {{"a.bin", sha256_of(a)}, {"b.bin", sha256_of(b)}}});
  }
  fs::path cached(const std::string& f) const { return cache.path() / "pdserve" / "models" / "fake" / f; }
};

TEST(ModelResolver, CacheDir) {
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/x/cache");
    EXPECT_EQ(model_cache_dir(), "/x/cache/pdserve/models");
  }
  ScopedEnv xdg("XDG_CACHE_HOME", "");
  ScopedEnv home("HOME", "/home/u");
  EXPECT_EQ(model_cache_dir(), "/home/u/.cache/pdserve/models");
}

TEST(ModelResolver, ModelPathHit) {
  Fixture f;
  TempDir one, two;
  fs::create_directories(two.path() / "anything");
  ScopedEnv path("PDSERVE_MODEL_PATH", absl::StrCat(one.str(), ":", two.str()));
  auto dir = resolve_model("anything", {.registry = &f.registry});
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, (two.path() / "anything").string());
}

TEST(ModelResolver, CacheHitNeedsNoNetwork) {
  Fixture f;
  fs::create_directories(f.cached("").parent_path());
  write_file(f.cached("a.bin"), f.a);
  write_file(f.cached("b.bin"), f.b);
  ScopedEnv base("PDSERVE_MODEL_BASE_URL", absl::StrCat("http://127.0.0.1:", closed_port()));
  auto dir = resolve_model("fake", {.registry = &f.registry});
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(fs::path(*dir), f.cached("").parent_path());
}

TEST(ModelResolver, DownloadsAndVerifies) {
  Fixture f;
  FileServer server({{"fake/a.bin", f.a}, {"fake/b.bin", f.b}});
  // Through a redirect, as the public home answers.
  ScopedEnv base("PDSERVE_MODEL_BASE_URL", server.url("moved"));
  auto dir = resolve_model("fake", {.registry = &f.registry});
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(read_file(f.cached("a.bin")), f.a);
  EXPECT_EQ(read_file(f.cached("b.bin")), f.b);
  EXPECT_EQ(server.requests(), 2);
  // Nothing but the two files is left behind, and the second resolve is a cache hit.
  EXPECT_EQ(std::distance(fs::directory_iterator(*dir), fs::directory_iterator()), 2);
  ASSERT_TRUE(resolve_model("fake", {.registry = &f.registry}).ok());
  EXPECT_EQ(server.requests(), 2);
  // Only a missing file is fetched again.
  fs::remove(f.cached("a.bin"));
  ASSERT_TRUE(resolve_model("fake", {.registry = &f.registry}).ok());
  EXPECT_EQ(server.requests(), 3);
}

TEST(ModelResolver, ChecksumMismatchDeletesTheFile) {
  Fixture f;
  FileServer server({{"fake/a.bin", "tampered"}, {"fake/b.bin", f.b}});
  ScopedEnv base("PDSERVE_MODEL_BASE_URL", server.url());
  auto dir = resolve_model("fake", {.registry = &f.registry});
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(dir.status().message().find("checksum"), std::string::npos) << dir.status();
  EXPECT_NE(dir.status().message().find(sha256_of(f.a)), std::string::npos) << dir.status();
  EXPECT_TRUE(fs::is_empty(f.cached("").parent_path()));
}

TEST(ModelResolver, MissingRemoteFile) {
  Fixture f;
  FileServer server({{"fake/a.bin", f.a}});
  ScopedEnv base("PDSERVE_MODEL_BASE_URL", server.url());
  auto dir = resolve_model("fake", {.registry = &f.registry});
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(dir.status().message().find("404"), std::string::npos) << dir.status();
  EXPECT_FALSE(fs::exists(f.cached("b.bin")));
}

TEST(ModelResolver, NoNetworkFailsFastAndClearly) {
  Fixture f;
  ScopedEnv base("PDSERVE_MODEL_BASE_URL", absl::StrCat("http://127.0.0.1:", closed_port()));
  auto start = std::chrono::steady_clock::now();
  // The built-in registry, so the real model's error is what users see (it never goes out:
  // the base URL is a closed loopback port).
  auto dir = resolve_model("stories260K");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(dir.status().message().find("cannot download"), std::string::npos) << dir.status();
  EXPECT_NE(dir.status().message().find("PDSERVE_MODEL_PATH"), std::string::npos) << dir.status();
  EXPECT_TRUE(fs::is_empty(f.cache.path() / "pdserve" / "models" / "stories260K"));
}

TEST(ModelResolver, UnknownNamesAndDisabledDownloads) {
  Fixture f;
  auto unknown = resolve_model("no-such-model");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("stories260K"), std::string::npos) << unknown.status();
  EXPECT_FALSE(resolve_model("../etc").ok());
  EXPECT_FALSE(resolve_model("").ok());
  auto off = resolve_model("fake", {.allow_download = false, .registry = &f.registry});
  EXPECT_EQ(off.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve::engine
