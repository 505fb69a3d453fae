// Package profiling serves Go's net/http/pprof profiles on a listener of
// their own: the controller's --profiling-listen (off by default) and the
// load harness's own pprof (test/load). Never on the API's listener, whose
// routes are authenticated and rate-limited: profiles are unauthenticated,
// so the address belongs on loopback (the controller refuses any other),
// and the command line, which holds secrets, is not among them.
package profiling

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Serve listens on addr ("127.0.0.1:0": a free port) and serves the pprof
// handlers under /debug/pprof/ until ctx ends. It returns once the listener
// is open, with the address it listens on; the error names addr when it
// cannot listen. A serving error after that goes to onErr (nil: dropped).
func Serve(ctx context.Context, addr string, onErr func(error)) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen for profiling on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	// No /debug/pprof/cmdline: the command line holds secrets
	// (--database-url with its password, --agent-token).
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) && onErr != nil {
			onErr(err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return l.Addr().String(), nil
}
