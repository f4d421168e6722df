{{/* The chart's name, or nameOverride. */}}
{{- define "sitsprobe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of every object: fullnameOverride, else the release name (with the chart's name unless it has it). */}}
{{- define "sitsprobe.fullname" -}}
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

{{- define "sitsprobe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sitsprobe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sitsprobe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sitsprobe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "sitsprobe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sitsprobe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sitsprobe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The agent's metrics port: config.metrics.port (the schema keeps it 1..65535). */}}
{{- define "sitsprobe.metricsPort" -}}
{{- .Values.config.metrics.port | int }}
{{- end }}

{{/* Where the ConfigMap's config.yaml appears in the container. */}}
{{- define "sitsprobe.configDir" -}}/etc/sitsprobe{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES: the node, the agent's pod, then .Values.otlp.resourceAttributes. */}}
{{- define "sitsprobe.resourceAttributes" -}}
{{- $attrs := list "k8s.node.name=$(K8S_NODE_NAME)" "host.name=$(K8S_NODE_NAME)" "sitsprobe.agent.pod.name=$(K8S_POD_NAME)" }}
{{- range $k, $v := .Values.otlp.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $k (toString $v)) }}
{{- end }}
{{- join "," $attrs }}
{{- end }}
