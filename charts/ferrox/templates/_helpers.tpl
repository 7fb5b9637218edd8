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

{{- define "ferrox.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ferrox.labels" -}}
{{ include "ferrox.selectorLabels" . }}
{{ include "ferrox.commonLabels" . }}
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

{{/* The router's objects: <fullname>-router, within the 63 characters of a Service name. */}}
{{- define "ferrox.router.fullname" -}}
{{- printf "%s-router" (include "ferrox.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{/* A name of its own, so that neither the operator's selector nor the router's
     matches the other's pods. */}}
{{- define "ferrox.router.selectorLabels" -}}
app.kubernetes.io/name: ferrox-router
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end -}}

{{- define "ferrox.router.labels" -}}
{{ include "ferrox.router.selectorLabels" . }}
{{ include "ferrox.commonLabels" . }}
{{- end -}}

{{- define "ferrox.router.image" -}}
{{- printf "%s:%s" .Values.router.image.repository (default .Chart.AppVersion .Values.router.image.tag) -}}
{{- end -}}
