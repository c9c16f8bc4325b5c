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

{{/* The ingest Service's in-cluster host name (what the agents dial and the certificate names). */}}
{{- define "network-enforcer.ingestHost" -}}
{{- printf "%s.%s.svc" (include "network-enforcer.controllerName" .) .Release.Namespace }}
{{- end }}

{{/* The agents' controller URL: https unless uplink.tls.mode is insecure. */}}
{{- define "network-enforcer.controllerUrl" -}}
{{- $scheme := ternary "http" "https" (eq .Values.uplink.tls.mode "insecure") }}
{{- printf "%s://%s:%d" $scheme (include "network-enforcer.ingestHost" .) (int .Values.controller.ingestPort) }}
{{- end }}

{{/* The Secret holding the ingest server certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "network-enforcer.uplinkSecretName" -}}
{{- if eq .Values.uplink.tls.mode "existingSecret" }}
{{- required "uplink.tls.mode=existingSecret needs uplink.tls.existingSecret.name (a Secret with tls.crt, tls.key and ca.crt)" .Values.uplink.tls.existingSecret.name }}
{{- else }}
{{- printf "%s-uplink-tls" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The default OTEL collector's objects and the Secret of its server certificate. */}}
{{- define "network-enforcer.collectorName" -}}
{{- printf "%s-otel-collector" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "network-enforcer.collectorSecretName" -}}
{{- if eq .Values.telemetry.collector.tls.mode "existingSecret" }}
{{- required "telemetry.collector.tls.mode=existingSecret needs telemetry.collector.tls.existingSecret.name (a Secret with tls.crt, tls.key and ca.crt)" .Values.telemetry.collector.tls.existingSecret.name }}
{{- else }}
{{- printf "%s-tls" (include "network-enforcer.collectorName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The DNS names of a Service `name` in the release namespace, for its server certificate. */}}
{{- define "network-enforcer.serviceDnsNames" -}}
{{- $ns := .root.Release.Namespace }}
{{- list .name (printf "%s.%s" .name $ns) (printf "%s.%s.svc" .name $ns) (printf "%s.%s.svc.%s" .name $ns .root.Values.clusterDomain) | toJson }}
{{- end }}

{{- /*
A server certificate for a Service of the chart. Call with
(dict "root" $ "service" <Service name> "secretName" <Secret> "tls" <{mode, issuerRef, validityDays}> "what" <values path>).
  selfSigned: a CA and a certificate signed by it, generated once and kept across upgrades (read back with
              `lookup`; delete the Secret to regenerate).
  issuer:     a cert-manager Certificate; the issuer must put ca.crt in the Secret (CA and selfSigned
              issuers do).
  existingSecret, insecure: nothing (the user's Secret, or no TLS).
*/ -}}
{{- define "network-enforcer.serverCertificate" -}}
{{- $root := .root }}
{{- $dnsNames := include "network-enforcer.serviceDnsNames" (dict "root" $root "name" .service) | fromJsonArray }}
{{- if eq .tls.mode "selfSigned" }}
{{- $data := dict }}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace .secretName }}
{{- if and $existing $existing.data }}
{{- if and (index $existing.data "tls.crt") (index $existing.data "tls.key") (index $existing.data "ca.crt") }}
{{- $data = pick $existing.data "tls.crt" "tls.key" "ca.crt" }}
{{- end }}
{{- end }}
{{- if not $data }}
{{- $days := int .tls.validityDays }}
{{- /* ECDSA P-256: small, fast to generate, supported by rustls and Go. */ -}}
{{- $ca := genCAWithKey (printf "%s-ca" .service) $days (genPrivateKey "ecdsa") }}
{{- $cert := genSignedCertWithKey (printf "%s.%s.svc" .service $root.Release.Namespace) nil $dnsNames $days $ca (genPrivateKey "ecdsa") }}
{{- $data = dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) }}
{{- end }}
apiVersion: v1
kind: Secret
type: kubernetes.io/tls
metadata:
  name: {{ .secretName }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "network-enforcer.labels" $root | nindent 4 }}
data:
  {{- range $k, $v := $data }}
  {{ $k }}: {{ $v }}
  {{- end }}
{{- else if eq .tls.mode "issuer" }}
{{- if not .tls.issuerRef.name }}
{{- fail (printf "%s.mode=issuer needs %s.issuerRef.name (a cert-manager Issuer or ClusterIssuer)" .what .what) }}
{{- end }}
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ .service }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "network-enforcer.labels" $root | nindent 4 }}
spec:
  secretName: {{ .secretName }}
  commonName: {{ printf "%s.%s.svc" .service $root.Release.Namespace }}
  dnsNames:
    {{- toYaml $dnsNames | nindent 4 }}
  usages: ["server auth", "digital signature", "key encipherment"]
  privateKey:
    rotationPolicy: Always
  issuerRef:
    name: {{ .tls.issuerRef.name }}
    kind: {{ .tls.issuerRef.kind | default "Issuer" }}
    group: {{ .tls.issuerRef.group | default "cert-manager.io" }}
{{- end }}
{{- end }}

{{- /*
Goldmane's client certificate and CA (provider calico), as the controller sees them: one directory with
tls.crt, tls.key and ca.crt. existingSecret in another namespace cannot be mounted, so it is copied into
the release namespace (goldmaneCopyName) at install/upgrade.
*/ -}}
{{- define "network-enforcer.goldmaneCopyName" -}}
{{- printf "%s-goldmane-tls" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "network-enforcer.goldmaneIssuedName" -}}
{{- printf "%s-goldmane-client" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "network-enforcer.goldmaneCrossNamespace" -}}
{{- $s := .Values.controller.provider.calico.tls.existingSecret }}
{{- if and (eq .Values.controller.provider.calico.tls.mode "existingSecret") $s.namespace (ne $s.namespace .Release.Namespace) }}true{{- end }}
{{- end }}
{{- define "network-enforcer.goldmaneVolume" -}}
{{- $tls := .Values.controller.provider.calico.tls }}
{{- if eq $tls.mode "issuer" }}
secret:
  secretName: {{ printf "%s-tls" (include "network-enforcer.goldmaneIssuedName" .) }}
{{- else if include "network-enforcer.goldmaneCrossNamespace" . }}
# A copy of {{ $tls.existingSecret.namespace }}/{{ $tls.existingSecret.name }}; optional, so a missing source
# leaves only the Goldmane source down (reported on /readyz), not the controller.
secret:
  secretName: {{ include "network-enforcer.goldmaneCopyName" . }}
  optional: true
{{- else }}
{{- $name := required "controller.provider.calico.tls.mode=existingSecret needs controller.provider.calico.tls.existingSecret.name" $tls.existingSecret.name }}
projected:
  sources:
    - secret:
        name: {{ $name }}
        items:
          - key: tls.crt
            path: tls.crt
          - key: tls.key
            path: tls.key
          {{- if not $tls.existingSecret.caBundleConfigMap }}
          - key: ca.crt
            path: ca.crt
          {{- end }}
    {{- with $tls.existingSecret.caBundleConfigMap }}
    - configMap:
        name: {{ . }}
        items:
          - key: {{ $tls.existingSecret.caBundleKey | default "ca.crt" }}
            path: ca.crt
    {{- end }}
{{- end }}
{{- end }}
