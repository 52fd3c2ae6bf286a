// The portable GEMM: y = x · wᵀ for the projections, where no vendor BLAS is available (a ROCm
// image without hipBLASLt) or the weights are 16-bit and the activations f32 (--weight-dtype
// bf16). Weights f32, f16 or bf16, accumulation always f32. No tensor cores: the vendor GEMMs
// are the fast path for same-type operands.
// - Up to kGemvRows rows (decode steps): a GEMV, one warp per output column streaming its
//   weight row once for every token, as decode is bound by reading the weights: 16 bytes per
//   lane and load (8 bf16/f16 or 4 f32 weights; issue 18's R5b) where the rows are 16-byte
//   aligned, one weight per lane and load otherwise. SwiGLU's gate and up projections have a
//   GEMV of their own with silu_mul as its epilogue (issue 18's R7).
// - More rows: classic shared-memory tiling, a block computing a 64×64 tile of y with 256
//   threads of 4×4 outputs each, stepping through the inner dimension 16 at a time.
// Either may round each activation to bf16 as it loads it (GemmPrecision::kBf16 with bf16
// weights): the products of the vendor bf16 GEMM, in the order of these kernels.
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

constexpr int kTile = 64;      // Rows of y (tokens) and columns (outputs) per block.
constexpr int kStep = 16;      // Inner-dimension slice held in shared memory.
constexpr int kThreads = 256;  // 16×16 threads; each computes 4×4 outputs, 16 apart.

// x as the GEMM multiplies it: as stored, or rounded to bf16 (nearest even).
template <bool kRoundX>
__device__ __forceinline__ float x_in(float v) {
  if constexpr (kRoundX) return to_f32(from_f32<gpu_bf16>(v));
  return v;
}

template <typename W, bool kRoundX>
__global__ void __launch_bounds__(kThreads)
    gemm_xwt_kernel(float* y, const float* x, const W* w, int rows, int out, int in, int64_t ldw) {
  // Transposed tiles ([k][row]) so that the inner loop reads along rows; +1 breaks bank conflicts.
  __shared__ float xs[kStep][kTile + 1];
  __shared__ float ws[kStep][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < in; k0 += kStep) {
    // 64×16 of x and of w each: four elements per thread, consecutive k for coalesced reads.
    for (int i = threadIdx.x; i < kTile * kStep; i += kThreads) {
      const int r = i / kStep, k = i % kStep, gk = k0 + k;
      const int gr = row0 + r, gc = col0 + r;
      xs[k][r] = gr < rows && gk < in ? x_in<kRoundX>(x[int64_t(gr) * in + gk]) : 0.0f;
      ws[k][r] = gc < out && gk < in ? to_f32(w[int64_t(gc) * ldw + gk]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kStep; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[k][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[k][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = row0 + ty + 16 * i;
    if (r >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = col0 + tx + 16 * j;
      if (c < out) y[int64_t(r) * out + c] = acc[i][j];
    }
  }
}

constexpr int kGemvRows = kGemvMaxRows;

// The kPer weights of one 16-byte load as f32.
template <typename W>
__device__ __forceinline__ void widen16(const uint4& raw, float* out) {
  constexpr int kPer = 16 / int(sizeof(W));
  W v[kPer];
  __builtin_memcpy(v, &raw, 16);
#pragma unroll
  for (int e = 0; e < kPer; ++e) out[e] = to_f32(v[e]);
}

// The R dot products of the weight row `row` with x's R rows, each lane summing its share and the
// warp's sum left in every lane (the caller's lane 0 writes them). kVec: each lane loads 16 bytes of the row at a time (kPer weights; consecutive lanes
// consecutive chunks, so a warp loads kWarpSize × 16 contiguous bytes), which needs rows starting
// 16-byte aligned (w and ldw), and the last in % kPer weights one per lane; otherwise every
// weight one per lane (coalesced too).
template <typename W, int R, bool kVec, bool kRoundX>
__device__ __forceinline__ void gemv_lane_sums(float (&acc)[R], const float* x, const W* row, int in, int lane) {
  constexpr int kPer = 16 / int(sizeof(W));
  const int chunks = kVec ? in / kPer : 0;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if constexpr (kVec) {
    const uint4* vec = reinterpret_cast<const uint4*>(row);
#pragma unroll 4
    for (int chunk = lane; chunk < chunks; chunk += kWarpSize) {
      float wf[kPer];
      widen16<W>(vec[chunk], wf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float* xr = x + int64_t(r) * in + int64_t(chunk) * kPer;
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc[r] = fmaf(x_in<kRoundX>(xr[e]), wf[e], acc[r]);
      }
    }
  }
  for (int i = chunks * kPer + lane; i < in; i += kWarpSize) {
    const float wi = to_f32(row[i]);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = fmaf(x_in<kRoundX>(x[int64_t(r) * in + i]), wi, acc[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
}

// One warp per output column (grid-stride over columns), multiplying each weight into all R rows
// of x; the lanes' sums meet in a warp reduction. kSwiGlu: SwiGLU's gate and up GEMVs with
// silu_mul as their epilogue — w holds 2·cols rows, gate then up; the warp of column c sums rows
// c and cols + c exactly as the plain GEMV sums those columns and writes only silu(gate) · up to
// y[r][c]: one launch instead of two, and the 2·cols GEMM outputs neither written nor read back,
// bit for bit the unfused pair's results.
template <typename W, int R, bool kVec, bool kRoundX, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads)
    gemv_xwt_kernel(float* y, const float* x, const W* w, int cols, int in, int64_t ldw) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = kThreads / kWarpSize;
  for (int c = blockIdx.x * warps + warp; c < cols; c += gridDim.x * warps) {
    float acc[R];
    gemv_lane_sums<W, R, kVec, kRoundX>(acc, x, w + int64_t(c) * ldw, in, lane);
    if constexpr (kSwiGlu) {
      float up[R];
      gemv_lane_sums<W, R, kVec, kRoundX>(up, x, w + int64_t(cols + c) * ldw, in, lane);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = silu_times(acc[r], up[r]);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) y[int64_t(r) * cols + c] = acc[r];
    }
  }
}

// Launches gemv_xwt_kernel, a warp per column of `cols`, with 16-byte loads where the weight rows
// allow them.
template <typename W, int R, bool kRoundX, bool kSwiGlu>
void launch_gemv(float* y, const float* x, const W* w, int cols, int in, int64_t ldw, gpuStream_t stream) {
  constexpr int warps = kThreads / kWarpSize;
  const unsigned blocks = grid_for(cols, warps);
  const bool aligned = reinterpret_cast<uintptr_t>(w) % 16 == 0 && (ldw * int64_t(sizeof(W))) % 16 == 0;
  if (aligned)
    gpu_launch(gemv_xwt_kernel<W, R, true, kRoundX, kSwiGlu>, blocks, kThreads, 0, stream, y, x, w, cols, in, ldw);
  else
    gpu_launch(gemv_xwt_kernel<W, R, false, kRoundX, kSwiGlu>, blocks, kThreads, 0, stream, y, x, w, cols, in, ldw);
}

template <typename W, bool kRoundX, bool kSwiGlu = false>
void gemv(float* y, const float* x, const W* w, int rows, int cols, int in, int64_t ldw, gpuStream_t stream) {
  switch (rows) {
    case 1: return launch_gemv<W, 1, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
    case 2: return launch_gemv<W, 2, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
    case 3: return launch_gemv<W, 3, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
    case 4: return launch_gemv<W, 4, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
    case 5: return launch_gemv<W, 5, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
    case 6: return launch_gemv<W, 6, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
    case 7: return launch_gemv<W, 7, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
    default: return launch_gemv<W, kGemvRows, kRoundX, kSwiGlu>(y, x, w, cols, in, ldw, stream);
  }
}

template <typename W, bool kRoundX>
void matmul(float* y, const float* x, const W* w, int rows, int out, int in, int64_t ldw, gpuStream_t stream) {
  if (rows <= kGemvRows) return gemv<W, kRoundX>(y, x, w, rows, out, in, ldw, stream);
  if ((int64_t(rows) + kTile - 1) / kTile > 65535)
    kernel_limit_exceeded("matmul_xwt", "more than 65535 row tiles (4M rows)");
  const dim3 grid((out + kTile - 1) / kTile, (rows + kTile - 1) / kTile);
  gpu_launch(gemm_xwt_kernel<W, kRoundX>, grid, kThreads, 0, stream, y, x, w, rows, out, in, ldw);
}

__global__ void round_to_bf16_kernel(gpu_bf16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<gpu_bf16>(in[i]);
}

}  // namespace

void matmul_xwt(float* y, const float* x, const void* w, Storage w_type, int rows, int out, int in,
                int64_t ldw, gpuStream_t stream, bool bf16_x) {
  if (rows <= 0 || out <= 0) return;
  if (bf16_x) {  // Only bf16 weights meet bf16 activations (GemmPrecision::kBf16).
    if (w_type != Storage::kBF16) kernel_limit_exceeded("matmul_xwt", "bf16 activations with weights not bf16");
    return matmul<gpu_bf16, true>(y, x, static_cast<const gpu_bf16*>(w), rows, out, in, ldw, stream);
  }
  dispatch_storage(w_type, [&](auto* tag) {
    using W = std::remove_pointer_t<decltype(tag)>;
    matmul<W, false>(y, x, static_cast<const W*>(w), rows, out, in, ldw, stream);
  });
}

void gate_up_silu_gemv(float* act, const float* x, const void* w, int rows, int hidden, int in, int64_t ldw,
                       gpuStream_t stream, bool bf16_x) {
  if (rows <= 0 || hidden <= 0) return;
  if (rows > kGemvMaxRows) kernel_limit_exceeded("gate_up_silu_gemv", "more than kGemvMaxRows rows");
  const auto* wb = static_cast<const gpu_bf16*>(w);
  if (bf16_x) return gemv<gpu_bf16, true, true>(act, x, wb, rows, hidden, in, ldw, stream);
  gemv<gpu_bf16, false, true>(act, x, wb, rows, hidden, in, ldw, stream);
}

void round_to_bf16(void* out, const float* in, int64_t n, gpuStream_t stream) {
  if (n <= 0) return;
  gpu_launch(round_to_bf16_kernel, grid_for(n, kThreads), kThreads, 0, stream, static_cast<gpu_bf16*>(out), in, n);
}

}  // namespace pdserve::kernels::gpu
