{{/*
Fail, naming what to install, when a Prometheus Operator object is asked for and the cluster
does not serve its kind. Without this Helm stops with "no matches for kind PodMonitor", which
names neither the value nor the fix, and NOTES.txt would never be shown (it follows a
successful install). `helm template` has no cluster to ask: it needs --api-versions.
Call with (dict "root" $ "value" "metrics.podMonitor.enabled").
*/}}
{{- define "elastra.requirePodMonitorApi" -}}
{{- if not (.root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor") -}}
{{- fail (printf "%s is true, but this cluster does not serve monitoring.coreos.com/v1 PodMonitor: install the Prometheus Operator's CRDs first (kube-prometheus-stack, or the prometheus-operator-crds chart), or set %s=false. For helm template, pass --api-versions monitoring.coreos.com/v1/PodMonitor" .value .value) -}}
{{- end -}}
{{- end -}}

{{/* A monitor's or the dashboard's labels: the chart's, then the user's (theirs win). */}}
{{- define "elastra.extraLabels" -}}
{{- $chart := include "elastra.labels" .root | fromYaml -}}
{{- toYaml (merge (dict) (.labels | default (dict)) $chart) -}}
{{- end -}}
