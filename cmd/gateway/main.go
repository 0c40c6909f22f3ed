// Command gateway runs tlgate, the LLM inference gateway.
//
//	gateway -config tlgate.toml     run with a configuration file
//	gateway -demo                   run with in-process reference engines
//
// main parses flags and calls run, which builds the logger, the metrics
// registry and the gateway, and stops them in reverse on SIGINT/SIGTERM.
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

	"github.com/tlgate/tlgate/internal/config"
	"github.com/tlgate/tlgate/internal/gateway"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "path of the TOML configuration file")
	demo := fs.Bool("demo", false, "run with in-process reference engines and example routes on loopback")
	logFormat := fs.String("log-format", "", "json or console (default: the config's log_format; console with -demo)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see -h)", fs.Arg(0))
	}
	var cfg *config.Config
	switch {
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
	format := cfg.Gateway.LogFormat
	if *demo {
		format = config.LogConsole
	}
	if *logFormat != "" {
		format = *logFormat
	}
	logger, err := newLogger(stderr, format, *logLevel)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	gw, err := gateway.Start(ctx, cfg, gateway.Options{Logger: logger, Registry: reg, Gatherer: reg})
	if err != nil {
		return err
	}
	var stopDemo func()
	if *demo {
		if stopDemo, err = startDemo(ctx, gw, logger, stdout); err != nil {
			_ = gw.Close(context.Background())
			return err
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for waiting := true; waiting; {
		select {
		case <-ctx.Done():
			waiting = false
		case <-hup:
			reload(*configPath, gw, logger)
		}
	}
	logger.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.ShutdownTimeout.Duration+time.Second)
	defer cancel()
	if stopDemo != nil {
		stopDemo()
	}
	return gw.Close(sctx)
}

// reload re-reads the configuration on SIGHUP and applies what can change
// at run time: the list of probed engines. A bad file changes nothing.
func reload(path string, gw *gateway.Gateway, logger zerolog.Logger) {
	if path == "" {
		logger.Warn().Msg("SIGHUP ignored: no -config file to reload")
		return
	}
	cfg, err := config.Load(path)
	if err != nil {
		logger.Error().Err(err).Msg("reload refused; nothing changed")
		return
	}
	gw.ApplyEngines(cfg.Gateway.Engines)
	logger.Info().Int("engines", len(cfg.Gateway.Engines)).Msg("reloaded the probed engines")
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
