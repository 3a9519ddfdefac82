{{/* The pod templates, shared by today's layout (the coordinator Deployment, the worker
     StatefulSet) and the LeaderWorkerSet (leader = coordinator, workers = the ranks), so
     that both run the same containers, probes, secrets and volumes. */}}
{{- define "chunkattn.coordinator.podTemplate" -}}
{{- $c := .Values.coordinator -}}
metadata:
  labels:
    {{- include "chunkattn.coordinator.selectorLabels" . | nindent 4 }}
    {{- with $c.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $c.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- include "chunkattn.podCommon" . | nindent 2 }}
  # The drain, and time to stop after it.
  terminationGracePeriodSeconds: {{ add $c.drainTimeoutSeconds 15 }}
  containers:
    - name: coordinator
      image: {{ include "chunkattn.image" (dict "image" $c.image "root" .) | quote }}
      imagePullPolicy: {{ $c.image.pullPolicy }}
      command: ["/opt/chunkattn/bin/chunkattn-coordinator"]
      args:
        - --listen=0.0.0.0:{{ $c.grpcPort }}
        - --health_port={{ $c.healthPort }}
        - --metrics_host=0.0.0.0
        - --metrics_port={{ $c.metricsPort }}
        - --workers={{ include "chunkattn.workerAddresses" . }}
        - --model={{ include "chunkattn.modelPath" . }}
        - --load_format={{ .Values.model.loadFormat }}
        - --dummy_seed={{ .Values.model.dummySeed }}
        - --chunk_size={{ .Values.cache.chunkSize }}
        - --kv_dtype={{ .Values.cache.kvDtype }}
        - --prefix_sharing={{ .Values.cache.prefixSharing }}
        - --max_kv_chunks={{ .Values.cache.maxKvChunks }}
        - --max_retained_chunks_per_tenant={{ .Values.cache.maxRetainedChunksPerTenant }}
        - --decode_impl={{ .Values.scheduler.decodeImpl }}
        - --max_batch_size={{ .Values.scheduler.maxBatchSize }}
        - --max_tokens_per_step={{ .Values.scheduler.maxTokensPerStep }}
        - --join_timeout_s={{ $c.joinTimeoutSeconds }}
        - --collective_timeout_s={{ $c.collectiveTimeoutSeconds }}
        - --step_timeout_s={{ $c.stepTimeoutSeconds }}
        - --kv_tier_write_policy={{ .Values.cache.tiers.writePolicy }}
        - --kv_tier_max_loads_per_step={{ .Values.cache.tiers.maxLoadsPerStep }}
        {{- if include "chunkattn.kvStoreUrlSecret" . }}
        - --kv_store_url_file=/etc/chunkattn/kv-store/url  # the Secret, mounted: no password in argv
        {{- end }}
        {{- if include "chunkattn.kvStoreTlsSecret" . }}
        - --kv_store_tls_ca_file=/etc/chunkattn/kv-store-tls/ca.crt
        {{- if include "chunkattn.kvStoreTlsClientCertificate" . }}
        - --kv_store_tls_cert_file=/etc/chunkattn/kv-store-tls/tls.crt
        - --kv_store_tls_key_file=/etc/chunkattn/kv-store-tls/tls.key
        {{- end }}
        {{- end }}
        - --drain_timeout_s={{ $c.drainTimeoutSeconds }}
        {{- if .Values.http.enabled }}
        - --http_host=0.0.0.0
        - --http_port={{ .Values.http.port }}
        - {{ printf "--served_model_name=%s" (include "chunkattn.servedModelName" .) | quote }}
        {{- else }}
        - --http_port=0  # the coordinator's default is 8000
        {{- end }}
        {{- if .Values.tls.enabled }}
        - --tls_cert_file=/etc/chunkattn/tls/tls.crt
        - --tls_key_file=/etc/chunkattn/tls/tls.key
        {{- if .Values.tls.clientCASecretName }}
        - --tls_client_ca_file=/etc/chunkattn/client-ca/ca.crt
        {{- end }}
        {{- end }}
        {{- if .Values.workerAuth.enabled }}
        - --worker_token_file=/etc/chunkattn/worker-token/token
        {{- end }}
        {{- with include "chunkattn.workerTlsCoordinatorArgs" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- if .Values.metrics.auth.existingSecret }}
        - --metrics_token_file=/etc/chunkattn/metrics-token/token
        {{- end }}
        {{- if .Values.auth.enabled }}
        - --auth_token_file=/etc/chunkattn/auth/{{ .Values.auth.secretKey }}
        {{- end }}
        {{- with include "chunkattn.kvEventsArgs" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- range $c.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      {{- with include "chunkattn.coordinator.env" . | trim }}
      env:
        {{- . | nindent 8 }}
      {{- end }}
      ports:
        - name: grpc
          containerPort: {{ $c.grpcPort }}
          protocol: TCP
        - name: metrics
          containerPort: {{ $c.metricsPort }}
          protocol: TCP
        - name: health
          containerPort: {{ $c.healthPort }}
          protocol: TCP
        {{- if .Values.http.enabled }}
        - name: http
          containerPort: {{ .Values.http.port }}
          protocol: TCP
        {{- end }}
        {{- if .Values.kvEvents.enabled }}
        # KV-cache events (ZMQ PUB) and their replay (ZMQ ROUTER), for cache-aware routers.
        - name: kv-events
          containerPort: {{ .Values.kvEvents.port }}
          protocol: TCP
        - name: kv-replay
          containerPort: {{ .Values.kvEvents.replayPort }}
          protocol: TCP
        {{- end }}
      # Liveness does not wait for the workers (a coordinator waiting for them is
      # healthy); readiness does, so the Service sends calls only once they joined.
      # Liveness stays on the cheap plaintext gRPC health port.
      livenessProbe:
        grpc:
          port: {{ $c.healthPort }}
          service: liveness
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 6
      # Readiness: with the HTTP API on, GET /health on its port. Like the gRPC readiness it
      # is 200 only once every worker has joined, and it also proves that the port answers
      # which the Service's `http` and an InferencePool send requests to. The endpoint
      # picker keeps a pod in its pool exactly while it is Ready, so /health must turn 503
      # on SIGTERM as the gRPC readiness does. The kubelet speaks HTTPS without checking
      # the certificate but has no client certificate: where tls.clientCASecretName makes
      # the port require one, and with the HTTP API off, readiness stays gRPC health on
      # the plaintext health port.
      readinessProbe:
        {{- if include "chunkattn.httpProbe" . }}
        httpGet:
          path: /health
          port: http
          scheme: {{ ternary "HTTPS" "HTTP" .Values.tls.enabled }}
        {{- else }}
        grpc:
          port: {{ $c.healthPort }}
        {{- end }}
        periodSeconds: 5
        timeoutSeconds: 5
        failureThreshold: 3
      resources:
        {{- toYaml $c.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- with include "chunkattn.modelMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "chunkattn.workerTokenMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "chunkattn.kvStoreUrlMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "chunkattn.workerTlsMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- if .Values.metrics.auth.existingSecret }}
        - name: metrics-token
          mountPath: /etc/chunkattn/metrics-token
          readOnly: true
        {{- end }}
        {{- if .Values.tls.enabled }}
        - name: tls
          mountPath: /etc/chunkattn/tls
          readOnly: true
        {{- if .Values.tls.clientCASecretName }}
        - name: client-ca
          mountPath: /etc/chunkattn/client-ca
          readOnly: true
        {{- end }}
        {{- end }}
        {{- if .Values.auth.enabled }}
        - name: auth
          mountPath: /etc/chunkattn/auth
          readOnly: true
        {{- end }}
        {{- with include "chunkattn.kvEventsCurveMounts" . }}
        {{- . | nindent 8 }}
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- with include "chunkattn.modelVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "chunkattn.workerTokenVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "chunkattn.kvStoreUrlVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "chunkattn.kvStoreTlsVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "chunkattn.workerTlsVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with .Values.metrics.auth.existingSecret }}
    - name: metrics-token
      secret:
        secretName: {{ . }}
        items:
          - key: {{ $.Values.metrics.auth.secretKey }}
            path: token
    {{- end }}
    {{- if .Values.tls.enabled }}
    - name: tls
      secret:
        secretName: {{ required "tls.secretName is required when tls.enabled" .Values.tls.secretName }}
    {{- if .Values.tls.clientCASecretName }}
    - name: client-ca
      secret:
        secretName: {{ .Values.tls.clientCASecretName }}
    {{- end }}
    {{- end }}
    {{- if .Values.auth.enabled }}
    - name: auth
      secret:
        secretName: {{ required "auth.existingSecret is required when auth.enabled" .Values.auth.existingSecret }}
        items:
          - key: {{ .Values.auth.secretKey }}
            path: {{ .Values.auth.secretKey }}
    {{- end }}
    {{- with include "chunkattn.kvEventsCurveVolumes" . }}
    {{- . | nindent 4 }}
    {{- end }}
  {{- with $c.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "chunkattn.worker.podTemplate" -}}
{{- $w := .Values.worker -}}
metadata:
  labels:
    {{- include "chunkattn.worker.selectorLabels" . | nindent 4 }}
    {{- with $w.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $w.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- include "chunkattn.podCommon" . | nindent 2 }}
  {{- with $w.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ add $w.drainTimeoutSeconds 15 }}
  containers:
    - name: worker
      image: {{ include "chunkattn.image" (dict "image" $w.image "root" .) | quote }}
      imagePullPolicy: {{ $w.image.pullPolicy }}
      command: ["/opt/chunkattn/bin/chunkattn-worker"]
      args:
        - --listen=0.0.0.0:{{ $w.port }}
        - --device={{ .Values.device }}
        - --kv_cache_mib={{ $w.kvCacheMiB }}
        {{- with .Values.cache.tiers }}
        {{- if gt (int .hostMiB) 0 }}
        - --host_kv_cache_mib={{ .hostMiB }}
        {{- end }}
        {{- if gt (int .diskMiB) 0 }}
        - --disk_kv_cache_dir=/var/cache/chunkattn-kv
        - --disk_kv_cache_mib={{ .diskMiB }}
        {{- end }}
        {{- end }}
        - --threads={{ $w.threads }}
        - --drain_timeout_s={{ $w.drainTimeoutSeconds }}
        {{- if eq .Values.device "cuda" }}
        - --gpu_memory_fraction={{ $w.gpuMemoryFraction }}
        - --cuda_graphs={{ $w.cudaGraphs }}
        {{- end }}
        # The collectives (Gloo / NCCL bootstrap) bind and advertise the pod's IP.
        - --collective_host=$(POD_IP)
        - --model_root={{ include "chunkattn.modelRoot" . }}
        {{- if .Values.workerAuth.enabled }}
        - --worker_token_file=/etc/chunkattn/worker-token/token
        {{- end }}
        {{- with include "chunkattn.workerTlsWorkerArgs" . }}
        {{- . | nindent 8 }}
        {{- end }}
        # The probes' port: the gRPC port may speak only TLS, which the kubelet cannot.
        - --health_port={{ $w.healthPort }}
        {{- range $w.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        {{- if eq .Values.device "cpu" }}
        # Where the NVIDIA runtime is the default, a CPU worker sees no GPU.
        - name: NVIDIA_VISIBLE_DEVICES
          value: void
        {{- end }}
      ports:
        - name: grpc
          containerPort: {{ $w.port }}
          protocol: TCP
        - name: health
          containerPort: {{ $w.healthPort }}
          protocol: TCP
      # The worker's health is SERVING from start: it must be reachable before the
      # coordinator can Join it.
      livenessProbe:
        grpc:
          port: {{ $w.healthPort }}
          service: liveness  # SERVING through a SIGTERM drain, unlike readiness
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 6
      readinessProbe:
        grpc:
          port: {{ $w.healthPort }}
        periodSeconds: 5
        timeoutSeconds: 5
        failureThreshold: 3
      resources:
        {{- $res := deepCopy $w.resources }}
        {{- if eq .Values.device "cuda" }}
        {{- $limits := merge (dict "nvidia.com/gpu" (int $w.gpusPerWorker)) (default (dict) $res.limits) }}
        {{- $_ := set $res "limits" $limits }}
        {{- end }}
        {{- toYaml $res | nindent 8 }}
      securityContext:
        {{- toYaml .Values.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- with include "chunkattn.modelMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "chunkattn.workerTokenMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "chunkattn.workerTlsMount" . }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- if eq .Values.device "cuda" }}
        # NCCL's shared-memory transport between GPUs of one node.
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
        {{- if gt (int .Values.cache.tiers.diskMiB) 0 }}
        # The disk KV tier: prompts' KV, the pod's own (SECURITY.md), gone with the pod.
        - name: kv-tier
          mountPath: /var/cache/chunkattn-kv
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 256Mi
    {{- if gt (int .Values.cache.tiers.diskMiB) 0 }}
    - name: kv-tier
      emptyDir:
        sizeLimit: {{ add .Values.cache.tiers.diskMiB 64 }}Mi
    {{- end }}
    {{- if eq .Values.device "cuda" }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: 1Gi
    {{- end }}
    {{- with include "chunkattn.modelVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "chunkattn.workerTokenVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "chunkattn.workerTlsVolume" . }}
    {{- . | nindent 4 }}
    {{- end }}
  {{- with $w.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
