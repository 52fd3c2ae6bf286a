// Element types of weights and KV caches, their sizes, and the precision GEMMs multiply in. Kept
// separate so that headers which only describe memory (KV spec, geometry) need nothing else from
// the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>


namespace pdserve::engine {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

// The DType dtype_name() calls `name`, or nullopt.
inline std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

// What a GEMM's activations are multiplied as (EngineOptions::gemm_precision; issue 18's R5a).
// - kExact: f32, as stored. A bf16 checkpoint's tokens are the CPU's, token for token.
// - kBf16: each activation rounded to bf16 (nearest even) at the GEMM's input, so both operands
//   are bf16 (bf16 weights only), products accumulated and outputs kept in f32: what tensor cores
//   and the vendor bf16 GEMMs take. Within a small tolerance of kExact, not equal to it.
enum class GemmPrecision : uint8_t { kExact = 0, kBf16 = 1 };

constexpr const char* gemm_precision_name(GemmPrecision p) { return p == GemmPrecision::kBf16 ? "bf16" : "exact"; }

// The GemmPrecision gemm_precision_name() calls `name`, or nullopt.
inline std::optional<GemmPrecision> gemm_precision_from_name(std::string_view name) {
  for (GemmPrecision p : {GemmPrecision::kExact, GemmPrecision::kBf16})
    if (name == gemm_precision_name(p)) return p;
  return std::nullopt;
}

}  // namespace pdserve::engine
