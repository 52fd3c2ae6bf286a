// Bad values must fail the render with a message that names the key, with Helm 3 and Helm 4.
// Schema errors are worded differently by the two (Helm 3: "prefill: Additional property x is not
// allowed", Helm 4: "at '/prefill': additional properties 'x' not allowed"), so each case asserts
// on the key's parts, not on either wording. _validate.tpl messages are the chart's own and are
// matched exactly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderError } from './lib.mjs';

const CASES = [
  // values.schema.json
  { name: 'unknown top-level key', opts: { set: ['replica=2'] }, want: [/replica/] },
  { name: 'typo in a role block', opts: { set: ['prefill.tensorParalel=2'] }, want: [/prefill/, /tensorParalel/] },
  { name: 'typo in a nested block', opts: { set: ['decode.probes.startupMaxSecond=60'] }, want: [/probes/, /startupMaxSecond/] },
  { name: 'wrong type', opts: { set: ['decode.replicas=two'] }, want: [/decode/, /replicas/] },
  { name: 'unknown UCX preset', opts: { set: ['ucx.preset=infiniband'] }, want: [/ucx/, /preset/] },
  { name: 'unknown vendor', opts: { set: ['accelerator.vendor=intel'] }, want: [/accelerator/, /vendor/] },
  { name: 'router without replicas', opts: { set: ['router.replicas=0'] }, want: [/router/, /replicas/] },
  { name: 'TP above 8', opts: { set: ['decode.tensorParallel=16'] }, want: [/decode/, /tensorParallel/] },
  { name: 'router failure threshold 0', opts: { set: ['router.failureThreshold=0'] }, want: [/router/, /failureThreshold/] },
  { name: 'fractional router failure threshold', opts: { setJson: ['router.failureThreshold=1.5'] }, want: [/router/, /failureThreshold/] },
  { name: 'router stall timeout 0', opts: { set: ['router.stallTimeoutSeconds=0'] }, want: [/router/, /stallTimeoutSeconds/] },
  { name: 'negative router worker wait', opts: { set: ['router.workerWaitSeconds=-1'] }, want: [/router/, /workerWaitSeconds/] },
  { name: 'negative router max migrations', opts: { set: ['router.maxMigrations=-1'] }, want: [/router/, /maxMigrations/] },
  { name: 'negative router local prefill tokens', opts: { set: ['router.localPrefillTokens=-1'] },
    want: [/router/, /localPrefillTokens/] },
  { name: 'typo in auth', opts: { set: ['auth.apiKey.existingSecret=keys'] }, want: [/auth/, /apiKey/] },
  { name: 'Secret name that is no Kubernetes name', opts: { set: ['auth.clusterToken.existingSecret=My_Token'] },
    want: [/clusterToken/, /existingSecret/] },
  { name: 'kvtransfer key Secret name that is no Kubernetes name', opts: { set: ['auth.kvKey.existingSecret=My_KV_Key'] },
    want: [/kvKey/, /existingSecret/] },
  { name: 'empty kvtransfer key Secret key', opts: { set: ['auth.kvKey.existingSecret=kv', 'auth.kvKey.secretKey='] }, want: [/kvKey/, /secretKey/] },
  { name: 'empty Secret key', opts: { set: ['auth.apiKeys.existingSecret=keys', 'auth.apiKeys.secretKey='] }, want: [/apiKeys/, /secretKey/] },
  { name: 'metricsNeedKey not a bool', opts: { set: ['auth.metricsNeedKey=yes'] }, want: [/auth/, /metricsNeedKey/] },
  { name: 'TLS without a Secret', opts: { set: ['tls.enabled=true'] }, want: [/tls/, /existingSecret/] },
  { name: 'TLS with an empty Secret name', opts: { set: ['tls.enabled=true', 'tls.existingSecret='] }, want: [/tls/, /existingSecret/] },
  { name: 'TLS Secret name that is no Kubernetes name', opts: { set: ['tls.enabled=true', 'tls.existingSecret=My_TLS'] },
    want: [/tls/, /existingSecret/] },
  { name: 'tls.enabled not a bool', opts: { set: ['tls.enabled=yes', 'tls.existingSecret=pd-tls'] }, want: [/tls/, /enabled/] },
  { name: 'worker name that is no DNS name', opts: { set: ['tls.enabled=true', 'tls.existingSecret=pd-tls', 'tls.workerName=Worker_1'] },
    want: [/tls/, /workerName/] },
  // A worker's TLS is always mutual and it registers on the router's TLS port: no server-only mode.
  { name: 'no tls.mutual switch', opts: { set: ['tls.enabled=true', 'tls.existingSecret=pd-tls', 'tls.mutual=false'] }, want: [/tls/, /mutual/] },
  // _validate.tpl
  { name: 'TP 3', opts: { set: ['prefill.tensorParallel=3'] }, want: ['prefill.tensorParallel must be 1, 2, 4 or 8 (got 3)'] },
  { name: 'GPU vendor on the CPU preset', opts: { preset: 'cpu', set: ['accelerator.vendor=nvidia'] },
    want: ['accelerator.device "cpu" does not match accelerator.vendor "nvidia"'] },
  { name: 'GPU device on the CPU preset', opts: { preset: 'cpu', set: ['accelerator.device=cuda'] },
    want: ['accelerator.device "cuda" does not match accelerator.vendor "cpu"'] },
  { name: 'hip on NVIDIA', opts: { preset: 'nvidia-h200', set: ['accelerator.device=hip'] },
    want: ['accelerator.device "hip" does not match accelerator.vendor "nvidia"'] },
  { name: 'bf16 KV on CPU', opts: { preset: 'cpu', set: ['engine.kvDtype=bf16'] },
    want: ['engine.kvDtype bf16 needs a GPU device: CPU workers keep an f32 KV cache'] },
  { name: 'bf16 GEMM precision on CPU', opts: { preset: 'cpu', set: ['engine.gemmPrecision=bf16'] },
    want: ['engine.gemmPrecision bf16 needs a GPU device: CPU workers multiply f32 activations'] },
  { name: 'bf16 GEMM precision with f32 weights', opts: { preset: 'nvidia-h200', set: ['engine.gemmPrecision=bf16', 'engine.weightDtype=f32'] },
    want: ['engine.gemmPrecision bf16 multiplies bf16 activations by bf16 weights: it needs engine.weightDtype bf16, not f32'] },
  { name: 'decode graphs on CPU', opts: { preset: 'cpu', set: ['engine.decodeGraphs=true'] },
    want: ['engine.decodeGraphs records GPU graphs: CPU workers run every step eagerly'] },
  { name: 'decode graphs at decode TP 2', opts: { preset: 'nvidia-h200', set: ['engine.decodeGraphs=true', 'decode.tensorParallel=2'] },
    want: ['engine.decodeGraphs records decode steps at tensor parallelism 1 only: decode.tensorParallel is 2'] },
  { name: 'async scheduling on CPU', opts: { preset: 'cpu', set: ['engine.asyncScheduling=true'] },
    want: ['engine.asyncScheduling reads sampled tokens on a GPU: CPU workers sample on the host'] },
  { name: 'GPU resource name on CPU', opts: { preset: 'cpu', set: ['accelerator.resourceName=nvidia.com/gpu'] },
    want: ['accelerator.resourceName "nvidia.com/gpu" is set but accelerator.vendor is cpu'] },
  { name: 'router tGPS below preStop + drain + margin', opts: { set: ['router.terminationGracePeriodSeconds=20'] },
    want: ['router.terminationGracePeriodSeconds (20) is lower than router.drain.preStopSeconds + drainTimeoutSeconds + marginSeconds (10 + 30 + 10 = 50)'] },
  { name: 'tGPS below preStop + drain + margin', opts: { set: ['decode.terminationGracePeriodSeconds=30'] },
    want: ['decode.terminationGracePeriodSeconds (30) is lower than decode.drain.preStopSeconds + drainTimeoutSeconds + marginSeconds (10 + 60 + 15 = 85)'] },
  { name: 'router tGPS too low', opts: { set: ['router.terminationGracePeriodSeconds=5'] },
    want: ['router.terminationGracePeriodSeconds (5) is lower than'] },
  { name: 'RDMA preset without rdma.enabled', opts: { set: ['ucx.preset=ib'] }, want: ['ucx.preset ib configures RDMA transports but rdma.enabled is false'] },
  { name: 'tcp preset with RDMA', opts: { preset: 'nvidia-h200', set: ['ucx.preset=tcp'] }, want: ['ucx.preset tcp limits UCX to TCP but rdma.enabled is true'] },
  { name: 'rdma.required without rdma', opts: { set: ['rdma.required=true'] }, want: ['rdma.required is true but rdma.enabled is false'] },
  { name: 'GPU set by hand', opts: { set: ['prefill.resources.limits.nvidia\\.com/gpu=2'] },
    want: ['prefill.resources.limits must not set nvidia.com/gpu: the chart requests prefill.tensorParallel GPUs'] },
  { name: 'other vendor GPU set by hand', opts: { preset: 'amd-mi355x', set: ['decode.resources.requests.nvidia\\.com/gpu=1'] },
    want: ['decode.resources.requests requests nvidia.com/gpu but accelerator.vendor is amd'] },
  { name: 'RDMA resource set by hand', opts: { preset: 'nvidia-h200', set: ['decode.resources.limits.rdma/ib=1'] },
    want: ['decode.resources.limits must not set rdma/ib'] },
  { name: 'P:D ratio above the bound', opts: { preset: 'amd-mi355x', set: ['prefill.replicas=5'] },
    want: ['prefill.replicas / decode.replicas = 5/1 is above ratio.prefillPerDecodeMax (4)'] },
  { name: 'P:D ratio below the bound', opts: { preset: 'amd-mi355x', set: ['decode.replicas=3'] },
    want: ['prefill.replicas / decode.replicas = 2/3 is below ratio.prefillPerDecodeMin (1)'] },
  { name: 'ratio bounds inverted', opts: { set: ['ratio.prefillPerDecodeMin=4', 'ratio.prefillPerDecodeMax=2'] },
    want: ['ratio.prefillPerDecodeMin must not exceed ratio.prefillPerDecodeMax'] },
  { name: 'monitoring required without the API', opts: { set: ['monitoring.prometheusRule.enabled=true'] },
    want: ['monitoring.prometheusRule.enabled is true but the cluster serves no monitoring.coreos.com/v1 API'] },
  { name: 'router PDB that blocks drains', opts: { set: ['router.replicas=1'] },
    want: ['router.pdb.minAvailable (1) must be lower than the router\'s replica count (1)'] },
  { name: 'pvc without a claim', opts: { set: ['model.source=pvc'] }, want: ['model.pvc.claimName must be set when model.source is pvc'] },
  { name: 'hostPath without a path', opts: { set: ['model.source=hostPath'] }, want: ['model.hostPath.path must be set when model.source is hostPath'] },
  { name: 'model name is a path', opts: { set: ['model.name=a/b'] }, want: ['model.name "a/b" must be a name'] },
  { name: 'HPA without metrics', opts: { set: ['prefill.autoscaling.enabled=true', 'prefill.autoscaling.kind=hpa'] },
    want: ['prefill.autoscaling.hpa.metrics must list at least one metric'] },
  { name: 'HPA scaling to zero', opts: { set: ['prefill.autoscaling.enabled=true', 'prefill.autoscaling.kind=hpa', 'prefill.autoscaling.minReplicas=0'],
    setJson: ['prefill.autoscaling.hpa.metrics=[{"type":"Pods","pods":{"metric":{"name":"x"},"target":{"type":"AverageValue","averageValue":"1"}}}]'] },
    want: ['prefill.autoscaling.minReplicas must be at least 1 with kind hpa'] },
  { name: 'autoscaling min above max', opts: { set: ['decode.autoscaling.enabled=true', 'decode.autoscaling.minReplicas=5'] },
    want: ['decode.autoscaling.minReplicas must not exceed decode.autoscaling.maxReplicas'] },
  { name: 'rollout that cannot start', opts: { set: ['decode.rollout.maxSurge=0'] },
    want: ['decode.rollout.maxSurge and decode.rollout.maxUnavailable are both 0'] },
  { name: 'co-location with itself', opts: { set: ['decode.placement.colocateWith.role=decode'] },
    want: ['decode.placement.colocateWith.role must name the other role'] },
  { name: 'startup window shorter than a period', opts: { set: ['prefill.probes.startupMaxSeconds=5'] },
    want: ['prefill.probes.startupMaxSeconds must be at least prefill.probes.periodSeconds'] },
  { name: 'overlapping worker ports', opts: { set: ['prefill.tensorParallel=4', 'prefill.ports.probe=50072'] },
    want: ['prefill.ports: grpc, probe and kv .. kv+tensorParallel-1 must not overlap'] },
  { name: 'hugepages without a memory request', opts: { set: ['prefill.hugepages.enabled=true', 'prefill.resources.requests.memory=null'] },
    want: ['prefill.hugepages.enabled needs prefill.resources.requests.memory'] },
  { name: 'filesystem tier without the host tier', opts: { set: ['decode.kvOffload.enabled=true'] },
    want: ['decode.kvOffload.enabled needs decode.hostKvBytes: the filesystem tier stores and loads through the host tier'] },
  { name: 'filesystem tier on an emptyDir without a byte cap',
    opts: { set: ['decode.hostKvBytes=1073741824', 'decode.kvOffload.enabled=true', 'decode.kvOffload.maxBytes=null'] },
    want: ['decode.kvOffload.maxBytes must be set with an emptyDir sizeLimit (64Gi)'] },
  { name: 'filesystem tier volume with two sources',
    opts: { set: ['decode.hostKvBytes=1073741824', 'decode.kvOffload.enabled=true', 'decode.kvOffload.volume.persistentVolumeClaim.claimName=kv'] },
    want: ['decode.kvOffload.volume must name one volume source (e.g. emptyDir or persistentVolumeClaim), not 2'] },
  { name: 'a load timeout without the filesystem tier', opts: { set: ['decode.kvOffload.loadTimeoutMs=100'] },
    want: ['decode.kvOffload.loadTimeoutMs bounds the filesystem tier\'s loads: it needs decode.kvOffload.enabled'] },
  { name: 'a load timeout of 0', opts: { set: ['decode.hostKvBytes=1073741824', 'decode.kvOffload.enabled=true',
    'decode.kvOffload.loadTimeoutMs=0'] }, want: [/loadTimeoutMs/] },
  { name: 'pull-host without a prefill host tier', opts: { set: ['router.kvMode=pull-host'] },
    want: ['router.kvMode pull-host has decode read prompts from the prefill workers\' host KV tier: set prefill.hostKvBytes'] },
  { name: 'pull-host with a host tier of 0 bytes', opts: { set: ['router.kvMode=pull-host', 'prefill.hostKvBytes=0'] },
    want: [/router.kvMode pull-host .* set prefill.hostKvBytes/] },
  { name: 'an unknown kv mode', opts: { set: ['router.kvMode=pull-disk'] }, want: [/kvMode/] },
  { name: 'typo in kvOffload', opts: { set: ['decode.kvOffload.maxByte=1'] }, want: [/kvOffload/, /maxByte/] },
  { name: 'default-deny without the allow-list', opts: { set: ['networkPolicy.defaultDeny=true'] },
    want: ['networkPolicy.defaultDeny needs networkPolicy.enabled'] },
  { name: 'runtime class on AMD', opts: { preset: 'amd-mi355x', set: ['accelerator.runtimeClassName=nvidia'] },
    want: ['accelerator.runtimeClassName "nvidia" is for NVIDIA nodes'] },
  { name: 'metrics behind a key without API keys', opts: { set: ['auth.metricsNeedKey=true'] },
    want: ['auth.metricsNeedKey needs auth.apiKeys.existingSecret'] },
  { name: 'test key without the Secret', opts: { set: ['auth.apiKeys.testKeySecretKey=test-key'] },
    want: ['auth.apiKeys.testKeySecretKey "test-key" is set but auth.apiKeys.existingSecret is empty'] },
  { name: 'worker name without TLS', opts: { set: ['tls.existingSecret=pd-tls', 'tls.workerName=w.example'] },
    want: ['tls.workerName "w.example" is set but tls.enabled is false'] },
];

for (const version of [3, 4]) {
  for (const c of CASES) {
    test(`helm ${version}: ${c.name}`, () => {
      const err = renderError({ ...c.opts, helm: version });
      for (const w of c.want) {
        if (typeof w === 'string') assert.ok(err.includes(w), `expected ${JSON.stringify(w)} in:\n${err}`);
        else assert.match(err, w);
      }
    });
  }
}

test('several problems are reported together', () => {
  const err = renderError({ set: ['prefill.tensorParallel=3', 'ucx.preset=roce', 'decode.terminationGracePeriodSeconds=1'] });
  for (const w of ['prefill.tensorParallel', 'ucx.preset roce', 'decode.terminationGracePeriodSeconds']) assert.ok(err.includes(w), w);
});
