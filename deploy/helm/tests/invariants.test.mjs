// Invariants over `helm template --set ...` (Helm 4; golden.test.mjs shows Helm 3 renders the same).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  CHART, PRESETS, YAML, allContainers, args, byKind, deployment, envValue, find, fixture, flag, helm, mainContainer, podSpecs, render, selects,
} from './lib.mjs';

const ROLES = ['prefill', 'decode'];
const GPU_NAMES = ['nvidia.com/gpu', 'amd.com/gpu'];
const monitoring = ['monitoring.coreos.com/v1'];
const presets = Object.fromEntries(PRESETS.map((p) => [p, render({ preset: p, apiVersions: monitoring }).docs]));
const everythingOn = render({
  preset: 'nvidia-h200', apiVersions: monitoring,
  set: ['networkPolicy.enabled=true', 'networkPolicy.defaultDeny=true', 'monitoring.dashboards.enabled=true',
    'prefill.autoscaling.enabled=true', 'router.autoscaling.enabled=true', 'prefill.hugepages.enabled=true',
    'model.source=download'],
}).docs;
// Both auth Secrets, /metrics behind a key and every optional router flag (values/auth.yaml).
const authOn = render({ preset: 'cpu', apiVersions: monitoring, values: [fixture('auth.yaml')] }).docs;
// TLS from a cert-manager style Secret, with the cluster token (values/tls.yaml); and with an explicit
// worker name on top of values/auth.yaml, NetworkPolicy on (values/tls-worker-name.yaml).
const tlsOn = render({ preset: 'cpu', apiVersions: monitoring, values: [fixture('tls.yaml')] }).docs;
const tlsAuth = render({ preset: 'nvidia-h200', apiVersions: monitoring, values: [fixture('auth.yaml'), fixture('tls-worker-name.yaml')],
  set: ['networkPolicy.enabled=true'] }).docs;
const tlsRenders = { tls: tlsOn, 'tls-auth': tlsAuth };
const all = { ...presets, 'everything-on': everythingOn, auth: authOn, ...tlsRenders };
const tlsEnabled = (name) => name in tlsRenders;

const resourcesOf = (docs, role) => mainContainer(deployment(docs, role)).resources;
const caps = (c) => c.securityContext?.capabilities?.add ?? [];

test('GPU request = tensorParallel, for every TP and vendor', () => {
  for (const [vendor, device, gpu] of [['nvidia', 'cuda', 'nvidia.com/gpu'], ['amd', 'hip', 'amd.com/gpu']]) {
    for (const tp of [1, 2, 4, 8]) {
      const docs = render({ set: [`accelerator.vendor=${vendor}`, `accelerator.device=${device}`,
        `prefill.tensorParallel=${tp}`, `decode.tensorParallel=${8 / tp}`] }).docs;
      for (const [role, want] of [['prefill', tp], ['decode', 8 / tp]]) {
        const c = mainContainer(deployment(docs, role));
        assert.equal(c.resources.requests[gpu], String(want), `${vendor} ${role} requests`);
        assert.equal(c.resources.limits[gpu], String(want), `${vendor} ${role} limits`);
        assert.equal(flag(c, '--tp'), String(want), `${role} --tp`);
        for (const other of GPU_NAMES.filter((n) => n !== gpu)) assert.ok(!(other in c.resources.limits), `${role} also requests ${other}`);
        // One kvtransfer control port per rank.
        assert.equal(c.ports.filter((p) => p.name.startsWith('kv-')).length, want);
      }
      assert.equal(JSON.stringify(mainContainer(deployment(docs, 'router')).resources).includes('gpu'), false, 'the router requests no GPU');
    }
  }
});

test('IPC_LOCK and the RDMA resource if and only if rdma.enabled', () => {
  for (const enabled of [false, true]) {
    const set = [`rdma.enabled=${enabled}`, `ucx.preset=${enabled ? 'roce' : 'tcp'}`, 'rdma.resourceName=rdma/roce_a', 'rdma.perGpu=2',
      'prefill.tensorParallel=2', 'decode.tensorParallel=4'];
    const docs = render({ set }).docs;
    for (const [role, tp] of [['prefill', 2], ['decode', 4]]) {
      const c = mainContainer(deployment(docs, role));
      assert.deepEqual(caps(c), enabled ? ['IPC_LOCK'] : [], `${role} capabilities with rdma.enabled=${enabled}`);
      assert.equal(c.resources.requests['rdma/roce_a'], enabled ? String(2 * tp) : undefined, `${role} rdma request`);
      assert.equal(c.resources.limits['rdma/roce_a'], enabled ? String(2 * tp) : undefined, `${role} rdma limit`);
    }
    for (const { owner, spec } of podSpecs(docs)) {
      for (const c of allContainers(spec)) {
        const worker = owner.endsWith('-prefill') || owner.endsWith('-decode');
        if (!worker || c.name === 'fetch-model') assert.deepEqual(caps(c), [], `${owner} ${c.name} adds capabilities`);
      }
    }
  }
  // Presets: RDMA on for the GPU presets, off for cpu/default.
  for (const [name, docs] of Object.entries(presets)) {
    const want = name === 'nvidia-h200' || name === 'amd-mi355x';
    for (const role of ROLES) assert.equal(caps(mainContainer(deployment(docs, role))).includes('IPC_LOCK'), want, `${name} ${role}`);
  }
});

test('no privileged containers or host namespaces; hardened security contexts everywhere', () => {
  for (const [name, docs] of Object.entries(all)) {
    for (const { owner, spec } of podSpecs(docs)) {
      for (const k of ['hostIPC', 'hostPID', 'hostNetwork']) assert.notEqual(spec[k], true, `${name} ${owner} ${k}`);
      assert.equal(spec.securityContext.runAsNonRoot, true, `${name} ${owner} runAsNonRoot`);
      assert.equal(spec.securityContext.runAsUser, 10001, `${name} ${owner} runAsUser`);
      assert.equal(spec.securityContext.seccompProfile.type, 'RuntimeDefault', `${name} ${owner} seccomp`);
      assert.equal(spec.automountServiceAccountToken, false, `${name} ${owner} token`);
      assert.ok(!(spec.volumes ?? []).some((v) => v.hostPath), `${name} ${owner} hostPath volume`);
      for (const c of allContainers(spec)) {
        const sc = c.securityContext;
        const what = `${name} ${owner} ${c.name}`;
        assert.notEqual(sc.privileged, true, `${what} privileged`);
        assert.equal(sc.allowPrivilegeEscalation, false, `${what} allowPrivilegeEscalation`);
        assert.equal(sc.readOnlyRootFilesystem, true, `${what} readOnlyRootFilesystem`);
        assert.deepEqual(sc.capabilities.drop, ['ALL'], `${what} drop ALL`);
        for (const cap of caps(c)) assert.equal(cap, 'IPC_LOCK', `${what} adds ${cap}`);
        // A read-only root needs a writable /tmp.
        if (!owner.startsWith('Pod/')) assert.ok(c.volumeMounts.some((m) => m.mountPath === '/tmp'), `${what} has no /tmp`);
      }
    }
  }
});

test('startupProbe.failureThreshold = ceil(startupMaxSeconds / periodSeconds)', () => {
  for (const [max, period] of [[3600, 10], [1000, 7], [60, 60], [61, 60], [5, 10]]) {
    if (max < period) continue;  // rejected by validation (negative tests)
    const docs = render({ set: [`prefill.probes.startupMaxSeconds=${max}`, `prefill.probes.periodSeconds=${period}`,
      `router.probes.startupMaxSeconds=${max}`, `router.probes.periodSeconds=${period}`] }).docs;
    for (const component of ['prefill', 'router']) {
      const p = mainContainer(deployment(docs, component)).startupProbe;
      assert.equal(p.failureThreshold, Math.ceil(max / period), `${component} ${max}/${period}`);
      assert.equal(p.periodSeconds, period);
      assert.ok(p.failureThreshold * p.periodSeconds >= max);
    }
  }
  for (const [name, docs] of Object.entries(presets)) {
    for (const role of ROLES) {
      const p = mainContainer(deployment(docs, role)).startupProbe;
      assert.equal(p.httpGet.path, '/startupz', `${name} ${role}`);
    }
  }
});

test('workers probe /livez /startupz /readyz on the probe port; router liveness is tcpSocket, readiness gRPC health (HTTPS /health with TLS)', () => {
  for (const [name, docs] of Object.entries(all)) {
    for (const role of ROLES) {
      const c = mainContainer(deployment(docs, role));
      const probePort = c.ports.find((p) => p.name === 'probe').containerPort;
      assert.equal(flag(c, '--probe-port'), String(probePort));
      // The probe port stays plain HTTP with TLS (the worker's TLS is on its gRPC port only).
      assert.deepEqual([c.livenessProbe.httpGet, c.startupProbe.httpGet, c.readinessProbe.httpGet].map((g) => [g.path, g.port, g.scheme]),
        [['/livez', 'probe', undefined], ['/startupz', 'probe', undefined], ['/readyz', 'probe', undefined]], `${name} ${role}`);
    }
    const r = mainContainer(deployment(docs, 'router'));
    const grpcPort = r.ports.find((p) => p.name === 'grpc').containerPort;
    for (const p of [r.livenessProbe, r.startupProbe]) {
      // A TCP connect works whether or not the port serves TLS.
      assert.deepEqual(p.tcpSocket, { port: 'grpc' }, `${name} router liveness/startup must not depend on workers`);
      assert.equal(p.grpc, undefined);
      assert.equal(p.httpGet, undefined);
    }
    if (tlsEnabled(name)) {
      // The kubelet's gRPC probe cannot speak TLS; /health follows the gRPC health rule.
      assert.equal(r.readinessProbe.grpc, undefined, `${name}: a gRPC probe against a TLS port always fails`);
      assert.deepEqual(r.readinessProbe.httpGet, { path: '/health', port: 'http', scheme: 'HTTPS' }, `${name} router readiness`);
    } else {
      assert.deepEqual(r.readinessProbe.grpc, { port: grpcPort, service: '' }, `${name} router readiness`);
      assert.equal(r.readinessProbe.httpGet, undefined, name);
    }
  }
});

test('terminationGracePeriodSeconds = preStop + drain + margin, with a sleep preStop and --drain-timeout-s', () => {
  for (const [name, docs] of Object.entries(all)) {
    for (const role of ROLES) {
      const d = deployment(docs, role);
      const c = mainContainer(d);
      const preStop = c.lifecycle.preStop;
      assert.deepEqual(Object.keys(preStop), ['sleep'], `${name} ${role}: the image has no shell, so preStop must be the sleep handler`);
      const drain = Number(flag(c, '--drain-timeout-s'));
      assert.ok(d.spec.template.spec.terminationGracePeriodSeconds >= preStop.sleep.seconds + drain, `${name} ${role} tGPS`);
    }
    const r = deployment(docs, 'router');
    const rc = mainContainer(r);
    assert.ok(r.spec.template.spec.terminationGracePeriodSeconds >=
              rc.lifecycle.preStop.sleep.seconds + Number(flag(rc, '--drain-timeout-s')), `${name} router tGPS`);
  }
  const docs = render({ set: ['decode.drain.preStopSeconds=20', 'decode.drain.drainTimeoutSeconds=100', 'decode.drain.marginSeconds=7'] }).docs;
  assert.equal(deployment(docs, 'decode').spec.template.spec.terminationGracePeriodSeconds, 127);
  assert.equal(flag(mainContainer(deployment(docs, 'decode')), '--drain-timeout-s'), '100');
  const explicit = render({ set: ['decode.terminationGracePeriodSeconds=600'] }).docs;
  assert.equal(deployment(explicit, 'decode').spec.template.spec.terminationGracePeriodSeconds, 600);
  const noPreStop = render({ set: ['prefill.drain.preStopSeconds=0'] }).docs;
  assert.equal(mainContainer(deployment(noPreStop, 'prefill')).lifecycle, undefined, 'preStop 0: no lifecycle (0 s sleep needs 1.32)');
});

test('Service, PDB, NetworkPolicy and monitor selectors match the pods they are meant for', () => {
  for (const [name, docs] of Object.entries(all)) {
    const pods = podSpecs(docs).filter((p) => p.owner.startsWith('Deployment/'));
    const component = (labels) => labels['app.kubernetes.io/component'];
    const matching = (sel) => pods.filter((p) => selects(sel, p.labels)).map((p) => component(p.labels)).sort();
    for (const d of byKind(docs, 'Deployment')) {
      assert.ok(selects(d.spec.selector, d.spec.template.metadata.labels), `${name} ${d.metadata.name} selector`);
    }
    for (const s of byKind(docs, 'Service')) {
      const want = s.metadata.labels['app.kubernetes.io/component'];
      assert.deepEqual(matching({ matchLabels: s.spec.selector }), [want], `${name} Service/${s.metadata.name}`);
      // Each targetPort names a port of the selected containers.
      const c = mainContainer(deployment(docs, want));
      for (const p of s.spec.ports) assert.ok(c.ports.some((cp) => cp.name === p.targetPort), `${name} ${s.metadata.name} ${p.targetPort}`);
    }
    for (const p of byKind(docs, 'PodDisruptionBudget')) {
      assert.deepEqual(matching(p.spec.selector), [p.metadata.labels['app.kubernetes.io/component']], `${name} PDB/${p.metadata.name}`);
    }
    for (const np of byKind(docs, 'NetworkPolicy')) {
      if (np.metadata.name.endsWith('-default-deny')) { assert.deepEqual(np.spec.podSelector, {}); continue; }
      const want = np.metadata.labels['app.kubernetes.io/component'];
      if (want === 'test') {
        assert.ok(selects(np.spec.podSelector, find(docs, 'Pod', 'pd-pdserve-test').metadata.labels));
        continue;
      }
      assert.deepEqual(matching(np.spec.podSelector), [want], `${name} NetworkPolicy/${np.metadata.name}`);
      for (const rule of [...(np.spec.ingress ?? []).flatMap((r) => r.from ?? []), ...(np.spec.egress ?? []).flatMap((r) => r.to ?? [])]) {
        if (rule.podSelector && !rule.namespaceSelector && rule.podSelector.matchLabels?.['app.kubernetes.io/instance']) {
          const c = rule.podSelector.matchLabels['app.kubernetes.io/component'];
          if (c !== 'test') assert.deepEqual(matching(rule.podSelector), [c], `${name} ${np.metadata.name} peer ${c}`);
        }
      }
    }
    for (const pm of byKind(docs, 'PodMonitor')) assert.deepEqual(matching(pm.spec.selector), ['decode', 'prefill'], `${name} PodMonitor`);
    for (const sm of byKind(docs, 'ServiceMonitor')) {
      const svcs = byKind(docs, 'Service').filter((s) => selects(sm.spec.selector, s.metadata.labels));
      assert.ok(svcs.length >= 1, `${name} ServiceMonitor selects no Service`);
      for (const s of svcs) for (const e of sm.spec.endpoints) assert.ok(s.spec.ports.some((p) => p.name === e.port) || s.spec.clusterIP === 'None', `${name} ServiceMonitor port ${e.port} on ${s.metadata.name}`);
      for (const e of sm.spec.endpoints) assert.ok(find(docs, 'Service', 'pd-pdserve-router').spec.ports.some((p) => p.name === e.port));
    }
    for (const a of [...byKind(docs, 'HorizontalPodAutoscaler'), ...byKind(docs, 'ScaledObject')]) {
      find(docs, 'Deployment', a.spec.scaleTargetRef.name);
    }
  }
});

test('KV-compatibility: one 16-hex value on prefill and decode (label, env, flag), changing with its inputs', () => {
  const value = (docs) => {
    const vals = new Set();
    for (const role of ROLES) {
      const d = deployment(docs, role);
      const c = mainContainer(d);
      vals.add(d.spec.template.metadata.labels['pdserve.io/kv-compat']);
      vals.add(envValue(c, 'PDSERVE_KV_COMPAT'));
      assert.equal(flag(c, '--kv-compat'), '$(PDSERVE_KV_COMPAT)');
      // Not in the selector: a selector is immutable, and the value changes on upgrades.
      assert.equal(d.spec.selector.matchLabels['pdserve.io/kv-compat'], undefined);
    }
    assert.equal(vals.size, 1, `prefill and decode disagree: ${[...vals]}`);
    const [v] = vals;
    assert.match(v, /^[0-9a-f]{16}$/);
    return v;
  };
  for (const docs of Object.values(all)) value(docs);
  const base = value(render().docs);
  assert.equal(value(render({ set: ['prefill.tensorParallel=2', 'decode.replicas=3'] }).docs), base, 'per-role sizing must not change it');
  assert.equal(value(render({ set: ['engine.decodeGraphs=true'] }).docs), base, 'decode graphs compute what eager steps do');
  assert.equal(value(render({ set: ['engine.asyncScheduling=true'] }).docs), base, 'async scheduling computes the same tokens');
  assert.equal(value(render({ preset: 'cpu', set: ['engine.cpuThreads=2'] }).docs), value(render({ preset: 'cpu' }).docs),
    'a rank\'s threads compute the same tokens');
  for (const s of ['image.tag=other', 'image.digest=sha256:' + 'a'.repeat(64), 'model.name=other', 'model.revision=2',
    'engine.weightDtype=f32', 'engine.kvDtype=bf16', 'engine.gemmPrecision=bf16', 'engine.blockSize=32', 'engine.kvLayoutVersion=2']) {
    assert.notEqual(value(render({ set: [s] }).docs), base, `${s} must change the KV-compat value`);
  }
  assert.equal(value(render({ set: ['kvCompat.override=0123456789abcdef'] }).docs), '0123456789abcdef');
});

test('engine.kvDtype: --kv-dtype on prefill and decode only when not f32 (the workers\' default)', () => {
  for (const role of ROLES) {
    assert.equal(flag(mainContainer(deployment(render().docs, role)), '--kv-dtype'), undefined, role);
    assert.equal(flag(mainContainer(deployment(render({ set: ['engine.kvDtype=bf16'] }).docs, role)), '--kv-dtype'), 'bf16', role);
  }
});

test('engine.gemmPrecision: --gemm-precision on prefill and decode only when not exact (the workers\' default)', () => {
  for (const role of ROLES) {
    assert.equal(flag(mainContainer(deployment(render().docs, role)), '--gemm-precision'), undefined, role);
    const bf16 = render({ set: ['engine.gemmPrecision=bf16'] }).docs;
    assert.equal(flag(mainContainer(deployment(bf16, role)), '--gemm-precision'), 'bf16', role);
    assert.equal(flag(mainContainer(deployment(bf16, role)), '--weight-dtype'), 'bf16', role);
  }
});

test('engine.decodeGraphs: --decode-graphs on decode only (prefill runs no decode step), off by default', () => {
  assert.equal(flag(mainContainer(deployment(render().docs, 'decode')), '--decode-graphs'), undefined);
  // Prefill TP 2 is allowed: its workers record nothing.
  const on = render({ set: ['engine.decodeGraphs=true', 'prefill.tensorParallel=2'] }).docs;
  assert.equal(flag(mainContainer(deployment(on, 'decode')), '--decode-graphs'), true);
  assert.equal(flag(mainContainer(deployment(on, 'prefill')), '--decode-graphs'), undefined);
});

test('engine.asyncScheduling: --async-scheduling on decode only, off by default', () => {
  assert.equal(flag(mainContainer(deployment(render().docs, 'decode')), '--async-scheduling'), undefined);
  // At any tensor parallelism (rank 0 broadcasts the sampled tokens).
  const on = render({ set: ['engine.asyncScheduling=true', 'prefill.tensorParallel=2', 'decode.tensorParallel=2'] }).docs;
  assert.equal(flag(mainContainer(deployment(on, 'decode')), '--async-scheduling'), true);
  assert.equal(flag(mainContainer(deployment(on, 'prefill')), '--async-scheduling'), undefined);
});

test('engine.cpuThreads: --cpu-threads on every CPU worker when above 1 (the workers\' default)', () => {
  for (const role of ROLES) {
    assert.equal(flag(mainContainer(deployment(render({ preset: 'cpu' }).docs, role)), '--cpu-threads'), undefined, role);
    const two = render({ preset: 'cpu', set: ['engine.cpuThreads=2', `${role}.tensorParallel=2`] }).docs;
    assert.equal(flag(mainContainer(deployment(two, role)), '--cpu-threads'), '2', role);
  }
});

test('monitoring objects only where monitoring.coreos.com/v1 is served (or as told)', () => {
  const kinds = (docs) => ['ServiceMonitor', 'PodMonitor', 'PrometheusRule'].filter((k) => byKind(docs, k).length);
  assert.deepEqual(kinds(render().docs), [], 'auto without the API');
  assert.deepEqual(kinds(render({ apiVersions: monitoring }).docs), ['ServiceMonitor', 'PodMonitor', 'PrometheusRule'], 'auto with the API');
  assert.deepEqual(kinds(render({ apiVersions: monitoring, set: ['monitoring.podMonitor.enabled=false', 'monitoring.prometheusRule.enabled=false'] }).docs), ['ServiceMonitor']);
  assert.deepEqual(kinds(render({ apiVersions: monitoring, set: ['monitoring.serviceMonitor.enabled=true'] }).docs).includes('ServiceMonitor'), true);
  // The ratio alert only with bounds.
  const alerts = (docs) => byKind(docs, 'PrometheusRule').flatMap((r) => r.spec.groups.flatMap((g) => g.rules.map((x) => x.alert)));
  assert.ok(!alerts(render({ apiVersions: monitoring }).docs).includes('PdservePrefillDecodeRatioDrift'));
  const withRatio = alerts(presets['amd-mi355x']);
  for (const a of ['PdserveKvTransferFailures', 'PdserveRdmaRequiredButTcp', 'PdserveTtftSloBreach', 'PdserveTpotSloBreach',
    'PdserveKvCacheNearlyFull', 'PdservePrefillDecodeRatioDrift']) assert.ok(withRatio.includes(a), a);
});

test('replicas is not rendered while autoscaling; HPA/ScaledObject are', () => {
  const docs = render({ set: ['prefill.autoscaling.enabled=true', 'router.autoscaling.enabled=true', 'decode.autoscaling.enabled=true',
    'decode.autoscaling.kind=hpa'], setJson: ['decode.autoscaling.hpa.metrics=[{"type":"Pods","pods":{"metric":{"name":"x"},"target":{"type":"AverageValue","averageValue":"1"}}}]'] }).docs;
  for (const c of ['prefill', 'decode', 'router']) assert.equal('replicas' in deployment(docs, c).spec, false, c);
  assert.equal(find(docs, 'ScaledObject', 'pd-pdserve-prefill').spec.minReplicaCount, 1);
  assert.equal(find(docs, 'HorizontalPodAutoscaler', 'pd-pdserve-decode').spec.metrics[0].pods.metric.name, 'x');
  assert.equal(find(docs, 'HorizontalPodAutoscaler', 'pd-pdserve-router').spec.minReplicas, 2);
  const query = find(docs, 'ScaledObject', 'pd-pdserve-prefill').spec.triggers[0].metadata.query;
  assert.match(query, /app_kubernetes_io_instance="pd"/);
  const fixed = render().docs;
  for (const c of ['prefill', 'decode', 'router']) assert.equal(typeof deployment(fixed, c).spec.replicas, 'number', c);
  assert.equal(byKind(fixed, 'HorizontalPodAutoscaler').length + byKind(fixed, 'ScaledObject').length, 0);
});

test('every container and Service port is named; the router Service has grpc (appProtocol grpc), http, metrics', () => {
  for (const [name, docs] of Object.entries(all)) {
    for (const { owner, spec } of podSpecs(docs)) {
      for (const c of allContainers(spec)) for (const p of c.ports ?? []) assert.ok(p.name && p.name.length <= 15, `${name} ${owner} ${c.name} port ${p.containerPort}`);
    }
    for (const s of byKind(docs, 'Service')) for (const p of s.spec.ports) assert.ok(p.name, `${name} ${s.metadata.name} port ${p.port}`);
    const svc = find(docs, 'Service', 'pd-pdserve-router');
    assert.deepEqual(svc.spec.ports.map((p) => p.name), ['grpc', 'http', 'metrics']);
    assert.deepEqual(svc.spec.ports.map((p) => p.appProtocol), ['grpc', ...Array(2).fill(tlsEnabled(name) ? 'https' : 'http')], name);
    assert.notEqual(svc.spec.clusterIP, 'None');
    assert.equal(svc.spec.publishNotReadyAddresses, undefined, 'clients only reach ready routers');
  }
});

test('workers register through the headless, not-ready-publishing registry Service and advertise the pod IP', () => {
  for (const [name, docs] of Object.entries(all)) {
    const reg = find(docs, 'Service', 'pd-pdserve-router-registry');
    assert.equal(reg.spec.clusterIP, 'None');
    assert.equal(reg.spec.publishNotReadyAddresses, true);
    for (const role of ROLES) {
      const c = mainContainer(deployment(docs, role));
      assert.equal(flag(c, '--router'), `pd-pdserve-router-registry.pdserve.svc.cluster.local:${reg.spec.ports[0].port}`, `${name} ${role}`);
      const grpc = c.ports.find((p) => p.name === 'grpc').containerPort;
      assert.equal(flag(c, '--advertise'), `$(POD_IP):${grpc}`);
      assert.equal(flag(c, '--port'), String(grpc));
      assert.equal(flag(c, '--host'), '0.0.0.0');
      assert.deepEqual(c.env.find((e) => e.name === 'POD_IP').valueFrom, { fieldRef: { fieldPath: 'status.podIP' } });
      const headless = find(docs, 'Service', `pd-pdserve-${role}`);
      assert.equal(headless.spec.clusterIP, 'None', `${role} peer-discovery Service is headless`);
    }
  }
});

test('workers run the right program, device and model flags', () => {
  for (const [name, docs] of Object.entries(all)) {
    const device = { default: 'cuda', cpu: 'cpu', 'nvidia-h200': 'cuda', 'amd-mi355x': 'hip', 'everything-on': 'cuda', auth: 'cpu', tls: 'cpu', 'tls-auth': 'cuda' }[name];
    for (const role of ROLES) {
      const c = mainContainer(deployment(docs, role));
      assert.deepEqual(c.command, [`/opt/pdserve/bin/pdserve-${role}`]);
      assert.equal(flag(c, '--role'), role === 'decode' ? 'decode' : undefined);
      assert.equal(flag(c, '--device'), device, `${name} ${role}`);
      assert.equal(flag(c, '--weight-dtype') === undefined, device === 'cpu', `${name} ${role} --weight-dtype only on a GPU`);
      assert.equal(flag(c, '--require-rdma'), ['nvidia-h200', 'amd-mi355x', 'everything-on', 'tls-auth'].includes(name) ? true : undefined);
    }
    assert.deepEqual(mainContainer(deployment(docs, 'router')).command, ['/opt/pdserve/bin/pdserve-router']);
  }
});

test('per-role rollout defaults: prefill surge 0 / unavailable 1, decode surge 1 / unavailable 0', () => {
  for (const [name, docs] of Object.entries(presets)) {
    assert.deepEqual(deployment(docs, 'prefill').spec.strategy.rollingUpdate, { maxSurge: 0, maxUnavailable: 1 }, name);
    assert.deepEqual(deployment(docs, 'decode').spec.strategy.rollingUpdate, { maxSurge: 1, maxUnavailable: 0 }, name);
  }
});

test('anti-affinity within a role, optional co-location of decode with prefill', () => {
  const docs = render({ set: ['decode.placement.colocateWith.role=prefill', 'decode.placement.colocateWith.topologyKey=example.com/rack',
    'prefill.placement.antiAffinity=hard'] }).docs;
  const pre = deployment(docs, 'prefill').spec.template.spec.affinity;
  assert.equal(pre.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchLabels['app.kubernetes.io/component'], 'prefill');
  const dec = deployment(docs, 'decode').spec.template.spec.affinity;
  const term = dec.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm;
  assert.equal(term.topologyKey, 'example.com/rack');
  assert.equal(term.labelSelector.matchLabels['app.kubernetes.io/component'], 'prefill');
  assert.equal(dec.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.labelSelector.matchLabels['app.kubernetes.io/component'], 'decode');
  const none = render({ set: ['prefill.placement.antiAffinity=none'] }).docs;
  assert.equal(deployment(none, 'prefill').spec.template.spec.affinity, undefined);
});

test('/dev/shm is a memory emptyDir sized from TP; hugepages optional', () => {
  const docs = render({ set: ['prefill.tensorParallel=4', 'decode.tensorParallel=2', 'decode.shm.perRankMiB=1536',
    'prefill.hugepages.enabled=true', 'prefill.hugepages.amount=4Gi'] }).docs;
  const vol = (role, n) => deployment(docs, role).spec.template.spec.volumes.find((v) => v.name === n);
  assert.deepEqual(vol('prefill', 'dshm').emptyDir, { medium: 'Memory', sizeLimit: '8Gi' });
  assert.deepEqual(vol('decode', 'dshm').emptyDir, { medium: 'Memory', sizeLimit: '3Gi' });
  assert.deepEqual(vol('prefill', 'hugepages').emptyDir, { medium: 'HugePages-2Mi' });
  assert.equal(resourcesOf(docs, 'prefill').limits['hugepages-2Mi'], '4Gi');
  assert.equal(vol('decode', 'hugepages'), undefined);
  for (const role of ROLES) assert.ok(mainContainer(deployment(docs, role)).volumeMounts.some((m) => m.name === 'dshm' && m.mountPath === '/dev/shm'));
});

// The KV cache's tiers (docs/kv_offload.md): hostKvBytes is --host-kv-bytes; kvOffload mounts its
// volume (an emptyDir by default, or what the values name) at the --kv-offload-dir it passes.
test('kvOffload: the filesystem tier\'s volume, mount and flags; none while disabled', () => {
  const docs = render({ set: ['decode.hostKvBytes=68719476736', 'decode.kvOffload.enabled=true',
    'prefill.hostKvBytes=1073741824', 'prefill.kvOffload.enabled=true', 'prefill.kvOffload.maxBytes=null',
    'prefill.kvOffload.volume.emptyDir=null', 'prefill.kvOffload.volume.persistentVolumeClaim.claimName=pd-kv'] }).docs;
  const vol = (role) => deployment(docs, role).spec.template.spec.volumes.find((v) => v.name === 'kv-offload');
  const mount = (role) => mainContainer(deployment(docs, role)).volumeMounts.find((m) => m.name === 'kv-offload');
  const c = (role) => mainContainer(deployment(docs, role));
  assert.deepEqual(vol('decode'), { name: 'kv-offload', emptyDir: { sizeLimit: '64Gi' } });
  assert.deepEqual(vol('prefill'), { name: 'kv-offload', persistentVolumeClaim: { claimName: 'pd-kv' } });
  for (const role of ROLES) {
    assert.equal(mount(role).mountPath, '/var/cache/pdserve-kv', role);
    assert.equal(flag(c(role), '--kv-offload-dir'), '/var/cache/pdserve-kv', role);
  }
  assert.equal(flag(c('decode'), '--host-kv-bytes'), '68719476736');
  assert.equal(flag(c('decode'), '--kv-offload-dir-bytes'), '60000000000');
  assert.equal(flag(c('prefill'), '--kv-offload-dir-bytes'), undefined, 'maxBytes null: no cap');
  assert.equal(flag(c('decode'), '--kv-load-timeout-ms'), undefined, 'loadTimeoutMs null: no limit');
  const off = render({}).docs;
  for (const role of ROLES) {
    const d = deployment(off, role);
    assert.equal(d.spec.template.spec.volumes.some((v) => v.name === 'kv-offload'), false, role);
    assert.equal(flag(mainContainer(d), '--kv-offload-dir'), undefined, role);
    assert.equal(flag(mainContainer(d), '--host-kv-bytes'), undefined, role);
  }
});

test('the shared ConfigMap is in every pdserve container and its checksum rolls the pods', () => {
  const a = render().docs;
  const b = render({ set: ['logLevel=debug'] }).docs;
  for (const c of ['router', 'prefill', 'decode']) {
    const ann = (docs) => deployment(docs, c).spec.template.metadata.annotations['checksum/shared-config'];
    assert.match(ann(a), /^[0-9a-f]{64}$/);
    assert.notEqual(ann(a), ann(b), `${c} must roll when shared settings change`);
    assert.deepEqual(mainContainer(deployment(a, c)).envFrom, [{ configMapRef: { name: 'pd-pdserve-shared' } }]);
  }
  assert.equal(find(b, 'ConfigMap', 'pd-pdserve-shared').data.PDSERVE_LOG_LEVEL, 'debug');
});

test('UCX presets: RoCE sets UCX_IB_ADDR_TYPE=eth and the GID index; memory transports follow the vendor', () => {
  const data = (set) => find(render({ set }).docs, 'ConfigMap', 'pd-pdserve-shared').data;
  const roce = data(['rdma.enabled=true', 'ucx.preset=roce', 'ucx.gidIndex=1', 'ucx.netDevices=mlx5_0:1']);
  assert.equal(roce.UCX_IB_ADDR_TYPE, 'eth');
  assert.equal(roce.UCX_IB_GID_INDEX, '1');
  assert.equal(roce.UCX_NET_DEVICES, 'mlx5_0:1');
  assert.match(roce.UCX_TLS, /cuda_copy/);
  const mi = find(presets['amd-mi355x'], 'ConfigMap', 'pd-pdserve-shared').data;
  assert.equal(mi.UCX_IB_ADDR_TYPE, 'eth');
  assert.match(mi.UCX_TLS, /rocm_copy/);
  assert.doesNotMatch(mi.UCX_TLS, /cuda/);
  const ib = find(presets['nvidia-h200'], 'ConfigMap', 'pd-pdserve-shared').data;
  assert.match(ib.UCX_TLS, /^rc/);
  assert.equal(data(['ucx.preset=none']).UCX_TLS, undefined);
  assert.equal(data(['ucx.preset=tcp', 'ucx.env.UCX_LOG_LEVEL=debug']).UCX_LOG_LEVEL, 'debug');
});

test('MI355X preset: 2 prefill TP4 : 1 decode TP4 on amd.com/gpu, RDMA, IPC_LOCK, hip', () => {
  const docs = presets['amd-mi355x'];
  assert.equal(deployment(docs, 'prefill').spec.replicas, 2);
  assert.equal(deployment(docs, 'decode').spec.replicas, 1);
  for (const role of ROLES) {
    const c = mainContainer(deployment(docs, role));
    for (const kind of ['requests', 'limits']) {
      assert.equal(c.resources[kind]['amd.com/gpu'], '4', `${role} ${kind} amd.com/gpu`);
      assert.equal(c.resources[kind]['rdma/ib'], '4', `${role} ${kind} rdma/ib`);
      assert.equal(c.resources[kind]['nvidia.com/gpu'], undefined);
    }
    assert.deepEqual(caps(c), ['IPC_LOCK']);
    assert.equal(flag(c, '--tp'), '4');
    assert.equal(flag(c, '--device'), 'hip');
    assert.equal(c.image, 'pdserve:rocm');
    assert.equal(deployment(docs, role).spec.template.spec.runtimeClassName, undefined);
    assert.deepEqual(deployment(docs, role).spec.template.spec.securityContext.supplementalGroups, [44, 109]);
  }
});

test('CPU preset: no GPU or RDMA requests, the bundled stories260K (shipped in the CPU image), device cpu', () => {
  const docs = presets.cpu;
  const text = JSON.stringify(podSpecs(docs));
  for (const n of [...GPU_NAMES, 'rdma/', 'IPC_LOCK', 'runtimeClassName', '--require-rdma']) assert.ok(!text.includes(n), `cpu preset mentions ${n}`);
  for (const c of ['router', 'prefill', 'decode']) {
    const d = deployment(docs, c);
    const main = mainContainer(d);
    assert.equal(flag(main, '--model'), 'stories260K');
    assert.equal(main.image, 'pdserve:cpu');
    assert.equal(d.spec.template.spec.initContainers, undefined, 'no download');
    assert.equal(d.spec.template.spec.volumes.find((v) => v.name === 'model'), undefined, 'no model volume');
  }
  const data = find(docs, 'ConfigMap', 'pd-pdserve-shared').data;
  assert.equal(data.PDSERVE_MODEL_PATH, '/opt/pdserve/share/models', 'where Dockerfile.cpu puts the bundled model');
  assert.equal(data.UCX_TLS, 'tcp,self', 'no shared memory between pods');
  for (const role of ROLES) assert.equal(flag(mainContainer(deployment(docs, role)), '--device'), 'cpu');
});

test('model sources: pvc and hostPath read-only at /models, download via the resolver in an init container', () => {
  const pvc = render({ set: ['model.source=pvc', 'model.pvc.claimName=models', 'model.pvc.subPath=llm'] }).docs;
  for (const c of ['router', 'prefill', 'decode']) {
    const spec = deployment(pvc, c).spec.template.spec;
    assert.deepEqual(spec.volumes.find((v) => v.name === 'model').persistentVolumeClaim, { claimName: 'models', readOnly: true });
    assert.deepEqual(spec.containers[0].volumeMounts.find((m) => m.name === 'model'), { name: 'model', mountPath: '/models', readOnly: true, subPath: 'llm' });
  }
  assert.equal(find(pvc, 'ConfigMap', 'pd-pdserve-shared').data.PDSERVE_MODEL_PATH, '/models');
  const dl = render({ set: ['model.download.baseUrl=http://mirror.local/models'] }).docs;
  for (const c of ['router', 'prefill', 'decode']) {
    const spec = deployment(dl, c).spec.template.spec;
    const init = spec.initContainers.find((i) => i.name === 'fetch-model');
    assert.deepEqual(init.command, ['/opt/pdserve/bin/pdserve']);
    assert.deepEqual(init.args.slice(0, 3), ['generate', '--model', 'stories260K']);
    assert.equal(init.env.find((e) => e.name === 'PDSERVE_MODEL_BASE_URL').value, 'http://mirror.local/models');
    assert.equal(init.volumeMounts.find((m) => m.name === 'model').readOnly, undefined, 'the init container writes the cache');
    assert.equal(spec.containers[0].volumeMounts.find((m) => m.name === 'model').readOnly, true, 'the servers read it');
  }
  assert.equal(find(dl, 'ConfigMap', 'pd-pdserve-shared').data.XDG_CACHE_HOME, '/models');
  const img = render({ set: ['model.source=image'] }).docs;
  for (const c of ['router', 'prefill', 'decode']) {
    const spec = deployment(img, c).spec.template.spec;
    assert.equal(spec.initContainers, undefined, `${c}: source image fetches nothing`);
    assert.ok(!spec.volumes.some((v) => v.name === 'model'));
  }
  assert.equal(find(img, 'ConfigMap', 'pd-pdserve-shared').data.PDSERVE_MODEL_PATH, '/models');
});

test('NetworkPolicy: clients reach only the router; router -> workers; prefill <-> decode on all TCP; DNS', () => {
  const docs = render({ set: ['networkPolicy.enabled=true'], setJson: ['networkPolicy.clients=[{"podSelector":{"matchLabels":{"app":"client"}}}]'] }).docs;
  const router = find(docs, 'NetworkPolicy', 'pd-pdserve-router');
  const clientRule = router.spec.ingress.find((r) => r.from?.some((f) => f.podSelector?.matchLabels?.app === 'client'));
  assert.deepEqual(clientRule.ports.map((p) => p.port), ['grpc', 'http']);
  assert.ok(clientRule.from.some((f) => f.podSelector?.matchLabels?.['app.kubernetes.io/component'] === 'test'), 'helm test pod may reach the router');
  for (const role of ROLES) {
    const other = role === 'prefill' ? 'decode' : 'prefill';
    const np = find(docs, 'NetworkPolicy', `pd-pdserve-${role}`);
    const fromOther = np.spec.ingress.find((r) => r.from?.[0]?.podSelector?.matchLabels?.['app.kubernetes.io/component'] === other);
    assert.deepEqual(fromOther.ports, [{ protocol: 'TCP' }], `${role}: UCX uses ephemeral ports`);
    const fromRouter = np.spec.ingress.find((r) => r.from?.[0]?.podSelector?.matchLabels?.['app.kubernetes.io/component'] === 'router');
    assert.deepEqual(fromRouter.ports, [{ protocol: 'TCP', port: 'grpc' }]);
    assert.ok(np.spec.egress.some((r) => r.ports?.some((p) => p.port === 53 && p.protocol === 'UDP')), `${role} DNS`);
    assert.ok(!np.spec.ingress.some((r) => !r.from), `${role}: no ingress rule open to every source`);
  }
  assert.equal(byKind(docs, 'NetworkPolicy').some((n) => n.metadata.name.endsWith('default-deny')), false, 'default-deny is opt-in');
  assert.equal(byKind(render().docs, 'NetworkPolicy').length, 0, 'off by default');
});

test('helm test pod: pdserve check (gRPC health, model info, /v1/models, 1-token completions), then a decode step', () => {
  for (const [name, docs] of Object.entries(all)) {
    const pod = find(docs, 'Pod', 'pd-pdserve-test');
    assert.equal(pod.metadata.annotations['helm.sh/hook'], 'test');
    assert.equal(pod.spec.restartPolicy, 'Never');
    const steps = [...pod.spec.initContainers, ...pod.spec.containers];
    assert.deepEqual(steps.map((s) => s.name), ['check', 'decode-4-tokens'], name);
    for (const s of steps) assert.deepEqual(s.command, ['/opt/pdserve/bin/pdserve'], 'only what the image has');
    // With TLS the fully qualified Service name (what the router's certificate names), and the CA.
    const host = tlsEnabled(name) ? 'pd-pdserve-router.pdserve.svc.cluster.local' : 'pd-pdserve-router';
    const tls = tlsEnabled(name) ? ['--tls-ca', '/etc/pdserve/tls/ca.crt'] : [];
    assert.deepEqual(steps[0].args, ['check', '--router', `${host}:50051`, '--http', `${host}:8080`, '--wait-s', '120', ...tls], name);
    assert.deepEqual(steps[1].args.slice(0, 3), ['generate', '--router', `${host}:50051`], name);
    assert.deepEqual(steps[1].args.slice(steps[1].args.length - tls.length), tls, name);
  }
  assert.equal(byKind(render({ set: ['tests.enabled=false'] }).docs, 'Pod').length, 0);
});

const AUTH_FLAGS = ['--api-key', '--api-key-file', '--metrics-auth', '--cluster-token-file', '--kv-key-file'];
const KEYS_FILE = '/etc/pdserve/api-keys/keys';
const TOKEN_FILE = '/etc/pdserve/cluster-token/token';
const KV_KEY_FILE = '/etc/pdserve/kv-key/kv.key';
const podVolume = (d, name) => (d.spec.template.spec.volumes ?? []).find((v) => v.name === name);
const podMount = (d, name) => (mainContainer(d).volumeMounts ?? []).find((m) => m.name === name);
const secretVolume = (secretName, key, path) => ({ secretName, items: [{ key, path }], defaultMode: 0o440 });

test('auth is off by default: no key or token flags, no Secret volumes, no PDSERVE_API_KEY', () => {
  for (const [name, docs] of Object.entries({ ...presets, 'everything-on': everythingOn })) {
    for (const { owner, spec } of podSpecs(docs)) {
      assert.ok(!(spec.volumes ?? []).some((v) => v.secret), `${name} ${owner} mounts a Secret`);
      for (const c of allContainers(spec)) {
        for (const f of AUTH_FLAGS) assert.equal(flag(c, f), undefined, `${name} ${owner} ${c.name} ${f}`);
        assert.ok(!(c.env ?? []).some((e) => e.name === 'PDSERVE_API_KEY'), `${name} ${owner} ${c.name} PDSERVE_API_KEY`);
      }
    }
    for (const sm of byKind(docs, 'ServiceMonitor')) for (const e of sm.spec.endpoints) assert.equal(e.authorization, undefined, name);
  }
});

test('auth: API keys into the router, the cluster token into the router and every worker, read-only from the Secrets', () => {
  const docs = authOn;
  const router = deployment(docs, 'router');
  const rc = mainContainer(router);
  assert.equal(flag(rc, '--api-key-file'), KEYS_FILE);
  assert.equal(flag(rc, '--metrics-auth'), true);
  assert.deepEqual(podVolume(router, 'api-keys').secret, secretVolume('pd-api-keys', 'keys.txt', 'keys'));
  assert.deepEqual(podMount(router, 'api-keys'), { name: 'api-keys', mountPath: '/etc/pdserve/api-keys', readOnly: true });
  assert.equal(podVolume(router, 'kv-key'), undefined, 'the router moves no KV: no kvtransfer key');
  for (const component of ['router', ...ROLES]) {
    const d = deployment(docs, component);
    const c = mainContainer(d);
    assert.equal(flag(c, '--cluster-token-file'), TOKEN_FILE, component);
    assert.deepEqual(podVolume(d, 'cluster-token').secret, secretVolume('pd-cluster-token', 'token', 'token'), component);
    assert.deepEqual(podMount(d, 'cluster-token'), { name: 'cluster-token', mountPath: '/etc/pdserve/cluster-token', readOnly: true }, component);
    // Each flag's file is the Secret's item inside its mount (a whole-directory mount, no subPath,
    // so an updated Secret reaches the file).
    for (const [f, vol] of [['--api-key-file', 'api-keys'], ['--cluster-token-file', 'cluster-token'], ['--kv-key-file', 'kv-key']]) {
      const path = flag(c, f);
      if (path === undefined) continue;
      assert.equal(path, `${podMount(d, vol).mountPath}/${podVolume(d, vol).secret.items[0].path}`, `${component} ${f}`);
      assert.equal(podMount(d, vol).subPath, undefined);
    }
  }
  for (const role of ROLES) {
    const d = deployment(docs, role);
    assert.equal(flag(mainContainer(d), '--api-key-file'), undefined, `${role} gets no client keys`);
    assert.equal(flag(mainContainer(d), '--metrics-auth'), undefined, `${role}: --metrics-auth is a router flag`);
    assert.equal(podVolume(d, 'api-keys'), undefined, role);
    assert.equal(flag(mainContainer(d), '--kv-key-file'), KV_KEY_FILE, role);
    assert.deepEqual(podVolume(d, 'kv-key').secret, secretVolume('pd-kv-key', 'key', 'kv.key'), role);
  }
  // The chart's own clients send the test key, by reference.
  const pod = find(docs, 'Pod', 'pd-pdserve-test');
  for (const c of allContainers(pod.spec)) {
    assert.deepEqual(c.env, [{ name: 'PDSERVE_API_KEY', valueFrom: { secretKeyRef: { name: 'pd-api-keys', key: 'test-key' } } }], c.name);
  }
  assert.deepEqual(find(docs, 'ServiceMonitor', 'pd-pdserve-router').spec.endpoints[0].authorization,
    { type: 'Bearer', credentials: { name: 'pd-api-keys', key: 'test-key' } });
  // Never a secret value: no Secret object, no literal env value.
  assert.equal(byKind(docs, 'Secret').length, 0);
  for (const { spec } of podSpecs(docs)) for (const c of allContainers(spec)) assert.equal(envValue(c, 'PDSERVE_API_KEY'), undefined);
});

test('auth: each Secret alone; the test key defaults to secretKey; /metrics stays open without metricsNeedKey', () => {
  const keys = render({ apiVersions: monitoring, set: ['auth.apiKeys.existingSecret=my-keys'] }).docs;
  const router = deployment(keys, 'router');
  assert.equal(flag(mainContainer(router), '--api-key-file'), KEYS_FILE);
  assert.equal(flag(mainContainer(router), '--metrics-auth'), undefined);
  assert.deepEqual(podVolume(router, 'api-keys').secret, secretVolume('my-keys', 'api-keys', 'keys'));
  for (const c of ['router', ...ROLES]) {
    for (const [f, vol] of [['--cluster-token-file', 'cluster-token'], ['--kv-key-file', 'kv-key']]) {
      assert.equal(flag(mainContainer(deployment(keys, c)), f), undefined, c);
      assert.equal(podVolume(deployment(keys, c), vol), undefined, c);
    }
  }
  const pod = find(keys, 'Pod', 'pd-pdserve-test');
  for (const c of allContainers(pod.spec)) assert.deepEqual(c.env[0].valueFrom.secretKeyRef, { name: 'my-keys', key: 'api-keys' }, c.name);
  assert.equal(find(keys, 'ServiceMonitor', 'pd-pdserve-router').spec.endpoints[0].authorization, undefined);
  // metricsNeedKey without a separate test key: the ServiceMonitor sends secretKey's content.
  const scraped = render({ apiVersions: monitoring, set: ['auth.apiKeys.existingSecret=my-keys', 'auth.metricsNeedKey=true'] }).docs;
  assert.deepEqual(find(scraped, 'ServiceMonitor', 'pd-pdserve-router').spec.endpoints[0].authorization.credentials, { name: 'my-keys', key: 'api-keys' });

  const token = render({ set: ['auth.clusterToken.existingSecret=my-token'] }).docs;
  for (const c of ['router', ...ROLES]) {
    const d = deployment(token, c);
    assert.equal(flag(mainContainer(d), '--cluster-token-file'), TOKEN_FILE, c);
    assert.deepEqual(podVolume(d, 'cluster-token').secret, secretVolume('my-token', 'cluster-token', 'token'), c);
    assert.equal(podVolume(d, 'api-keys'), undefined, c);
    assert.equal(flag(mainContainer(d), '--kv-key-file'), undefined, c);
    assert.equal(podVolume(d, 'kv-key'), undefined, c);
  }
  assert.equal(flag(mainContainer(deployment(token, 'router')), '--api-key-file'), undefined);
  for (const c of allContainers(find(token, 'Pod', 'pd-pdserve-test').spec)) assert.equal(c.env, undefined, 'no key to send');
});

test('auth: the kvtransfer key into prefill and decode only (--kv-key-file), never the router or the test pod', () => {
  for (const preset of ['cpu', 'nvidia-h200']) {
    const docs = render({ preset, set: ['auth.kvKey.existingSecret=my-kv-key', 'model.source=download'] }).docs;
    for (const role of ROLES) {
      const d = deployment(docs, role);
      const c = mainContainer(d);
      assert.equal(flag(c, '--kv-key-file'), KV_KEY_FILE, `${preset} ${role}`);
      assert.deepEqual(podVolume(d, 'kv-key').secret, secretVolume('my-kv-key', 'kv.key', 'kv.key'), `${preset} ${role}`);
      assert.deepEqual(podMount(d, 'kv-key'), { name: 'kv-key', mountPath: '/etc/pdserve/kv-key', readOnly: true }, `${preset} ${role}`);
      assert.equal(flag(c, '--kv-key-file'), `${podMount(d, 'kv-key').mountPath}/${podVolume(d, 'kv-key').secret.items[0].path}`);
      // It travels alone: no cluster token, no client keys.
      assert.equal(podVolume(d, 'cluster-token'), undefined, `${preset} ${role}`);
      assert.equal(flag(c, '--cluster-token-file'), undefined, `${preset} ${role}`);
    }
    // Only the prefill and decode workers' main containers: never the router (it moves no KV), the
    // test pod, an init container, nor a worker of the aggregated role (it refuses the flag, exit 2).
    for (const { owner, spec } of podSpecs(docs)) {
      const worker = owner.endsWith('-prefill') || owner.endsWith('-decode');
      if (!worker) assert.ok(!(spec.volumes ?? []).some((v) => v.name === 'kv-key' || v.secret?.secretName === 'my-kv-key'), `${preset} ${owner} kv-key volume`);
      for (const c of allContainers(spec)) {
        const main = worker && c === spec.containers[0];
        assert.equal(flag(c, '--kv-key-file') !== undefined, main, `${preset} ${owner} ${c.name} --kv-key-file`);
        assert.equal((c.volumeMounts ?? []).some((m) => m.name === 'kv-key'), main, `${preset} ${owner} ${c.name} kv-key mount`);
        if (main) assert.notEqual(flag(c, '--role'), 'aggregated', `${preset} ${owner}`);
      }
    }
  }
});

const TLS_FLAGS = ['--tls-cert', '--tls-key', '--tls-ca', '--tls-worker-name', '--tls'];
const TLS_DIR = '/etc/pdserve/tls';
const TLS_KEYS = ['tls.crt', 'tls.key', 'ca.crt'];
const tlsVolume = (secretName, keys) => ({ secretName, items: keys.map((k) => ({ key: k, path: k })), defaultMode: 0o440 });
const fqdn = (svc, ns = 'pdserve', domain = 'cluster.local') => `${svc}.${ns}.svc.${domain}`;

test('TLS is off by default: no --tls flags, no tls volume, plain-HTTP scrape', () => {
  for (const [name, docs] of Object.entries(all)) {
    if (tlsEnabled(name)) continue;
    for (const { owner, spec } of podSpecs(docs)) {
      assert.ok(!(spec.volumes ?? []).some((v) => v.name === 'tls'), `${name} ${owner} tls volume`);
      for (const c of allContainers(spec)) {
        for (const f of TLS_FLAGS) {
          assert.equal(flag(c, f), undefined, `${name} ${owner} ${c.name} ${f}`);
          assert.ok(!args(c).includes(f), `${name} ${owner} ${c.name} ${f} (as its own argument)`);
        }
        assert.ok(!(c.volumeMounts ?? []).some((m) => m.name === 'tls' || m.mountPath === TLS_DIR), `${name} ${owner} ${c.name} tls mount`);
      }
    }
    for (const sm of byKind(docs, 'ServiceMonitor')) {
      for (const e of sm.spec.endpoints) assert.deepEqual([e.scheme, e.tlsConfig], [undefined, undefined], name);
    }
  }
});

test('TLS: the Secret read-only in the router and every worker, the same three files on each, mutual TLS', () => {
  for (const [name, docs] of Object.entries(tlsRenders)) {
    for (const component of ['router', ...ROLES]) {
      const d = deployment(docs, component);
      const c = mainContainer(d);
      const what = `${name} ${component}`;
      assert.deepEqual(podVolume(d, 'tls').secret, tlsVolume('pd-tls', TLS_KEYS), what);
      assert.deepEqual(podMount(d, 'tls'), { name: 'tls', mountPath: TLS_DIR, readOnly: true }, what);
      // Each flag names its Secret item inside the mount (whole directory, no subPath: a renewed
      // certificate reaches the files).
      for (const [f, key] of [['--tls-cert', 'tls.crt'], ['--tls-key', 'tls.key'], ['--tls-ca', 'ca.crt']]) {
        assert.equal(flag(c, f), `${podMount(d, 'tls').mountPath}/${key}`, `${what} ${f}`);
        assert.ok(podVolume(d, 'tls').secret.items.some((i) => i.key === key && i.path === key), `${what} ${key}`);
      }
      // Only the main container: the model download init container needs no certificate.
      for (const init of d.spec.template.spec.initContainers ?? []) {
        for (const f of TLS_FLAGS) assert.equal(flag(init, f), undefined, `${what} ${init.name} ${f}`);
      }
    }
    // The worker name is the router's alone; the workers check the router against --router.
    for (const role of ROLES) assert.equal(flag(mainContainer(deployment(docs, role)), '--tls-worker-name'), undefined, `${name} ${role}`);
    // The cluster token still travels beside the certificates.
    for (const component of ['router', ...ROLES]) {
      assert.equal(flag(mainContainer(deployment(docs, component)), '--cluster-token-file'), TOKEN_FILE, `${name} ${component}`);
    }
    assert.equal(byKind(docs, 'Secret').length, 0, 'the chart never renders a Secret');
  }
  const router = (docs) => mainContainer(deployment(docs, 'router'));
  assert.equal(flag(router(tlsOn), '--tls-worker-name'), fqdn('pd-pdserve-worker'), 'default worker name');
  assert.equal(flag(router(tlsAuth), '--tls-worker-name'), 'pdserve-worker.example.internal', 'tls.workerName');
  // extraArgs still come last, after the TLS flags.
  const extra = render({ set: ['tls.enabled=true', 'tls.existingSecret=pd-tls'], setJson: ['decode.extraArgs=["--max-running=8"]'] }).docs;
  assert.deepEqual(args(mainContainer(deployment(extra, 'decode'))).slice(-2), ['--tls-ca=/etc/pdserve/tls/ca.crt', '--max-running=8']);
});

test('TLS: the names the certificate must carry are the ones clients, workers and Prometheus check', () => {
  for (const [opts, ns, domain] of [[{}, 'pdserve', 'cluster.local'],
    [{ release: 'prod', namespace: 'llm', set: ['clusterDomain=k8s.example'] }, 'llm', 'k8s.example']]) {
    const release = opts.release ?? 'pd';
    const docs = render({ ...opts, apiVersions: monitoring, set: [...(opts.set ?? []), 'tls.enabled=true', 'tls.existingSecret=pd-tls'] }).docs;
    const svc = find(docs, 'Service', `${release}-pdserve-router`);
    const registry = find(docs, 'Service', `${release}-pdserve-router-registry`);
    const clientName = fqdn(svc.metadata.name, ns, domain);
    // Workers dial the registry Service by name and check the routers' certificate against it.
    for (const role of ROLES) {
      const c = mainContainer(deployment(docs, role, release));
      assert.equal(flag(c, '--router'), `${fqdn(registry.metadata.name, ns, domain)}:${registry.spec.ports[0].port}`, role);
    }
    // The helm test pod dials the client Service by the name its certificate must carry.
    for (const c of allContainers(find(docs, 'Pod', `${release}-pdserve-test`).spec)) {
      assert.equal(c.args[c.args.indexOf('--router') + 1], `${clientName}:${svc.spec.ports[0].port}`, c.name);
    }
    // Prometheus dials pod IPs: serverName names the client Service instead.
    const e = find(docs, 'ServiceMonitor', `${release}-pdserve-router`).spec.endpoints[0];
    assert.equal(e.scheme, 'https');
    assert.deepEqual(e.tlsConfig, { ca: { secret: { name: 'pd-tls', key: 'ca.crt' } }, serverName: clientName, insecureSkipVerify: false });
    assert.equal(flag(mainContainer(deployment(docs, 'router', release)), '--tls-worker-name'), fqdn(`${release}-pdserve-worker`, ns, domain));
  }
});

test('TLS: the helm test pod trusts only the CA (ca.crt alone mounted) and keeps its API key', () => {
  for (const [name, docs] of Object.entries(tlsRenders)) {
    const pod = find(docs, 'Pod', 'pd-pdserve-test');
    assert.deepEqual(pod.spec.volumes, [{ name: 'tls', secret: tlsVolume('pd-tls', ['ca.crt']) }], `${name}: no private key in a client pod`);
    for (const c of allContainers(pod.spec)) {
      assert.deepEqual(c.volumeMounts, [{ name: 'tls', mountPath: TLS_DIR, readOnly: true }], `${name} ${c.name}`);
      assert.equal(c.args[c.args.indexOf('--tls-ca') + 1], `${TLS_DIR}/ca.crt`, `${name} ${c.name}`);
      for (const f of ['--tls-cert', '--tls-key', '--tls-worker-name']) assert.ok(!c.args.includes(f), `${name} ${c.name} ${f}`);
    }
  }
  for (const c of allContainers(find(tlsAuth, 'Pod', 'pd-pdserve-test').spec)) {
    assert.deepEqual(c.env, [{ name: 'PDSERVE_API_KEY', valueFrom: { secretKeyRef: { name: 'pd-api-keys', key: 'test-key' } } }], c.name);
  }
});

test('TLS: the ServiceMonitor scrapes HTTPS with the Secret CA (and the key with metricsNeedKey); worker scrapes stay HTTP', () => {
  for (const [name, docs] of Object.entries(tlsRenders)) {
    const e = find(docs, 'ServiceMonitor', 'pd-pdserve-router').spec.endpoints[0];
    assert.equal(e.scheme, 'https', name);
    assert.equal(e.tlsConfig.insecureSkipVerify, false, name);
    assert.deepEqual(e.tlsConfig.ca, { secret: { name: 'pd-tls', key: 'ca.crt' } }, name);
    for (const pm of byKind(docs, 'PodMonitor')) {
      for (const pe of pm.spec.podMetricsEndpoints) assert.deepEqual([pe.port, pe.scheme, pe.tlsConfig], ['probe', undefined, undefined], name);
    }
  }
  assert.deepEqual(find(tlsAuth, 'ServiceMonitor', 'pd-pdserve-router').spec.endpoints[0].authorization,
    { type: 'Bearer', credentials: { name: 'pd-api-keys', key: 'test-key' } });
});

test('TLS: NOTES.txt prints https endpoints under the certificate name', () => {
  const r = helm(4, ['install', 'pd', CHART, '--namespace', 'pdserve', '--dry-run=client', '--set', 'tls.enabled=true', '--set', 'tls.existingSecret=pd-tls']);
  assert.equal(r.status, 0, r.stderr);
  const notes = r.stdout.slice(r.stdout.indexOf('NOTES:'));
  for (const want of ['gRPC     pd-pdserve-router.pdserve.svc.cluster.local:50051 (TLS)',
    'https://pd-pdserve-router.pdserve.svc.cluster.local:8080/v1/completions', 'certificates from Secret pd-tls',
    'workers must carry pd-pdserve-worker.pdserve.svc.cluster.local', '--cacert ca.crt']) assert.ok(notes.includes(want), `NOTES lack ${JSON.stringify(want)}:\n${notes}`);
});

test('router flags: each optional one only when set (0 too where the router allows it)', () => {
  const want = { '--max-running': '64', '--max-waiting': '256', '--request-timeout': '300', '--max-migrations': '0',
    '--poll-interval-ms': '250', '--stall-timeout-s': '2.5', '--worker-wait-s': '0', '--failure-threshold': '5' };
  const rc = mainContainer(deployment(authOn, 'router'));
  for (const [f, v] of Object.entries(want)) assert.equal(flag(rc, f), v, f);
  for (const [name, docs] of Object.entries(presets)) {
    for (const f of Object.keys(want)) assert.equal(flag(mainContainer(deployment(docs, 'router')), f), undefined, `${name} ${f}`);
  }
  // --set gives integers; the seconds flags take fractions from a values file or --set-json.
  const set = mainContainer(deployment(render({ set: ['router.maxMigrations=7', 'router.stallTimeoutSeconds=10',
    'router.failureThreshold=1'], setJson: ['router.workerWaitSeconds=0.5'] }).docs, 'router'));
  assert.deepEqual([flag(set, '--max-migrations'), flag(set, '--stall-timeout-s'), flag(set, '--worker-wait-s'), flag(set, '--failure-threshold')],
    ['7', '10', '0.5', '1']);
  // router.extraArgs still come last, after the auth flags.
  const extra = mainContainer(deployment(render({ set: ['auth.apiKeys.existingSecret=k'],
    setJson: ['router.extraArgs=["--max-message-bytes=1024"]'] }).docs, 'router'));
  assert.deepEqual(extra.args.slice(-2), ['--api-key-file=/etc/pdserve/api-keys/keys', '--max-message-bytes=1024']);
});

test('the dashboard is valid JSON over metric names pdserve exports', () => {
  const known = new Set(['time_to_first_token_seconds_bucket', 'time_per_output_token_seconds_bucket', 'e2e_request_latency_seconds_bucket',
    'num_requests_running', 'num_requests_waiting', 'request_success_total', 'request_failure_total', 'kv_transfer_bytes_total',
    'kv_transfer_seconds_bucket', 'worker_up', 'kv_cache_usage_perc', 'kv_cache_free_blocks', 'kv_cache_total_blocks',
    'worker_num_requests_running', 'worker_num_requests_waiting', 'worker_queued_prefill_tokens', 'worker_ready', 'worker_started',
    'worker_draining', 'worker_rdma_required', 'worker_rdma_available', 'worker_kv_transfer_failures_total', 'worker_kv_cache_usage_perc']);
  const cm = find(everythingOn, 'ConfigMap', 'pd-pdserve-dashboard');
  assert.equal(cm.metadata.labels.grafana_dashboard, '1');
  const dash = JSON.parse(cm.data['pdserve.json']);
  assert.equal(dash, JSON.parse(readFileSync(join(CHART, 'dashboards/pdserve.json'), 'utf8')) && dash);
  const exprs = dash.panels.flatMap((p) => p.targets.map((t) => t.expr));
  assert.ok(exprs.length >= 10);
  const rules = byKind(presets['amd-mi355x'], 'PrometheusRule').flatMap((r) => r.spec.groups.flatMap((g) => g.rules.map((x) => x.expr)));
  for (const e of [...exprs, ...rules]) {
    for (const m of e.matchAll(/pdserve:([a-z0-9_]+)/g)) assert.ok(known.has(m[1]), `unknown metric pdserve:${m[1]} in ${e}`);
  }
});

test('NOTES.txt prints the endpoints and the P:D topology (helm 4 install --dry-run=client)', () => {
  const r = helm(4, ['install', 'pd', CHART, '--namespace', 'pdserve', '--dry-run=client',
    '-f', join(CHART, 'values-amd-mi355x.yaml')]);
  assert.equal(r.status, 0, r.stderr);
  const notes = r.stdout.slice(r.stdout.indexOf('NOTES:'));
  for (const want of ['prefill  2 x TP4  (4 amd.com/gpu per pod)', 'decode   1 x TP4', 'P:D = 2:1, 12 GPUs in all',
    'gRPC     pd-pdserve-router.pdserve.svc:50051', 'http://pd-pdserve-router.pdserve.svc:8080/v1/completions',
    'helm test pd -n pdserve', 'no kvtransfer key: the KV control channel is plaintext'])
    assert.ok(notes.includes(want), `NOTES lack ${JSON.stringify(want)}:\n${notes}`);
  const keyed = helm(4, ['install', 'pd', CHART, '--namespace', 'pdserve', '--dry-run=client',
    '-f', join(CHART, 'values-amd-mi355x.yaml'), '--set', 'auth.kvKey.existingSecret=pd-kv-key']);
  assert.equal(keyed.status, 0, keyed.stderr);
  assert.ok(keyed.stdout.includes('the KV control channel is CURVE-encrypted with the key from Secret pd-kv-key'), keyed.stdout);
});

test('values.yaml sets every key values.schema.json defines for the chart (so each is documented there)', () => {
  const schema = JSON.parse(readFileSync(join(CHART, 'values.schema.json'), 'utf8'));
  const values = YAML.parse(readFileSync(join(CHART, 'values.yaml'), 'utf8'));
  const deref = (s) => (s.$ref ? schema.definitions[s.$ref.split('/').pop()] : s);
  const missing = [];
  const walk = (s, v, path) => {
    s = deref(s);
    if (s.additionalProperties !== false || !s.properties) return;  // Kubernetes pass-through
    for (const [k, sub] of Object.entries(s.properties)) {
      if (path === '' && k === 'global') continue;
      if (!(k in v)) { missing.push(`${path}${k}`); continue; }
      if (v[k] && typeof v[k] === 'object' && !Array.isArray(v[k])) walk(sub, v[k], `${path}${k}.`);
    }
  };
  walk(schema, values, '');
  // Kubernetes ResourceRequirements.claims is passed through if given; nothing to document.
  assert.deepEqual(missing.filter((m) => !m.endsWith('.claims')), []);
});

test('router.kvMode pull-host reaches the router flag, with the prefill workers\' host tier', () => {
  const docs = render({ set: ['router.kvMode=pull-host', 'prefill.hostKvBytes=8589934592'] }).docs;
  assert.equal(flag(mainContainer(deployment(docs, 'router')), '--kv-mode'), 'pull-host');
  assert.equal(flag(mainContainer(deployment(docs, 'prefill')), '--host-kv-bytes'), '8589934592');
});
