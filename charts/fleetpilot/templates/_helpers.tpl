{{/*
Names, labels and the pieces both Deployments share.
*/}}

{{- define "fleetpilot.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's prefix: "fleetpilot" for a release named fleetpilot, else "<release>-fleetpilot". */}}
{{- define "fleetpilot.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetpilot.operator.fullname" -}}{{ include "fleetpilot.fullname" . }}-operator{{- end -}}
{{- define "fleetpilot.planner.fullname" -}}{{ include "fleetpilot.fullname" . }}-planner{{- end -}}

{{- define "fleetpilot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "fleetpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetpilot
{{- end -}}

{{/* Selector labels of one component: include with (dict "root" $ "component" "operator"). */}}
{{- define "fleetpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetpilot.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetpilot.componentLabels" -}}
{{ include "fleetpilot.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetpilot.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Pod Security "restricted": the image's own non-root user (65532), no privileges, RuntimeDefault seccomp. */}}
{{- define "fleetpilot.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "fleetpilot.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Who the pod is, for leader election (identity, lease namespace) and for logs. */}}
{{- define "fleetpilot.downwardEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* The root filesystem is read-only: Python and the predictors write temporary files under /tmp only. */}}
{{- define "fleetpilot.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "fleetpilot.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{/* Spread replicas over nodes when there are several, so one node's loss leaves a replica to take the lease. */}}
{{- define "fleetpilot.spread" -}}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "fleetpilot.selectorLabels" . | nindent 6 }}
{{- end -}}
