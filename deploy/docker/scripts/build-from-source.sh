#!/bin/sh
# build-from-source.sh ucx|rdma-core|perftest PREFIX [EXTRA CONFIGURE ARGS...]
# Builds one RDMA/UCX component from its release source into PREFIX, for the GPU images (the
# Debian/Ubuntu packages lack what they need: Debian 12's UCX 1.13 has no CUDA or ROCm transports,
# and distribution rdma-core before v61.0 has no ionic provider for AMD Pollara NICs).
#
# Environment (per component, NAME = UCX, RDMA_CORE or PERFTEST):
#   NAME_VERSION  the version (UCX: 1.20.1, rdma-core: 62.0, perftest: a tag such as 25.10.0-0.128)
#   NAME_URL      where to download the tarball (default: the project's GitHub release/tag archive)
#   NAME_SHA256   when set, the tarball's sha256 must match
#   NAME_TARBALL  a local tarball to use instead of downloading (a release tarball, or a
#                 `git archive` of a tag: sources without ./configure are bootstrapped with autogen.sh)
#   JOBS          parallel jobs (default: nproc)
#   REQUIRE       space-separated UCX modules (ib rdmacm cuda rocm ...) or rdma-core providers
#                 (mlx5 ionic ...) that must have been built; the build fails otherwise, so a
#                 missing -dev package never silently drops a transport.
# Verified on Debian 12 (bookworm) in a container of this project's base image, from `git archive`s
# of the release tags: rdma-core 62.0 (REQUIRE="ionic mlx5 bnxt_re"), UCX 1.20.1 against it
# (REQUIRE="ib rdmacm", --with-verbs/--with-rdmacm=/opt/rdma-core) and perftest 25.10.0-0.128.
# The CUDA and ROCm flags were not run (no toolkit there).
set -eu
component=$1 prefix=$2
shift 2
jobs=${JOBS:-$(nproc)}

case "$component" in
  ucx)       var=UCX ;       default_version=1.20.1 ;;
  rdma-core) var=RDMA_CORE ; default_version=62.0 ;;
  perftest)  var=PERFTEST ;  default_version=25.10.0-0.128 ;;
  *) echo "build-from-source.sh: unknown component $component" >&2; exit 2 ;;
esac
eval "version=\${${var}_VERSION:-$default_version}"
eval "url=\${${var}_URL:-}"
eval "sha=\${${var}_SHA256:-}"
eval "tarball=\${${var}_TARBALL:-}"
if [ -z "$url" ]; then
  case "$component" in
    ucx)       url=https://github.com/openucx/ucx/releases/download/v$version/ucx-$version.tar.gz ;;
    rdma-core) url=https://github.com/linux-rdma/rdma-core/releases/download/v$version/rdma-core-$version.tar.gz ;;
    perftest)  url=https://github.com/linux-rdma/perftest/archive/refs/tags/$version.tar.gz ;;
  esac
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$tarball" ]; then
  cp "$tarball" "$work/src.tar.gz"
else
  echo "build-from-source.sh: downloading $url"
  curl -fsSL --retry 3 -o "$work/src.tar.gz" "$url"
fi
if [ -n "$sha" ]; then
  echo "$sha  $work/src.tar.gz" | sha256sum -c -
else
  echo "build-from-source.sh: $component $version sha256 $(sha256sum "$work/src.tar.gz" | cut -d' ' -f1) (not pinned: set ${var}_SHA256)"
fi
mkdir "$work/src"
tar -xzf "$work/src.tar.gz" -C "$work/src" --strip-components=1
cd "$work/src"

require() {  # require DIR PATTERN-WITH-% NAME...: every NAME's file must exist in DIR
  dir=$1 pattern=$2; shift 2
  missing=""
  for name in "$@"; do
    file=$(echo "$pattern" | sed "s/%/$name/")
    ls "$dir"/$file >/dev/null 2>&1 || missing="$missing $name"
  done
  if [ -n "$missing" ]; then
    echo "build-from-source.sh: $component was built without:$missing (in $dir: $(ls "$dir" | tr '\n' ' '))" >&2
    exit 1
  fi
}

case "$component" in
  ucx)
    [ -x configure ] || ./autogen.sh
    # configure-release: no logging/debug/assertion/parameter-check code (the upstream release flags).
    ./contrib/configure-release --prefix="$prefix" --enable-mt --enable-cma \
      --without-java --without-go --disable-doxygen-doc --without-knem --without-xpmem "$@"
    make -j"$jobs"
    make install
    "$prefix/bin/ucx_info" -v
    # shellcheck disable=SC2086
    [ -z "${REQUIRE:-}" ] || require "$prefix/lib/ucx" 'libuct_%.so' $REQUIRE
    ls "$prefix/lib/ucx"
    ;;
  rdma-core)
    # Libraries, providers and the verbs utilities (ibv_devinfo, ibv_devices, rdma_* tools); no man
    # pages (pandoc), no Python bindings, no daemons' systemd units needed in a container.
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
      -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_INSTALL_SYSCONFDIR="$prefix/etc" -DCMAKE_INSTALL_RUNDIR=/run \
      -DNO_MAN_PAGES=1 -DNO_PYVERBS=1 -DENABLE_STATIC=0 "$@"
    cmake --build build -j "$jobs"
    cmake --install build
    # shellcheck disable=SC2086
    [ -z "${REQUIRE:-}" ] || require "$prefix/lib/libibverbs" 'lib%-rdmav*.so' $REQUIRE
    ls "$prefix/lib/libibverbs"
    ;;
  perftest)
    [ -x configure ] || ./autogen.sh
    ./configure --prefix="$prefix" "$@"
    make -j"$jobs"
    make install
    ls "$prefix/bin"
    ;;
esac
echo "build-from-source.sh: $component $version installed in $prefix"
