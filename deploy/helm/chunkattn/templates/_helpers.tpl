{{/* Names. The fullname is cut to 45 characters: the StatefulSet "<fullname>-worker" then
     stays within 52, the most Kubernetes allows before its pods' controller-revision-hash
     label (the name plus 11 characters) passes 63 and no pod can be created. */}}
{{- define "chunkattn.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 45 | trimSuffix "-" -}}
{{- end -}}

{{- define "chunkattn.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "chunkattn.coordinator.fullname" -}}{{ include "chunkattn.fullname" . }}-coordinator{{- end -}}
{{- define "chunkattn.worker.fullname" -}}{{ include "chunkattn.fullname" . }}-worker{{- end -}}

{{- define "chunkattn.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "chunkattn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: chunkattn
{{- end -}}

{{- define "chunkattn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chunkattn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "chunkattn.coordinator.selectorLabels" -}}
{{ include "chunkattn.selectorLabels" . }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{- define "chunkattn.worker.selectorLabels" -}}
{{ include "chunkattn.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "chunkattn.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "chunkattn.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "chunkattn.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The model folder as the binaries see it. */}}
{{- define "chunkattn.modelPath" -}}
{{- if eq .Values.model.source "demo" -}}
/opt/chunkattn/models/demo
{{- else if .Values.model.subPath -}}
/models/{{ .Values.model.subPath | trimPrefix "/" }}
{{- else -}}
/models
{{- end -}}
{{- end -}}

{{/* The model id of the HTTP API (--served_model_name): the folder's name unless set. */}}
{{- define "chunkattn.servedModelName" -}}
{{- .Values.http.servedModelName | default (base (include "chunkattn.modelPath" .)) -}}
{{- end -}}

{{/* The HTTP API's readiness probe can work only where the kubelet can connect: it has no
     client certificate, so not when tls.clientCASecretName makes the port require one. */}}
{{- define "chunkattn.httpProbe" -}}
{{- if and .Values.http.enabled (not (and .Values.tls.enabled .Values.tls.clientCASecretName)) -}}
true
{{- end -}}
{{- end -}}

{{/* The folder a worker may load models from (--model_root): the model's volume. */}}
{{- define "chunkattn.modelRoot" -}}
{{- if eq .Values.model.source "demo" -}}
/opt/chunkattn/models
{{- else -}}
/models
{{- end -}}
{{- end -}}

{{/* The Secret with the workers' shared token: the user's, or the chart's own. */}}
{{- define "chunkattn.workerTokenSecret" -}}
{{- .Values.workerAuth.existingSecret | default (printf "%s-worker-token" (include "chunkattn.fullname" .)) -}}
{{- end -}}

{{/* The worker token's volume and mount (both components). */}}
{{- define "chunkattn.workerTokenVolume" -}}
{{- if .Values.workerAuth.enabled -}}
- name: worker-token
  secret:
    secretName: {{ include "chunkattn.workerTokenSecret" . }}
    items:
      - key: {{ .Values.workerAuth.secretKey }}
        path: token
{{- end }}
{{- end -}}

{{- define "chunkattn.workerTokenMount" -}}
{{- if .Values.workerAuth.enabled -}}
- name: worker-token
  mountPath: /etc/chunkattn/worker-token
  readOnly: true
{{- end }}
{{- end -}}

{{/* The shared KV tier's Redis URL (its password included) as a file of the coordinator's,
     --kv_store_url_file: never in its argv or environment. 0440 (288): owner root, group the
     pod's fsGroup, which the coordinator checks as a secret's mode. */}}
{{- define "chunkattn.kvStoreUrlVolume" -}}
{{- with include "chunkattn.kvStoreUrlSecret" . -}}
- name: kv-store-url
  secret:
    secretName: {{ . }}
    defaultMode: 288
    items:
      - key: {{ if include "chunkattn.chartRedis" $ }}url{{ else }}{{ $.Values.cache.tiers.shared.urlSecretKey }}{{ end }}
        path: url
{{- end }}
{{- end -}}

{{- define "chunkattn.kvStoreTlsVolume" -}}
{{- with include "chunkattn.kvStoreTlsSecret" . -}}
- name: kv-store-tls
  secret:
    secretName: {{ . }}
    defaultMode: 288
    items:
      - key: ca.crt
        path: ca.crt
      {{- if include "chunkattn.kvStoreTlsClientCertificate" $ }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- end -}}

{{/* The Secret with the shared tier's rediss:// files (ca.crt; tls.crt and tls.key, a client
     certificate): the user's (tlsSecretName), the chart's Redis's client Secret, or "". */}}
{{- define "chunkattn.kvStoreTlsSecret" -}}
{{- if .Values.cache.tiers.shared.tlsSecretName -}}
{{- .Values.cache.tiers.shared.tlsSecretName -}}
{{- else if include "chunkattn.chartRedisTls" . -}}
{{- printf "%s-kv-redis-client" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* "true" when the coordinator presents a client certificate: the user's choice for their
     Redis, always for the chart's (its tls-auth-clients is yes). */}}
{{- define "chunkattn.kvStoreTlsClientCertificate" -}}
{{- if include "chunkattn.chartRedisTls" . -}}true
{{- else if and .Values.cache.tiers.shared.tlsSecretName .Values.cache.tiers.shared.tlsClientCertificate -}}true
{{- end -}}
{{- end -}}

{{/* "true" when the chart runs its own Redis for the shared tier (redis.enabled, no
     urlSecretName of the user's). */}}
{{- define "chunkattn.chartRedis" -}}
{{- if and .Values.redis.enabled (not .Values.cache.tiers.shared.urlSecretName) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the chart's Redis speaks TLS only (redis.tls.enabled), with certificates the
     chart makes (templates/kv-redis-tls-secret.yaml). */}}
{{- define "chunkattn.chartRedisTls" -}}
{{- if and (include "chunkattn.chartRedis" .) .Values.redis.tls.enabled -}}true{{- end -}}
{{- end -}}

{{/* The chart's Redis's Service (charts/redis's redis.fullname) and its in-cluster DNS name:
     the URL's host, which the server certificate must name. */}}
{{- define "chunkattn.redisService" -}}
{{- printf "%s-redis" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chunkattn.redisHost" -}}
{{- printf "%s.%s.svc.%s" (include "chunkattn.redisService" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* The Secret holding the shared tier's URL: the user's, the chart's Redis's (its name is
     charts/redis's redis.secretName), or "" for no shared tier. */}}
{{- define "chunkattn.kvStoreUrlSecret" -}}
{{- if .Values.cache.tiers.shared.urlSecretName -}}
{{- .Values.cache.tiers.shared.urlSecretName -}}
{{- else if .Values.redis.enabled -}}
{{- printf "%s-kv-redis" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "chunkattn.kvStoreUrlMount" -}}
{{- if include "chunkattn.kvStoreUrlSecret" . -}}
- name: kv-store-url
  mountPath: /etc/chunkattn/kv-store
  readOnly: true
{{- end }}
{{- if include "chunkattn.kvStoreTlsSecret" . }}
- name: kv-store-tls
  mountPath: /etc/chunkattn/kv-store-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* The Secret with the worker port's CA and certificate: the user's, or the chart's own. */}}
{{- define "chunkattn.workerTlsSecret" -}}
{{- .Values.workerTls.existingSecret | default (printf "%s-worker-tls" (include "chunkattn.fullname" .)) -}}
{{- end -}}

{{/* Where both components find it, and its flags: the workers serve with the certificate and
     require client certificates the CA signed; the coordinator and the ranks (calling rank 0's
     rendezvous store) show the same certificate and check the workers' against the CA. */}}
{{- define "chunkattn.workerTlsDir" -}}/etc/chunkattn/worker-tls{{- end -}}

{{- define "chunkattn.workerTlsVolume" -}}
{{- if .Values.workerTls.enabled -}}
- name: worker-tls
  secret:
    secretName: {{ include "chunkattn.workerTlsSecret" . }}
    items:
      - key: ca.crt
        path: ca.crt
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end -}}

{{- define "chunkattn.workerTlsMount" -}}
{{- if .Values.workerTls.enabled -}}
- name: worker-tls
  mountPath: {{ include "chunkattn.workerTlsDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "chunkattn.workerTlsWorkerArgs" -}}
{{- if .Values.workerTls.enabled -}}
{{- $dir := include "chunkattn.workerTlsDir" . -}}
- --tls_cert_file={{ $dir }}/tls.crt
- --tls_key_file={{ $dir }}/tls.key
- --tls_client_ca_file={{ $dir }}/ca.crt
- --worker_tls_server_name={{ .Values.workerTls.serverName }}
{{- end }}
{{- end -}}

{{- define "chunkattn.workerTlsCoordinatorArgs" -}}
{{- if .Values.workerTls.enabled -}}
{{- $dir := include "chunkattn.workerTlsDir" . -}}
- --worker_tls_ca_file={{ $dir }}/ca.crt
- --worker_tls_cert_file={{ $dir }}/tls.crt
- --worker_tls_key_file={{ $dir }}/tls.key
- --worker_tls_server_name={{ .Values.workerTls.serverName }}
{{- end }}
{{- end -}}

{{/* LeaderWorkerSet mode: several replicas (each a coordinator with its own ranks), or asked
     for. One replica without lws.enabled keeps the Deployment + StatefulSet layout. */}}
{{- define "chunkattn.lws" -}}
{{- if or .Values.lws.enabled (gt (int .Values.replicas) 1) -}}
true
{{- end -}}
{{- end -}}

{{/* The LeaderWorkerSet's name, which LWS also gives its headless Service: so not the
     coordinator Service's. Its worker StatefulSets are "<name>-<group>": the fullname is cut
     to 40 so that "<name>-999" stays within a StatefulSet's 52 characters (see chunkattn.name). */}}
{{- define "chunkattn.lws.fullname" -}}
{{- printf "%s-replica" (include "chunkattn.fullname" . | trunc 40 | trimSuffix "-") -}}
{{- end -}}

{{/* Rank order: worker-0 is rank 0 (it also serves the collectives' rendezvous). In a
     LeaderWorkerSet, group g's ranks are its pods <lws>-g-1 ... <lws>-g-N (rank i-1), named in
     the headless Service <lws> that LWS makes (subdomain policy Shared). g is the leader's
     group-index label, which the downward API puts in CHUNKATTN_GROUP_INDEX and the kubelet
     substitutes for $(CHUNKATTN_GROUP_INDEX): no shell, and the names are LWS's own rule. */}}
{{- define "chunkattn.workerAddresses" -}}
{{- $addrs := list -}}
{{- if include "chunkattn.lws" . -}}
{{- $lws := include "chunkattn.lws.fullname" . -}}
{{- range $i := until (int .Values.tensorParallelSize) -}}
{{- $addrs = append $addrs (printf "%s-$(CHUNKATTN_GROUP_INDEX)-%d.%s.%s.svc.%s:%d" $lws (add1 $i) $lws $.Release.Namespace $.Values.clusterDomain (int $.Values.worker.port)) -}}
{{- end -}}
{{- else -}}
{{- $worker := include "chunkattn.worker.fullname" . -}}
{{- range $i := until (int .Values.tensorParallelSize) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s.%s.svc.%s:%d" $worker $i $worker $.Release.Namespace $.Values.clusterDomain (int $.Values.worker.port)) -}}
{{- end -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/* The coordinator's environment: its LWS group (for --workers) and, with KV events, its
     IP (the events' topic). Empty in the one-replica layout without KV events. */}}
{{- define "chunkattn.coordinator.env" -}}
{{- if include "chunkattn.lws" . }}
- name: CHUNKATTN_GROUP_INDEX  # the group's index, which names its workers in --workers
  valueFrom:
    fieldRef:
      fieldPath: metadata.labels['leaderworkerset.sigs.k8s.io/group-index']
{{- end }}
{{- if .Values.kvEvents.enabled }}
- name: POD_IP  # names the pod in the KV events' topic
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
{{- end -}}

{{/* KV-cache events in vLLM's format (ZMQ PUB + ROUTER replay, bound on every address):
     llm-d's topic kv@<pod IP>@<served model name>, the model segment being the `model` the
     router sees in requests. Every address of the pod is what routers dial, so the binary's
     guard against a wildcard host is met with CURVE or, without it, explicit consent (the
     NetworkPolicy then being the ports' protection). */}}
{{- define "chunkattn.kvEventsArgs" -}}
{{- $k := .Values.kvEvents -}}
{{- if $k.enabled -}}
- {{ printf "--kv_events_endpoint=tcp://*:%d" (int $k.port) | quote }}
- {{ printf "--kv_events_replay_endpoint=tcp://*:%d" (int $k.replayPort) | quote }}
- {{ printf "--kv_events_topic=kv@$(POD_IP)@%s" (include "chunkattn.servedModelName" .) | quote }}
- --kv_events_format={{ $k.format }}
- --kv_events_buffer_steps={{ int64 $k.bufferSteps }}
- {{ printf "--kv_events_hash_seed=%s" (include "chunkattn.kvEventsHashSeed" .) | quote }}
{{- if $k.curve.enabled }}
- --kv_events_curve_secret_key_file=/etc/chunkattn/kv-events-curve/secret-key
{{- if $k.curve.allowedClientKeys }}
- --kv_events_curve_client_keys_file=/etc/chunkattn/kv-events-clients/client-keys
{{- end }}
{{- else }}
- --kv_events_allow_plaintext_remote=true
{{- end }}
{{- end }}
{{- end -}}

{{/* The Secret with the KV-event ports' CURVE secret key: the user's, or the chart's own. */}}
{{- define "chunkattn.kvEventsCurveSecret" -}}
{{- .Values.kvEvents.curve.existingSecret | default (printf "%s-kv-events-curve" (include "chunkattn.fullname" .)) -}}
{{- end -}}

{{/* With KV events under CURVE: the secret key's volume, and the admitted clients' keys. */}}
{{- define "chunkattn.kvEventsCurveVolumes" -}}
{{- $k := .Values.kvEvents -}}
{{- if and $k.enabled $k.curve.enabled -}}
- name: kv-events-curve
  secret:
    secretName: {{ include "chunkattn.kvEventsCurveSecret" . }}
    items:
      - key: secret-key
        path: secret-key
{{- if $k.curve.allowedClientKeys }}
- name: kv-events-clients
  configMap:
    name: {{ include "chunkattn.fullname" . }}-kv-events-clients
    items:
      - key: client-keys
        path: client-keys
{{- end }}
{{- end }}
{{- end -}}

{{- define "chunkattn.kvEventsCurveMounts" -}}
{{- $k := .Values.kvEvents -}}
{{- if and $k.enabled $k.curve.enabled -}}
- name: kv-events-curve
  mountPath: /etc/chunkattn/kv-events-curve
  readOnly: true
{{- if $k.curve.allowedClientKeys }}
- name: kv-events-clients
  mountPath: /etc/chunkattn/kv-events-clients
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* A string, or an integer (--set kvEvents.hashSeed=0 gives one): never float notation. */}}
{{- define "chunkattn.kvEventsHashSeed" -}}
{{- $seed := .Values.kvEvents.hashSeed -}}
{{- if kindIs "string" $seed -}}{{ $seed }}{{- else -}}{{ int64 $seed }}{{- end -}}
{{- end -}}

{{/* The model volume (none for the built-in demo model). */}}
{{- define "chunkattn.modelVolume" -}}
{{- if eq .Values.model.source "pvc" -}}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required when model.source=pvc" .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" -}}
- name: model
  hostPath:
    path: {{ required "model.hostPath.path is required when model.source=hostPath" .Values.model.hostPath.path }}
    type: Directory
{{- end }}
{{- end -}}

{{- define "chunkattn.modelMount" -}}
{{- if ne .Values.model.source "demo" -}}
- name: model
  mountPath: /models
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod-level settings both components share. */}}
{{- define "chunkattn.podCommon" -}}
serviceAccountName: {{ include "chunkattn.serviceAccountName" . }}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}
