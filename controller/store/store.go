// Package store is the controller's PostgreSQL storage: findings as the agents
// reported them, node facts, diagnoses, and the repair ledger with its
// append-only audit. It is the only package that uses pgx; all SQL lives here
// (as constants next to the functions that run it) and in ../../migrations.
//
// Conventions:
//   - Every method whose result depends on time takes `now time.Time`; the
//     store never calls time.Now or SQL now(), so callers and tests inject a
//     clock. Times are stored with microsecond precision and returned in UTC.
//   - Errors are translated at this edge: ErrNotFound (no such row),
//     ErrConflict (a unique key or a compare-and-set lost to another writer,
//     or a serialization failure: re-read and retry), ErrInvalid (a row the
//     schema refuses), ErrBudgetExceeded (a *BudgetExceededError) and
//     ErrUnavailable (the database cannot be reached or is overloaded: retry
//     later). Other errors are infrastructure failures. All are wrapped
//     "verb noun: %w".
//   - Every repair state change is checked with ledger.Check and writes its
//     audit entry in the same transaction.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetrepair/fleetrepair/controller/decide"
)

// Store is a pool of connections to the controller's database. It is safe
// for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// clusters holds the names of the cluster rows known to exist (they are
	// never deleted), so IngestReport creates each only once.
	clusters sync.Map
	// groups writes reports in groups (group commit, groupcommit.go).
	groups *reportGroups
}

// DefaultMaxConns is the connection pool size when the DSN does not set
// pool_max_conns: the ingest group writers (GroupWriters, half the pool at
// most) one each, the reconciler's workers (config.DefaultWorkers, 16) one
// each.
const DefaultMaxConns = 32

// GroupWriters is how many goroutines write report groups (groupcommit.go),
// each on one connection. Few on purpose: a group takes the reports waiting
// when its writer is free, so fewer writers make larger groups, and a
// group's statements cost about the same for 3 reports as for 30 (node
// locks, upsert, the finding insert with its partitions). With 16 writers
// (half the pool, before) small reports came in groups of about 3 and
// cost twice the PostgreSQL CPU per report of 4 writers; on a PostgreSQL
// of 2 cores more writers than cores only queue there (docs/scale.md,
// "Ingest at fleet rate"). Four leave a writer free while another writes a
// 10,000-finding group.
const GroupWriters = 4

// Open connects to the database at dsn (a postgres:// URL or a libpq
// keyword/value string) and checks that it answers. The schema must have been
// migrated (Migrate). Close releases the pool.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse database DSN: %w", err)
	}
	// Controllers run in UTC; timestamps come back as UTC anyway, this keeps
	// any text rendering in SQL (logs, errors) consistent.
	cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	cfg.ConnConfig.RuntimeParams["application_name"] = "fleetrepair"
	if !strings.Contains(dsn, "pool_max_conns") {
		// pgxpool's default, max(4, CPUs), is 4 on a 2-core pod: the
		// reconcile workers alone took all of it and ingest stalled behind
		// them in the load harness (docs/scale.md). Ingest in flight is
		// bounded separately (web/api MaxIngestInFlight), so 20 serves
		// workers, ingest and the API together; two replicas stay well
		// under PostgreSQL's default max_connections of 100.
		cfg.MaxConns = DefaultMaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database %s: %w", redact(cfg.ConnConfig), err)
	}
	s := &Store{pool: pool}
	// At most half the pool writes report groups; the rest serves
	// everything else.
	s.groups = startReportGroups(s, min(GroupWriters, int(cfg.MaxConns)/2))
	return s, nil
}

// Close closes every connection of the pool; it waits for connections in use
// to be released.
func (s *Store) Close() {
	s.groups.stop()
	s.pool.Close()
}

// Ping checks that the database answers (for /readyz).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	return nil
}

func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s", c.Host, c.Port, c.User, c.Database)
}

// Errors returned (wrapped) by Store methods; test with errors.Is.
var (
	// ErrNotFound: the row asked for does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: another writer got there first (a unique key, a lost
	// compare-and-set on a repair's state, a serialization failure). Re-read
	// the current state before deciding again.
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the database refused the data (a CHECK, NOT NULL or foreign
	// key constraint, a value out of range), or an argument is invalid.
	ErrInvalid = errors.New("invalid")
	// ErrBudgetExceeded: a deletion budget of the cluster is spent; the error
	// is a *BudgetExceededError carrying the numbers.
	ErrBudgetExceeded = decide.ErrBudgetExceeded
	// ErrUnavailable: the database could not be reached or could not serve
	// the request in time (connection refused or lost, server shutting down
	// or starting, too many connections, out of resources, statement
	// timeout, the caller's deadline). Nothing was written; retry later.
	ErrUnavailable = errors.New("database unavailable")
)

// dbError is a database error classified as one of the sentinel errors; it
// keeps the driver's error (*pgconn.PgError) in the chain.
type dbError struct {
	kind error
	err  error
}

func (e *dbError) Error() string   { return e.err.Error() }
func (e *dbError) Unwrap() []error { return []error{e.kind, e.err} }

// translate maps driver errors onto the sentinel errors; others pass through.
func translate(err error) error {
	var done *dbError
	if err == nil || errors.As(err, &done) {
		return err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return &dbError{kind: ErrNotFound, err: err}
	}
	if unavailable(err) {
		return &dbError{kind: ErrUnavailable, err: err}
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch {
		case pg.Code == "23505", // unique_violation
			pg.Code == "40001", // serialization_failure
			pg.Code == "40P01": // deadlock_detected
			return &dbError{kind: ErrConflict, err: err}
		case strings.HasPrefix(pg.Code, "23"), // integrity constraint violations
			strings.HasPrefix(pg.Code, "22"): // data exceptions (out of range, bad text)
			return &dbError{kind: ErrInvalid, err: err}
		}
	}
	return err
}

// unavailable tells whether err means the database could not serve the
// request now (as opposed to refusing it): see ErrUnavailable.
func unavailable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return strings.HasPrefix(pg.Code, "08") || // connection exception
			strings.HasPrefix(pg.Code, "53") || // insufficient resources (too many connections, disk full, out of memory)
			pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03" || // admin/crash shutdown, cannot connect now
			pg.Code == "57014" || // query_canceled: statement_timeout
			pg.Code == "55P03" // lock_not_available: lock_timeout (partition drop or swap, history.go)
	}
	var connect *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connect) || errors.As(err, &netErr) || pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// errorf wraps a translated err as "format: err".
func errorf(err error, format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, translate(err))...)
}

// invalidf returns an ErrInvalid for a bad argument.
func invalidf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrInvalid)...)
}

// inTx runs fn in a transaction (READ COMMITTED), committing when fn returns
// nil and rolling back otherwise.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}

// Helpers for nullable timestamps: the zero time.Time is NULL.

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func fromNull(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// DatabaseRefused reports whether err carries PostgreSQL's own refusal of a
// value (a constraint, a type, an encoding): callers answer the request as
// invalid without echoing the database's text, which names tables and
// constraints.
func DatabaseRefused(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg)
}
