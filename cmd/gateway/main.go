// Command gateway runs tlgate, the LLM inference gateway.
//
//	gateway -config tlgate.toml     run with a configuration file
//	gateway -demo                   run with in-process reference engines
//	gateway -demo -replicas 3       the same with 3 gateways sharing an embedded etcd and NATS
//	                                (not in a binary built with -tags noembed, as the image's is)
//	gateway -config F -seed-from D/routes.json   copy a file store's table into etcd, then exit
//	gateway -check -config tlgate.toml   validate a configuration and exit (0: valid)
//	gateway -version                print the version and build information
//
// -listen and -registry-listen override the listeners of either (port 0
// picks a free port; the demo prints the address it got).
//
// main parses flags and calls run, which builds the logger, the metrics
// registry and the gateway, reloads the keys, tokens and probed engines on
// SIGHUP (naming the changed keys that need a restart) and on SIGINT/SIGTERM
// turns /readyz 503, serves on for shutdown_delay, then stops everything in
// reverse, letting requests in flight finish within shutdown_timeout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/logbuf"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// maxReplicas bounds -replicas: the demo runs them all in one process.
const maxReplicas = 9

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, a second one ends the process at once (Go's
	// default), cutting the graceful stop short.
	context.AfterFunc(ctx, stop)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, hup); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// run runs the gateway until ctx ends, then stops it and returns nil (or
// why it could not start or stop cleanly). Each value received on reload
// (main feeds it SIGHUP) re-reads the -config file and applies its API
// keys, registry tokens and probed engines; a nil reload never fires.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, reload <-chan os.Signal) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "path of the TOML configuration file")
	demo := fs.Bool("demo", false, "run with in-process reference engines and example routes on loopback")
	listen := fs.String("listen", "", "HTTP listener host:port, overriding the config's listen (port 0: any free port)")
	registryListen := fs.String("registry-listen", "", "gRPC registry listener host:port, overriding the config's registry_listen")
	logFormat := fs.String("log-format", "", "json or console (default: the config's log_format; console with -demo)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	replicas := fs.Int("replicas", 1, "with -demo: gateway replicas sharing an embedded etcd and NATS (1: the file store, no sync)")
	seedFrom := fs.String("seed-from", "", "copy this routes.json (a file store's) into the -config's etcd store and exit")
	seedForce := fs.Bool("seed-force", false, "with -seed-from: replace a table etcd already holds")
	otlp := fs.String("otlp-endpoint", "", "OTLP receiver URL for traces (grpc, e.g. http://127.0.0.1:4317), overriding [gateway.tracing] endpoint; with -demo the engines export there too")
	version := fs.Bool("version", false, "print the version and build information, then exit")
	check := fs.Bool("check", false, "with -config: validate the configuration (keys, files, state_dir, route tables) and exit: 0 when it is valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see -h)", fs.Arg(0))
	}
	if *version {
		printVersion(stdout)
		return nil
	}
	var cfg *config.Config
	switch {
	case *check && *configPath == "":
		return errors.New("-check needs -config FILE")
	case *check && *demo:
		return errors.New("-check and -demo are exclusive")
	case *demo && *configPath != "":
		return errors.New("-demo and -config are exclusive")
	case *demo:
		cfg = demoConfig()
	case *configPath != "":
		var err error
		if cfg, err = config.Load(*configPath); err != nil {
			return err
		}
	default:
		return errors.New("-config FILE or -demo is required (see -h)")
	}
	if err := applyOverrides(cfg, *listen, *registryListen, *otlp); err != nil {
		return err
	}
	if *check {
		if err := gateway.Check(cfg); err != nil {
			return fmt.Errorf("%s: %w", *configPath, err)
		}
		fmt.Fprintf(stdout, "%s: ok\n", *configPath)
		return nil
	}
	switch {
	case *seedFrom != "" && *demo:
		return errors.New("-seed-from needs -config, not -demo")
	case *seedFrom != "":
		return seedStore(ctx, cfg, *seedFrom, *seedForce, stdout)
	case *replicas < 1 || *replicas > maxReplicas:
		return fmt.Errorf("-replicas: must be from 1 to %d, got %d", maxReplicas, *replicas)
	case *replicas > 1 && !*demo:
		return errors.New("-replicas needs -demo (a deployment runs one gateway per process)")
	}
	format := cfg.Gateway.LogFormat
	if *demo {
		format = config.LogConsole
	}
	if *logFormat != "" {
		format = *logFormat
	}
	logOut := stderr
	if d := cfg.Gateway.LogFlushInterval.Duration; d > 0 {
		lw := logbuf.New(stderr, d)
		defer func() { _ = lw.Close() }()
		logOut = lw
	}
	logger, err := newLogger(logOut, format, *logLevel)
	if err != nil {
		return err
	}
	if *demo && *replicas > 1 {
		return runReplicas(ctx, *replicas, logger, stdout)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The demo's engines (sims): the probed ones are listed in the
	// configuration, so they start first; the heartbeating ones need the
	// gateway's registry.
	var sims *demoFleet
	if *demo {
		if sims, err = startDemoProbed(ctx, cfg, logger); err != nil {
			return err
		}
	}
	gw, err := gateway.Start(ctx, cfg, gateway.Options{Logger: logger, Registry: reg, Gatherer: reg})
	if err != nil {
		if sims != nil {
			sims.stop()
		}
		if *configPath != "" {
			return fmt.Errorf("%s: %w", *configPath, err)
		}
		return fmt.Errorf("-demo: %w", err)
	}
	if sims != nil {
		if err := sims.startHeartbeating(ctx, gw, stdout); err != nil {
			sims.stop()
			_ = gw.Close(context.Background())
			if ctx.Err() != nil {
				return nil // stopped while starting: not a failure
			}
			return err
		}
	}
	running := *cfg // the reloader's copy: it records what each reload applied
	rl := &reloader{path: *configPath, running: &running, gw: gw, logger: logger,
		override: func(c *config.Config) error { return applyOverrides(c, *listen, *registryListen, *otlp) }}
	for waiting := true; waiting; {
		select {
		case <-ctx.Done():
			waiting = false
		case <-reload:
			rl.reload()
		}
	}
	shutdown(gw, cfg.Gateway, logger)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.ShutdownTimeout.Duration+time.Second)
	defer cancel()
	if sims != nil {
		sims.stop()
	}
	return gw.Close(sctx)
}

// shutdown is the first part of a graceful stop: /readyz turns 503 at
// once and the gateway goes on serving for shutdown_delay, so that load
// balancers and Kubernetes endpoints move away before it stops accepting
// (Close, which the caller runs next, then finishes what is in flight
// within shutdown_timeout).
func shutdown(gw *gateway.Gateway, g config.Gateway, logger zerolog.Logger) {
	gw.BeginShutdown()
	delay := g.ShutdownDelay.Duration
	logger.Info().Dur("shutdown_delay", delay).Dur("shutdown_timeout", g.ShutdownTimeout.Duration).
		Msg("shutting down: /readyz answers 503; still serving for shutdown_delay, then requests in flight get shutdown_timeout to finish")
	if delay > 0 {
		time.Sleep(delay)
	}
	logger.Info().Msg("shutdown delay over: no longer accepting; finishing requests in flight")
}

// applyOverrides applies the flags that override the configuration:
// -listen, -registry-listen and -otlp-endpoint (empty: keep the config's),
// validating the result and naming the flag on error.
func applyOverrides(cfg *config.Config, listen, registryListen, otlp string) error {
	if err := overrideListeners(cfg, listen, registryListen); err != nil {
		return err
	}
	if otlp != "" {
		cfg.Gateway.Tracing.Endpoint = otlp
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("-otlp-endpoint: %w", err)
		}
	}
	return nil
}

// overrideListeners applies -listen and -registry-listen (empty: keep the
// config's) and validates the result, naming the flags on error.
func overrideListeners(cfg *config.Config, listen, registryListen string) error {
	var flags []string
	if listen != "" {
		cfg.Gateway.Listen = listen
		flags = append(flags, "-listen")
	}
	if registryListen != "" {
		cfg.Gateway.RegistryListen = registryListen
		flags = append(flags, "-registry-listen")
	}
	if len(flags) == 0 {
		return nil
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%s: %w", joinFlags(flags), err)
	}
	return nil
}

func joinFlags(flags []string) string {
	if len(flags) == 1 {
		return flags[0]
	}
	return flags[0] + " and " + flags[1]
}

func newLogger(w io.Writer, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("-log-level: %w", err)
	}
	switch format {
	case config.LogJSON, "":
	case config.LogConsole:
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	default:
		return zerolog.Nop(), fmt.Errorf("-log-format: must be json or console, got %q", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
