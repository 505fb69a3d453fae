{{/* fleetrepair.fullname is the release's name prefix, at most 63 characters. */}}
{{- define "fleetrepair.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetrepair.clusterName" -}}
{{- required "clusterName is required: this cluster's name as the controller knows it" .Values.clusterName -}}
{{- end -}}

{{/* fleetrepair.labels are the labels every object carries. */}}
{{- define "fleetrepair.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetrepair
{{- end -}}

{{/* fleetrepair.selector selects one component: pass (list $ "controller"). */}}
{{- define "fleetrepair.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "fleetrepair.controller.name" -}}
{{- printf "%s-controller" (include "fleetrepair.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleetrepair.agent.name" -}}
{{- printf "%s-agent" (include "fleetrepair.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleetrepair.controller.serviceAccount" -}}
{{- default (include "fleetrepair.controller.name" .) .Values.controller.serviceAccount.name -}}
{{- end -}}

{{- define "fleetrepair.agent.serviceAccount" -}}
{{- default (include "fleetrepair.agent.name" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{/* Images: repository@digest when a digest pins it, else repository:tag
(the agent's tag carries its DCGM variant). */}}
{{- define "fleetrepair.controller.image" -}}
{{- with .Values.controller.image -}}
{{- if .digest -}}{{ printf "%s@%s" .repository .digest }}{{- else -}}{{ printf "%s:%s" .repository (default $.Chart.AppVersion (toString (.tag | default ""))) }}{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fleetrepair.agent.image" -}}
{{- with .Values.agent.image -}}
{{- $tag := default $.Chart.AppVersion (toString (.tag | default "")) -}}
{{- if .variant -}}{{- $tag = printf "%s-%s" $tag .variant -}}{{- end -}}
{{- if .digest -}}{{ printf "%s@%s" .repository .digest }}{{- else -}}{{ printf "%s:%s" .repository $tag }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* fleetrepair.agent.dcgmAddress is nv-hostengine's address, "" when the
DCGM monitors are off. */}}
{{- define "fleetrepair.agent.dcgmAddress" -}}
{{- $d := .Values.agent.dcgm -}}
{{- if $d.address -}}{{ $d.address }}
{{- else if eq $d.mode "service" -}}{{ $d.serviceAddress }}
{{- else if eq $d.mode "local" -}}127.0.0.1:5555
{{- end -}}
{{- end -}}

{{/* fleetrepair.tlsSecret is the Secret holding the controller's serving
certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "fleetrepair.tlsSecret" -}}
{{- if .Values.controller.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "fleetrepair.controller.name" .) -}}
{{- else -}}
{{- required "controller.tls.existingSecret (or controller.tls.certManager.enabled) is required with controller.tls.enabled" .Values.controller.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* fleetrepair.databaseEnv is the DATABASE_URL variable, from the Secret. */}}
{{- define "fleetrepair.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "controller.database.existingSecret is required: a Secret holding the PostgreSQL connection string" .Values.controller.database.existingSecret }}
      key: {{ .Values.controller.database.key }}
{{- end -}}

{{/* fleetrepair.restrictedSecurityContext is the container security context of
the controller and the migration Job (the restricted Pod Security Standard). */}}
{{- define "fleetrepair.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* fleetrepair.agent.controllerURL is where agents report: agent.controllerURL,
else this release's controller Service. */}}
{{- define "fleetrepair.agent.controllerURL" -}}
{{- if .Values.agent.controllerURL -}}
{{- .Values.agent.controllerURL -}}
{{- else if .Values.controller.enabled -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" .Values.controller.tls.enabled) (include "fleetrepair.controller.name" .) .Release.Namespace .Values.controller.service.port -}}
{{- else -}}
{{- fail "agent.controllerURL is required when controller.enabled is false: the URL of the controller serving this cluster" -}}
{{- end -}}
{{- end -}}
