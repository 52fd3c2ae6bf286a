{{/* Cross-field checks that values.schema.json cannot express. Each message starts with the key to fix.
Called once, from validate.yaml. */}}
{{- define "pdserve.validate" -}}
{{- $v := .Values -}}
{{- $errors := list -}}

{{- /* Accelerator: the device each vendor's workers run. */ -}}
{{- $devices := dict "cpu" (list "cpu" "emulated") "nvidia" (list "cuda") "amd" (list "hip") -}}
{{- if not (has $v.accelerator.device (get $devices $v.accelerator.vendor)) -}}
{{- $errors = append $errors (printf "accelerator.device %q does not match accelerator.vendor %q: vendor cpu runs device cpu (or emulated), nvidia runs cuda, amd runs hip" $v.accelerator.device $v.accelerator.vendor) -}}
{{- end -}}
{{- if and (eq $v.accelerator.vendor "cpu") $v.accelerator.resourceName -}}
{{- $errors = append $errors (printf "accelerator.resourceName %q is set but accelerator.vendor is cpu: CPU workers request no GPU" $v.accelerator.resourceName) -}}
{{- end -}}
{{- if and (ne $v.accelerator.vendor "nvidia") $v.accelerator.runtimeClassName -}}
{{- $errors = append $errors (printf "accelerator.runtimeClassName %q is for NVIDIA nodes; accelerator.vendor is %s" $v.accelerator.runtimeClassName $v.accelerator.vendor) -}}
{{- end -}}
{{- if and (eq $v.accelerator.device "cpu") (ne $v.engine.kvDtype "f32") -}}
{{- $errors = append $errors (printf "engine.kvDtype %s needs a GPU device: CPU workers keep an f32 KV cache (accelerator.device is cpu)" $v.engine.kvDtype) -}}
{{- end -}}
{{- if and $v.engine.asyncScheduling (eq $v.accelerator.device "cpu") -}}
{{- $errors = append $errors "engine.asyncScheduling reads sampled tokens on a GPU: CPU workers sample on the host (accelerator.device is cpu)" -}}
{{- end -}}
{{- if and (gt ($v.engine.cpuThreads | int) 1) (ne $v.accelerator.device "cpu") -}}
{{- $errors = append $errors (printf "engine.cpuThreads %d is for CPU workers: a GPU backend's kernels run on its device (accelerator.device is %s)" ($v.engine.cpuThreads | int) $v.accelerator.device) -}}
{{- end -}}
{{- if and $v.engine.decodeGraphs (eq $v.accelerator.device "cpu") -}}
{{- $errors = append $errors "engine.decodeGraphs records GPU graphs: CPU workers run every step eagerly (accelerator.device is cpu)" -}}
{{- end -}}
{{- if ne $v.engine.gemmPrecision "exact" -}}
{{- if eq $v.accelerator.device "cpu" -}}
{{- $errors = append $errors (printf "engine.gemmPrecision %s needs a GPU device: CPU workers multiply f32 activations (accelerator.device is cpu)" $v.engine.gemmPrecision) -}}
{{- else if ne $v.engine.weightDtype "bf16" -}}
{{- $errors = append $errors (printf "engine.gemmPrecision %s multiplies bf16 activations by bf16 weights: it needs engine.weightDtype bf16, not %s" $v.engine.gemmPrecision $v.engine.weightDtype) -}}
{{- end -}}
{{- end -}}
{{- $gpu := include "pdserve.gpuResource" . -}}

{{- /* Model source. */ -}}
{{- $m := $v.model -}}
{{- if or (contains "/" $m.name) (eq $m.name ".") (eq $m.name "..") -}}
{{- $errors = append $errors (printf "model.name %q must be a name (a directory inside the model volume), not a path" $m.name) -}}
{{- end -}}
{{- if and (eq $m.source "pvc") (not $m.pvc.claimName) -}}
{{- $errors = append $errors "model.pvc.claimName must be set when model.source is pvc" -}}
{{- end -}}
{{- if and (eq $m.source "hostPath") (not $m.hostPath.path) -}}
{{- $errors = append $errors "model.hostPath.path must be set when model.source is hostPath" -}}
{{- end -}}

{{- /* RDMA and UCX. */ -}}
{{- $preset := $v.ucx.preset -}}
{{- if and (has $preset (list "ib" "roce" "amd-ionic")) (not $v.rdma.enabled) -}}
{{- $errors = append $errors (printf "ucx.preset %s configures RDMA transports but rdma.enabled is false: enable rdma (device resource, IPC_LOCK) or use ucx.preset tcp/none" $preset) -}}
{{- end -}}
{{- if and (eq $preset "tcp") $v.rdma.enabled -}}
{{- $errors = append $errors "ucx.preset tcp limits UCX to TCP but rdma.enabled is true: pick ib, roce or amd-ionic (or disable rdma)" -}}
{{- end -}}
{{- if and $v.rdma.required (not $v.rdma.enabled) -}}
{{- $errors = append $errors "rdma.required is true but rdma.enabled is false: the workers could never become ready" -}}
{{- end -}}

{{- /* Router. */ -}}
{{- $r := $v.router -}}
{{- $rMin := ternary ($r.autoscaling.minReplicas | int) ($r.replicas | int) $r.autoscaling.enabled -}}
{{- if and $r.pdb.enabled (ge ($r.pdb.minAvailable | int) $rMin) -}}
{{- $errors = append $errors (printf "router.pdb.minAvailable (%d) must be lower than the router's replica count (%d), or no router could ever be evicted and node drains would hang; raise router.replicas or disable router.pdb" ($r.pdb.minAvailable | int) $rMin) -}}
{{- end -}}
{{- if and $r.autoscaling.enabled (gt ($r.autoscaling.minReplicas | int) ($r.autoscaling.maxReplicas | int)) -}}
{{- $errors = append $errors "router.autoscaling.minReplicas must not exceed router.autoscaling.maxReplicas" -}}
{{- end -}}
{{- $rNeed := add ($r.drain.preStopSeconds | int) ($r.drain.drainTimeoutSeconds | int) ($r.drain.marginSeconds | int) -}}
{{- if and (not (kindIs "invalid" $r.terminationGracePeriodSeconds)) (lt ($r.terminationGracePeriodSeconds | int) $rNeed) -}}
{{- $errors = append $errors (printf "router.terminationGracePeriodSeconds (%d) is lower than router.drain.preStopSeconds + drainTimeoutSeconds + marginSeconds (%d + %d + %d = %d): the kubelet would kill streams mid-drain" ($r.terminationGracePeriodSeconds | int) ($r.drain.preStopSeconds | int) ($r.drain.drainTimeoutSeconds | int) ($r.drain.marginSeconds | int) $rNeed) -}}
{{- end -}}
{{- if gt ($r.probes.periodSeconds | int) ($r.probes.startupMaxSeconds | int) -}}
{{- $errors = append $errors "router.probes.startupMaxSeconds must be at least router.probes.periodSeconds" -}}
{{- end -}}
{{- if eq ($r.ports.grpc | int) ($r.ports.http | int) -}}
{{- $errors = append $errors "router.ports.http must differ from router.ports.grpc" -}}
{{- end -}}

{{- /* Mode aggregated: nothing moves KV and no prefill/decode worker runs, so every value that only
acts on those is refused, not dropped. The chart's defaults hold prefill and decode blocks and a
value set there cannot be told from them: the blocks must be removed altogether. */ -}}
{{- $aggregated := eq $v.mode "aggregated" -}}
{{- if $aggregated -}}
{{- range $role := list "prefill" "decode" -}}
{{- if hasKey $v $role -}}
{{- $errors = append $errors (printf "%s is set but mode is aggregated, which runs no %s workers: remove the block (%s: null in a values file, --set %s=null) and size the aggregated workers with aggregated.*" $role $role $role $role) -}}
{{- end -}}
{{- end -}}
{{- $ratio := default (dict) (get $v "ratio") -}}
{{- range $bound := list "prefillPerDecodeMin" "prefillPerDecodeMax" -}}
{{- if and (hasKey $ratio $bound) (not (kindIs "invalid" (get $ratio $bound))) -}}
{{- $errors = append $errors (printf "ratio.%s is set but mode is aggregated: there is no prefill:decode ratio to bound" $bound) -}}
{{- end -}}
{{- end -}}
{{- if ne $v.router.kvMode "push" -}}
{{- $errors = append $errors (printf "router.kvMode %s says how decode fetches KV from prefill, but mode aggregated moves no KV (the router runs --kv-mode=aggregated): leave router.kvMode at push" $v.router.kvMode) -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.router.localPrefillTokens) -}}
{{- $errors = append $errors "router.localPrefillTokens chooses between a decode and a prefill worker, but mode aggregated runs neither (the router refuses --local-prefill-tokens with --kv-mode=aggregated): leave it null" -}}
{{- end -}}
{{- if or $v.rdma.enabled $v.rdma.required -}}
{{- $errors = append $errors "rdma.enabled / rdma.required are set but mode is aggregated: aggregated workers move no KV, so they request no RDMA device and refuse --require-rdma" -}}
{{- end -}}
{{- if or (ne $v.ucx.preset "none") $v.ucx.netDevices $v.ucx.env -}}
{{- $errors = append $errors (printf "ucx.preset (%s), ucx.netDevices or ucx.env is set but mode is aggregated: aggregated workers do not use UCX; set ucx.preset none and leave netDevices and env empty" $v.ucx.preset) -}}
{{- end -}}
{{- if $v.auth.kvKey.existingSecret -}}
{{- $errors = append $errors (printf "auth.kvKey.existingSecret %q is set but mode is aggregated: there is no KV control channel to encrypt (aggregated workers refuse --kv-key-file)" $v.auth.kvKey.existingSecret) -}}
{{- end -}}
{{- end -}}

{{- if and (not $aggregated) (eq $v.router.kvMode "pull-host") (not (gt (default 0 $v.prefill.hostKvBytes | int64) 0)) -}}
{{- $errors = append $errors "router.kvMode pull-host has decode read prompts from the prefill workers' host KV tier: set prefill.hostKvBytes (the router refuses prefill workers without one)" -}}
{{- end -}}

{{- /* The mode's worker roles: prefill and decode, or aggregated. */ -}}
{{- range $role := include "pdserve.workerRoles" . | fromJsonArray -}}
{{- $w := get $v $role -}}
{{- $tp := $w.tensorParallel | int -}}
{{- if not (has $tp (list 1 2 4 8)) -}}
{{- $errors = append $errors (printf "%s.tensorParallel must be 1, 2, 4 or 8 (got %d)" $role $tp) -}}
{{- end -}}
{{- if and $v.engine.decodeGraphs (ne $role "prefill") (gt $tp 1) -}}
{{- $errors = append $errors (printf "engine.decodeGraphs records decode steps at tensor parallelism 1 only: %s.tensorParallel is %d (set it to 1, or engine.decodeGraphs false)" $role $tp) -}}
{{- end -}}
{{- range $kind := list "requests" "limits" -}}
{{- $res := default (dict) (get $w.resources $kind) -}}
{{- if and $gpu (hasKey $res $gpu) -}}
{{- $errors = append $errors (printf "%s.resources.%s must not set %s: the chart requests %s.tensorParallel GPUs" $role $kind $gpu $role) -}}
{{- end -}}
{{- range $name := list "nvidia.com/gpu" "amd.com/gpu" -}}
{{- if and (hasKey $res $name) (ne $name $gpu) -}}
{{- $errors = append $errors (printf "%s.resources.%s requests %s but accelerator.vendor is %s" $role $kind $name $v.accelerator.vendor) -}}
{{- end -}}
{{- end -}}
{{- if and $v.rdma.enabled (hasKey $res $v.rdma.resourceName) -}}
{{- $errors = append $errors (printf "%s.resources.%s must not set %s: the chart requests rdma.perGpu per rank" $role $kind $v.rdma.resourceName) -}}
{{- end -}}
{{- end -}}
{{- $need := add ($w.drain.preStopSeconds | int) ($w.drain.drainTimeoutSeconds | int) ($w.drain.marginSeconds | int) -}}
{{- if and (not (kindIs "invalid" $w.terminationGracePeriodSeconds)) (lt ($w.terminationGracePeriodSeconds | int) $need) -}}
{{- $errors = append $errors (printf "%s.terminationGracePeriodSeconds (%d) is lower than %s.drain.preStopSeconds + drainTimeoutSeconds + marginSeconds (%d + %d + %d = %d): the kubelet would kill streams and KV transfers mid-drain" $role ($w.terminationGracePeriodSeconds | int) $role ($w.drain.preStopSeconds | int) ($w.drain.drainTimeoutSeconds | int) ($w.drain.marginSeconds | int) $need) -}}
{{- end -}}
{{- if gt ($w.probes.periodSeconds | int) ($w.probes.startupMaxSeconds | int) -}}
{{- $errors = append $errors (printf "%s.probes.startupMaxSeconds must be at least %s.probes.periodSeconds" $role $role) -}}
{{- end -}}
{{- if and (eq (toString $w.rollout.maxSurge) "0") (eq (toString $w.rollout.maxUnavailable) "0") -}}
{{- $errors = append $errors (printf "%s.rollout.maxSurge and %s.rollout.maxUnavailable are both 0: a rollout could never start" $role $role) -}}
{{- end -}}
{{- with $w.kvOffload -}}
{{- if and .enabled (not (gt (default 0 $w.hostKvBytes | int64) 0)) -}}
{{- $errors = append $errors (printf "%s.kvOffload.enabled needs %s.hostKvBytes: the filesystem tier stores and loads through the host tier" $role $role) -}}
{{- end -}}
{{- if and .enabled (ne (len (keys .volume)) 1) -}}
{{- $errors = append $errors (printf "%s.kvOffload.volume must name one volume source (e.g. emptyDir or persistentVolumeClaim), not %d" $role (len (keys .volume))) -}}
{{- end -}}
{{- if and (not .enabled) (not (kindIs "invalid" .loadTimeoutMs)) -}}
{{- $errors = append $errors (printf "%s.kvOffload.loadTimeoutMs bounds the filesystem tier's loads: it needs %s.kvOffload.enabled" $role $role) -}}
{{- end -}}
{{- $sizeLimit := dig "emptyDir" "sizeLimit" "" .volume -}}
{{- if and .enabled $sizeLimit (kindIs "invalid" .maxBytes) -}}
{{- $errors = append $errors (printf "%s.kvOffload.maxBytes must be set with an emptyDir sizeLimit (%s): the kubelet evicts a pod whose emptyDir outgrows it" $role $sizeLimit) -}}
{{- end -}}
{{- end -}}
{{- if and $w.hugepages.enabled (not (hasKey (default (dict) $w.resources.requests) "memory")) -}}
{{- $errors = append $errors (printf "%s.hugepages.enabled needs %s.resources.requests.memory (Kubernetes requires a memory or CPU request beside hugepages)" $role $role) -}}
{{- end -}}
{{- /* As strings: int and int64 never compare equal. */ -}}
{{- $ports := list ($w.ports.grpc | int | toString) ($w.ports.probe | int | toString) -}}
{{- if hasKey $w.ports "kv" -}}
{{- range $rank := until $tp -}}
{{- $ports = append $ports (add ($w.ports.kv | int) $rank | toString) -}}
{{- end -}}
{{- end -}}
{{- if ne (len $ports) (len (uniq $ports)) -}}
{{- $errors = append $errors (printf "%s.ports: %s must not overlap" $role (ternary "grpc, probe and kv .. kv+tensorParallel-1" "grpc and probe" (hasKey $w.ports "kv"))) -}}
{{- end -}}
{{- $a := $w.autoscaling -}}
{{- if $a.enabled -}}
{{- if gt ($a.minReplicas | int) ($a.maxReplicas | int) -}}
{{- $errors = append $errors (printf "%s.autoscaling.minReplicas must not exceed %s.autoscaling.maxReplicas" $role $role) -}}
{{- end -}}
{{- if and (eq $a.kind "hpa") (lt ($a.minReplicas | int) 1) -}}
{{- $errors = append $errors (printf "%s.autoscaling.minReplicas must be at least 1 with kind hpa (only KEDA scales to zero)" $role) -}}
{{- end -}}
{{- if and (eq $a.kind "hpa") (not $a.hpa.metrics) -}}
{{- $errors = append $errors (printf "%s.autoscaling.hpa.metrics must list at least one metric (a GPU worker's CPU use says nothing about its load)" $role) -}}
{{- end -}}
{{- if and (eq $a.kind "keda") (not $a.keda.serverAddress) -}}
{{- $errors = append $errors (printf "%s.autoscaling.keda.serverAddress must name the Prometheus KEDA queries" $role) -}}
{{- end -}}
{{- end -}}
{{- with dig "colocateWith" "role" "" $w.placement -}}
{{- if eq . $role -}}
{{- $errors = append $errors (printf "%s.placement.colocateWith.role must name the other role, not %s itself" $role $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* P:D ratio, for static replica counts (mode aggregated refused the bounds above). */ -}}
{{- if not $aggregated -}}
{{- $lo := $v.ratio.prefillPerDecodeMin -}}
{{- $hi := $v.ratio.prefillPerDecodeMax -}}
{{- if and (not (kindIs "invalid" $lo)) (not (kindIs "invalid" $hi)) (gt (float64 $lo) (float64 $hi)) -}}
{{- $errors = append $errors "ratio.prefillPerDecodeMin must not exceed ratio.prefillPerDecodeMax" -}}
{{- end -}}
{{- if not (or $v.prefill.autoscaling.enabled $v.decode.autoscaling.enabled) -}}
{{- $p := $v.prefill.replicas | int -}}
{{- $d := $v.decode.replicas | int -}}
{{- if and (not (kindIs "invalid" $lo)) (lt (float64 $p) (mulf (float64 $lo) (float64 $d))) -}}
{{- $errors = append $errors (printf "prefill.replicas / decode.replicas = %d/%d is below ratio.prefillPerDecodeMin (%v)" $p $d $lo) -}}
{{- end -}}
{{- if and (not (kindIs "invalid" $hi)) (gt (float64 $p) (mulf (float64 $hi) (float64 $d))) -}}
{{- $errors = append $errors (printf "prefill.replicas / decode.replicas = %d/%d is above ratio.prefillPerDecodeMax (%v)" $p $d $hi) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Authentication. */ -}}
{{- $auth := $v.auth -}}
{{- if and $auth.metricsNeedKey (not $auth.apiKeys.existingSecret) -}}
{{- $errors = append $errors "auth.metricsNeedKey needs auth.apiKeys.existingSecret: without API keys the router has no key to ask /metrics for" -}}
{{- end -}}
{{- if and $auth.apiKeys.testKeySecretKey (not $auth.apiKeys.existingSecret) -}}
{{- $errors = append $errors (printf "auth.apiKeys.testKeySecretKey %q is set but auth.apiKeys.existingSecret is empty: name the Secret it is a key of" $auth.apiKeys.testKeySecretKey) -}}
{{- end -}}

{{- /* TLS (tls.enabled without existingSecret is the schema's to refuse). */ -}}
{{- if and $v.tls.workerName (not $v.tls.enabled) -}}
{{- $errors = append $errors (printf "tls.workerName %q is set but tls.enabled is false: it is the name the router checks workers' certificates against, with TLS only" $v.tls.workerName) -}}
{{- end -}}

{{- /* NetworkPolicy default-deny without the allow-list would cut the release off. */ -}}
{{- if and $v.networkPolicy.defaultDeny (not $v.networkPolicy.enabled) -}}
{{- $errors = append $errors "networkPolicy.defaultDeny needs networkPolicy.enabled (the allow-list policies), or pdserve's own traffic is denied too" -}}
{{- end -}}

{{- if $errors -}}
{{- fail (printf "\n\npdserve values are invalid:\n  - %s\n" (join "\n  - " $errors)) -}}
{{- end -}}
{{- end -}}
