#include "worker/kv_staging.h"

#include <algorithm>

#include "common/logging.h"

namespace pdserve::worker {

using engine::ByteRange;
using engine::KvPart;

StatusOr<std::unique_ptr<KvStaging>> KvStaging::create(const engine::KvCacheLayout& layout, void* device,
                                                       void* host, engine::Backend* backend) {
  if (device == nullptr || host == nullptr || backend == nullptr)
    return absl::InvalidArgumentError("KV staging needs a device arena, a host mirror and a backend");
  std::unique_ptr<KvStaging> s(
      new KvStaging(layout, static_cast<uint8_t*>(device), static_cast<uint8_t*>(host), backend));
  // Pinning is for speed only: memory the driver will not pin (some shared mappings) still
  // stages, through its pageable path.
  if (Status pinned = backend->pin_host_memory(host, layout.total_bytes()); pinned.ok()) {
    s->pinned_ = true;
  } else {
    PD_LOG_WARN("KV staging on {}: host mirror not pinned ({}); copies take the pageable path", backend->name(),
                pinned.ToString());
  }
  return s;
}

KvStaging::~KvStaging() {
  if (pinned_) backend_->unpin_host_memory(host_);
}

std::vector<ByteRange> KvStaging::ranges(const std::vector<int>& blocks, int layer) const {
  std::vector<ByteRange> out;
  const int first = layer < 0 ? 0 : layer, last = layer < 0 ? layout_.num_layers() : layer + 1;
  for (int l = first; l < last; ++l) {
    const bool has_v = layout_.spec().layers[l].has_v();
    for (int b : blocks) {
      layout_.ranges(l, b, KvPart::kK, 0, layout_.num_local_heads(l), &out);
      if (has_v) layout_.ranges(l, b, KvPart::kV, 0, layout_.num_local_heads(l), &out);
    }
  }
  // Runs of consecutive blocks are contiguous in every order: merge them into one copy each.
  std::sort(out.begin(), out.end(), [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : out) {
    if (!merged.empty() && merged.back().offset + merged.back().length == r.offset) {
      merged.back().length += r.length;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

Status KvStaging::copy(const std::vector<ByteRange>& ranges, bool to_host) {
  uint64_t bytes = 0;
  for (const ByteRange& r : ranges) {
    void* dst = (to_host ? host_ : device_) + r.offset;
    const void* src = (to_host ? device_ : host_) + r.offset;
    PD_RETURN_IF_ERROR(backend_->staging_copy(dst, src, r.length));
    bytes += r.length;
  }
  PD_RETURN_IF_ERROR(backend_->staging_wait());
  (to_host ? bytes_to_host_ : bytes_to_device_) += bytes;
  return absl::OkStatus();
}

Status KvStaging::check(const std::vector<int>& blocks, int layer) const {
  if (layer >= layout_.num_layers()) return absl::OutOfRangeError(absl::StrCat("no KV layer ", layer));
  for (int b : blocks)
    if (b < 0 || b >= layout_.num_blocks()) return absl::OutOfRangeError(absl::StrCat("no KV block ", b));
  return absl::OkStatus();
}

Status KvStaging::to_host(const std::vector<int>& blocks, int layer) {
  PD_RETURN_IF_ERROR(check(blocks, layer));
  return copy(ranges(blocks, layer), /*to_host=*/true);
}

Status KvStaging::to_device(const std::vector<int>& blocks) {
  PD_RETURN_IF_ERROR(check(blocks, -1));
  return copy(ranges(blocks, -1), /*to_host=*/false);
}

}  // namespace pdserve::worker
