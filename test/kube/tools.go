//go:build tools

// Package kube pins the kube-apiserver that the discovery tests run.
package kube

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
