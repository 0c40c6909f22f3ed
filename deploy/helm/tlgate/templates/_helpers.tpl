{{/* The chart's name. */}}
{{- define "tlgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: the release name when it contains the chart's. */}}
{{- define "tlgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tlgate.etcdName" -}}{{ include "tlgate.fullname" . | trunc 58 | trimSuffix "-" }}-etcd{{- end -}}
{{- define "tlgate.natsName" -}}{{ include "tlgate.fullname" . | trunc 58 | trimSuffix "-" }}-nats{{- end -}}
{{- define "tlgate.secretName" -}}{{ include "tlgate.fullname" . | trunc 58 | trimSuffix "-" }}-keys{{- end -}}
{{- define "tlgate.configName" -}}{{ include "tlgate.fullname" . | trunc 56 | trimSuffix "-" }}-config{{- end -}}

{{- define "tlgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tlgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount the gateway runs as (serviceAccount.create is false)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of a component: (list $ "tlgate"|"etcd"|"nats"). */}}
{{- define "tlgate.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ if eq (index . 1) "tlgate" }}{{ include "tlgate.name" $root }}{{ else }}{{ index . 1 }}{{ end }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
{{- end -}}

{{/* Labels of a component's objects: (list $ "tlgate"|"etcd"|"nats"). */}}
{{- define "tlgate.labels" -}}
{{- $root := index . 0 -}}
{{ include "tlgate.selectorLabels" . }}
app.kubernetes.io/part-of: tlgate
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The port of a host:port listener. */}}
{{- define "tlgate.port" -}}
{{- $p := splitList ":" . | last -}}
{{- if not (regexMatch "^[0-9]+$" $p) -}}{{- fail (printf "config: listener %q has no port number" .) -}}{{- end -}}
{{- $p -}}
{{- end -}}

{{/*
tlgate.config: the [gateway] table the gateway reads, as YAML: .Values.config
with what the chart runs filled in (etcd endpoints, NATS URLs, the TLS
files), checked against the other values.
*/}}
{{- define "tlgate.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $store := default dict $cfg.store -}}
{{- if .Values.etcd.enabled -}}
{{- if not $store.kind -}}{{- $_ := set $store "kind" "etcd" -}}{{- end -}}
{{- if ne $store.kind "etcd" -}}
{{- fail (printf "etcd.enabled runs an etcd, but config.store.kind is %q: set it to etcd, or etcd.enabled=false" $store.kind) -}}
{{- end -}}
{{- if not $store.endpoints -}}
{{- $name := include "tlgate.etcdName" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "http://%s-%d.%s:2379" $name $i $name) -}}
{{- end -}}
{{- $_ := set $store "endpoints" $eps -}}
{{- end -}}
{{- else if and (eq (toString $store.kind) "etcd") (not $store.endpoints) -}}
{{- fail "config.store.kind is etcd: set config.store.endpoints to your etcd, or etcd.enabled=true for the chart's own" -}}
{{- end -}}
{{- if $store -}}{{- $_ := set $cfg "store" $store -}}{{- end -}}
{{- $sync := default dict $cfg.sync -}}
{{- if .Values.nats.enabled -}}
{{- if not $sync.kind -}}{{- $_ := set $sync "kind" "nats" -}}{{- end -}}
{{- if ne $sync.kind "nats" -}}
{{- fail (printf "nats.enabled runs NATS, but config.sync.kind is %q: set it to nats, or nats.enabled=false" $sync.kind) -}}
{{- end -}}
{{- if not $sync.token_env -}}
{{- fail "nats.enabled: the chart's NATS takes a token; set config.sync.token_env to a variable of secretEnv" -}}
{{- end -}}
{{- if not $sync.url -}}
{{- $name := include "tlgate.natsName" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.nats.replicas) -}}
{{- $urls = append $urls (printf "nats://%s-%d.%s:4222" $name $i $name) -}}
{{- end -}}
{{- $_ := set $sync "url" $urls -}}
{{- end -}}
{{- else if and (eq (toString $sync.kind) "nats") (not $sync.url) -}}
{{- fail "config.sync.kind is nats: set config.sync.url to your NATS, or nats.enabled=true for the chart's own" -}}
{{- end -}}
{{- if $sync -}}{{- $_ := set $cfg "sync" $sync -}}{{- end -}}
{{- if .Values.tls.existingSecret -}}
{{- $_ := set $cfg "tls_cert_file" "/etc/tlgate-tls/tls.crt" -}}
{{- $_ := set $cfg "tls_key_file" "/etc/tlgate-tls/tls.key" -}}
{{- end -}}
{{- $known := keys .Values.secretEnv -}}
{{- range .Values.extraEnv -}}{{- $known = append $known .name -}}{{- end -}}
{{- range $env := include "tlgate.envNames" $cfg | splitList " " | compact | uniq -}}
{{- if not (has $env $known) -}}
{{- fail (printf "config names the environment variable %s (a *_env key), which neither secretEnv nor extraEnv sets" $env) -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* tlgate.envNames: the values of every *_env key in a config tree, space-separated. */}}
{{- define "tlgate.envNames" -}}
{{- if kindIs "map" . -}}
{{- range $k, $v := . -}}
{{- if and (hasSuffix "_env" $k) (kindIs "string" $v) $v -}}{{ $v }} {{ end -}}
{{- include "tlgate.envNames" $v -}}
{{- end -}}
{{- else if kindIs "slice" . -}}
{{- range . -}}{{- include "tlgate.envNames" . -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/* tlgate.toml.key: a TOML key, bare when it can be. */}}
{{- define "tlgate.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{/*
tlgate.toml.value: a TOML value: a string, a boolean, a number (an integral
one as an integer: values files give every number as a float), an array
or an inline table.
*/}}
{{- define "tlgate.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}{{ toJson $v }}
{{- else if kindIs "bool" $v -}}{{ $v }}
{{- else if or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- if eq (float64 $v) (floor $v) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if kindIs "slice" $v -}}[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "tlgate.toml.value" $e }}{{ end }}]
{{- else if kindIs "map" $v -}}{ {{- range $i, $k := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ include "tlgate.toml.key" $k }} = {{ include "tlgate.toml.value" (get $v $k) }}{{ end }} }
{{- else -}}{{- fail (printf "config: cannot write %v (%s) in TOML" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* tlgate.toml.tableArray: "true" when a value is written as an array of tables. */}}
{{- define "tlgate.toml.tableArray" -}}
{{- if and (kindIs "slice" .) (gt (len .) 0) -}}{{- if kindIs "map" (first .) -}}true{{- end -}}{{- end -}}
{{- end -}}

{{/*
tlgate.toml.table: table .t under the header [.path]: its plain keys, then
its sub-tables, then its arrays of tables ([[.path.key]], each entry's
keys written inline).
*/}}
{{- define "tlgate.toml.table" -}}
{{- $t := .t -}}
{{- $path := .path -}}
[{{ $path }}]
{{- range $k := keys $t | sortAlpha -}}
{{- $v := get $t $k -}}
{{- if not (or (kindIs "map" $v) (include "tlgate.toml.tableArray" $v) (kindIs "invalid" $v)) }}
{{ include "tlgate.toml.key" $k }} = {{ include "tlgate.toml.value" $v }}
{{- end -}}
{{- end -}}
{{- range $k := keys $t | sortAlpha -}}
{{- $v := get $t $k -}}
{{- if kindIs "map" $v }}

{{ include "tlgate.toml.table" (dict "path" (printf "%s.%s" $path (include "tlgate.toml.key" $k)) "t" $v) }}
{{- end -}}
{{- end -}}
{{- range $k := keys $t | sortAlpha -}}
{{- $v := get $t $k -}}
{{- if include "tlgate.toml.tableArray" $v -}}
{{- range $e := $v }}

[[{{ $path }}.{{ include "tlgate.toml.key" $k }}]]
{{- range $ek := keys $e | sortAlpha -}}
{{- $ev := get $e $ek -}}
{{- if not (kindIs "invalid" $ev) }}
{{ include "tlgate.toml.key" $ek }} = {{ include "tlgate.toml.value" $ev }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* tlgate.gatewayToml: the gateway.toml the ConfigMap holds. */}}
{{- define "tlgate.gatewayToml" -}}
# Written by the tlgate Helm chart from its values (config); keys as in
# configs/README.md.
{{ include "tlgate.toml.table" (dict "path" "gateway" "t" (include "tlgate.config" . | fromYaml)) }}
{{ end -}}

{{/* tlgate.secretRef: the Secret and key a secretEnv variable comes from: (list $ NAME). */}}
{{- define "tlgate.secretRef" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $ref := default dict (get $root.Values.secretEnv $name) -}}
name: {{ default (include "tlgate.secretName" $root) $ref.secret }}
key: {{ if $ref.secret }}{{ default $name $ref.key }}{{ else }}{{ $name }}{{ end }}
{{- end -}}

{{/* tlgate.ownSecretKeys: the secretEnv variables the chart's own Secret holds, space-separated. */}}
{{- define "tlgate.ownSecretKeys" -}}
{{- range $name, $ref := .Values.secretEnv -}}
{{- if not (and $ref $ref.secret) -}}{{ $name }} {{ end -}}
{{- end -}}
{{- end -}}

{{/*
tlgate.discoveryRBAC: what discovery reads in each namespace, as YAML:
namespace -> {pods: bool, endpointslices: bool, inferencepools: [names]}.
A kubernetes source may read either Pods (selector) or EndpointSlices
(service), as deploy/kubernetes/rbac.yaml grants; an inferencepool source
reads its pool (by name) and Pods.
*/}}
{{- define "tlgate.discoveryRBAC" -}}
{{- $cfg := include "tlgate.config" . | fromYaml -}}
{{- $out := dict -}}
{{- range $d := $cfg.discovery -}}
{{- if or (eq $d.kind "kubernetes") (eq $d.kind "inferencepool") -}}
{{- range $ns := $d.namespaces -}}
{{- $r := default (dict "pods" false "endpointslices" false "inferencepools" (list)) (get $out $ns) -}}
{{- if eq $d.kind "inferencepool" -}}
{{- $_ := set $r "pods" true -}}
{{- $_ := set $r "inferencepools" (append $r.inferencepools $d.pool | uniq) -}}
{{- else -}}
{{- $_ := set $r "endpointslices" true -}}
{{- $_ := set $r "pods" true -}}
{{- end -}}
{{- $_ := set $out $ns $r -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
tlgate.durationMs: a Go duration string ("20s", "1m30s", "1.5h", "250ms",
"0"), as the gateway's config reads it, in milliseconds: (list KEY VALUE).
Anything else fails, naming KEY.
*/}}
{{- define "tlgate.durationMs" -}}
{{- $key := index . 0 -}}
{{- $d := index . 1 -}}
{{- if not (kindIs "string" $d) -}}
{{- fail (printf "%s: %v is not a duration string such as \"20s\" or \"1m30s\"" $key $d) -}}
{{- end -}}
{{- $part := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" -}}
{{- if not (regexMatch (printf "^\\+?(0|(%s)+)$" $part) $d) -}}
{{- fail (printf "%s: %q is not a duration such as \"20s\" or \"1m30s\"" $key $d) -}}
{{- end -}}
{{- $unit := dict "ns" 0.000001 "us" 0.001 "µs" 0.001 "μs" 0.001 "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 -}}
{{- $ms := 0.0 -}}
{{- range $p := regexFindAll $part $d -1 -}}
{{- $n := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" $p -}}
{{- $ms = addf $ms (mulf (float64 $n) (get $unit (trimPrefix $n $p))) -}}
{{- end -}}
{{- $ms -}}
{{- end -}}

{{/*
tlgate.checkGrace: a stop takes the preStop sleep, then shutdown_delay,
then at most shutdown_timeout; terminationGracePeriodSeconds must be
longer, or Kubernetes kills requests in flight. Fails otherwise. Absent
durations are the gateway's defaults (5s, 10s).
*/}}
{{- define "tlgate.checkGrace" -}}
{{- $cfg := .Values.config | default dict -}}
{{- $delay := include "tlgate.durationMs" (list "config.shutdown_delay" (default "5s" $cfg.shutdown_delay)) | float64 -}}
{{- $timeout := include "tlgate.durationMs" (list "config.shutdown_timeout" (default "10s" $cfg.shutdown_timeout)) | float64 -}}
{{- $need := addf (mulf (float64 .Values.preStopSleepSeconds) 1000.0) $delay $timeout -}}
{{- $grace := mulf (float64 .Values.terminationGracePeriodSeconds) 1000.0 -}}
{{- if le $grace $need -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be longer than preStopSleepSeconds (%v) + config.shutdown_delay (%v) + config.shutdown_timeout (%v) = %vs, or requests in flight are killed: raise terminationGracePeriodSeconds or lower the others" .Values.terminationGracePeriodSeconds .Values.preStopSleepSeconds (default "5s" $cfg.shutdown_delay) (default "10s" $cfg.shutdown_timeout) (divf $need 1000.0)) -}}
{{- end -}}
{{- end -}}
