{{/*
Names. The operator's app.kubernetes.io/name is "kvpilot-operator", not "kvpilot": model pods
carry app.kubernetes.io/name=kvpilot and app.kubernetes.io/instance=<ModelDeployment> (naming.py),
and a model Service must never select the operator's pod.
*/}}
{{- define "kvpilot.name" -}}
{{- .Values.nameOverride | default "kvpilot-operator" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Namespaced objects: "<release>-kvpilot-operator", or "<release>-operator" when the release
name says kvpilot already. Children of a ModelDeployment are named after it, so a
ModelDeployment named like the operator in the same namespace would collide: hence "-operator". */}}
{{- define "kvpilot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "kvpilot" .Release.Name -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kvpilot-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects are shared by releases of every namespace: the namespace is part of
their name. */}}
{{- define "kvpilot.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "kvpilot.fullname" .) -}}
{{- end -}}

{{/* The name of kopf's peering object when the operator runs more than one replica (empty:
one replica, standalone): a ClusterKopfPeering, named like the cluster-scoped objects, when
watching all namespaces; else a KopfPeering of the release's name in each watched namespace. */}}
{{- define "kvpilot.peering" -}}
{{- if gt (int .Values.operator.replicas) 1 -}}
{{- if eq .Values.watch.scope "All" -}}
{{- include "kvpilot.clusterName" . -}}
{{- else -}}
{{- include "kvpilot.fullname" . -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "kvpilot.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "kvpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvpilot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvpilot
app.kubernetes.io/component: operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels every model pod carries and only model pods (naming.labels). */}}
{{- define "kvpilot.modelPodSelector" -}}
app.kubernetes.io/name: kvpilot
app.kubernetes.io/component: model-server
app.kubernetes.io/managed-by: kvpilot-operator
{{- end -}}

{{/* registry/repository:tag or registry/repository@digest; global.imageRegistry wins. */}}
{{- define "kvpilot.imageRef" -}}
{{- $image := .image -}}
{{- $registry := (.root.Values.global).imageRegistry | default $image.registry -}}
{{- $ref := printf "%s:%s" $image.repository ($image.tag | default .defaultTag) -}}
{{- if $image.digest -}}
{{- $ref = printf "%s@%s" $image.repository $image.digest -}}
{{- end -}}
{{- if $registry -}}
{{- printf "%s/%s" $registry $ref -}}
{{- else -}}
{{- $ref -}}
{{- end -}}
{{- end -}}

{{/* The operator image: scripts/build-image.sh tags it <version>-operator. */}}
{{- define "kvpilot.image" -}}
{{- include "kvpilot.imageRef" (dict "root" . "image" .Values.image "defaultTag" (printf "%s-operator" .Chart.AppVersion)) -}}
{{- end -}}

{{/* The model server image for ModelDeployments without spec.image: <version>, as the
operator's own default (handlers.image). */}}
{{- define "kvpilot.modelImage" -}}
{{- include "kvpilot.imageRef" (dict "root" . "image" .Values.modelImage "defaultTag" .Chart.AppVersion) -}}
{{- end -}}

{{/* The namespaces the operator watches, as a JSON list; [] means all namespaces. */}}
{{- define "kvpilot.watchedNamespaces" -}}
{{- if eq .Values.watch.scope "All" -}}
{{- list | toJson -}}
{{- else if eq .Values.watch.scope "Namespaces" -}}
{{- if not .Values.watch.namespaces -}}
{{- fail "watch.scope=Namespaces needs watch.namespaces" -}}
{{- end -}}
{{- .Values.watch.namespaces | uniq | toJson -}}
{{- else -}}
{{- list .Release.Namespace | toJson -}}
{{- end -}}
{{- end -}}

{{/* Where per-namespace objects for model pods go (NetworkPolicies): the watched namespaces,
or, watching all of them, networkPolicy.namespaces (default: the release namespace). */}}
{{- define "kvpilot.modelNamespaces" -}}
{{- $watched := include "kvpilot.watchedNamespaces" . | fromJsonArray -}}
{{- if $watched -}}
{{- toJson $watched -}}
{{- else -}}
{{- .Values.networkPolicy.namespaces | default (list .Release.Namespace) | uniq | toJson -}}
{{- end -}}
{{- end -}}

{{/* "true" when monitoring.coreos.com/v1 objects may be rendered: the cluster serves the API,
or monitoring.skipApiCheck says so (helm template, Argo CD and Flux render without a cluster). */}}
{{- define "kvpilot.monitoringApi" -}}
{{- if or .Values.monitoring.skipApiCheck (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}
true
{{- end -}}
{{- end -}}

{{- define "kvpilot.monitoringLabels" -}}
{{ include "kvpilot.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The gateway (`kvpilot gateway`): named like the operator with "gateway" for "operator".
Its app.kubernetes.io/name is neither the operator's nor the model pods' ("kvpilot"), so no
Service or policy of theirs selects it. */}}
{{- define "kvpilot.gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- printf "%s-gateway" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "kvpilot" .Release.Name -}}
{{- printf "%s-gateway" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kvpilot-gateway" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvpilot.gateway.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "kvpilot.gateway.fullname" .) -}}
{{- end -}}

{{- define "kvpilot.gateway.serviceAccountName" -}}
{{- $account := .Values.gateway.serviceAccount -}}
{{- if $account.create -}}
{{- $account.name | default (include "kvpilot.gateway.fullname" .) -}}
{{- else -}}
{{- $account.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "kvpilot.gateway.selectorLabels" -}}
app.kubernetes.io/name: kvpilot-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvpilot.gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvpilot.gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvpilot
app.kubernetes.io/component: gateway
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Where the gateway reads its API keys: the Secret's key mounted as one file. */}}
{{- define "kvpilot.gateway.apiKeyDir" -}}
/etc/kvpilot/gateway-keys
{{- end -}}
