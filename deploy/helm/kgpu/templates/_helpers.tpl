{{/*
Names, labels and derived values shared by kgpu's templates. Object names
are fixed rather than derived from the release name: kgpu's tools look for
the Service kgpu-extender, the extender's Lease is called kgpu-extender
(the leader-election Role names it), and one cluster runs one kgpu.
*/}}

{{- define "kgpu.extender.name" -}}kgpu-extender{{- end -}}
{{- define "kgpu.devicePlugin.name" -}}kgpu-device-plugin{{- end -}}
{{- define "kgpu.schedulerConfig.name" -}}kgpu-scheduler-config{{- end -}}
{{- define "kgpu.fakeGpus.name" -}}kgpu-device-plugin-fake-gpus{{- end -}}
{{- define "kgpu.dra.name" -}}kgpu-dra-plugin{{- end -}}

{{- define "kgpu.extender.namespace" -}}{{ required "namespaces.extender.name is required" .Values.namespaces.extender.name }}{{- end -}}
{{- define "kgpu.devicePlugin.namespace" -}}{{ required "namespaces.devicePlugin.name is required" .Values.namespaces.devicePlugin.name }}{{- end -}}
{{- define "kgpu.dra.namespace" -}}{{ required "namespaces.dra.name is required" .Values.namespaces.dra.name }}{{- end -}}

{{- define "kgpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The labels of every object. Called with a dict: ctx (the root context),
name (app.kubernetes.io/name, may be empty) and component (may be empty).
The kustomize manifests carry name, part-of and component; the rest are
Helm's. Selectors use kgpu.selectorLabels only, which equal the kustomize
ones, so Helm and kustomize installs select the same pods.
*/}}
{{- define "kgpu.labels" -}}
{{- if .name -}}
app.kubernetes.io/name: {{ .name }}
{{ end -}}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: kgpu
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
helm.sh/chart: {{ include "kgpu.chart" .ctx }}
{{- end -}}

{{- define "kgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ . }}
{{- end -}}

{{- define "kgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The Service's port: the extender's listen port. */}}
{{- define "kgpu.extender.port" -}}
{{- int64 .Values.extender.config.port -}}
{{- end -}}

{{/* The probe listener's port. */}}
{{- define "kgpu.extender.probePort" -}}
{{- int64 .Values.extender.config.probePort -}}
{{- end -}}

{{/* Where kube-scheduler calls the extender: the Service's name, namespace and port, unless scheduler.urlPrefix says otherwise. */}}
{{- define "kgpu.scheduler.urlPrefix" -}}
{{- if .Values.scheduler.urlPrefix -}}
{{- .Values.scheduler.urlPrefix -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%s" (ternary "https" "http" .Values.extender.tls.enabled) (include "kgpu.extender.name" .) (include "kgpu.extender.namespace" .) (include "kgpu.extender.port" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the extender requires client certificates: TLS on and requireClientCert (which means nothing without TLS, so turning TLS off for a try needs one value). */}}
{{- define "kgpu.extender.clientCerts" -}}
{{- if and .Values.extender.tls.enabled .Values.extender.tls.requireClientCert -}}true{{- end -}}
{{- end -}}

{{/* The memory unit, shared by the extender and the device plugin; a quantity string, never a bare number (which the two would read differently). */}}
{{- define "kgpu.memoryUnit" -}}
{{- $u := .Values.extender.config.memoryUnit -}}
{{- if not (kindIs "string" $u) -}}
{{- fail (printf "extender.config.memoryUnit must be a quantity string such as 1Gi or 512Mi, not %v" $u) -}}
{{- end -}}
{{- $u -}}
{{- end -}}

{{/*
The device plugin's affinity: devicePlugin.affinity with, in every term of
its required node affinity, kgpu.io/gpu-allocator NotIn [dra] added, so that
whatever the operator writes there, the plugin never runs on a node whose
GPUs the DRA driver serves (one owner per node). Without a required node
affinity, that expression alone becomes the one term. A YAML map, indented
from column 0.
*/}}
{{- define "kgpu.devicePlugin.affinity" -}}
{{- $notDra := dict "key" "kgpu.io/gpu-allocator" "operator" "NotIn" "values" (list "dra") -}}
{{- $aff := deepCopy (.Values.devicePlugin.affinity | default dict) -}}
{{- $na := $aff.nodeAffinity | default dict -}}
{{- $req := $na.requiredDuringSchedulingIgnoredDuringExecution | default dict -}}
{{- $terms := list -}}
{{- range ($req.nodeSelectorTerms | default (list dict)) -}}
{{- $exprs := .matchExpressions | default list -}}
{{- if not (has $notDra $exprs) -}}
{{- $exprs = append $exprs $notDra -}}
{{- end -}}
{{- $terms = append $terms (set . "matchExpressions" $exprs) -}}
{{- end -}}
{{- $_ := set $req "nodeSelectorTerms" $terms -}}
{{- $_ = set $na "requiredDuringSchedulingIgnoredDuringExecution" $req -}}
{{- $_ = set $aff "nodeAffinity" $na -}}
{{- toYaml $aff -}}
{{- end -}}

{{/* Settings that cannot work together stop the render with a reason. */}}
{{- define "kgpu.validate" -}}
{{- if and (not .Values.extender.leaderElection.enabled) (gt (int64 .Values.extender.replicas) 1) -}}
{{- fail "extender.replicas > 1 needs extender.leaderElection.enabled: without leader election, two replicas could hand out the same GPU twice" -}}
{{- end -}}
{{- if and .Values.devicePlugin.enabled (eq .Values.namespaces.extender.name .Values.namespaces.devicePlugin.name) -}}
{{- fail "namespaces.devicePlugin.name must differ from namespaces.extender.name: the device plugin needs host access, which only a privileged namespace of its own should allow" -}}
{{- end -}}
{{- if and .Values.dra.enabled (eq .Values.namespaces.extender.name .Values.namespaces.dra.name) -}}
{{- fail "namespaces.dra.name must differ from namespaces.extender.name: the DRA driver needs host access, which only a privileged namespace of its own should allow" -}}
{{- end -}}
{{- if and .Values.dra.enabled .Values.devicePlugin.enabled (eq .Values.namespaces.devicePlugin.name .Values.namespaces.dra.name) -}}
{{- fail "namespaces.dra.name must differ from namespaces.devicePlugin.name: each is installed and removed alone" -}}
{{- end -}}
{{- end -}}

{{/* ownScheduler's routing: "policy" (a MutatingAdmissionPolicy in the API server) or "webhook" (the extender's /mutate/pods); with via auto, the policy where the API server serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy. */}}
{{- define "kgpu.routing.via" -}}
{{- $via := .Values.ownScheduler.routing.via -}}
{{- if eq $via "auto" -}}
{{- ternary "policy" "webhook" (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") -}}
{{- else if or (eq $via "policy") (eq $via "webhook") -}}
{{- $via -}}
{{- else -}}
{{- fail (printf "ownScheduler.routing.via: %q: expected auto, policy or webhook" $via) -}}
{{- end -}}
{{- end -}}

{{/* Which pods are routed, as CEL conditions on the pod being created: the policy's and the webhook's (so that only GPU pods reach the webhook). */}}
{{- define "kgpu.routing.matchConditions" -}}
{{- $res := list -}}
{{- range .Values.scheduler.managedResources }}{{ $res = append $res (printf "'%s'" .name) }}{{ end -}}
- name: names-no-other-scheduler
  expression: >-
    !has(object.spec.schedulerName) || object.spec.schedulerName == '' || object.spec.schedulerName == 'default-scheduler'
- name: asks-for-a-gpu
  expression: >-
    (object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []))
    .exists(c, has(c.resources) && [{{ join ", " $res }}].exists(r,
    (has(c.resources.limits) && r in c.resources.limits) ||
    (has(c.resources.requests) && r in c.resources.requests)))
{{- end -}}
