# Shared helpers of image-build.sh and image-test.sh (sourced, not run): find a Docker engine or
# start a private one, and create the Debian base image without a registry.
#
# The private engine is Debian's Docker engine (package docker.io, 20.10) with everything under
# one work directory outside the checkout (PDSERVE_DOCKER_WORKDIR, default <checkout>/../dockerd-data):
#   root/        dockerd --data-root (images, layers, BuildKit cache incl. the ccache mount)
#   exec/        dockerd --exec-root (its containerd's state and socket)
#   docker.sock  the API socket (DOCKER_HOST=unix://.../docker.sock)
#   dockerd.pid, dockerd.log
#   rootfs-bookworm/  the debootstrap tree the base image is imported from (removed after import)
# It runs with the vfs storage driver (no overlayfs needed; every layer is a full copy, so watch
# the disk and prune), no iptables and no bridge (containers and builds use --network host).

PD_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PD_REPO_ROOT=$(cd "$PD_SCRIPTS_DIR/../.." && pwd)
PD_WORKDIR=${PDSERVE_DOCKER_WORKDIR:-$(cd "$PD_REPO_ROOT/.." && pwd)/dockerd-data}
PD_BASE_IMAGE=${PDSERVE_BASE_IMAGE:-pdserve-base:bookworm}
PD_STARTED_DOCKERD=0

pd_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
pd_die() { pd_log "error: $*"; exit 1; }

# The Debian client: /usr/bin/docker speaks to the 20.10 engine and has BuildKit built in (the
# preinstalled /usr/local/bin/docker 28.x has no buildx plugin, so its `build` cannot use BuildKit).
pd_docker_client() {
  if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker || true; fi
}

pd_answers() {  # pd_answers [DOCKER_HOST]: does an engine answer there (or at the default)?
  local client; client=$(pd_docker_client)
  [ -n "$client" ] || return 1
  if [ -n "${1:-}" ]; then
    DOCKER_HOST="$1" timeout 10 "$client" version --format '{{.Server.Version}}' >/dev/null 2>&1
  else
    timeout 10 "$client" version --format '{{.Server.Version}}' >/dev/null 2>&1
  fi
}

# Finds an engine that answers: $DOCKER_HOST (or the default socket), then the private one under
# PD_WORKDIR. Exports DOCKER_HOST for the one found. Returns 1 when none answers.
pd_find_engine() {
  local client; client=$(pd_docker_client)
  [ -n "$client" ] || return 1
  if pd_answers; then
    return 0
  fi
  if [ -S "$PD_WORKDIR/docker.sock" ] && pd_answers "unix://$PD_WORKDIR/docker.sock"; then
    export DOCKER_HOST="unix://$PD_WORKDIR/docker.sock"
    return 0
  fi
  return 1
}

pd_install_packages() {  # apt-get install, only when the command is missing
  local need=()
  command -v dockerd >/dev/null 2>&1 && [ -x /usr/bin/docker ] || need+=('?name(^docker\.io$)')
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || pd_die "need root to install ${need[*]} (apt-get)"
  pd_log "installing ${need[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# Starts the private dockerd and waits until it answers; pd_stop_dockerd (called from the
# caller's EXIT trap) stops it again unless PDSERVE_KEEP_DOCKERD=1.
pd_start_dockerd() {
  [ "$(id -u)" -eq 0 ] || pd_die "starting dockerd needs root"
  mkdir -p "$PD_WORKDIR/root" "$PD_WORKDIR/exec"
  if [ -f "$PD_WORKDIR/dockerd.pid" ] && ! kill -0 "$(cat "$PD_WORKDIR/dockerd.pid")" 2>/dev/null; then
    rm -f "$PD_WORKDIR/dockerd.pid" "$PD_WORKDIR/docker.sock"
  fi
  pd_log "starting dockerd (data root $PD_WORKDIR/root, vfs, no iptables, no bridge)"
  setsid /usr/sbin/dockerd \
    --data-root "$PD_WORKDIR/root" --exec-root "$PD_WORKDIR/exec" \
    --pidfile "$PD_WORKDIR/dockerd.pid" -H "unix://$PD_WORKDIR/docker.sock" \
    --storage-driver=vfs --iptables=false --ip-masq=false --bridge=none \
    >>"$PD_WORKDIR/dockerd.log" 2>&1 </dev/null &
  PD_STARTED_DOCKERD=1
  export DOCKER_HOST="unix://$PD_WORKDIR/docker.sock"
  local i
  for i in $(seq 1 120); do
    pd_answers "$DOCKER_HOST" && return 0
    sleep 0.5
  done
  tail -20 "$PD_WORKDIR/dockerd.log" >&2
  pd_die "dockerd did not answer within 60 s (log: $PD_WORKDIR/dockerd.log)"
}

pd_stop_dockerd() {
  [ "$PD_STARTED_DOCKERD" = 1 ] || return 0
  if [ "${PDSERVE_KEEP_DOCKERD:-0}" = 1 ]; then
    pd_log "leaving dockerd running: DOCKER_HOST=unix://$PD_WORKDIR/docker.sock (pid $(cat "$PD_WORKDIR/dockerd.pid" 2>/dev/null))"
    return 0
  fi
  local pid; pid=$(cat "$PD_WORKDIR/dockerd.pid" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  pd_log "stopping dockerd (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { PD_STARTED_DOCKERD=0; return 0; }
    sleep 0.5
  done
  pd_log "dockerd (pid $pid) did not stop in 30 s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

# Finds an engine or starts the private one (installing Debian's engine when missing).
pd_ensure_engine() {
  pd_find_engine && return 0
  pd_install_packages
  pd_start_dockerd
}

pd_image_exists() { "$(pd_docker_client)" image inspect "$1" >/dev/null 2>&1; }

# The base image of the CPU image: Debian bookworm minbase from debootstrap, imported once (a
# registry would give debian:bookworm-slim; none can be reached here). Its apt sources are the
# host's mirror (bookworm, bookworm-updates, bookworm-security), so `docker build --network host`
# installs packages from the same archive the host uses.
pd_ensure_base() {
  local docker; docker=$(pd_docker_client)
  if pd_image_exists "$PD_BASE_IMAGE"; then
    pd_log "base image $PD_BASE_IMAGE exists (cached; remove it to rebuild)"
    return 0
  fi
  pd_install_packages
  local mirror security rootfs="$PD_WORKDIR/rootfs-bookworm" t0
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  security=$(awk '/^URIs:/ && /security/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$security" ] || security=http://deb.debian.org/debian-security
  t0=$(date +%s)
  rm -rf "$rootfs"
  pd_log "debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$PD_WORKDIR/debootstrap.log" 2>&1 \
    || { tail -20 "$PD_WORKDIR/debootstrap.log" >&2; pd_die "debootstrap failed (log: $PD_WORKDIR/debootstrap.log)"; }
  cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
  # What the official images do: no recommends, no apt cache left in layers.
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$rootfs/etc/apt/apt.conf.d/90pdserve-norecommends"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" --numeric-owner -c . | "$docker" import \
    -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' \
    -m "debootstrap --variant=minbase bookworm ($mirror)" - "$PD_BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  PD_BASE_SECONDS=$(( $(date +%s) - t0 ))
  pd_log "created $PD_BASE_IMAGE in ${PD_BASE_SECONDS} s ($("$docker" image inspect -f '{{.Size}}' "$PD_BASE_IMAGE") bytes)"
}

# The build context: the checkout's tracked and untracked-but-not-ignored files (git ls-files), as a
# tar stream on stdin of `docker build -`. So build/ trees, .git and anything .gitignore'd are never
# sent, with the legacy builder and BuildKit alike, without a .dockerignore at the repository root.
# Without git (an exported tree), everything but build*/, .git and .cache is sent.
pd_context_tar() {
  local tar_file
  tar_file=$(mktemp)
  if git -C "$PD_REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$PD_REPO_ROOT" ls-files -z --cached --others --exclude-standard \
      | (cd "$PD_REPO_ROOT" && while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) \
      | tar -C "$PD_REPO_ROOT" --null --no-recursion -c -f "$tar_file" -T -
  else
    tar -C "$PD_REPO_ROOT" --exclude='./build*' --exclude=./.git --exclude=./.cache -c -f "$tar_file" .
  fi
  # The bundled test model, as models/stories260K/ in the context (never in the repository): the
  # CPU image ships it, so its chart preset and `docker run` need no model volume or download.
  if [ -n "${PD_CONTEXT_MODEL_DIR:-}" ]; then
    tar -C "$(dirname "$PD_CONTEXT_MODEL_DIR")" --transform 's,^,models/,' -r -f "$tar_file" \
      "$(basename "$PD_CONTEXT_MODEL_DIR")"
  fi
  cat "$tar_file"
  rm -f "$tar_file"
}
