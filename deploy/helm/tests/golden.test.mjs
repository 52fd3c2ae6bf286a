// Golden renders: `helm template` of every preset (with the monitoring API present, so the
// ServiceMonitor/PodMonitor/PrometheusRule are covered too) must equal golden/<preset>.yaml, with
// Helm 3 and Helm 4 alike. A change to the chart that changes a render shows up as a diff here.
//
// Regenerate after an intended change (then review the diff):
//   UPDATE_GOLDEN=1 node --test deploy/helm/tests/golden.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { GOLDEN, PRESETS, render } from './lib.mjs';

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

for (const preset of PRESETS) {
  const file = join(GOLDEN, `${preset}.yaml`);
  const opts = { preset, apiVersions: ['monitoring.coreos.com/v1'] };
  test(`golden ${preset}`, () => {
    const got = render({ ...opts, helm: 4 }).text;
    if (update) writeFileSync(file, got);
    assert.ok(existsSync(file), `${file} is missing: run with UPDATE_GOLDEN=1`);
    const want = readFileSync(file, 'utf8');
    assert.ok(got === want, `helm 4 render of ${preset} differs from ${file} (UPDATE_GOLDEN=1 to accept):\n${firstDiff(want, got)}`);
  });
  test(`golden ${preset} (helm 3 renders the same)`, () => {
    const got = render({ ...opts, helm: 3 }).text;
    const want = readFileSync(file, 'utf8');
    assert.ok(got === want, `helm 3 render of ${preset} differs from ${file}:\n${firstDiff(want, got)}`);
  });
}
