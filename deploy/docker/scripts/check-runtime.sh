#!/bin/sh
# check-runtime.sh DEPS_FILE PREFIX: run in a runtime stage after the programs were copied in.
# ALLOW_MISSING: sonames the host provides at run time (GPU driver), see runtime-deps.sh.
# Fails when a package that the builder found the programs linking (DEPS_FILE, written by
# runtime-deps.sh) is not installed, when a shared library does not resolve, when a compiler is
# present (PDSERVE_ALLOW_COMPILER=1 allows one), or when a program does not start.
set -eu
deps=$1 prefix=$2
missing=""
while read -r pkg; do
  case "$pkg" in ''|'#'*) continue ;; esac
  dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $pkg"
done <"$deps"
if [ -n "$missing" ]; then
  echo "check-runtime.sh: the programs link libraries of packages the runtime stage does not install:$missing" >&2
  echo "  add them to the runtime package list of the Dockerfile" >&2
  exit 1
fi
bad=$(for f in "$prefix"/bin/* "$prefix"/lib/*.so*; do [ -f "$f" ] && ldd "$f"; done | grep 'not found' \
  | awk -v allow=" ${ALLOW_MISSING:-} " 'index(allow, " " $1 " ") == 0' || true)
if [ -n "$bad" ]; then
  echo "check-runtime.sh: unresolved shared libraries:" >&2
  echo "$bad" >&2
  exit 1
fi
for cc in gcc g++ cc c++ clang nvcc hipcc; do
  [ "${PDSERVE_ALLOW_COMPILER:-0}" = 1 ] && break
  if command -v "$cc" >/dev/null 2>&1; then
    echo "check-runtime.sh: a compiler ($cc) is in the runtime image" >&2
    exit 1
  fi
done
for p in pdserve pdserve-router pdserve-prefill pdserve-decode; do
  "$prefix/bin/$p" --help >/dev/null || { echo "check-runtime.sh: $p --help failed" >&2; exit 1; }
done
echo "check-runtime.sh: ok ($(grep -vc '^#' "$deps") packages; $(ls "$prefix/bin" | wc -l) programs)"
