// The compatibility hash that two ranks compare in the control-channel handshake before any
// KV byte moves: a transfer between different geometries "completes" and yields garbage, so a
// mismatch must be refused up front, with both geometries in the error.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/kv_spec.h"

namespace pdserve::kvtransfer {

// Hash of the model identity and the whole KV cache spec (per-layer geometry, dtypes, block
// size). Equal hashes are required for a handshake to be accepted.
uint64_t compat_hash(std::string_view model_id, const engine::KvCacheSpec& spec);

}  // namespace pdserve::kvtransfer
