#!/usr/bin/env bash
# Writes the tokenizer reference corpus (tests/reference/tokenizer_cases.mjs) into OUT with the
# pinned reference encoder, installing the references first if need be.
#
#   tests/reference/tokenizer-cases.sh OUT [--count N] [--seed S] [NAME...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
eval "$("$here/../../scripts/reference-tools.sh")"
exec node "$here/tokenizer_cases.mjs" "$@"
