{{/* Names and labels shared by every template of the chart. */}}

{{/* The release's base name: the release name, or <release>-vcp when it does not say vcp. */}}
{{- define "vcp.fullname" -}}
{{- if contains "vcp" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-vcp" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vcp.labels" -}}
app.kubernetes.io/name: vcp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* vcp's own pods. */}}
{{- define "vcp.selector" -}}
app.kubernetes.io/name: vcp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: orchestrator
{{- end -}}

{{/* The evaluation Postgres' pod. */}}
{{- define "vcp.postgresql.selector" -}}
app.kubernetes.io/name: vcp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: postgresql
{{- end -}}

{{- define "vcp.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "vcp.syncerImage" -}}
{{- printf "%s:%s" .Values.syncerImage.repository (.Values.syncerImage.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Whether vcp reads a templates directory (--templates) instead of its built-in templates. */}}
{{- define "vcp.customTemplates" -}}
{{- if or .Values.versionsCatalog .Values.templates -}}true{{- end -}}
{{- end -}}

{{/* The Secret and key vcp reads its database URL from. */}}
{{- define "vcp.databaseSecret" -}}
{{- if .Values.postgresql.enabled -}}
{{- printf "%s-postgresql" (include "vcp.fullname" .) -}}
{{- else -}}
{{- .Values.database.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "vcp.databaseKey" -}}
{{- if .Values.postgresql.enabled -}}url{{- else -}}{{ .Values.database.secretKey }}{{- end -}}
{{- end -}}

{{/* The Secret holding a private CA for an external database's certificate, if any (the
  evaluation Postgres has no TLS: with it, database.* is not read). */}}
{{- define "vcp.databaseCA" -}}
{{- if not .Values.postgresql.enabled -}}{{ .Values.database.tls.caSecret }}{{- end -}}
{{- end -}}

{{- define "vcp.adminSecret" -}}
{{- .Values.adminToken.existingSecret | default (printf "%s-admin-token" (include "vcp.fullname" .)) -}}
{{- end -}}

{{- define "vcp.adminKey" -}}
{{- if .Values.adminToken.existingSecret -}}{{ .Values.adminToken.secretKey }}{{- else -}}token{{- end -}}
{{- end -}}

{{- define "vcp.inventoryKeySecret" -}}
{{- .Values.inventoryKey.existingSecret | default (printf "%s-inventory-key" (include "vcp.fullname" .)) -}}
{{- end -}}

{{- define "vcp.inventoryKeyKey" -}}
{{- if .Values.inventoryKey.existingSecret -}}{{ .Values.inventoryKey.secretKey }}{{- else -}}key{{- end -}}
{{- end -}}

{{/* The restricted Pod Security profile, for a container. */}}
{{- define "vcp.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The gateway's pods (expose.mode gateway). */}}
{{- define "vcp.gateway.selector" -}}
app.kubernetes.io/name: vcp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "vcp.gatewayImage" -}}
{{- printf "%s:%s" .Values.gateway.image.repository (.Values.gateway.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
