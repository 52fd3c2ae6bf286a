#include "kvtransfer/transfer_plan.h"

#include <algorithm>

namespace pdserve::kvtransfer {
namespace {

Status check_side(const char* side, const engine::KvCacheLayout& layout, int rank, int tp,
                  uint64_t fingerprint) {
  if (layout.rank() != rank || layout.tp() != tp) {
    return absl::InvalidArgumentError(absl::StrCat("transfer plan: ", side, " layout is rank ", layout.rank(),
                                                   " of TP ", layout.tp(), ", expected rank ", rank, " of TP ", tp));
  }
  if (layout.spec_fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer plan: ", side, " KV spec (fingerprint ", layout.spec_fingerprint(),
                     ") is not the one the rank map was built for (", fingerprint, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::span<const int>> sent_blocks(std::span<const int> blocks, int skip_blocks) {
  if (skip_blocks < 0 || static_cast<size_t>(skip_blocks) > blocks.size()) {
    return absl::OutOfRangeError(absl::StrCat("transfer plan: skip_blocks ", skip_blocks, " outside [0, ",
                                              blocks.size(), "]"));
  }
  return blocks.subspan(static_cast<size_t>(skip_blocks));
}

StatusOr<TransferPlan> plan_for_pair(int producer_rank, int consumer_rank, const RankMap& map,
                                     const engine::KvCacheLayout& producer,
                                     const engine::KvCacheLayout& consumer,
                                     std::span<const int> producer_blocks,
                                     std::span<const int> consumer_blocks,
                                     int skip_blocks) {
  PD_RETURN_IF_ERROR(check_side("producer", producer, producer_rank, map.producer_tp, map.spec_fingerprint));
  PD_RETURN_IF_ERROR(check_side("consumer", consumer, consumer_rank, map.consumer_tp, map.spec_fingerprint));
  if (producer_blocks.size() != consumer_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("transfer plan: ", producer_blocks.size(),
                                                   " producer blocks but ", consumer_blocks.size(),
                                                   " consumer blocks"));
  }
  std::vector<int> sorted(consumer_blocks.begin(), consumer_blocks.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    return absl::InvalidArgumentError(absl::StrCat("transfer plan: consumer block ", *dup, " listed twice"));
  }

  PD_ASSIGN_OR_RETURN(std::span<const int> producer_sent, sent_blocks(producer_blocks, skip_blocks));
  PD_ASSIGN_OR_RETURN(std::span<const int> consumer_sent, sent_blocks(consumer_blocks, skip_blocks));

  TransferPlan plan;
  plan.producer_rank = producer_rank;
  plan.consumer_rank = consumer_rank;
  plan.layers.resize(producer.num_layers());
  for (const RankMapEntry& e : map.entries_between(producer_rank, consumer_rank)) {
    PD_RETURN_IF_ERROR(append_copy_ops(producer, consumer, e, producer_sent, consumer_sent,
                                       &plan.layers[e.layer].ops));
  }
  for (LayerCopies& layer : plan.layers) {
    for (const CopyOp& op : layer.ops) layer.bytes += op.length;
    plan.total_bytes += layer.bytes;
    plan.total_ops += layer.ops.size();
  }
  return plan;
}

}  // namespace pdserve::kvtransfer
