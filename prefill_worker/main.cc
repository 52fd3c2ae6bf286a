// pdserve-prefill: serves the prefill role (prompt KV pushed to, or held for, decode workers).
#include "worker/worker_main.h"

int main(int argc, char** argv) {
  return pdserve::worker::worker_main(pdserve::worker::WorkerProgram::kPrefill, argc, argv);
}
