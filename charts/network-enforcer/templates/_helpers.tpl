{{/* The chart's name, overridable with nameOverride. */}}
{{- define "network-enforcer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The fully qualified release name, overridable with fullnameOverride. */}}
{{- define "network-enforcer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "network-enforcer.labels" -}}
app.kubernetes.io/name: {{ include "network-enforcer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Selector labels of one component (controller, agent). Call with (dict "root" $ "component" "agent"). */}}
{{- define "network-enforcer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "network-enforcer.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Names of the components' objects. */}}
{{- define "network-enforcer.controllerName" -}}
{{- printf "%s-controller" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "network-enforcer.agentName" -}}
{{- printf "%s-agent" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "network-enforcer.cleanupName" -}}
{{- printf "%s-cleanup" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* An image reference from {repository, tag}; the tag defaults to the chart's appVersion. */}}
{{- define "network-enforcer.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* imagePullSecrets: each entry is a string or {name: ...}. */}}
{{- define "network-enforcer.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
{{- if kindIs "string" . }}
  - name: {{ . | quote }}
{{- else }}
  - name: {{ .name | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
