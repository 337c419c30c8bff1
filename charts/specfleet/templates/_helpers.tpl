{{- define "specfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specfleet.labels" -}}
app.kubernetes.io/name: specfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: specfleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "specfleet.selectorLabels" -}}
app.kubernetes.io/name: specfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "specfleet.serviceAccountName" -}}
{{- default (include "specfleet.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "specfleet.image" -}}
{{- /* toString: `--set image.tag=1` arrives as a number (0 included, which `default` would drop) */ -}}
{{- $tag := toString .Values.image.tag -}}
{{- printf "%s:%s" .Values.image.repository (eq $tag "" | ternary .Chart.AppVersion $tag) -}}
{{- end -}}
