// Loading the GPU backend library: one built from other engine headers is refused by its ABI id.
#include "engine/gpu_module.h"

#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

using ::testing::HasSubstr;

TEST(GpuModule, RefusesALibraryBuiltFromOtherHeaders) {
  // $PDSERVE_GPU_BACKEND is the first place looked at for a vendor kind ("hip" here: no test
  // process loads a real one).
  ASSERT_EQ(setenv("PDSERVE_GPU_BACKEND", PDSERVE_STALE_GPU_BACKEND, 1), 0);
  const auto api = load_gpu_module("hip");
  unsetenv("PDSERVE_GPU_BACKEND");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(api.status().message()), HasSubstr("built from other engine headers"));
  EXPECT_THAT(std::string(api.status().message()), HasSubstr(PDSERVE_STALE_GPU_BACKEND));
}

TEST(GpuModule, LoadsTheLibraryOfThisBuild) {
  const auto api = load_gpu_module("emulated");
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ((*api)->kind(), "emulated");
}

}  // namespace
}  // namespace pdserve::engine
