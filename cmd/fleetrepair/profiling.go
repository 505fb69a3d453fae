package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// serveProfiling serves Go's net/http/pprof handlers on addr, on a listener
// of its own: never on the API's, whose routes are authenticated and
// rate-limited, and off unless asked for (--profiling-listen). A CPU
// profile or goroutine dump of a controller that stalls under load is what
// the load harness found missing (docs/scale.md, "The 100,000-node runs").
// It returns once the listener is open (an error names addr when it cannot
// be); stop closes it, and so does the end of ctx.
func serveProfiling(ctx context.Context, addr string, log *slog.Logger) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--profiling-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("profiling: net/http/pprof served, unauthenticated", "addr", l.Addr().String())
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("profiling listener stopped", "err", err)
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return cancel, nil
}
