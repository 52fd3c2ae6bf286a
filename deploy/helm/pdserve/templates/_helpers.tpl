{{/* Names ------------------------------------------------------------------------------------ */}}

{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Kept short: "-router-registry" and the role suffixes must still fit in 63 characters. */}}
{{- define "pdserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels ------------------------------------------------------------------------------------ */}}

{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pdserve.labels" -}}
helm.sh/chart: {{ include "pdserve.chart" . }}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdserve
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A component's selector: the release's plus app.kubernetes.io/component. ctx: {root, component} */}}
{{- define "pdserve.componentSelectorLabels" -}}
{{ include "pdserve.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pdserve.componentLabels" -}}
{{ include "pdserve.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image ------------------------------------------------------------------------------------- */}}

{{- define "pdserve.imageTag" -}}
{{- if .Values.image.tag -}}
{{- .Values.image.tag -}}
{{- else -}}
{{- get (dict "cpu" "cpu" "nvidia" "cuda" "amd" "rocm") .Values.accelerator.vendor -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest (a digest names one build whatever the tag says). */}}
{{- define "pdserve.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (include "pdserve.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{/* Accelerator ------------------------------------------------------------------------------- */}}

{{/* The GPU resource name, or "" on CPU. */}}
{{- define "pdserve.gpuResource" -}}
{{- if ne .Values.accelerator.vendor "cpu" -}}
{{- default (get (dict "nvidia" "nvidia.com/gpu" "amd" "amd.com/gpu") .Values.accelerator.vendor) .Values.accelerator.resourceName -}}
{{- end -}}
{{- end -}}

{{/* KV compatibility ---------------------------------------------------------------------------
One value for prefill and decode, computed from everything that decides whether a prefill worker's
KV blocks mean the same thing to a decode worker. */}}
{{- define "pdserve.kvCompat" -}}
{{- if .Values.kvCompat.override -}}
{{- .Values.kvCompat.override -}}
{{- else -}}
{{- $fields := list
      (printf "model=%s" .Values.model.name)
      (printf "revision=%s" (.Values.model.revision | toString))
      (printf "dtype=%s" .Values.engine.weightDtype)
      (printf "block=%d" (.Values.engine.blockSize | int))
      (printf "layout=%s" (.Values.engine.kvLayoutVersion | toString))
      (printf "image=%s" (include "pdserve.image" .)) -}}
{{- /* The KV dtype only when not f32: an f32 release keeps the value it had before the field existed. */ -}}
{{- if ne .Values.engine.kvDtype "f32" -}}
{{- $fields = append $fields (printf "kv=%s" .Values.engine.kvDtype) -}}
{{- end -}}
{{- /* Likewise the GEMM precision when not exact: the KV a prefill writes is computed with it. */ -}}
{{- if ne .Values.engine.gemmPrecision "exact" -}}
{{- $fields = append $fields (printf "gemm=%s" .Values.engine.gemmPrecision) -}}
{{- end -}}
{{- join "\n" $fields | sha256sum | trunc 16 -}}
{{- end -}}
{{- end -}}

{{/* Workloads --------------------------------------------------------------------------------- */}}

{{/* The worker roles the mode deploys, as a JSON list (include returns text): prefill and decode, or
aggregated alone. ctx: root */}}
{{- define "pdserve.workerRoles" -}}
{{- if eq .Values.mode "aggregated" -}}
["aggregated"]
{{- else -}}
["prefill","decode"]
{{- end -}}
{{- end -}}

{{/* Router addresses ---------------------------------------------------------------------------- */}}

{{- define "pdserve.routerServiceName" -}}
{{- printf "%s-router" (include "pdserve.fullname" .) -}}
{{- end -}}

{{/* Headless, publishNotReadyAddresses: workers must register while the router is still not ready
(it is not ready until workers exist), and they register with every address the name resolves to. */}}
{{- define "pdserve.routerRegistryName" -}}
{{- printf "%s-router-registry" (include "pdserve.fullname" .) -}}
{{- end -}}

{{/* Fully qualified Service names: what the workers (registry) and TLS clients (client Service)
dial, and so what the router's certificate must name. */}}
{{- define "pdserve.routerRegistryHost" -}}
{{- printf "%s.%s.svc.%s" (include "pdserve.routerRegistryName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "pdserve.routerServiceHost" -}}
{{- printf "%s.%s.svc.%s" (include "pdserve.routerServiceName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "pdserve.routerRegistryAddress" -}}
{{- printf "%s:%d" (include "pdserve.routerRegistryHost" .) (.Values.router.ports.grpc | int) -}}
{{- end -}}

{{/* Probes, shutdown ---------------------------------------------------------------------------- */}}

{{/* ceil(startupMaxSeconds / periodSeconds). ctx: a probes block */}}
{{- define "pdserve.startupFailureThreshold" -}}
{{- $max := .startupMaxSeconds | int -}}
{{- $period := .periodSeconds | int -}}
{{- div (add $max (sub $period 1)) $period -}}
{{- end -}}

{{/* preStop + drain + margin, unless set. ctx: a role block (workers) */}}
{{- define "pdserve.workerGracePeriod" -}}
{{- if kindIs "invalid" .terminationGracePeriodSeconds -}}
{{- add (.drain.preStopSeconds | int) (.drain.drainTimeoutSeconds | int) (.drain.marginSeconds | int) -}}
{{- else -}}
{{- .terminationGracePeriodSeconds | int -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.routerGracePeriod" -}}
{{- if kindIs "invalid" .terminationGracePeriodSeconds -}}
{{- add (.drain.preStopSeconds | int) (.drain.drainTimeoutSeconds | int) (.drain.marginSeconds | int) -}}
{{- else -}}
{{- .terminationGracePeriodSeconds | int -}}
{{- end -}}
{{- end -}}

{{/* The kubelet's own sleep handler: the image has no shell or /bin/sleep. Omitted at 0 (a 0 s sleep
needs Kubernetes 1.32). ctx: seconds */}}
{{- define "pdserve.preStop" -}}
{{- if gt (. | int) 0 -}}
lifecycle:
  preStop:
    sleep:
      seconds: {{ . | int }}
{{- end }}
{{- end -}}

{{/* Memory ------------------------------------------------------------------------------------- */}}

{{/* /dev/shm size. ctx: a role block */}}
{{- define "pdserve.shmSize" -}}
{{- if .shm.sizeLimit -}}
{{- .shm.sizeLimit -}}
{{- else -}}
{{- $mib := mul (.shm.perRankMiB | int) (.tensorParallel | int) -}}
{{- if eq (mod $mib 1024) 0 -}}
{{- printf "%dGi" (div $mib 1024) -}}
{{- else -}}
{{- printf "%dMi" $mib -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Security ----------------------------------------------------------------------------------- */}}

{{- define "pdserve.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser | int }}
runAsGroup: {{ .Values.security.runAsGroup | int }}
fsGroup: {{ .Values.security.fsGroup | int }}
seccompProfile:
  type: RuntimeDefault
{{- with .Values.accelerator.supplementalGroups }}
supplementalGroups:
{{- range . }}
  - {{ . | int }}
{{- end }}
{{- end }}
{{- end -}}

{{/* ctx: {rdma: bool} — IPC_LOCK only when RDMA pins memory. */}}
{{- define "pdserve.containerSecurityContext" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- if .rdma }}
  add: [IPC_LOCK]
{{- end }}
{{- end -}}

{{/* Model ---------------------------------------------------------------------------------------- */}}

{{/* The settings every pdserve container shares, as a dict: the ConfigMap's data. PDSERVE_MODEL_PATH /
XDG_CACHE_HOME make `--model NAME` resolve to the mounted copy; UCX_* only matter to the workers. */}}
{{- define "pdserve.sharedEnv" -}}
{{- $m := .Values.model -}}
{{- $env := dict "PDSERVE_LOG_LEVEL" .Values.logLevel -}}
{{- if or (eq $m.source "pvc") (eq $m.source "hostPath") -}}
{{- $_ := set $env "PDSERVE_MODEL_PATH" "/models" -}}
{{- else if eq $m.source "image" -}}
{{- $_ := set $env "PDSERVE_MODEL_PATH" $m.image.path -}}
{{- else if eq $m.source "download" -}}
{{- /* The resolver's cache is $XDG_CACHE_HOME/pdserve/models; naming it in PDSERVE_MODEL_PATH too
keeps the image's own PDSERVE_MODEL_PATH from being searched first. */ -}}
{{- $_ := set $env "XDG_CACHE_HOME" "/models" -}}
{{- $_ := set $env "PDSERVE_MODEL_PATH" "/models/pdserve/models" -}}
{{- end -}}
{{- $env = merge $env (include "pdserve.ucxEnv" . | fromYaml) -}}
{{- toYaml $env -}}
{{- end -}}

{{- define "pdserve.modelVolumes" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "pvc" -}}
- name: model
  persistentVolumeClaim:
    claimName: {{ $m.pvc.claimName }}
    readOnly: true
{{- else if eq $m.source "hostPath" -}}
- name: model
  hostPath:
    path: {{ $m.hostPath.path }}
    type: {{ $m.hostPath.type }}
{{- else if eq $m.source "download" -}}
- name: model
  emptyDir:
    sizeLimit: {{ $m.download.sizeLimit }}
{{- end }}
{{- end -}}

{{- define "pdserve.modelMounts" -}}
{{- $m := .Values.model -}}
{{- if ne $m.source "image" -}}
- name: model
  mountPath: /models
  readOnly: true
{{- if and (eq $m.source "pvc") $m.pvc.subPath }}
  subPath: {{ $m.pvc.subPath }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The CLI's resolver fetches a registered model and checks each file's sha256; generating one token
then proves the files load. It runs on CPU, which is only sensible for small registered models. */}}
{{- define "pdserve.modelInitContainers" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "download" -}}
- name: fetch-model
  image: {{ include "pdserve.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [/opt/pdserve/bin/pdserve]
  args: [generate, --model, {{ $m.name | quote }}, --device, cpu, --max-tokens, "1", --prompt, x]
  env:
    - name: XDG_CACHE_HOME
      value: /models
    - name: PDSERVE_MODEL_PATH
      value: /models/pdserve/models
    - name: PDSERVE_LOG_LEVEL
      value: {{ .Values.logLevel | quote }}
{{- with $m.download.baseUrl }}
    - name: PDSERVE_MODEL_BASE_URL
      value: {{ . | quote }}
{{- end }}
  securityContext:
    {{- include "pdserve.containerSecurityContext" (dict "rdma" false) | nindent 4 }}
  resources:
    {{- toYaml $m.download.resources | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: /models
    - name: tmp
      mountPath: /tmp
{{- end }}
{{- end -}}

{{/* UCX ------------------------------------------------------------------------------------------ */}}

{{/* The preset's variables as a dict (name -> value). GPU memory types come from the vendor: UCX must
be told it may move cuda/rocm memory, or it treats device pointers as host memory. KV only ever moves
between pods (a prefill and a decode worker), so no shared-memory or GPU-IPC transport: pods on one
node share the boot id UCX uses to judge sm/cuda_ipc reachable, but not /dev/shm or the IPC
namespace, and such a lane fails at connect time. */}}
{{- define "pdserve.ucxEnv" -}}
{{- $u := .Values.ucx -}}
{{- $vendor := .Values.accelerator.vendor -}}
{{- $mem := get (dict "nvidia" ",cuda_copy" "amd" ",rocm_copy" "cpu" "") $vendor -}}
{{- $env := dict -}}
{{- if eq $u.preset "ib" -}}
{{- $_ := set $env "UCX_TLS" (printf "rc_x,rc,dc_x,dc,self%s" $mem) -}}
{{- $_ := set $env "UCX_RNDV_SCHEME" "get_zcopy" -}}
{{- else if or (eq $u.preset "roce") (eq $u.preset "amd-ionic") -}}
{{- /* Ethernet link layer: the GID, not a LID, addresses the peer. */ -}}
{{- $_ := set $env "UCX_TLS" (printf "rc_x,rc,self%s" $mem) -}}
{{- $_ := set $env "UCX_RNDV_SCHEME" "get_zcopy" -}}
{{- $_ := set $env "UCX_IB_ADDR_TYPE" "eth" -}}
{{- $_ := set $env "UCX_IB_GID_INDEX" ($u.gidIndex | int | toString) -}}
{{- else if eq $u.preset "tcp" -}}
{{- $_ := set $env "UCX_TLS" (printf "tcp,self%s" $mem) -}}
{{- end -}}
{{- if $u.netDevices -}}
{{- $_ := set $env "UCX_NET_DEVICES" $u.netDevices -}}
{{- end -}}
{{- range $k, $v := $u.env -}}
{{- $_ := set $env $k ($v | toString) -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}

{{/* Authentication ------------------------------------------------------------------------------- */}}

{{/* Only references to Secrets the user created: no secret value is ever rendered. Each Secret's key
is mounted as a file in a directory of its own (no subPath, so an updated Secret reaches the file;
the programs read it when they start). */}}
{{- define "pdserve.apiKeysFile" -}}/etc/pdserve/api-keys/keys{{- end -}}
{{- define "pdserve.clusterTokenFile" -}}/etc/pdserve/cluster-token/token{{- end -}}
{{- define "pdserve.kvKeyFile" -}}/etc/pdserve/kv-key/kv.key{{- end -}}

{{/* The Secret key holding the one API key the chart's own clients send (helm test, ServiceMonitor). */}}
{{- define "pdserve.testKeySecretKey" -}}
{{- default .Values.auth.apiKeys.secretKey .Values.auth.apiKeys.testKeySecretKey -}}
{{- end -}}

{{/* Auth flags, one "- flag" line each. ctx: {root, router: bool} (workers: the cluster token and the kvtransfer key) */}}
{{- define "pdserve.authArgs" -}}
{{- $a := .root.Values.auth -}}
{{- $args := list -}}
{{- if and .router $a.apiKeys.existingSecret -}}
{{- $args = append $args (printf "--api-key-file=%s" (include "pdserve.apiKeysFile" .root)) -}}
{{- if $a.metricsNeedKey -}}
{{- $args = append $args "--metrics-auth" -}}
{{- end -}}
{{- end -}}
{{- if $a.clusterToken.existingSecret -}}
{{- $args = append $args (printf "--cluster-token-file=%s" (include "pdserve.clusterTokenFile" .root)) -}}
{{- end -}}
{{- /* Prefill and decode only: the router moves no KV (an aggregated worker refuses the flag). */ -}}
{{- if and (not .router) $a.kvKey.existingSecret -}}
{{- $args = append $args (printf "--kv-key-file=%s" (include "pdserve.kvKeyFile" .root)) -}}
{{- end -}}
{{- range $i, $arg := $args }}{{ if $i }}{{ "\n" }}{{ end }}- {{ $arg }}{{ end -}}
{{- end -}}

{{/* ctx: {root, router: bool} */}}
{{- define "pdserve.authVolumes" -}}
{{- $a := .root.Values.auth -}}
{{- $out := list -}}
{{- if and .router $a.apiKeys.existingSecret -}}
{{- $out = append $out (dict "name" "api-keys" "secret" $a.apiKeys.existingSecret "key" $a.apiKeys.secretKey "path" (include "pdserve.apiKeysFile" .root | base)) -}}
{{- end -}}
{{- if $a.clusterToken.existingSecret -}}
{{- $out = append $out (dict "name" "cluster-token" "secret" $a.clusterToken.existingSecret "key" $a.clusterToken.secretKey "path" (include "pdserve.clusterTokenFile" .root | base)) -}}
{{- end -}}
{{- if and (not .router) $a.kvKey.existingSecret -}}
{{- $out = append $out (dict "name" "kv-key" "secret" $a.kvKey.existingSecret "key" $a.kvKey.secretKey "path" (include "pdserve.kvKeyFile" .root | base)) -}}
{{- end -}}
{{- range $i, $v := $out }}
{{- if $i }}{{ "\n" }}{{ end -}}
- name: {{ $v.name }}
  secret:
    secretName: {{ $v.secret | quote }}
    items:
      - key: {{ $v.key | quote }}
        path: {{ $v.path }}
    # 0440: the pods' fsGroup reads it, nobody else.
    defaultMode: 288
{{- end -}}
{{- end -}}

{{/* ctx: {root, router: bool} */}}
{{- define "pdserve.authMounts" -}}
{{- $a := .root.Values.auth -}}
{{- $out := list -}}
{{- if and .router $a.apiKeys.existingSecret -}}
{{- $out = append $out (dict "name" "api-keys" "dir" (include "pdserve.apiKeysFile" .root | dir)) -}}
{{- end -}}
{{- if $a.clusterToken.existingSecret -}}
{{- $out = append $out (dict "name" "cluster-token" "dir" (include "pdserve.clusterTokenFile" .root | dir)) -}}
{{- end -}}
{{- if and (not .router) $a.kvKey.existingSecret -}}
{{- $out = append $out (dict "name" "kv-key" "dir" (include "pdserve.kvKeyFile" .root | dir)) -}}
{{- end -}}
{{- range $i, $v := $out }}
{{- if $i }}{{ "\n" }}{{ end -}}
- name: {{ $v.name }}
  mountPath: {{ $v.dir }}
  readOnly: true
{{- end -}}
{{- end -}}

{{/* The helm test pod's API key, from the Secret (PDSERVE_API_KEY: pdserve check and generate read it). */}}
{{- define "pdserve.testApiKeyEnv" -}}
{{- with .Values.auth.apiKeys.existingSecret -}}
- name: PDSERVE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ include "pdserve.testKeySecretKey" $ | quote }}
{{- end -}}
{{- end -}}

{{/* TLS ------------------------------------------------------------------------------------------ */}}

{{/* tls.existingSecret's three keys (cert-manager's layout), mounted as files of one directory (no
subPath, so a renewed certificate reaches the files; the programs read them when they start). */}}
{{- define "pdserve.tlsDir" -}}/etc/pdserve/tls{{- end -}}

{{/* The name the router checks every worker's certificate against (--tls-worker-name). */}}
{{- define "pdserve.tlsWorkerName" -}}
{{- default (printf "%s-worker.%s.svc.%s" (include "pdserve.fullname" .) .Release.Namespace .Values.clusterDomain) .Values.tls.workerName -}}
{{- end -}}

{{/* TLS flags, one "- flag" line each: the same three files for the router and the workers (a
worker's TLS is always mutual), and the workers' certificate name for the router. ctx: {root, router: bool} */}}
{{- define "pdserve.tlsArgs" -}}
{{- if .root.Values.tls.enabled -}}
{{- $dir := include "pdserve.tlsDir" .root -}}
- --tls-cert={{ $dir }}/tls.crt
- --tls-key={{ $dir }}/tls.key
- --tls-ca={{ $dir }}/ca.crt
{{- if .router }}
- --tls-worker-name={{ include "pdserve.tlsWorkerName" .root }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The Secret volume: all three keys, or only ca.crt (the helm test pod, a client). A missing key
keeps the pod from starting (FailedMount). ctx: {root, caOnly: bool} */}}
{{- define "pdserve.tlsVolume" -}}
{{- if .root.Values.tls.enabled -}}
- name: tls
  secret:
    secretName: {{ .root.Values.tls.existingSecret | quote }}
    items:
{{- $keys := ternary (list "ca.crt") (list "tls.crt" "tls.key" "ca.crt") .caOnly }}
{{- range $keys }}
      - key: {{ . }}
        path: {{ . }}
{{- end }}
    # 0440: the pods' fsGroup reads it, nobody else.
    defaultMode: 288
{{- end -}}
{{- end -}}

{{/* ctx: root */}}
{{- define "pdserve.tlsMount" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  mountPath: {{ include "pdserve.tlsDir" . }}
  readOnly: true
{{- end -}}
{{- end -}}

{{/* Monitoring ----------------------------------------------------------------------------------- */}}

{{/* "true" when a monitoring object of this kind renders. ctx: {root, enabled, key} */}}
{{- define "pdserve.monitoringOn" -}}
{{- $has := .root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}
{{- if eq (toString .enabled) "auto" -}}
{{- if $has }}true{{ end -}}
{{- else if eq (toString .enabled) "true" -}}
{{- if not $has -}}
{{- fail (printf "%s is true but the cluster serves no monitoring.coreos.com/v1 API: install the prometheus-operator CRDs, pass --api-versions monitoring.coreos.com/v1 to helm template, or set it to auto" .key) -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The label selector that picks this release's pdserve metrics in PromQL. ctx: root */}}
{{- define "pdserve.promSelector" -}}
namespace="{{ .Release.Namespace }}",app_kubernetes_io_instance="{{ .Release.Name }}"
{{- end -}}
