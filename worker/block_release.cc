#include "worker/block_release.h"

#include "common/logging.h"

namespace pdserve::worker {

bool release_blocks(engine::Engine& engine, const std::vector<int>& blocks, std::string_view what) {
  const Status s = engine.release_blocks(blocks);
  if (!s.ok())
    PD_LOG_ERROR("{}: releasing {} KV blocks failed (a block-accounting bug): {}", what, blocks.size(), s.ToString());
  return s.ok();
}

}  // namespace pdserve::worker
