// Where a worker's kvtransfer endpoints put KV, by backend: a host arena is registered as it
// is; a GPU arena is offered to UCX as device memory and, where the UCX build cannot take it
// (Debian's has no CUDA support), staged through a host mirror; --kv-memory staged forces the
// mirror. GPUs are stood in for by the guarded backend, named as the GPU backend would be.
#include "worker/kv_ranks.h"

#include <gtest/gtest.h>

#include "tests/engine/guarded_backend.h"
#include "tests/engine/test_model.h"

namespace pdserve::worker {
namespace {

std::unique_ptr<engine::Engine> engine_on(const std::string& backend_name, int tp = 1) {
  auto model = engine::load_model({pdserve::testing::stories_bin()});
  EXPECT_TRUE(model.ok()) << model.status();
  engine::EngineOptions o;
  o.kv_cache_bytes = 4 << 20;
  o.tp = tp;
  if (!backend_name.empty())
    o.backend_factory = [backend_name](int) -> StatusOr<std::unique_ptr<engine::Backend>> {
      return pdserve::testing::make_guarded_backend(size_t(1) << 30, backend_name);
    };
  auto e = engine::Engine::create(std::move(*model), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

std::string path_of(const engine::Engine& engine, KvMemory memory) {
  KvRanksOptions o;
  o.model_id = "stories260K";
  o.memory = memory;
  auto ranks = KvRanks::create(engine, o, [](int, const kvtransfer::KvTransferEvent&) {},
                               [](int, const std::string&, std::vector<int>) {});
  EXPECT_TRUE(ranks.ok()) << ranks.status();
  if (!ranks.ok()) return "";
  EXPECT_EQ((*ranks)->memory_path() == "staged", (*ranks)->staging(0) != nullptr);
  return (*ranks)->memory_path();
}

TEST(KvRanksMemory, HostArenasAreRegisteredAsTheyAre) {
  auto cpu = engine_on("", 2);
  EXPECT_EQ(path_of(*cpu, KvMemory::kAuto), "host");
  EXPECT_EQ(path_of(*cpu, KvMemory::kStaged), "staged");
}

TEST(KvRanksMemory, GpuArenasUcxCannotRegisterAreStaged) {
  auto gpu = engine_on("cuda:0");
  EXPECT_EQ(path_of(*gpu, KvMemory::kAuto), "staged");  // Debian's UCX: no CUDA memory type.
  auto other = engine_on("guarded:0");  // A device the transport has no name for.
  EXPECT_EQ(path_of(*other, KvMemory::kAuto), "staged");
}

}  // namespace
}  // namespace pdserve::worker
