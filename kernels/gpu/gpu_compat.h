// One spelling of the GPU runtime for CUDA and HIP, so that every kernel source in kernels/gpu
// compiles unchanged with nvcc (CUDA) and with hipcc -x hip (ROCm): runtime names (gpu* for
// cuda*/hip*), the warp (32 lanes) or wavefront (64 lanes on the CDNA parts we target) as a
// constexpr, warp shuffles, the 16-bit float storage types, kernel launches (gpu_launch) and
// dynamic shared memory. No build-time source rewriting: the vendor is chosen by the compiler's
// own macros. With PDSERVE_GPU_EMULATION the same names come from a CPU emulation
// (kernels/gpu/emulation/simt.h), so that tests run the kernels on machines without a GPU.
// PDSERVE_GPU_WMMA says that CUDA's warp matrix functions (nvcuda::wmma: tensor cores from
// sm_80) are there, on CUDA and in the emulation (kernels/gpu/emulation/wmma.h); HIP has none.
#pragma once

#include <cstdint>
#include <utility>

#if defined(PDSERVE_GPU_EMULATION)
#include "kernels/gpu/emulation/simt.h"
#include "kernels/gpu/emulation/wmma.h"
#define PDSERVE_GPU_WMMA 1
using gpu_bf16 = gpu_emulated_bf16;
using gpu_f16 = gpu_emulated_f16;
#elif defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define PDSERVE_GPU_HIP 1
// ROCm 5.7+ spells bf16 as CUDA does (__hip_bfloat16); older ROCm (Debian's 5.2 hipcc, used for
// compile checks) has only the hip_bfloat16 class.
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#define PDSERVE_HIP_NATIVE_BF16 1
#else
#include <hip/hip_bfloat16.h>
#endif
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuStream_t hipStream_t
#define gpuEvent_t hipEvent_t
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemset hipMemset
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpy2D hipMemcpy2D
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuMemGetInfo hipMemGetInfo
#define gpuSetDevice hipSetDevice
#define gpuGetDevice hipGetDevice
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuEventCreate hipEventCreate
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuHostAlloc hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuHostRegister hipHostRegister
#define gpuHostRegisterDefault hipHostRegisterDefault
#define gpuHostUnregister hipHostUnregister
#define gpuGraph_t hipGraph_t
#define gpuGraphExec_t hipGraphExec_t
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuGraphInstantiate hipGraphInstantiateWithFlags
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphDestroy hipGraphDestroy
#define gpuGraphExecDestroy hipGraphExecDestroy
#if defined(PDSERVE_HIP_NATIVE_BF16)
using gpu_bf16 = __hip_bfloat16;
#else
using gpu_bf16 = hip_bfloat16;
#endif
using gpu_f16 = __half;
#else
#define PDSERVE_GPU_CUDA 1
#define PDSERVE_GPU_WMMA 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <mma.h>
#endif

#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuStream_t cudaStream_t
#define gpuEvent_t cudaEvent_t
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemset cudaMemset
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpy2D cudaMemcpy2D
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuMemGetInfo cudaMemGetInfo
#define gpuSetDevice cudaSetDevice
#define gpuGetDevice cudaGetDevice
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuEventCreate cudaEventCreate
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuHostAlloc cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuHostRegister cudaHostRegister
#define gpuHostRegisterDefault cudaHostRegisterDefault
#define gpuHostUnregister cudaHostUnregister
#define gpuGraph_t cudaGraph_t
#define gpuGraphExec_t cudaGraphExec_t
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuGraphInstantiate cudaGraphInstantiateWithFlags
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphDestroy cudaGraphDestroy
#define gpuGraphExecDestroy cudaGraphExecDestroy
using gpu_bf16 = __nv_bfloat16;
using gpu_f16 = __half;
#endif

namespace pdserve::kernels::gpu {

// Lanes that execute in lockstep and share shuffles. The HIP targets (gfx90a, gfx942, gfx950)
// are CDNA parts, all wave64; an RDNA (wave32) target would need 32 here.
#if defined(PDSERVE_GPU_HIP)
inline constexpr int kWarpSize = 64;
#else
inline constexpr int kWarpSize = 32;
#endif

// Threads per block for the row-wise kernels: a multiple of both warp sizes.
inline constexpr int kBlockThreads = 256;

#if defined(__CUDACC__) || defined(__HIPCC__)

// kernel<<<grid, block, shared_bytes, stream>>>(args...), spelled as a call so that the
// emulation can provide it too.
template <typename... Params, typename... Args>
void gpu_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, gpuStream_t stream,
                Args&&... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
}

// Lets `kernel` launch with `bytes` of dynamic shared memory: above 48 KB a kernel must opt in.
template <typename... Params>
gpuError_t allow_dynamic_shared(void (*kernel)(Params...), size_t bytes) {
#if defined(PDSERVE_GPU_HIP)
  return hipFuncSetAttribute(reinterpret_cast<const void*>(kernel), hipFuncAttributeMaxDynamicSharedMemorySize,
                             int(bytes));
#else
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
#endif
}

// Shared memory sized at launch (gpu_launch's shared_bytes).
#define PDSERVE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]

#endif

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(PDSERVE_GPU_EMULATION)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = kWarpSize / 2; m > 0; m >>= 1) {
#if defined(PDSERVE_GPU_HIP)
    v += __shfl_xor(v, m, kWarpSize);
#else
    v += __shfl_xor_sync(0xffffffffu, v, m, kWarpSize);
#endif
  }
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = kWarpSize / 2; m > 0; m >>= 1) {
#if defined(PDSERVE_GPU_HIP)
    v = fmaxf(v, __shfl_xor(v, m, kWarpSize));
#else
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m, kWarpSize));
#endif
  }
  return v;
}

// Sum over the whole block (blockDim.x a multiple of kWarpSize, at most 1024); every thread
// gets the result. `scratch` holds one float per warp.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call.
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

// Storage <-> f32 for the element types kernels are instantiated for.
__device__ __forceinline__ float to_f32(float x) { return x; }
#if defined(PDSERVE_GPU_HIP) && !defined(PDSERVE_HIP_NATIVE_BF16)
__device__ __forceinline__ float to_f32(gpu_bf16 x) { return static_cast<float>(x); }
#else
__device__ __forceinline__ float to_f32(gpu_bf16 x) { return __bfloat162float(x); }
#endif
__device__ __forceinline__ float to_f32(gpu_f16 x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
#if defined(PDSERVE_GPU_HIP) && !defined(PDSERVE_HIP_NATIVE_BF16)
template <>
__device__ __forceinline__ gpu_bf16 from_f32<gpu_bf16>(float x) { return gpu_bf16(x); }
#else
template <>
__device__ __forceinline__ gpu_bf16 from_f32<gpu_bf16>(float x) { return __float2bfloat16(x); }
#endif
template <>
__device__ __forceinline__ gpu_f16 from_f32<gpu_f16>(float x) { return __float2half(x); }

#endif  // __CUDACC__ || __HIPCC__ || PDSERVE_GPU_EMULATION

}  // namespace pdserve::kernels::gpu
