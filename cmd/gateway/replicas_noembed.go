//go:build noembed

package main

import (
	"context"
	"errors"
	"io"

	"github.com/rs/zerolog"
)

// errNoEmbed answers -demo -replicas in a gateway built without the
// embedded etcd and NATS servers that only that demo needs (the image's).
var errNoEmbed = errors.New("-replicas: this gateway was built with -tags noembed, without the embedded etcd and NATS servers the replicas demo runs (go run ./cmd/gateway -demo -replicas N from a checkout has them)")

// runReplicas is -demo -replicas n, which this build cannot run.
func runReplicas(context.Context, int, zerolog.Logger, io.Writer) error { return errNoEmbed }
