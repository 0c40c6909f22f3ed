#!/usr/bin/env bash
# Builds the pinned helm and kustomize (go.mod) into the folder $1, with
# the version information helm's own release build sets (its Makefile's
# LDFLAGS): helm template and helm lint then assume the Kubernetes version
# of helm's client libraries (1.34), as a released helm does.
set -euo pipefail
out=$(realpath -m "${1:?usage: build.sh OUTDIR}")
cd "$(dirname "$0")"
helmver=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
k8s=$(go list -m -f '{{.Version}}' k8s.io/client-go) # v0.MINOR.PATCH
minor=$(echo "$k8s" | cut -d. -f2)
ld="-s -w -X helm.sh/helm/v4/internal/version.version=$helmver -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v4/pkg/chart/v2/lint/rules helm.sh/helm/v4/internal/chart/v3/lint/rules helm.sh/helm/v4/pkg/chart/common; do
  ld="$ld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
done
ld="$ld -X helm.sh/helm/v4/internal/version.kubeClientVersionMajor=1 -X helm.sh/helm/v4/internal/version.kubeClientVersionMinor=$minor"
mkdir -p "$out"
go build -trimpath -ldflags "$ld" -o "$out/helm.tmp" helm.sh/helm/v4/cmd/helm
mv "$out/helm.tmp" "$out/helm"
go build -trimpath -ldflags '-s -w' -o "$out/kustomize.tmp" sigs.k8s.io/kustomize/kustomize/v5
mv "$out/kustomize.tmp" "$out/kustomize"
