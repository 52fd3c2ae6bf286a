// Element types of weights and KV caches, and their sizes. Kept separate so that headers which
// only describe memory (KV spec, geometry) need nothing else from the engine.
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

}  // namespace pdserve::engine
