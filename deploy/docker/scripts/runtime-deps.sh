#!/bin/sh
# runtime-deps.sh FILE...: prints, one a line and sorted, the dpkg packages that own the shared
# libraries FILE... load (ldd), and fails when one is not found. Run in a builder stage on the
# installed programs; the runtime stage checks that every package printed is installed, so the
# explicit runtime package list of the Dockerfile cannot silently fall behind the link line.
# ALLOW_MISSING: space-separated sonames that may be unresolved here because the host provides
# them at run time (the GPU driver: libcuda.so.1, libnvidia-ml.so.1).
# Libraries outside dpkg (a UCX or rdma-core built from source under /opt, CUDA or ROCm
# libraries of the base image installed without dpkg) are printed as "# unowned PATH".
set -eu
libs=$(for f in "$@"; do ldd "$f"; done | awk -v allow=" ${ALLOW_MISSING:-} " '
  /not found/ { if (index(allow, " " $1 " ") == 0) print "MISSING " $1; next }
  $2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
if printf '%s\n' "$libs" | grep -q '^MISSING '; then
  printf '%s\n' "$libs" | grep '^MISSING ' >&2
  echo "runtime-deps.sh: unresolved shared libraries (above)" >&2
  exit 1
fi
for lib in $libs; do
  real=$(realpath "$lib")
  pkg=""
  # Merged /usr: dpkg may have registered the file under /lib or under /usr/lib.
  for p in "$real" "$lib" "${real#/usr}" "/usr${lib}"; do
    pkg=$(dpkg -S "$p" 2>/dev/null | grep -v "^diversion" | head -1 | cut -d: -f1) && [ -n "$pkg" ] && break
  done
  if [ -n "$pkg" ]; then echo "$pkg"; else echo "# unowned $real"; fi
done | sort -u
