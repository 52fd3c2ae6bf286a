// Mode aggregated (values.yaml `mode`, docs/deploy.md "Aggregated mode"): aggregated workers only,
// with Helm 3 and 4 alike. Each preset with values/aggregated.yaml renders one aggregated Deployment
// (pdserve-decode --role=aggregated, the aggregated block's replicas, TP and engine knobs, one GPU of
// the vendor per rank, nothing that moves KV) and no prefill/decode object; the router runs
// --kv-mode=aggregated; lint --strict passes; every object passes kubernetes-models; NetworkPolicy,
// monitors and alerts follow the mode; and every value that only acts on prefill/decode is refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CHART, KUBE_VERSION, byKind, deployment, find, fixture, flag, helm, kubeModelFailures, mainContainer,
  presetFiles, render, renderError } from './lib.mjs';

const AGG = fixture('aggregated.yaml');
const monitoring = ['monitoring.coreos.com/v1'];
const GPU_NAMES = ['nvidia.com/gpu', 'amd.com/gpu'];
// The presets' aggregated blocks (values-<preset>.yaml) and what each must run.
const PRESETS = [
  { preset: 'cpu', device: 'cpu', gpu: undefined, replicas: 1, tp: 1 },
  { preset: 'amd-mi355x', device: 'hip', gpu: 'amd.com/gpu', replicas: 2, tp: 4 },
  { preset: 'nvidia-h200', device: 'cuda', gpu: 'nvidia.com/gpu', replicas: 2, tp: 4 },
];
const KV_FLAGS = ['--kv-port', '--kv-memory', '--kv-compat', '--kv-lease-ms', '--kv-peer-timeout-ms', '--kv-key-file', '--require-rdma'];
const gpuOf = (c, kind, name) => (c.resources?.[kind]?.[name] === undefined ? undefined : String(c.resources[kind][name]));

for (const { preset, device, gpu, replicas, tp } of PRESETS) {
  for (const version of [3, 4]) {
    test(`helm ${version}: ${preset} preset, aggregated: ${replicas} x TP${tp} on ${device}, no prefill/decode`, () => {
      const { docs } = render({ helm: version, preset, values: [AGG],
        set: ['aggregated.maxBatchTokens=4096', 'aggregated.maxRunning=96', 'aggregated.heartbeatMs=500'] });
      const names = docs.map((o) => `${o.kind}/${o.metadata.name}`);
      assert.deepEqual(names.filter((n) => /-(prefill|decode)$/.test(n)), [], 'no prefill/decode object');
      const dep = deployment(docs, 'aggregated');
      const c = mainContainer(dep);
      assert.equal(dep.spec.replicas, replicas);
      assert.deepEqual(c.command, ['/opt/pdserve/bin/pdserve-decode']);
      assert.equal(c.name, 'aggregated');
      assert.equal(flag(c, '--role'), 'aggregated');
      assert.equal(flag(c, '--tp'), String(tp));
      assert.equal(flag(c, '--device'), device);
      assert.equal(flag(c, '--weight-dtype'), device === 'cpu' ? undefined : 'bf16');
      assert.equal(flag(c, '--max-batch-tokens'), '4096');
      assert.equal(flag(c, '--max-running'), '96');
      assert.equal(flag(c, '--heartbeat-ms'), '500');
      assert.equal(flag(c, '--router'), 'pd-pdserve-router-registry.pdserve.svc.cluster.local:50051');
      // An aggregated worker refuses --kv-port / --kv-key-file / --require-rdma: none of the KV side.
      for (const f of KV_FLAGS) assert.equal(flag(c, f), undefined, f);
      assert.deepEqual(c.ports.map((p) => p.name), ['grpc', 'probe']);
      assert.equal((c.env ?? []).some((e) => e.name === 'PDSERVE_KV_COMPAT'), false);
      assert.equal(dep.spec.template.metadata.labels['pdserve.io/kv-compat'], undefined);
      assert.equal(dep.spec.template.metadata.labels['pdserve.io/role'], 'aggregated');
      assert.deepEqual(c.securityContext.capabilities.add, undefined, 'no IPC_LOCK');
      for (const kind of ['requests', 'limits']) {
        for (const name of GPU_NAMES) assert.equal(gpuOf(c, kind, name), name === gpu ? String(tp) : undefined, `${kind} ${name}`);
        assert.equal(Object.keys(c.resources[kind]).some((k) => k.startsWith('rdma/')), false, `${kind} rdma`);
      }
      const svc = find(docs, 'Service', 'pd-pdserve-aggregated');
      assert.deepEqual(svc.spec.ports.map((p) => p.name), ['grpc', 'probe']);
      find(docs, 'PodDisruptionBudget', 'pd-pdserve-aggregated');
      const router = mainContainer(deployment(docs, 'router'));
      assert.equal(flag(router, '--kv-mode'), 'aggregated');
      // Only the aggregated workers request GPUs.
      const requesting = byKind(docs, 'Deployment').filter((d) => d.spec.template.spec.containers.some(
        (k) => GPU_NAMES.some((g) => gpuOf(k, 'limits', g) !== undefined || gpuOf(k, 'requests', g) !== undefined)));
      assert.deepEqual(requesting.map((d) => d.metadata.name), gpu ? ['pd-pdserve-aggregated'] : []);
    });
    test(`helm ${version} lint --strict ${preset} preset, aggregated`, () => {
      const r = helm(version, ['lint', '--strict', CHART, '--kube-version', KUBE_VERSION,
        ...[...presetFiles(preset), AGG].flatMap((f) => ['-f', f])]);
      assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
    });
  }
  test(`${preset} preset, aggregated: Helm 3 and 4 render the same`, () => {
    const opts = { preset, values: [AGG], apiVersions: monitoring, set: ['networkPolicy.enabled=true'] };
    assert.equal(render({ ...opts, helm: 3 }).text, render({ ...opts, helm: 4 }).text);
  });
}

test('aggregated from the chart defaults alone: mode and the two removed blocks', () => {
  const { docs } = render({ set: ['mode=aggregated', 'prefill=null', 'decode=null'] });
  const c = mainContainer(deployment(docs, 'aggregated'));
  assert.equal(deployment(docs, 'aggregated').spec.replicas, 1);
  assert.equal(c.resources.limits['nvidia.com/gpu'], '1');
  assert.equal(flag(mainContainer(deployment(docs, 'router')), '--kv-mode'), 'aggregated');
});

test('aggregated: engine.decodeGraphs passes --decode-graphs at TP 1 and is refused above', () => {
  const c = mainContainer(deployment(render({ values: [AGG], set: ['engine.decodeGraphs=true'] }).docs, 'aggregated'));
  assert.equal(flag(c, '--decode-graphs'), true);
  const stderr = renderError({ values: [AGG], set: ['engine.decodeGraphs=true', 'aggregated.tensorParallel=2'] });
  assert.match(stderr, /engine\.decodeGraphs records decode steps at tensor parallelism 1 only: aggregated\.tensorParallel is 2/);
});

test('aggregated: GPU request = tensorParallel, for every TP and vendor', () => {
  for (const [vendor, device, gpu] of [['nvidia', 'cuda', 'nvidia.com/gpu'], ['amd', 'hip', 'amd.com/gpu']]) {
    for (const tp of [1, 2, 4, 8]) {
      const c = mainContainer(deployment(render({ values: [AGG],
        set: [`accelerator.vendor=${vendor}`, `accelerator.device=${device}`, `aggregated.tensorParallel=${tp}`] }).docs, 'aggregated'));
      for (const kind of ['requests', 'limits']) {
        for (const name of GPU_NAMES) assert.equal(gpuOf(c, kind, name), name === gpu ? String(tp) : undefined, `${vendor} TP${tp} ${kind} ${name}`);
      }
      assert.equal(flag(c, '--tp'), String(tp));
    }
  }
});

// Every optional object of the mode: NetworkPolicy with default-deny, monitors and rules, the
// dashboard, KEDA (then HPA) autoscaling, hugepages, a downloaded model, auth and TLS.
const EVERYTHING = { preset: 'nvidia-h200', values: [AGG, fixture('tls.yaml')], apiVersions: monitoring, set: [
  'networkPolicy.enabled=true', 'networkPolicy.defaultDeny=true', 'monitoring.dashboards.enabled=true',
  'aggregated.autoscaling.enabled=true', 'router.autoscaling.enabled=true', 'aggregated.hugepages.enabled=true',
  'model.source=download', 'auth.apiKeys.existingSecret=pd-keys', 'auth.clusterToken.existingSecret=pd-token'] };

test('kubernetes-models validation: every preset aggregated, and with every optional object on', async () => {
  const renders = [...PRESETS.map(({ preset }) => ({ preset, values: [AGG], apiVersions: monitoring })), EVERYTHING,
    { ...EVERYTHING, set: [...EVERYTHING.set, 'aggregated.autoscaling.kind=hpa'],
      setJson: ['aggregated.autoscaling.hpa.metrics=[{"type":"Pods","pods":{"metric":{"name":"pdserve_worker_num_requests_running"},"target":{"type":"AverageValue","averageValue":"64"}}}]'] }];
  for (const opts of renders) {
    const failures = await kubeModelFailures(render(opts).docs);
    assert.deepEqual(failures, [], `${JSON.stringify(opts.set ?? opts.preset)}:\n${failures.join('\n')}`);
  }
});

test('aggregated: the host and filesystem tiers (hostKvBytes, kvOffload) reach the aggregated workers', () => {
  const c = mainContainer(deployment(render({ values: [AGG], set: ['aggregated.hostKvBytes=67108864',
    'aggregated.kvOffload.enabled=true', 'aggregated.kvOffload.maxBytes=1000000000',
    'aggregated.kvOffload.loadTimeoutMs=250'] }).docs, 'aggregated'));
  assert.equal(flag(c, '--host-kv-bytes'), '67108864');
  assert.equal(flag(c, '--kv-offload-dir'), '/var/cache/pdserve-kv');
  assert.equal(flag(c, '--kv-offload-dir-bytes'), '1000000000');
  assert.equal(flag(c, '--kv-load-timeout-ms'), '250');
  assert.ok(c.volumeMounts.some((m) => m.name === 'kv-offload' && m.mountPath === '/var/cache/pdserve-kv'));
});

test('aggregated: KEDA scales on the aggregated workers\' running sequences; replicas left to it', () => {
  const { docs } = render(EVERYTHING);
  assert.equal(deployment(docs, 'aggregated').spec.replicas, undefined);
  const so = find(docs, 'ScaledObject', 'pd-pdserve-aggregated');
  assert.match(so.spec.triggers[0].metadata.query, /^sum\(pdserve:worker_num_requests_running\{.*app_kubernetes_io_component="aggregated"\}\)$/);
});

test('aggregated NetworkPolicy: the router and the aggregated workers reach each other over grpc; no worker-to-worker rule', () => {
  const { docs } = render(EVERYTHING);
  const policies = byKind(docs, 'NetworkPolicy').map((p) => p.metadata.name).sort();
  assert.deepEqual(policies, ['pd-pdserve-aggregated', 'pd-pdserve-default-deny', 'pd-pdserve-router', 'pd-pdserve-test']);
  const router = find(docs, 'NetworkPolicy', 'pd-pdserve-router');
  const component = (peer) => peer.podSelector?.matchLabels?.['app.kubernetes.io/component'];
  const registering = router.spec.ingress.find((r) => r.ports.length === 1 && r.ports[0].port === 'grpc' && r.from);
  assert.deepEqual(registering.from.map(component), ['aggregated']);
  assert.deepEqual(router.spec.egress.filter((r) => r.to && component(r.to[0])).map((r) => [component(r.to[0]), r.ports[0].port]),
                   [['aggregated', 50060]]);
  const worker = find(docs, 'NetworkPolicy', 'pd-pdserve-aggregated');
  const peers = [...worker.spec.ingress.flatMap((r) => r.from ?? []), ...worker.spec.egress.flatMap((r) => r.to ?? [])]
    .map(component).filter((x) => x);
  assert.deepEqual([...new Set(peers)], ['router']);
});

test('aggregated monitoring: the PodMonitor scrapes the aggregated workers; no KV, RDMA or P:D ratio alert', () => {
  const { docs } = render({ preset: 'nvidia-h200', values: [AGG], apiVersions: monitoring });
  const pm = byKind(docs, 'PodMonitor')[0];
  assert.deepEqual(pm.spec.selector.matchExpressions, [{ key: 'app.kubernetes.io/component', operator: 'In', values: ['aggregated'] }]);
  const alerts = byKind(docs, 'PrometheusRule')[0].spec.groups.flatMap((g) => g.rules.map((r) => r.alert));
  assert.deepEqual(alerts, ['PdserveTtftSloBreach', 'PdserveTpotSloBreach', 'PdserveKvCacheNearlyFull']);
  const text = JSON.stringify(byKind(docs, 'PrometheusRule'));
  assert.ok(!/scale (prefill|decode)/.test(text), 'an alert still tells to scale prefill or decode');
});

test('aggregated NOTES.txt: the aggregated topology, kv-mode aggregated, no P:D line (helm 4 install --dry-run=client)', () => {
  const r = helm(4, ['install', 'pd', CHART, '--namespace', 'pdserve', '--dry-run=client',
    '-f', `${CHART}/values-amd-mi355x.yaml`, '-f', AGG]);
  assert.equal(r.status, 0, r.stderr);
  const notes = r.stdout.slice(r.stdout.indexOf('NOTES:'));
  for (const want of ['Topology (kv-mode aggregated, device hip,', 'aggregated 2 x TP4  (4 amd.com/gpu per pod)',
    'No prefill/decode split: each aggregated worker prefills and decodes its own requests, 8 GPUs in all',
    'KV transfer: none (mode aggregated)', '3600 s (aggregated) loading'])
    assert.ok(notes.includes(want), `NOTES lack ${JSON.stringify(want)}:\n${notes}`);
  for (const unwanted of ['P:D =', 'prefill ', 'KV-compatibility', 'pdserve.io/kv-compat'])
    assert.ok(!notes.includes(unwanted), `NOTES still say ${JSON.stringify(unwanted)}:\n${notes}`);
});

// Refused: values that only act on prefill/decode, and blocks the mode needs or does not know.
const REFUSALS = [
  // _validate.tpl (matched exactly)
  { name: 'prefill block left in', opts: { set: ['mode=aggregated', 'decode=null'] },
    want: ['prefill is set but mode is aggregated, which runs no prefill workers: remove the block (prefill: null in a values file, --set prefill=null)'] },
  { name: 'a preset\'s prefill replicas', opts: { preset: 'nvidia-h200', set: ['mode=aggregated', 'decode=null', 'ratio=null',
    'rdma.enabled=false', 'rdma.required=false', 'ucx.preset=none', 'prefill.replicas=3'] },
    want: ['prefill is set but mode is aggregated'] },
  { name: 'decode block left in', opts: { set: ['mode=aggregated', 'prefill=null'] },
    want: ['decode is set but mode is aggregated, which runs no decode workers'] },
  { name: 'P:D ratio bound', opts: { set: ['mode=aggregated', 'prefill=null', 'decode=null', 'ratio.prefillPerDecodeMax=2'] },
    want: ['ratio.prefillPerDecodeMax is set but mode is aggregated: there is no prefill:decode ratio to bound'] },
  { name: 'a preset\'s ratio bounds left in', opts: { preset: 'amd-mi355x', set: ['mode=aggregated', 'prefill=null', 'decode=null',
    'rdma.enabled=false', 'rdma.required=false', 'ucx.preset=none'] },
    want: ['ratio.prefillPerDecodeMin is set but mode is aggregated', 'ratio.prefillPerDecodeMax is set but mode is aggregated'] },
  { name: 'pull kv mode', opts: { values: [AGG], set: ['router.kvMode=pull'] },
    want: ['router.kvMode pull says how decode fetches KV from prefill, but mode aggregated moves no KV'] },
  { name: 'pull-host kv mode', opts: { values: [AGG], set: ['router.kvMode=pull-host'] },
    want: ['router.kvMode pull-host says how decode fetches KV from prefill, but mode aggregated moves no KV'] },
  { name: 'decode-local prefill', opts: { values: [AGG], set: ['router.localPrefillTokens=64'] },
    want: ['router.localPrefillTokens chooses between a decode and a prefill worker, but mode aggregated runs neither'] },
  { name: 'RDMA', opts: { values: [AGG], set: ['rdma.enabled=true', 'ucx.preset=ib'] },
    want: ['rdma.enabled / rdma.required are set but mode is aggregated', 'ucx.preset (ib), ucx.netDevices or ucx.env is set but mode is aggregated'] },
  { name: 'UCX over TCP (the CPU preset\'s)', opts: { preset: 'cpu', values: [AGG], set: ['ucx.preset=tcp'] },
    want: ['ucx.preset (tcp), ucx.netDevices or ucx.env is set but mode is aggregated'] },
  { name: 'UCX variables', opts: { values: [AGG], set: ['ucx.env.UCX_LOG_LEVEL=info'] },
    want: ['ucx.preset (none), ucx.netDevices or ucx.env is set but mode is aggregated'] },
  { name: 'kvtransfer key', opts: { values: [AGG], set: ['auth.kvKey.existingSecret=pd-kv-key'] },
    want: ['auth.kvKey.existingSecret "pd-kv-key" is set but mode is aggregated'] },
  { name: 'aggregated TP 3', opts: { values: [AGG], set: ['aggregated.tensorParallel=3'] },
    want: ['aggregated.tensorParallel must be 1, 2, 4 or 8 (got 3)'] },
  { name: 'aggregated GPU set by hand', opts: { values: [AGG], set: ['aggregated.resources.limits.nvidia\\.com/gpu=2'] },
    want: ['aggregated.resources.limits must not set nvidia.com/gpu: the chart requests aggregated.tensorParallel GPUs'] },
  { name: 'aggregated ports overlap', opts: { values: [AGG], set: ['aggregated.ports.probe=50060'] },
    want: ['aggregated.ports: grpc and probe must not overlap'] },
  { name: 'aggregated tGPS below the drain', opts: { values: [AGG], set: ['aggregated.terminationGracePeriodSeconds=30'] },
    want: ['aggregated.terminationGracePeriodSeconds (30) is lower than aggregated.drain.preStopSeconds + drainTimeoutSeconds + marginSeconds (10 + 60 + 15 = 85)'] },
  // values.schema.json (Helm 3 and 4 word these differently: the key's parts only)
  { name: 'unknown mode', opts: { set: ['mode=split'] }, want: [/mode/, /disaggregated/] },
  { name: 'aggregated kv port', opts: { values: [AGG], set: ['aggregated.ports.kv=50070'] }, want: [/ports/, /kv/] },
  { name: 'aggregated KV lease', opts: { values: [AGG], set: ['aggregated.kvLeaseMs=100'] }, want: [/aggregated/, /kvLeaseMs/] },
  { name: 'aggregated co-location', opts: { values: [AGG], set: ['aggregated.placement.colocateWith.role=decode'] },
    want: [/placement/, /colocateWith/] },
  { name: 'mode aggregated without the aggregated block', opts: { values: [AGG], set: ['aggregated=null'] }, want: [/aggregated/] },
  { name: 'mode disaggregated without the prefill block', opts: { set: ['prefill=null'] }, want: [/prefill/] },
];
for (const version of [3, 4]) {
  for (const c of REFUSALS) {
    test(`helm ${version} refuses, aggregated: ${c.name}`, () => {
      const err = renderError({ ...c.opts, helm: version });
      for (const w of c.want) {
        if (typeof w === 'string') assert.ok(err.includes(w), `expected ${JSON.stringify(w)} in:\n${err}`);
        else assert.match(err, w);
      }
    });
  }
}
