package pgtest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// BackendCPU returns the CPU time so far of the PostgreSQL backends
// connected to conn's database, but conn's own: the sum of the first field
// of each backend's /proc/PID/schedstat (nanoseconds on a CPU), so the
// server must run on this machine (the throwaway server, or a
// DATABASE_URL on this host). A backend that ended meanwhile is not
// counted (pgxpool keeps its connections); benchmarks take the difference
// of two calls as the database's CPU cost of what ran between them, a
// figure a machine shared with other work changes far less than wall
// time. Errors are the query's.
func BackendCPU(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	rows, _ := conn.Query(ctx,
		`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, fmt.Errorf("list backends: %w", err)
	}
	var total time.Duration
	for _, pid := range pids {
		total += schedTime(fmt.Sprintf("/proc/%d/schedstat", pid))
	}
	return total, nil
}

// schedTime is the first field of a schedstat file: time spent on a CPU
// (0 when it cannot be read: the process ended).
func schedTime(path string) time.Duration {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return 0
	}
	ns, _ := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns)
}
