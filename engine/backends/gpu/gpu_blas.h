// The vendor BLAS under one spelling (gpublas*, GPUBLAS_*), as kernels/gpu/gpu_compat.h spells
// the runtime: cuBLAS in CUDA builds, hipBLAS in HIP builds that found it (PDSERVE_HAVE_HIPBLAS;
// its hipDataType API, HIPBLAS_V2, which ROCm 6 offers and ROCm 7 makes the only one). Defines
// PDSERVE_GPU_BLAS when there is one; without it (a ROCm image without hipBLAS, the CPU
// emulation) callers use the portable GEMM of kernels/gpu. The GPU backend's SGEMM and bf16 GEMM
// (GemmPrecision::kBf16) and gpu_bench's bf16 GEMM rows call through it.
#pragma once

#include "kernels/gpu/gpu_compat.h"

#if defined(PDSERVE_GPU_CUDA)
#include <cublas_v2.h>
#define PDSERVE_GPU_BLAS 1
using gpublasHandle_t = cublasHandle_t;
#define gpublasCreate cublasCreate
#define gpublasDestroy cublasDestroy
#define gpublasSetStream cublasSetStream
#define gpublasSgemm cublasSgemm
#define gpublasGemmEx cublasGemmEx
#define GPUBLAS_STATUS_SUCCESS CUBLAS_STATUS_SUCCESS
#define GPUBLAS_OP_N CUBLAS_OP_N
#define GPUBLAS_OP_T CUBLAS_OP_T
#define GPUBLAS_R_16BF CUDA_R_16BF
#define GPUBLAS_R_32F CUDA_R_32F
#define GPUBLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define GPUBLAS_GEMM_DEFAULT CUBLAS_GEMM_DEFAULT
#elif defined(PDSERVE_GPU_HIP) && defined(PDSERVE_HAVE_HIPBLAS)
#ifndef HIPBLAS_V2
#define HIPBLAS_V2
#endif
#include <hipblas/hipblas.h>
#define PDSERVE_GPU_BLAS 1
using gpublasHandle_t = hipblasHandle_t;
#define gpublasCreate hipblasCreate
#define gpublasDestroy hipblasDestroy
#define gpublasSetStream hipblasSetStream
#define gpublasSgemm hipblasSgemm
#define gpublasGemmEx hipblasGemmEx
#define GPUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define GPUBLAS_OP_N HIPBLAS_OP_N
#define GPUBLAS_OP_T HIPBLAS_OP_T
#define GPUBLAS_R_16BF HIP_R_16BF
#define GPUBLAS_R_32F HIP_R_32F
#define GPUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define GPUBLAS_GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#endif
