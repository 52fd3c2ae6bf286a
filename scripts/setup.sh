#!/usr/bin/env bash
# Installs every Debian package pdserve's build and tests need. Idempotent: packages already
# present are skipped, so a second run costs one dpkg query.
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libssl-dev openssl
  libpcre2-dev libutf8proc-dev python3-jinja2
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  libucx-dev ucx-utils libzmq3-dev cppzmq-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)
# CI also compile-checks the GPU kernels as HIP with Debian's hipcc (a large toolchain, so only
# when asked: .ci/run sets PDSERVE_GPU_CHECKS=1).
if [ "${PDSERVE_GPU_CHECKS:-0}" = 1 ]; then PACKAGES+=(hipcc); fi
# The fuzzers (scripts/fuzz.sh) build with clang and its libFuzzer runtime.
if [ "${PDSERVE_FUZZ:-0}" = 1 ]; then PACKAGES+=(clang libclang-rt-dev); fi
# The deployment tests (ctest -L deploy) run helm and schema validators from npm packages
# (deploy/package.json) on Node.js; the machines here ship Node.js 20, elsewhere Debian's.
command -v node >/dev/null && command -v npm >/dev/null || PACKAGES+=(nodejs npm)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
