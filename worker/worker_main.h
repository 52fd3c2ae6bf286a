// The start-up of a worker process (pdserve-prefill, pdserve-decode): flags, model and engine,
// the role's kvtransfer endpoints, the gRPC server (Worker service, health, reflection), one
// machine-readable "READY grpc=HOST:PORT ..." line on stdout, and a graceful shutdown on
// SIGTERM/SIGINT (in-flight RPCs cancelled, transfers aborted and drained, requests aborted).
#pragma once

namespace pdserve::worker {

// Which program runs: the prefill binary serves the prefill role only; the decode binary
// serves the decode role or, with --role aggregated, whole requests.
enum class WorkerProgram { kPrefill, kDecode };

// Parses the flags and serves until a signal; the process exit code.
int worker_main(WorkerProgram program, int argc, char** argv);

}  // namespace pdserve::worker
