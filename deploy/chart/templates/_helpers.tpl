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

{{- define "fleetrepair.controller.image" -}}
{{- printf "%s:%s" .Values.controller.image.repository (default .Chart.AppVersion .Values.controller.image.tag) -}}
{{- end -}}

{{- define "fleetrepair.agent.image" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) -}}
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
{{- printf "http://%s.%s.svc:%v" (include "fleetrepair.controller.name" .) .Release.Namespace .Values.controller.service.port -}}
{{- else -}}
{{- fail "agent.controllerURL is required when controller.enabled is false: the URL of the controller serving this cluster" -}}
{{- end -}}
{{- end -}}
