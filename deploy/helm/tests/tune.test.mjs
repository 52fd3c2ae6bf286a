// The values.yaml `pdserve tune` writes (tune/deploy_values.h), rendered by the chart: for each
// plan the emitter (tests/tune/deploy_values_emit.cc) writes, layered over its preset, helm lint
// --strict and helm template pass with Helm 3 and 4, the objects pass kubernetes-models'
// validation, and helm template's Deployments and router (Helm 3 and 4) run exactly the planned topology: replicas, TP,
// the device's GPU resource (and no other vendor's), kv mode, admission limits, engine knobs. The
// aggregated plans ("do not disaggregate") render the chart's mode aggregated: aggregated workers
// only, the router in kv mode aggregated.
// The emitter is PDSERVE_TUNE_VALUES_EMIT (ctest sets it), else the one in <repo>/build.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CHART, KUBE_VERSION, byKind, deployment, flag, helm, kubeModelFailures, mainContainer, presetFiles, render }
  from './lib.mjs';

const emitter = process.env.PDSERVE_TUNE_VALUES_EMIT
  ?? resolve(CHART, '../../../build/tests/tune/tune_deploy_values_emit');
if (!existsSync(emitter)) {
  throw new Error(`no ${emitter}: build tune_deploy_values_emit (ninja -C build tune_deploy_values_emit) ` +
                  'or point PDSERVE_TUNE_VALUES_EMIT at it');
}
const out = mkdtempSync(join(tmpdir(), 'pdserve-tune-values-'));
execFileSync(emitter, [out]);
const CASES = readdirSync(out).filter((f) => f.endsWith('.plan.json')).sort().map((f) => {
  const name = f.slice(0, -'.plan.json'.length);
  return { name, plan: JSON.parse(readFileSync(join(out, f), 'utf8')), values: join(out, `${name}.values.yaml`) };
});
const GPU = { cuda: 'nvidia.com/gpu', hip: 'amd.com/gpu', cpu: undefined, emulated: undefined };
const ALL_GPUS = ['nvidia.com/gpu', 'amd.com/gpu'];

const ROLES = ['prefill', 'decode', 'aggregated'];
const planned = (plan) => Object.keys(plan.workers).sort().join('+');

test('the emitter wrote a P/D plan and an aggregated one for every GPU vendor and for CPU', () => {
  assert.deepEqual(CASES.map((c) => `${c.plan.device} ${planned(c.plan)}`).sort(),
                   ['cpu aggregated', 'cpu decode+prefill', 'cuda aggregated', 'cuda decode+prefill', 'hip aggregated', 'hip decode+prefill']);
});

for (const { name, plan, values } of CASES) {
  const files = [...presetFiles(plan.preset), values];
  for (const version of [3, 4]) {
    test(`${name}: helm ${version} lint --strict over values-${plan.preset}.yaml`, () => {
      const r = helm(version, ['lint', '--strict', CHART, '--kube-version', KUBE_VERSION, ...files.flatMap((f) => ['-f', f])]);
      assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
    });
  }

  test(`${name}: the rendered objects pass kubernetes-models validation`, async () => {
    const { docs } = render({ preset: plan.preset, values: [values] });
    const failures = await kubeModelFailures(docs);
    assert.deepEqual(failures, [], failures.join('\n'));
  });

  // helm lint only logs the chart's cross-field checks (_validate.tpl's fail): helm template runs them.
  for (const version of [3, 4]) test(`${name}: helm ${version} template runs the planned topology`, () => {
    const { docs } = render({ helm: version, preset: plan.preset, values: [values] });
    const gpu = GPU[plan.device];
    for (const role of ROLES.filter((r) => !(r in plan.workers))) {
      assert.equal(byKind(docs, 'Deployment').some((d) => d.metadata.name === `pd-pdserve-${role}`), false, `a ${role} Deployment`);
    }
    for (const [role, want] of Object.entries(plan.workers)) {
      const dep = deployment(docs, role);
      const c = mainContainer(dep);
      assert.equal(dep.spec.replicas, want.replicas, `${role} replicas`);
      assert.equal(flag(c, '--tp'), String(want.tp), `${role} --tp`);
      assert.equal(flag(c, '--device'), plan.device, `${role} --device`);
      assert.equal(flag(c, '--model'), plan.model, `${role} --model`);
      assert.equal(flag(c, '--weight-dtype'), plan.device === 'cpu' ? undefined : plan.weightDtype, `${role} --weight-dtype`);
      assert.equal(flag(c, '--kv-dtype'), plan.kvDtype === 'f32' ? undefined : plan.kvDtype, `${role} --kv-dtype`);
      assert.equal(flag(c, '--gemm-precision'), plan.gemmPrecision === 'exact' ? undefined : plan.gemmPrecision,
                   `${role} --gemm-precision`);
      assert.equal(flag(c, '--max-batch-tokens'), want.maxBatchTokens === null ? undefined : String(want.maxBatchTokens),
                   `${role} --max-batch-tokens`);
      assert.equal(flag(c, '--max-running'), want.maxRunning === null ? undefined : String(want.maxRunning), `${role} --max-running`);
      assert.equal(flag(c, '--role'), role === 'prefill' ? undefined : role, `${role} --role`);
      for (const kind of ['requests', 'limits']) {
        const res = c.resources?.[kind] ?? {};
        for (const name of ALL_GPUS) {
          const expected = name === gpu ? String(want.tp) : undefined;
          assert.equal(res[name] === undefined ? undefined : String(res[name]), expected, `${role} ${kind} ${name}`);
        }
      }
    }
    const router = mainContainer(deployment(docs, 'router'));
    assert.equal(flag(router, '--kv-mode'), plan.kvMode);
    // The sizing assumes every P/D prompt prefills on a prefill worker.
    assert.equal(flag(router, '--local-prefill-tokens'), plan.kvMode === 'aggregated' ? undefined : '0');
    assert.equal(flag(router, '--max-running'), String(plan.router.maxRunning));
    assert.equal(flag(router, '--max-waiting'), plan.router.maxWaiting === null ? undefined : String(plan.router.maxWaiting));
    // No GPU of any vendor anywhere but the workers' own.
    const requesting = byKind(docs, 'Deployment').filter((d) => d.spec.template.spec.containers.some(
      (c) => ALL_GPUS.some((g) => c.resources?.limits?.[g] !== undefined || c.resources?.requests?.[g] !== undefined)));
    assert.deepEqual(requesting.map((d) => d.metadata.name).sort(),
                     gpu ? Object.keys(plan.workers).sort().map((r) => `pd-pdserve-${r}`) : []);
  });
}
