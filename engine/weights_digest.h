// A fingerprint of a checkpoint's weights for the prefix cache's key root: two models with the
// same geometry but different weights (a fine-tune) must never share cached KV. Reading every
// byte of a large checkpoint would cost seconds at start-up, so each tensor contributes its
// name, dtype and shape and, for large tensors, 64 evenly spaced 1 KiB windows of its bytes
// (small ones whole): any real fine-tune changes those windows.
#pragma once

#include <array>
#include <cstdint>

#include "engine/weights.h"

namespace pdserve::engine {

// SHA-256 over the tensors in name order; the same on every rank and every TP degree.
std::array<uint8_t, 32> weights_digest(const WeightSource& weights);

}  // namespace pdserve::engine
