// Every rendered object against the Kubernetes (and prometheus-operator, KEDA) schemas, for every
// preset and for a render with every optional object on:
//  1. kubernetes-models' ajv validation (types, required fields, enums, formats);
//  2. a strict pass for what (1) lets through, unknown fields and nulls: each object becomes a typed
//     object literal in a .ts file and `tsc --noEmit --strict` reports excess properties (TS2353).
// A kind with no model fails: nothing rendered goes unchecked.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PRESETS, TOOLS, fixture, kubeModelFailures, modelPath, render } from './lib.mjs';

const monitoring = ['monitoring.coreos.com/v1'];
const CASES = [
  ...PRESETS.map((preset) => ({ name: preset, opts: { preset, apiVersions: monitoring } })),
  { name: 'everything-on', opts: { preset: 'nvidia-h200', apiVersions: monitoring, set: [
    'networkPolicy.enabled=true', 'networkPolicy.defaultDeny=true', 'monitoring.dashboards.enabled=true',
    'prefill.autoscaling.enabled=true', 'decode.autoscaling.enabled=true', 'decode.autoscaling.kind=hpa',
    'router.autoscaling.enabled=true', 'prefill.hugepages.enabled=true',
    'model.source=download', 'decode.placement.antiAffinity=hard', 'decode.placement.colocateWith.mode=required',
    'decode.hostKvBytes=68719476736', 'decode.kvOffload.enabled=true', 'prefill.hostKvBytes=68719476736',
    'prefill.kvOffload.enabled=true', 'prefill.kvOffload.volume.emptyDir=null',
    'prefill.kvOffload.volume.persistentVolumeClaim.claimName=pd-kv'],
    setJson: ['decode.autoscaling.hpa.metrics=[{"type":"Pods","pods":{"metric":{"name":"pdserve_worker_num_requests_running"},"target":{"type":"AverageValue","averageValue":"64"}}}]',
      'networkPolicy.clients=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"apps"}}}]'] } },
  { name: 'cpu-hostpath', opts: { preset: 'cpu', set: ['model.source=hostPath', 'model.hostPath.path=/srv/models', 'ucx.preset=none'] } },
  // Secret volumes, secretKeyRef env and the ServiceMonitor's bearer credentials.
  { name: 'auth', opts: { preset: 'nvidia-h200', apiVersions: monitoring, values: [fixture('auth.yaml')],
    set: ['networkPolicy.enabled=true', 'model.source=download'] } },
  // TLS: the Secret volumes (all three keys, ca.crt alone in the test pod), the HTTPS readiness
  // probe, the ServiceMonitor's scheme and tlsConfig beside its bearer credentials.
  { name: 'tls', opts: { preset: 'cpu', apiVersions: monitoring, values: [fixture('tls.yaml')], set: ['networkPolicy.enabled=true'] } },
  { name: 'tls-auth', opts: { preset: 'nvidia-h200', apiVersions: monitoring, values: [fixture('auth.yaml'), fixture('tls-worker-name.yaml')],
    set: ['model.source=download'] } },
];

const rendered = CASES.map((c) => ({ ...c, docs: render(c.opts).docs }));

for (const { name, docs } of rendered) {
  test(`kubernetes-models validation: ${name}`, async () => {
    const failures = await kubeModelFailures(docs);
    assert.deepEqual(failures, [], failures.join('\n'));
  });
}

test('strict pass: no unknown fields or nulls (tsc --noEmit --strict)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'pdserve-chart-ts-'));
  try {
    symlinkSync(TOOLS.nodeModules, join(dir, 'node_modules'), 'dir');
    writeFileSync(join(dir, 'package.json'), '{"type":"module","private":true}\n');
    const imports = new Map();
    const lines = [];
    const where = [];  // line number (1-based, after the imports) -> object
    for (const { name, docs } of rendered) {
      for (const o of docs) {
        const mp = modelPath(o);
        assert.ok(mp, `${name}: ${o.kind}/${o.metadata?.name} has no schema model`);
        const alias = `I${o.kind}_${mp.replace(/[^A-Za-z0-9]/g, '_')}`;
        imports.set(alias, `import type { I${o.kind} as ${alias} } from "${mp}";`);
        where.push(`${name}: ${o.kind}/${o.metadata?.name}`);
        lines.push(`export const d${lines.length}: ${alias} = ${JSON.stringify(o)};`);
      }
    }
    const head = [...imports.values()];
    writeFileSync(join(dir, 'rendered.ts'), [...head, ...lines, ''].join('\n'));
    const r = spawnSync(process.execPath, [TOOLS.tsc, '--noEmit', '--strict', '--module', 'nodenext',
      '--moduleResolution', 'nodenext', '--skipLibCheck', '--target', 'es2022', 'rendered.ts'],
    { cwd: dir, encoding: 'utf8' });
    const out = `${r.stdout}${r.stderr}`;
    // rendered.ts(LINE,COL): error TSxxxx: ... -> the object it came from.
    const errors = [...out.matchAll(/rendered\.ts\((\d+),\d+\): (error TS\d+: .*)/g)]
      .map((m) => `${where[Number(m[1]) - head.length - 1] ?? `line ${m[1]}`}: ${m[2]}`);
    assert.equal(r.status, 0, errors.length ? errors.join('\n') : out);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
