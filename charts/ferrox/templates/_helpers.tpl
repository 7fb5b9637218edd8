{{/* The release's full name, capped at the 63 characters a label value may hold. */}}
{{- define "ferrox.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ferrox.selectorLabels" -}}
app.kubernetes.io/name: ferrox-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ferrox.labels" -}}
{{ include "ferrox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ferrox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ferrox.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ferrox.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ferrox.serverImage" -}}
{{- default (printf "ghcr.io/ferrox/ferrox-server:%s" .Chart.AppVersion) .Values.serverImage -}}
{{- end -}}

{{- define "ferrox.serverImageCuda" -}}
{{- default (printf "ghcr.io/ferrox/ferrox-server:%s-cuda" .Chart.AppVersion) .Values.serverImageCuda -}}
{{- end -}}
