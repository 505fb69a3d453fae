package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fleetrepair/fleetrepair/web/profiling"
)

// serveProfiling serves pprof on addr (--profiling-listen) until ctx ends:
// a CPU profile or goroutine dump of a controller that stalls under load is
// what the load harness found missing (docs/scale.md, "The 100,000-node
// runs"). The error names the flag.
func serveProfiling(ctx context.Context, addr string, log *slog.Logger) error {
	at, err := profiling.Serve(ctx, addr, func(err error) { log.Error("profiling listener stopped", "err", err) })
	if err != nil {
		return fmt.Errorf("--profiling-listen: %w", err)
	}
	log.Info("profiling: net/http/pprof served, unauthenticated", "addr", at)
	return nil
}
