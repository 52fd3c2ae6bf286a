// pdserve-decode: serves the decode role (KV pushed into reserved blocks or pulled from a
// prefill worker) or, with --role aggregated, whole requests.
#include "worker/worker_main.h"

int main(int argc, char** argv) {
  return pdserve::worker::worker_main(pdserve::worker::WorkerProgram::kDecode, argc, argv);
}
