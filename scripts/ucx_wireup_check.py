#!/usr/bin/env python3
"""Checks the installed UCX for the wireup assertion that aborts a process whose peer dies while
a new endpoint between them is still being wired up: UCX 1.13's `ucp_request.c:684 ... got REP
message` (openucx/ucx PR #8175 removed it; Debian 12 ships 1.13.1). docs/transport.md says what
it does to a cluster.

One consumer kv_peer (the survivor) runs throughout. Each round starts a producer kv_peer, has it
push a request to the consumer (so the producer's endpoint to the consumer is made and wired up
then), and SIGKILLs it a random 0..--max-delay-ms later. A consumer that dies is counted (and
whether its stderr has the assertion; its log is kept) and started again. Prints one JSON line; exits 1 when the
consumer ever died, 0 when it survived every kill, 2 on a setup error.

  scripts/ucx_wireup_check.py [--kv-peer build/tests/kvtransfer/kv_peer] [--kills 100]
                              [--max-delay-ms 20] [--tls TLS (default: UCX's own choice)] [--seed N]
"""
import argparse
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time


class SetupError(Exception):
    pass


def start(kv_peer, role, log_path, env):
    """Starts a kv_peer of `role`; returns (process, its rank-0 endpoint) once it says READY."""
    with open(log_path, "w") as log:
        p = subprocess.Popen(
            [kv_peer, "--role", role, "--tps", "1", "--blocks", "8", "--peer-timeout-ms", "1000",
             "--connect-timeout-ms", "1000", "--quarantine-ms", "500"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, text=True, bufsize=1)
    endpoint, pending = None, b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # Unbuffered: a buffered reader would hold lines select() cannot see.
        if not select.select([p.stdout], [], [], 1.0)[0]:
            continue
        chunk = os.read(p.stdout.fileno(), 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"ENDPOINT "):
                endpoint = line.split()[3].decode()
            elif line.startswith(b"READY"):
                return p, endpoint
    p.kill()
    raise SetupError(f"{role} kv_peer did not start; its log: {log_path}")


def died(consumer, log_path, wait_s=0.05):
    """Whether the consumer has exited (waiting wait_s for it), and whether with the assertion."""
    try:
        consumer.wait(timeout=wait_s)  # Its progress thread notices the dead peer.
    except subprocess.TimeoutExpired:
        return False, False
    with open(log_path) as log:
        return True, "got REP message" in log.read()


def ucx_version():
    try:
        out = subprocess.run(["ucx_info", "-v"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return "unknown (no ucx_info)"
    return out[0].lstrip("# ") if out else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv-peer", default="build/tests/kvtransfer/kv_peer")
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--max-delay-ms", type=float, default=20)
    ap.add_argument("--tls", default="", help="UCX_TLS for both sides (default: UCX's own choice)")
    ap.add_argument("--seed", type=int, default=1, help="for the kill delays")
    args = ap.parse_args()
    if not os.access(args.kv_peer, os.X_OK):
        print(f"error: no kv_peer at {args.kv_peer} (build it: ninja -C build tests/kvtransfer/kv_peer)", file=sys.stderr)
        return 2
    random.seed(args.seed)
    env = {k: v for k, v in os.environ.items() if k != "UCX_TLS"}
    if args.tls:
        env["UCX_TLS"] = args.tls
    env.setdefault("PDSERVE_LOG_LEVEL", "warning")
    work = tempfile.mkdtemp(prefix="ucx-wireup-")
    consumer_log = os.path.join(work, "consumer.log")
    deaths = assertions = 0
    consumer = None
    try:
        consumer, consumer_ep = start(args.kv_peer, "consumer", consumer_log, env)
        for i in range(args.kills):
            producer, producer_ep = start(args.kv_peer, "producer", os.path.join(work, "producer.log"), env)
            try:
                consumer.stdin.write(f"expect k{i} 1 1 3000 {producer_ep} 6,7\n")
                consumer.stdin.flush()
            except BrokenPipeError:
                pass  # It died after the last check: counted below.
            producer.stdin.write(f"push k{i} 1 1 3000 {consumer_ep} 2,3 6,7\n")
            producer.stdin.flush()
            time.sleep(random.uniform(0, args.max_delay_ms) / 1e3)
            producer.kill()
            producer.wait()
            while select.select([consumer.stdout], [], [], 0)[0] and os.read(consumer.stdout.fileno(), 65536):
                pass  # Its acks and events: drained, so a full pipe never blocks it.
            dead, with_assertion = died(consumer, consumer_log)
            if dead:
                deaths += 1
                assertions += with_assertion
                os.rename(consumer_log, os.path.join(work, f"consumer-death-{deaths}.log"))
                consumer, consumer_ep = start(args.kv_peer, "consumer", consumer_log, env)
        dead, with_assertion = died(consumer, consumer_log, 1.0)  # A late death after the last kill.
        deaths += dead
        assertions += with_assertion
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    print(json.dumps({"ucx": ucx_version(), "tls": args.tls or "default", "kills": args.kills,
                      "max_delay_ms": args.max_delay_ms, "seed": args.seed, "consumer_deaths": deaths,
                      "with_wireup_assertion": assertions, "logs": work}))
    return 1 if deaths else 0


if __name__ == "__main__":
    sys.exit(main())
