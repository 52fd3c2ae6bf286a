// helm lint --strict for every preset, with Helm 3 and Helm 4 (the schema and the templates both
// run; --strict turns lint warnings into failures).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CHART, KUBE_VERSION, PRESETS, fixture, helm, presetFiles } from './lib.mjs';

for (const version of [3, 4]) {
  for (const preset of PRESETS) {
    test(`helm ${version} lint --strict ${preset}`, () => {
      const files = presetFiles(preset).flatMap((f) => ['-f', f]);
      const r = helm(version, ['lint', '--strict', CHART, '--kube-version', KUBE_VERSION, ...files]);
      assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
      assert.match(r.stdout, /1 chart\(s\) linted, 0 chart\(s\) failed/);
    });
  }
  // The optional objects (lint has no --api-versions, so the monitoring ones stay out).
  test(`helm ${version} lint --strict default with the optional objects on`, () => {
    const r = helm(version, ['lint', '--strict', CHART, '--kube-version', KUBE_VERSION,
      '--set', 'monitoring.dashboards.enabled=true', '--set', 'networkPolicy.enabled=true',
      '--set', 'networkPolicy.defaultDeny=true', '--set', 'prefill.autoscaling.enabled=true',
      '--set', 'router.autoscaling.enabled=true']);
    assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
  });
  test(`helm ${version} lint --strict cpu with every auth Secret and the router flags (values/auth.yaml)`, () => {
    const r = helm(version, ['lint', '--strict', CHART, '--kube-version', KUBE_VERSION,
      ...presetFiles('cpu').flatMap((f) => ['-f', f]), '-f', fixture('auth.yaml')]);
    assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
  });
  test(`helm ${version} lint --strict cpu with TLS (values/tls.yaml, values/tls-worker-name.yaml)`, () => {
    for (const extra of [['tls.yaml'], ['auth.yaml', 'tls-worker-name.yaml']]) {
      const r = helm(version, ['lint', '--strict', CHART, '--kube-version', KUBE_VERSION,
        ...presetFiles('cpu').flatMap((f) => ['-f', f]), ...extra.flatMap((f) => ['-f', fixture(f)])]);
      assert.equal(r.status, 0, `${extra}: ${r.stdout}\n${r.stderr}`);
    }
  });
}
