{{/* Chart name, truncated to a DNS label. */}}
{{- define "elastra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name, with the chart name unless the release already holds it. */}}
{{- define "elastra.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "elastra.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the operator pod (never change them: selectors are immutable). */}}
{{- define "elastra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elastra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "elastra.labels" -}}
helm.sh/chart: {{ include "elastra.chart" . }}
{{ include "elastra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: elastra
{{- end -}}

{{- define "elastra.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "elastra.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Kopf peering object's name. */}}
{{- define "elastra.peeringName" -}}
{{- default (include "elastra.fullname" .) .Values.peering.name -}}
{{- end -}}

{{/* A worker toleration as `elastra run --toleration` reads it: KEY[=VALUE][:EFFECT]. */}}
{{- define "elastra.toleration" -}}
{{- .key -}}
{{- if hasKey . "value" -}}={{ .value }}{{- end -}}
{{- if .effect -}}:{{ .effect }}{{- end -}}
{{- end -}}

{{/*
The PriorityClass of capacity-request pods: the one capacityRequests.priorityClassName names,
else the release's own (templates/priorityclass.yaml).
*/}}
{{- define "elastra.capacityRequestClass" -}}
{{- .Values.capacityRequests.priorityClassName | default (printf "%s-capacity-request" (include "elastra.fullname" .)) -}}
{{- end -}}
