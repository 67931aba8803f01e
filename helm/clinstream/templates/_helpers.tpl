{{- define "clinstream.name" -}}{{ .Chart.Name }}{{- end -}}
{{- define "clinstream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- define "clinstream.labels" -}}
app.kubernetes.io/name: {{ include "clinstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "clinstream.selector" -}}
app.kubernetes.io/name: {{ include "clinstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "clinstream.envName" -}}{{ printf "CLINSTREAM__%s" (. | upper | replace "." "__") }}{{- end -}}
{{- /* The query service's pods: a name of their own, so the workers' selector (and Service, PDB) never picks them. */ -}}
{{- define "clinstream.querySelector" -}}
app.kubernetes.io/name: {{ include "clinstream.name" . }}-query
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: query
{{- end -}}
