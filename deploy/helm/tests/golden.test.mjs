// Golden renders: `helm template` of every preset (with the monitoring API present, so the
// ServiceMonitor/PodMonitor/PrometheusRule are covered too) must equal golden/<preset>.yaml, with
// Helm 3 and Helm 4 alike, and so must the extra cases below (golden/<name>.yaml: a preset plus a
// values fixture from values/). A change to the chart that changes a render shows up as a diff here.
//
// Regenerate after an intended change (then review the diff):
//   UPDATE_GOLDEN=1 node --test deploy/helm/tests/golden.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { GOLDEN, PRESETS, fixture, render } from './lib.mjs';

const update = process.env.UPDATE_GOLDEN === '1';

// First differing line, for a readable failure.
function firstDiff(want, got) {
  const a = want.split('\n');
  const b = got.split('\n');
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    if (a[i] !== b[i]) {
      const ctx = b.slice(Math.max(0, i - 3), i).map((l) => `    ${l}`).join('\n');
      return `line ${i + 1}:\n${ctx}\n  - ${a[i] ?? '<end of golden>'}\n  + ${b[i] ?? '<end of render>'}`;
    }
  }
  return 'no difference';
}

const monitoring = ['monitoring.coreos.com/v1'];
const CASES = [
  ...PRESETS.map((preset) => ({ name: preset, opts: { preset, apiVersions: monitoring } })),
  // The auth Secrets (API keys with /metrics behind a key, the cluster token, the kvtransfer key) and
  // every optional router flag: the Secret volumes and mounts, --api-key-file/--cluster-token-file,
  // --kv-key-file (prefill and decode), the test pod's PDSERVE_API_KEY and the ServiceMonitor's
  // bearer credentials.
  { name: 'cpu-auth', opts: { preset: 'cpu', apiVersions: monitoring, values: [fixture('auth.yaml')] } },
  // TLS with the cluster token: the tls Secret volume in the router, worker and test pods (ca.crt
  // alone in the test pod), the --tls-* flags, the HTTPS readiness probe and scrape.
  { name: 'cpu-tls', opts: { preset: 'cpu', apiVersions: monitoring, values: [fixture('tls.yaml')] } },
  // TLS on top of values/auth.yaml with an explicit worker name: bearer credentials beside the
  // tlsConfig, PDSERVE_API_KEY beside --tls-ca.
  { name: 'cpu-tls-auth', opts: { preset: 'cpu', apiVersions: monitoring, values: [fixture('auth.yaml'), fixture('tls-worker-name.yaml')] } },
];

for (const { name, opts } of CASES) {
  const file = join(GOLDEN, `${name}.yaml`);
  test(`golden ${name}`, () => {
    const got = render({ ...opts, helm: 4 }).text;
    if (update) writeFileSync(file, got);
    assert.ok(existsSync(file), `${file} is missing: run with UPDATE_GOLDEN=1`);
    const want = readFileSync(file, 'utf8');
    assert.ok(got === want, `helm 4 render of ${name} differs from ${file} (UPDATE_GOLDEN=1 to accept):\n${firstDiff(want, got)}`);
  });
  test(`golden ${name} (helm 3 renders the same)`, () => {
    const got = render({ ...opts, helm: 3 }).text;
    const want = readFileSync(file, 'utf8');
    assert.ok(got === want, `helm 3 render of ${name} differs from ${file}:\n${firstDiff(want, got)}`);
  });
}
