// The one conversion between the engine's log-probabilities (engine::TokenLogprob: a token's
// and its most likely alternatives) and the wire's (pdserve.v1.TokenLogprob), both ways: the
// workers put the engine's on the wire (WorkerEvent, PrefillResponse), the CLI prints them, and
// the tests compare what a cluster streamed with the in-process engine's.
#pragma once

#include <vector>

#include "engine/engine.h"
#include "proto/pdserve.pb.h"

namespace pdserve::worker {

v1::TokenLogprob to_wire(const engine::TokenLogprob& lp);
// The same, one per entry in order, appended to `out`.
void append_wire(const std::vector<engine::TokenLogprob>& lps,
                 google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out);
// The engine's form; top_ids and top_logprobs pair up to the shorter of the two.
engine::TokenLogprob from_wire(const v1::TokenLogprob& lp);

}  // namespace pdserve::worker
