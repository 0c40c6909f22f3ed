//go:build tools

// Package helm pins the helm and kustomize binaries that CI renders and
// lints the deployment with (deploy/helm/tlgate, deploy/kubernetes).
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
