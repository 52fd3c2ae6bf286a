// pdserve-prefill-faulty / pdserve-decode-faulty: the real worker binaries with kvtransfer faults
// injected at random through worker_main's seams (never part of the production binaries), for
// bench/chaos.sh's soak (CHAOS_FAULTS=1): a fraction of the transfers' completion notifications
// (WRITE_DONE, RELEASE) are "sent" but never leave, so those transfers end at their lease
// (--kv-lease-ms) as a lost message or a stalled peer would end them: the request fails on one
// side, the router places it again, and every block must still come back. The fraction is
// $PDSERVE_DROP_NOTIFICATIONS (default 0.05).
#include <cstdlib>

#include "worker/worker_main.h"

int main(int argc, char** argv) {
  pdserve::worker::WorkerSeams seams;
  const char* fraction = std::getenv("PDSERVE_DROP_NOTIFICATIONS");
  seams.kv_faults.drop_notifications = fraction ? std::atof(fraction) : 0.05;
#ifdef PDSERVE_FAULTY_PREFILL
  return pdserve::worker::worker_main(pdserve::worker::WorkerProgram::kPrefill, argc, argv, seams);
#else
  return pdserve::worker::worker_main(pdserve::worker::WorkerProgram::kDecode, argc, argv, seams);
#endif
}
