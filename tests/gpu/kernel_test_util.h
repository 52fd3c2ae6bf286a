// What the GPU kernel tests share: device arrays (Dev), random inputs, the error measure and
// tolerances, and REQUIRE_GPU. Written with gpu_compat.h's runtime names, so the same tests build
// for CUDA, HIP and the CPU emulation (kernels/gpu/emulation/simt.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/gpu/gpu_compat.h"
#include "tests/engine/random_floats.h"

namespace pdserve::kernels {

// f32 results within 1e-5 of the CPU's relative to the larger of 1 and the output's magnitude
// (RoPE 1e-4: the device's powf/sinf/cosf are not glibc's); bf16/f16 storage within 1e-2 (8 and
// 11 bit mantissas); products of operands rounded to bf16 (the tensor-core attention) within
// 2e-2.
constexpr double kF32Tol = 1e-5;
constexpr double kRopeTol = 1e-4;
constexpr double kHalfTol = 1e-2;
constexpr double kBf16OperandsTol = 2e-2;

#if defined(PDSERVE_GPU_EMULATION)
// The emulation runs each GPU thread in turn on one CPU: tests keep their shapes small there.
inline constexpr bool kEmulated = true;
inline bool have_gpu() { return true; }
#else
inline constexpr bool kEmulated = false;
inline bool have_gpu() {
  int count = 0;
  return gpuGetDeviceCount(&count) == gpuSuccess && count > 0;
}
#endif
#define REQUIRE_GPU() \
  if (!::pdserve::kernels::have_gpu()) GTEST_SKIP() << "no GPU"

using ::pdserve::testing::random_vec;

// Device copy of a host array, freed on scope exit.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    EXPECT_EQ(gpuMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), gpuSuccess);
    EXPECT_EQ(gpuMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)), gpuSuccess);
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    EXPECT_EQ(gpuMemcpy(p_, h.data(), h.size() * sizeof(T), gpuMemcpyHostToDevice), gpuSuccess);
  }
  Dev(const Dev&) = delete;
  ~Dev() { EXPECT_EQ(gpuFree(p_), gpuSuccess); }
  T* get() const { return p_; }
  std::vector<T> host() const {
    EXPECT_EQ(gpuDeviceSynchronize(), gpuSuccess);
    std::vector<T> h(n_);
    EXPECT_EQ(gpuMemcpy(h.data(), p_, n_ * sizeof(T), gpuMemcpyDeviceToHost), gpuSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// max |got - want| / max(1, max |want|).
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0.0, mag = 1.0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    mag = std::max(mag, std::abs(double(want[i])));
    if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
  }
  return diff / mag;
}

}  // namespace pdserve::kernels
