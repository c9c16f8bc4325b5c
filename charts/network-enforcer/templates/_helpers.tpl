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
{{/* "true" when the controller learns ClusterNetworkPolicyProposals (on, and watching every namespace), else empty. */}}
{{- define "network-enforcer.clusterProposals" -}}
{{- if and .Values.controller.clusterProposals.enabled (not .Values.controller.watchNamespace) }}true{{ end }}
{{- end }}
{{- define "network-enforcer.agentName" -}}
{{- printf "%s-agent" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{/* The agent's nftables table (NetworkPolicy enforcement): letters, digits and _ only. */}}
{{- define "network-enforcer.enforcementTable" -}}
{{- printf "ne_%s" (regexReplaceAll "[^A-Za-z0-9_]" .Release.Name "_") | trunc 64 }}
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
{{- /* The Secret holding the key proposals are signed with. */ -}}
{{- define "network-enforcer.signingKeySecretName" -}}
{{- printf "%s-proposal-signing-key" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

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
Goldmane (provider calico): the controller reads the client key pair (Secret: tls.crt, tls.key) and the CA
bundle (ConfigMap key) through the API, so they may stay in calico-system where the Calico operator
rotates them. goldmaneRefs returns {secret: {namespace, name}, configMap: {namespace, name, key}}.
*/ -}}
{{- define "network-enforcer.goldmaneIssuedName" -}}
{{- printf "%s-goldmane-client" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "network-enforcer.goldmaneRefs" -}}
{{- $tls := .Values.controller.provider.calico.tls }}
{{- $s := $tls.existingSecret }}
{{- $ns := $s.namespace | default .Release.Namespace }}
{{- $secret := dict }}
{{- if eq $tls.mode "issuer" }}
{{- $secret = dict "namespace" .Release.Namespace "name" (printf "%s-tls" (include "network-enforcer.goldmaneIssuedName" .)) }}
{{- else }}
{{- $secret = dict "namespace" $ns "name" (required "controller.provider.calico.tls.mode=existingSecret needs controller.provider.calico.tls.existingSecret.name (the Secret with Goldmane's client tls.crt/tls.key, e.g. goldmane-key-pair)" $s.name) }}
{{- end }}
{{- $cm := required "provider calico needs controller.provider.calico.tls.existingSecret.caBundleConfigMap (the ConfigMap with the CA of Goldmane's server certificate, e.g. goldmane-ca-bundle)" $s.caBundleConfigMap }}
{{- dict "secret" $secret "configMap" (dict "namespace" $ns "name" $cm "key" ($s.caBundleKey | default "ca.crt")) | toJson }}
{{- end }}

{{- /*
Hubble Relay client TLS (agent.hubble.source=relay, controller.provider.cilium.tls): one directory with
tls.crt, tls.key and ca.crt in every agent. The agents mount it, so an existingSecret must live in the
release namespace.
*/ -}}
{{- define "network-enforcer.hubbleRelayIssuedName" -}}
{{- printf "%s-hubble-relay-client" (include "network-enforcer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "network-enforcer.hubbleRelayVolume" -}}
{{- $tls := .Values.controller.provider.cilium.tls }}
{{- if eq $tls.mode "issuer" }}
secret:
  secretName: {{ printf "%s-tls" (include "network-enforcer.hubbleRelayIssuedName" .) }}
{{- else }}
{{- $s := $tls.existingSecret }}
{{- if and $s.namespace (ne $s.namespace .Release.Namespace) }}
{{- fail (printf "controller.provider.cilium.tls.existingSecret.namespace=%s: the agents mount the Hubble Relay client Secret, so it must be in the release namespace %s (copy it there, e.g. kube-system/hubble-relay-client-certs)" $s.namespace .Release.Namespace) }}
{{- end }}
projected:
  sources:
    - secret:
        name: {{ required "controller.provider.cilium.tls.mode=existingSecret needs controller.provider.cilium.tls.existingSecret.name (a Secret with tls.crt, tls.key and ca.crt)" $s.name }}
        items:
          - key: tls.crt
            path: tls.crt
          - key: tls.key
            path: tls.key
          {{- if not $s.caBundleConfigMap }}
          - key: ca.crt
            path: ca.crt
          {{- end }}
    {{- with $s.caBundleConfigMap }}
    - configMap:
        name: {{ . }}
        items:
          - key: {{ $s.caBundleKey | default "ca.crt" }}
            path: ca.crt
    {{- end }}
{{- end }}
{{- end }}
