// A stand-in for a GPU on machines without one: the CPU backend's kernels over memory the host
// cannot touch. All of its memory is one mapping kept PROT_NONE except while one of its own
// calls runs (calls are serialized), so any code that reads or writes backend memory other than
// through the Backend interface — which a GPU would not allow — faults at once. The engine's
// device path (weight upload, per-step metadata, logits, layer hooks, kvtransfer staging) runs
// on it exactly as on a GPU backend, host_memory() false.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "engine/backend.h"

namespace pdserve::testing {

// `capacity` bytes of address space; allocations are never reused (tests are short). `name` is
// what name() reports (e.g. "cuda:0", to be taken for a GPU by code that asks). Unless
// `pinnable`, pin_host_memory fails, as a driver's does for memory it cannot lock. When set,
// `queued_errors` is what queued_errors() reports (a failed launch, injected).
std::unique_ptr<engine::Backend> make_guarded_backend(size_t capacity = size_t(1) << 30,
                                                      const std::string& name = "guarded:0", bool pinnable = true,
                                                      std::function<Status()> queued_errors = {});

// GEMMs with bf16 weights that guarded backends ran, process-wide (proof that a bf16 path ran).
uint64_t guarded_bf16_gemms();

}  // namespace pdserve::testing
