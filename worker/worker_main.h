// The start-up of a worker process (pdserve-prefill, pdserve-decode): flags, model and engine,
// the role's kvtransfer endpoints, the gRPC server (Worker service, health, reflection), one
// machine-readable "READY grpc=HOST:PORT ..." line on stdout, and a graceful shutdown on
// SIGTERM/SIGINT (in-flight RPCs cancelled, transfers aborted and drained, requests aborted).
#pragma once

#include "kvtransfer/kv_endpoint.h"

namespace pdserve::worker {

// Which program runs: the prefill binary serves the prefill role only; the decode binary
// serves the decode role or, with --role aggregated, whole requests.
enum class WorkerProgram { kPrefill, kDecode };

// Parses the flags and serves until a signal; the process exit code.
int worker_main(WorkerProgram program, int argc, char** argv);

// What a test's worker binary changes in the real one, so that the mutation tests run the
// production start-up and serving code with one deliberate fault and nothing else different.
// The production binaries call the overload above, which injects none.
struct WorkerSeams {
  kvtransfer::TestFaults kv_faults;  // Given to every kvtransfer rank of the prefill / decode role.
};
int worker_main(WorkerProgram program, int argc, char** argv, const WorkerSeams& seams);

}  // namespace pdserve::worker
