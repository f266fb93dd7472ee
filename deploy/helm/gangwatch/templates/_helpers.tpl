{{/* Names and labels. */}}
{{- define "gangwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gangwatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "gangwatch.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gangwatch.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gangwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gangwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gangwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "gangwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gangwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gangwatch.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gangwatch.image" -}}
{{- $repo := required "image.repository is required: build the image from deploy/compose/Dockerfile and push it (docs/kubernetes.md)" .Values.image.repository -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gangwatch.bootstrap" -}}
{{- required "kafka.bootstrap is required: the Kafka brokers, host:port[,host:port]" .Values.kafka.bootstrap -}}
{{- end -}}

{{- define "gangwatch.signingSecret" -}}
{{- required "signing.existingSecret is required: a Secret holding the key actions are signed with (docs/kubernetes.md)" .Values.signing.existingSecret -}}
{{- end -}}

{{/* The ClickHouse store URL, or nothing. */}}
{{- define "gangwatch.storeURL" -}}
{{- with .Values.clickhouse -}}
{{- if .host -}}
{{- $q := list -}}
{{- if and .secure .caSecret -}}{{- $q = append $q (printf "ca_certs=/etc/gangwatch/clickhouse-tls/%s" .caKey) -}}{{- end -}}
{{- printf "%s://%s:%v/%s" (ternary "clickhouses" "clickhouse" (.secure | default false)) .host .port .database -}}
{{- if $q -}}?{{ join "&" $q }}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Kafka SASL / TLS variables and the signing secret: every gangwatch process of the chart. */}}
{{- define "gangwatch.kafkaEnv" -}}
- name: GANGWATCH_WEBHOOK_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "gangwatch.signingSecret" . }}
      key: {{ .Values.signing.key }}
{{- with .Values.kafka }}
{{- if hasPrefix "SASL_" .securityProtocol }}
- name: GANGWATCH_KAFKA_SASL_MECHANISM
  value: {{ required "kafka.sasl.mechanism is required with a SASL protocol" .sasl.mechanism | quote }}
- name: GANGWATCH_KAFKA_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ required "kafka.sasl.existingSecret is required with a SASL protocol" .sasl.existingSecret }}
      key: {{ .sasl.usernameKey }}
- name: GANGWATCH_KAFKA_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .sasl.existingSecret }}
      key: {{ .sasl.passwordKey }}
{{- end }}
{{- if .tls.existingSecret }}
- name: GANGWATCH_KAFKA_SSL_CAFILE
  value: /etc/gangwatch/kafka-tls/{{ .tls.caKey }}
{{- if .tls.certKey }}
- name: GANGWATCH_KAFKA_SSL_CERTFILE
  value: /etc/gangwatch/kafka-tls/{{ .tls.certKey }}
- name: GANGWATCH_KAFKA_SSL_KEYFILE
  value: /etc/gangwatch/kafka-tls/{{ required "kafka.tls.keyKey is required with kafka.tls.certKey" .tls.keyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gangwatch.kafkaTLSVolumeMount" -}}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: /etc/gangwatch/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gangwatch.kafkaTLSVolume" -}}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}
