{{/*
Checks across values that values.schema.json cannot express; each failure
names the values involved and what to do.
*/}}
{{- define "sitsprobe.validate" -}}
{{- $select := .Values.config.select | default dict }}
{{- $cli := join " " .Values.extraArgs }}
{{- if not (or $select.pids $select.comms $select.cmdline $select.ports (regexMatch "(^| )--(pid|comm|cmdline|port)([ =]|$)" $cli)) }}
{{- fail "config.select: nothing to trace; set at least one of config.select.pids, comms, cmdline or ports (the agent refuses to start without one)" }}
{{- end }}
{{- $traces := .Values.config.traces | default dict }}
{{- if and .Values.otlp.endpoint $traces.otlp_endpoint }}
{{- fail "otlp.endpoint and config.traces.otlp_endpoint are both set; set one (config.traces.otlp_endpoint would win)" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled: a ServiceMonitor selects the agents through their Service" }}
{{- end }}
{{- end }}
