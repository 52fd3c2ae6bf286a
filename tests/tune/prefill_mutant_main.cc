// pdserve-prefill-mutant: the real prefill worker with a wrong KV rank map, for the correctness
// gate's mutation proof (docs/tune.md §6.5). Every rank-map entry of layer 1 names layer 0
// instead, so the producer — which plans a push transfer's writes — copies layer 0's KV twice
// and layer 1's never. The op count is unchanged, so the decode side accepts the transfer as
// complete and decodes over a layer whose KV is stale: the outputs are wrong, nothing fails.
#include "kvtransfer/rank_map.h"
#include "worker/worker_main.h"

int main(int argc, char** argv) {
  pdserve::worker::WorkerSeams seams;
  seams.kv_faults.mutate_map = [](pdserve::kvtransfer::RankMap& map) {
    for (auto& entries : map.receives)
      for (pdserve::kvtransfer::RankMapEntry& e : entries)
        if (e.layer == 1) e.layer = 0;
  };
  return pdserve::worker::worker_main(pdserve::worker::WorkerProgram::kPrefill, argc, argv, seams);
}
