{{/* Names: 63 characters at most (DNS label), no trailing dash. */}}
{{- define "hookline.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hookline.fullname" -}}
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

{{/* <fullname>-<component>, e.g. hookline-receiver. Call with (dict "ctx" $ "component" "receiver"). */}}
{{- define "hookline.componentName" -}}
{{- printf "%s-%s" (include "hookline.fullname" .ctx | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "hookline.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels on every object. */}}
{{- define "hookline.labels" -}}
helm.sh/chart: {{ include "hookline.chart" . }}
{{ include "hookline.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hookline
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "hookline.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hookline.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component: (dict "ctx" $ "component" "receiver"). */}}
{{- define "hookline.componentLabels" -}}
{{ include "hookline.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Selector labels of one component; immutable once a Deployment exists, so no version in here. */}}
{{- define "hookline.componentSelectorLabels" -}}
{{ include "hookline.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* repository:tag or repository@digest. */}}
{{- define "hookline.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding HOOKLINE_DATABASE_URL: the user's, or the dev Postgres one. */}}
{{- define "hookline.databaseSecretName" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else if .Values.devPostgres.enabled }}
{{- include "hookline.componentName" (dict "ctx" . "component" "dev-database") }}
{{- else }}
{{- fail "database.existingSecret is required: create a Secret holding the postgresql:// URL (key database.secretKey, default \"url\") and set database.existingSecret to its name" }}
{{- end }}
{{- end }}

{{/* The Secret holding the key file of secrets at rest (values secretsAtRest). */}}
{{- define "hookline.secretKeysSecretName" -}}
{{- .Values.secretsAtRest.existingSecret | default (include "hookline.componentName" (dict "ctx" . "component" "secret-keys")) }}
{{- end }}

{{/* Where the key file is mounted: the receiver, relay, operator and migrate Job, never a worker. */}}
{{- define "hookline.secretKeysEnv" -}}
- name: HOOKLINE_SECRET_KEYS_FILE
  value: /etc/hookline/secret-keys/keys
{{- end }}

{{/* Keys from values roll the pods that read them, so `helm upgrade --wait` returns once every
pod has the new key file: only then may `hookline secrets rotate-key` run. */}}
{{- define "hookline.secretKeysChecksum" -}}
checksum/secret-keys: {{ .Values.secretsAtRest.keys | toJson | sha256sum }}
{{- end }}

{{- define "hookline.secretKeysMount" -}}
- name: secret-keys
  mountPath: /etc/hookline/secret-keys
  readOnly: true
{{- end }}

{{- define "hookline.secretKeysVolume" -}}
- name: secret-keys
  secret:
    secretName: {{ include "hookline.secretKeysSecretName" . }}
    # Readable by the pod's fsGroup (podSecurityContext), not by other users.
    defaultMode: 0440
    items:
      - key: {{ .Values.secretsAtRest.secretKey }}
        path: keys
{{- end }}

{{/* The Secret holding the console's CSRF key (values console.csrf). */}}
{{- define "hookline.consoleCsrfSecretName" -}}
{{- .Values.console.csrf.existingSecret | default (include "hookline.componentName" (dict "ctx" . "component" "console-csrf")) }}
{{- end }}

{{/* The database password file (values database.passwordFile), when set: the receiver, relay, operator
and migrate Job read it at each new connection; worker pods never get it (they log in as their own role). */}}
{{- define "hookline.databasePasswordEnv" -}}
{{- if .Values.database.passwordFile.existingSecret }}
{{- if not .Values.database.existingSecret }}
{{- fail "database.passwordFile needs database.existingSecret, a URL without a password (the dev Postgres's URL has one: the processes would refuse to start)" }}
{{- end }}
- name: HOOKLINE_DATABASE_PASSWORD_FILE
  value: /etc/hookline/database-password/password
{{- end }}
{{- end }}

{{- define "hookline.databasePasswordMount" -}}
{{- if .Values.database.passwordFile.existingSecret }}
- name: database-password
  mountPath: /etc/hookline/database-password
  readOnly: true
{{- end }}
{{- end }}

{{/* No subPath: the kubelet then updates the file when the Secret changes (a refreshed token). */}}
{{- define "hookline.databasePasswordVolume" -}}
{{- if .Values.database.passwordFile.existingSecret }}
- name: database-password
  secret:
    secretName: {{ .Values.database.passwordFile.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.database.passwordFile.secretKey }}
        path: password
{{- end }}
{{- end }}

{{/* Postgres's CA bundle and client certificate (values database.tls), at one fixed path in every pod
that connects (the URL names the files: docs/postgres.md, "TLS"). */}}
{{- define "hookline.postgresTLSMount" -}}
{{- if or .Values.database.tls.caSecret .Values.database.tls.clientSecret }}
- name: postgres-tls
  mountPath: /etc/hookline/postgres-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "hookline.postgresTLSVolume" -}}
{{- $tls := .Values.database.tls }}
{{- if or $tls.caSecret $tls.clientSecret }}
- name: postgres-tls
  projected:
    # Readable by the pod's fsGroup (podSecurityContext), not by other users.
    defaultMode: 0440
    sources:
      {{- if $tls.caSecret }}
      - secret:
          name: {{ $tls.caSecret }}
          items:
            - key: {{ $tls.caKey }}
              path: ca.crt
      {{- end }}
      {{- if $tls.clientSecret }}
      - secret:
          name: {{ $tls.clientSecret }}
          items:
            - key: tls.crt
              path: client.crt
            - key: tls.key
              path: client.key
      {{- end }}
{{- end }}
{{- end }}

{{/* Environment shared by every Hookline container. */}}
{{- define "hookline.commonEnv" -}}
- name: HOOKLINE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "hookline.databaseSecretName" . }}
      key: {{ .Values.database.secretKey }}
{{- if not (has .Values.database.pooling (list "session" "transaction")) }}
{{- fail "database.pooling must be session or transaction" }}
{{- end }}
{{- if .Values.database.sessionUrl.existingSecret }}
- name: HOOKLINE_DATABASE_SESSION_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.sessionUrl.existingSecret }}
      key: {{ .Values.database.sessionUrl.secretKey }}
{{- else if eq .Values.database.pooling "transaction" }}
{{- fail "database.pooling=transaction needs database.sessionUrl.existingSecret: a Secret holding a direct (or session-mode) postgresql:// URL for LISTEN, leader election and migrations" }}
{{- end }}
- name: HOOKLINE_DATABASE_POOLING
  value: {{ .Values.database.pooling | quote }}
- name: HOOKLINE_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: HOOKLINE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
# Default retention for the partition manager (the relays' or a `worker --sweep`'s leader).
- name: HOOKLINE_RETENTION_DONE_HOURS
  value: {{ .Values.retention.doneHours | quote }}
- name: HOOKLINE_RETENTION_DEAD_DAYS
  value: {{ .Values.retention.deadDays | quote }}
- name: HOOKLINE_RETENTION_DEDUP_DAYS
  value: {{ .Values.retention.dedupDays | quote }}
- name: HOOKLINE_RETENTION_MAX_DONE_HOURS
  value: {{ .Values.retention.maxDoneHours | quote }}
- name: HOOKLINE_RETENTION_MAX_DEAD_DAYS
  value: {{ .Values.retention.maxDeadDays | quote }}
- name: HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS
  value: {{ .Values.retention.endpoints.doneHours | quote }}
- name: HOOKLINE_ENDPOINT_RETENTION_DEAD_DAYS
  value: {{ .Values.retention.endpoints.deadDays | quote }}
{{- if .Values.devSourceSync.enabled }}
- name: PYTHONPATH
  value: /opt/hookline-dev/src
{{- end }}
{{- end }}

{{/* Scrape annotations for a pod serving /metrics on `port`: (dict "ctx" $ "port" 8080). */}}
{{- define "hookline.scrapeAnnotations" -}}
{{- if .ctx.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* Writable scratch space: the root filesystem is read-only. */}}
{{- define "hookline.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- include "hookline.postgresTLSMount" . | nindent 0 }}
{{- if .Values.devSourceSync.enabled }}
- name: dev-src
  mountPath: /opt/hookline-dev/src
{{- end }}
{{- end }}

{{- define "hookline.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- include "hookline.postgresTLSVolume" . | nindent 0 }}
{{- if .Values.devSourceSync.enabled }}
- name: dev-src
  emptyDir:
    sizeLimit: 64Mi
{{- end }}
{{- end }}

{{/* Dev source sync: seed the emptyDir with the installed packages so that synced files overlay a
complete copy (a partial package on PYTHONPATH would shadow the installed one). */}}
{{- define "hookline.devSourceInit" -}}
{{- if .Values.devSourceSync.enabled }}
initContainers:
  - name: seed-dev-src
    image: {{ include "hookline.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command:
      - sh
      - -c
      - cp -r "$(python -c 'import hookline, os; print(os.path.dirname(os.path.dirname(hookline.__file__)))')"/hookline* /opt/hookline-dev/src/
    resources:
      requests: {cpu: 10m, memory: 32Mi}
      limits: {cpu: 500m, memory: 128Mi}
    securityContext:
      {{- toYaml .Values.containerSecurityContext | nindent 6 }}
    volumeMounts:
      {{- include "hookline.volumeMounts" . | nindent 6 }}
{{- end }}
{{- end }}

{{- define "hookline.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Namespaces the operator watches (and gets a Role in). */}}
{{- define "hookline.operatorNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- join "," (uniq .Values.operator.watchNamespaces) }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{- /* Exactly the calls the operator makes, nothing more (kopf runs standalone with scanning off: no
peering objects, no CRD or namespace reads). Every write is a PATCH (kopf merge- and JSON-patches; the
operator's own client patches), so no rule grants `update` except the finalizers one below.
tests/chart/test_chart_apiserver.py asks the API server (`kubectl auth can-i`) for each verb here and
runs the operator's scenarios as this role. */}}
{{- define "hookline.operatorRules" -}}
# Its own resource: kopf lists and watches it and patches finalizers and annotations (its handler
# state); the operator gets one to check that a provider name's owner still exists.
- apiGroups: [hookline.io]
  resources: [webhookproviders, webhookendpoints]
  verbs: [get, list, watch, patch]
- apiGroups: [hookline.io]
  resources: [webhookproviders/status, webhookendpoints/status]
  verbs: [patch]
# Owner references with blockOwnerDeletion need this where OwnerReferencesPermissionEnforcement is on.
- apiGroups: [hookline.io]
  resources: [webhookproviders/finalizers, webhookendpoints/finalizers]
  verbs: [update]
# Its Secrets (signing secret, the workers' database credential, the destination key): read one by
# name, create it when absent, patch it to rotate. No list/watch: it never enumerates Secrets.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
# The per-provider worker Deployment: read by name, created, its pod template patched; never listed
# or deleted (garbage collection removes it with its WebhookProvider)...
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch]
# ...and scaled through the scale subresource (a separate resource for RBAC).
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [patch]
# Kubernetes Events for every action: kopf posts core/v1 Events, one per action, never patched.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/* The worker image: worker.image, else the chart's image. */}}
{{- define "hookline.workerImage" -}}
{{- default (include "hookline.image" .) .Values.worker.image }}
{{- end }}

{{/* The worker pod template the operator reads (templates/worker-template.yaml): `concurrency`,
a PodTemplateSpec whose container `worker` the operator completes with its command, probes, ports and
the namespace's database Secret, and `tenantPlacement`, what a provider may add to the pods' placement. */}}
{{- define "hookline.workerTemplate" -}}
{{- $w := .Values.worker -}}
concurrency: {{ int $w.concurrency }}
tenantPlacement:
  {{- toYaml ($w.tenantPlacement | default dict) | nindent 2 }}
pod:
  metadata:
    labels:
      {{- include "hookline.labels" . | nindent 6 }}
      {{- with $w.podLabels }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- $annotations := merge (dict) ($w.podAnnotations | default dict) }}
    {{- if .Values.metrics.scrapeAnnotations }}
    {{- $_ := set $annotations "prometheus.io/scrape" "true" }}
    {{- $_ := set $annotations "prometheus.io/port" "8081" }}
    {{- $_ := set $annotations "prometheus.io/path" "/metrics" }}
    {{- end }}
    annotations:
      {{- toYaml $annotations | nindent 6 }}
  spec:
    {{- with $w.serviceAccountName }}
    serviceAccountName: {{ . }}
    {{- end }}
    {{- with $w.priorityClassName }}
    priorityClassName: {{ . }}
    {{- end }}
    securityContext:
      {{- toYaml (default .Values.podSecurityContext $w.podSecurityContext) | nindent 6 }}
    {{- with (default .Values.imagePullSecrets $w.imagePullSecrets) }}
    imagePullSecrets:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $w.nodeSelector }}
    nodeSelector:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $w.tolerations }}
    tolerations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $w.affinity }}
    affinity:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $w.topologySpreadConstraints }}
    topologySpreadConstraints:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    containers:
      - name: worker
        image: {{ include "hookline.workerImage" . }}
        imagePullPolicy: {{ default .Values.image.pullPolicy $w.pullPolicy }}
        resources:
          {{- toYaml $w.resources | nindent 10 }}
        securityContext:
          {{- toYaml (default .Values.containerSecurityContext $w.containerSecurityContext) | nindent 10 }}
        env:
          - name: HOOKLINE_LOG_FORMAT
            value: {{ .Values.logFormat | quote }}
          - name: HOOKLINE_LOG_LEVEL
            value: {{ .Values.logLevel | quote }}
          {{- with $w.extraEnv }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        {{- with $w.extraEnvFrom }}
        envFrom:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with (include "hookline.postgresTLSMount" .) }}
        volumeMounts:
          {{- . | nindent 10 }}
        {{- end }}
    {{- with (include "hookline.postgresTLSVolume" .) }}
    volumes:
      {{- . | nindent 6 }}
    {{- end }}
{{- end }}

{{/* Each process's most connections, named as in hookline.core.pools (where the services size
their pools): tests/chart checks the chart's sums against those functions for every number here. */}}
{{- define "hookline.pools" -}}
receiverExtra: 2   {{- /* pools.RECEIVER_EXTRA */}}
relayCap: 16       {{- /* pools.RELAY_CAP */}}
relayExtra: 4      {{- /* pools.RELAY_EXTRA */}}
operator: 5        {{- /* pools.OPERATOR */}}
console: 6         {{- /* pools.CONSOLE */}}
migrateJob: 1      {{- /* hookline migrate: one connection, no pool */}}
workerExtra: 5     {{- /* pools.WORKER_EXTRA */}}
{{- end }}

{{/* Connections the fixed part of a release may hold at once (database.maxConnections explains the
sum): each Deployment's replicas plus its one surge pod, times what one pod holds. */}}
{{- define "hookline.fixedConnections" -}}
{{- $pools := include "hookline.pools" . | fromYaml -}}
{{- $r := .Values.receiver -}}
{{- $receiverPods := add1 (int (ternary $r.autoscaling.maxReplicas $r.replicas $r.autoscaling.enabled)) -}}
{{- $total := mul $receiverPods (add (int $r.dbConnections) $pools.receiverExtra) -}}
{{- if .Values.relay.enabled }}
{{- $relayPod := add (min (int .Values.relay.concurrency) $pools.relayCap) $pools.relayExtra -}}
{{- $total = add $total (mul (add1 (int .Values.relay.replicas)) $relayPod) -}}
{{- end }}
{{- if .Values.console.enabled }}
{{- $total = add $total (mul (add1 (int .Values.console.replicas)) $pools.console) -}}
{{- end }}
{{- if .Values.operator.enabled }}
{{- $total = add $total $pools.operator -}}
{{- end }}
{{- if .Values.migrate.enabled }}
{{- $total = add $total $pools.migrateJob -}}
{{- end }}
{{- $total -}}
{{- end }}

{{/* What database.maxConnections leaves for the workers; fails when that is not one worker pod. */}}
{{- define "hookline.workerConnectionBudget" -}}
{{- $max := int .Values.database.maxConnections -}}
{{- $fixed := int (include "hookline.fixedConnections" .) -}}
{{- $perWorker := add (int .Values.worker.concurrency) (include "hookline.pools" . | fromYaml).workerExtra -}}
{{- if lt (sub $max $fixed) $perWorker }}
{{- fail (printf "database.maxConnections=%d leaves no room for a worker pod: receiver, relay, console, operator and migrations may hold %d connections, and one worker pod needs %d (worker.concurrency + 5); raise database.maxConnections or lower the replicas or pool sizes" $max $fixed $perWorker) }}
{{- end }}
{{- sub $max $fixed -}}
{{- end }}
