{{/*
What the operator may do in the namespaces of its jobs, and who may reach their workers.
*/}}

{{/* RBAC rules for writes in the jobs' namespaces: in the ClusterRole when every namespace is
watched, else in a Role of the watched namespace (templates/rbac.yaml). */}}
{{- define "elastra.jobNamespaceRules" -}}
# Worker pods: create, patch (assignments, scheduling gates), delete (resizes).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["create", "patch", "delete"]
# One headless Service per job, created once.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create"]
{{- if .Values.networkPolicy.enabled }}
# One NetworkPolicy per job, created once (networkPolicy.enabled).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create"]
{{- end }}
{{- end -}}

{{/* Labels as `elastra run` reads them: k=v,k=v (sorted). */}}
{{- define "elastra.labelList" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* A networkPolicy.metricsFrom entry as `elastra run --metrics-peer` reads it. */}}
{{- define "elastra.metricsPeer" -}}
{{- .namespace -}}
{{- with .podLabels }}/{{ include "elastra.labelList" . }}{{ end -}}
{{- end -}}
