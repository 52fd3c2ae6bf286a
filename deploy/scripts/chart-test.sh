#!/usr/bin/env bash
# Runs one of the Helm chart's test suites (deploy/helm/tests/<suite>.test.mjs) with the pinned tools.
#   deploy/scripts/chart-test.sh lint|golden|schema|invariants|negative|aggregated|tune|all
# UPDATE_GOLDEN=1 with `golden` rewrites deploy/helm/tests/golden/*.yaml from the current chart.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tests="$(dirname "$here")/helm/tests"
suite=${1:?usage: chart-test.sh lint|golden|schema|invariants|negative|aggregated|tune|all}
eval "$("$here/chart-tools.sh")"
if [[ $suite == all ]]; then
  files=("$tests"/*.test.mjs)
else
  files=("$tests/$suite.test.mjs")
  [[ -f ${files[0]} ]] || { echo "chart-test: no suite $suite in $tests" >&2; exit 2; }
fi
exec node --test --test-reporter=spec "${files[@]}"
