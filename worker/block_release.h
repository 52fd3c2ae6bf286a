// Giving KV blocks back to the engine from the worker roles. A release can only fail on a block
// that is not held (a double free or a foreign id): a bookkeeping bug that would otherwise leak
// or corrupt the pool silently, so it is logged with what was being released, never discarded.
#pragma once

#include <string_view>
#include <vector>

#include "engine/engine.h"

namespace pdserve::worker {

// Releases `blocks` to `engine`; logs an error naming `what` (e.g. "request r1: unclaimed
// reservation") when the engine refuses them. Whether they were released.
bool release_blocks(engine::Engine& engine, const std::vector<int>& blocks, std::string_view what);

}  // namespace pdserve::worker
