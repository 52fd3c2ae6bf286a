// Shared by the chart's test suites: the pinned tools (deploy/scripts/chart-tools.sh), rendering
// with Helm 3 or 4, and small helpers to find objects in a render.
import { execFileSync, spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const CHART = resolve(here, '../pdserve');
export const GOLDEN = join(here, 'golden');
export const KUBE_VERSION = '1.31.0';
// "default" is values.yaml alone; the others add values-<name>.yaml.
export const PRESETS = ['default', 'cpu', 'nvidia-h200', 'amd-mi355x'];
// Values files the tests add on top of a preset (values/<name>.yaml).
export const fixture = (name) => join(here, 'values', name);

function tools() {
  if (!process.env.HELM4 || !process.env.CHART_TOOLS_DIR) {
    const out = execFileSync('bash', [resolve(here, '../../scripts/chart-tools.sh')], { encoding: 'utf8' });
    for (const m of out.matchAll(/^export (\w+)='([^']*)'$/gm)) process.env[m[1]] = m[2];
  }
  return {
    helm: { 3: process.env.HELM3, 4: process.env.HELM4 },
    dir: process.env.CHART_TOOLS_DIR,
    nodeModules: process.env.CHART_TOOLS_NODE_MODULES,
    tsc: process.env.TSC,
  };
}
export const TOOLS = tools();
const requireTools = createRequire(join(TOOLS.dir, 'package.json'));
export const YAML = requireTools('yaml');

export function presetFiles(preset) {
  return preset === 'default' ? [] : [join(CHART, `values-${preset}.yaml`)];
}

// Runs helm; returns {status, stdout, stderr}.
export function helm(version, args) {
  const r = spawnSync(TOOLS.helm[version], args, { encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.error) throw r.error;
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

export function templateArgs({ preset = 'default', set = [], setJson = [], values = [], apiVersions = [],
                               release = 'pd', namespace = 'pdserve' } = {}) {
  const args = ['template', release, CHART, '--namespace', namespace, '--kube-version', KUBE_VERSION];
  for (const f of [...presetFiles(preset), ...values]) args.push('-f', f);
  for (const s of set) args.push('--set', s);
  for (const s of setJson) args.push('--set-json', s);
  for (const a of apiVersions) args.push('--api-versions', a);
  return args;
}

// helm template; throws with helm's stderr when it fails. Returns {text, docs}.
export function render(opts = {}) {
  const r = helm(opts.helm ?? 4, templateArgs(opts));
  if (r.status !== 0) throw new Error(`helm template failed (${JSON.stringify(opts)}):\n${r.stderr}`);
  return { text: r.stdout, docs: parseDocs(r.stdout) };
}

// helm template that must fail; returns stderr.
export function renderError(opts = {}) {
  const r = helm(opts.helm ?? 4, templateArgs(opts));
  if (r.status === 0) throw new Error(`helm template succeeded but should have failed (${JSON.stringify(opts)})`);
  return r.stderr;
}

export function parseDocs(text) {
  return YAML.parseAllDocuments(text).map((d) => {
    if (d.errors.length) throw new Error(`rendered YAML does not parse: ${d.errors[0].message}`);
    return d.toJS();
  }).filter((o) => o);
}

export const byKind = (docs, kind) => docs.filter((o) => o.kind === kind);
export function find(docs, kind, name) {
  const o = docs.find((d) => d.kind === kind && d.metadata.name === name);
  if (!o) throw new Error(`no ${kind}/${name} in the render (have: ${docs.map((d) => `${d.kind}/${d.metadata.name}`).join(', ')})`);
  return o;
}
export const deployment = (docs, component, release = 'pd') => find(docs, 'Deployment', `${release}-pdserve-${component}`);
export const mainContainer = (dep) => dep.spec.template.spec.containers[0];
export const args = (c) => c.args ?? [];
// The value of --flag=value in a container's args, or undefined; true for a bare --flag.
export function flag(c, name) {
  for (const a of args(c)) {
    if (a === name) return true;
    if (a.startsWith(`${name}=`)) return a.slice(name.length + 1);
  }
  return undefined;
}
export const envValue = (c, name) => (c.env ?? []).find((e) => e.name === name)?.value;

// Every pod spec in the render with where it came from: Deployments and bare Pods.
export function podSpecs(docs) {
  const out = [];
  for (const o of docs) {
    if (o.kind === 'Deployment') out.push({ owner: `Deployment/${o.metadata.name}`, labels: o.spec.template.metadata.labels, spec: o.spec.template.spec });
    if (o.kind === 'Pod') out.push({ owner: `Pod/${o.metadata.name}`, labels: o.metadata.labels, spec: o.spec });
  }
  return out;
}
export const allContainers = (spec) => [...(spec.initContainers ?? []), ...spec.containers];

// Kubernetes label-selector semantics (matchLabels + matchExpressions In/NotIn/Exists/DoesNotExist).
export function selects(selector, labels) {
  for (const [k, v] of Object.entries(selector.matchLabels ?? {})) if (labels[k] !== v) return false;
  for (const e of selector.matchExpressions ?? []) {
    const has = Object.hasOwn(labels, e.key);
    if (e.operator === 'In' && !(has && e.values.includes(labels[e.key]))) return false;
    if (e.operator === 'NotIn' && has && e.values.includes(labels[e.key])) return false;
    if (e.operator === 'Exists' && !has) return false;
    if (e.operator === 'DoesNotExist' && has) return false;
  }
  return true;
}

// apiVersion group -> the npm module with its kinds' schema models.
const PACKAGES = {
  '': 'kubernetes-models',
  'apps': 'kubernetes-models/apps',
  'policy': 'kubernetes-models/policy',
  'autoscaling': 'kubernetes-models/autoscaling',
  'networking.k8s.io': 'kubernetes-models/networking.k8s.io',
  'monitoring.coreos.com': '@kubernetes-models/prometheus-operator/monitoring.coreos.com',
  'keda.sh': '@kubernetes-models/keda/keda.sh',
};
export function modelPath(o) {
  const [group, version] = o.apiVersion.includes('/') ? o.apiVersion.split('/') : ['', o.apiVersion];
  const base = PACKAGES[group];
  if (!base) return undefined;
  return `${base}/${version}`;
}

// kubernetes-models' ajv validation (types, required fields, enums, formats) of every object in a
// render; one message per failure. A kind with no model fails: nothing rendered goes unchecked.
export async function kubeModelFailures(docs) {
  const failures = [];
  for (const o of docs) {
    const mp = modelPath(o);
    const where = `${o.kind}/${o.metadata?.name}`;
    if (!mp) { failures.push(`${where}: no schema model for apiVersion ${o.apiVersion}`); continue; }
    let Model;
    try {
      Model = (await import(pathToFileURL(join(TOOLS.nodeModules, mp, `${o.kind}.js`)).href))[o.kind];
    } catch (e) {
      failures.push(`${where}: no schema model ${mp}/${o.kind} (${e.code ?? e.message})`);
      continue;
    }
    try { new Model(o).validate(); } catch (e) { failures.push(`${where}: ${e.message}`); }
  }
  return failures;
}
