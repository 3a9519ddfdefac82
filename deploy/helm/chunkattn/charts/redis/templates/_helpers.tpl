{{/* Names the parent chart computes the same way (its chunkattn.redisService and
     chunkattn.kvStoreUrlSecret): the Service and the Secret holding redis.conf. */}}
{{- define "redis.fullname" -}}
{{- printf "%s-redis" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "redis.secretName" -}}
{{- printf "%s-kv-redis" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The server certificate, its key and the CA (the parent's templates/kv-redis-tls-secret.yaml),
     with tls.enabled. */}}
{{- define "redis.tlsSecretName" -}}
{{- printf "%s-kv-redis-tls" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "redis.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "redis.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: chunkattn
{{- end -}}

{{- define "redis.selectorLabels" -}}
app.kubernetes.io/name: redis
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kv-store
{{- end -}}
