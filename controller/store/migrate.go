package store

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/fleetrepair/fleetrepair/migrations"
)

// Migration directions accepted by Migrate.
const (
	MigrateUp     = "up"     // apply every pending migration
	MigrateDown   = "down"   // roll back the newest applied migration
	MigrateReset  = "reset"  // roll back every applied migration (an empty schema)
	MigrateStatus = "status" // list migrations and whether each is applied
)

// Migrate applies the embedded migrations (../../migrations) to the database
// at dsn in the given direction (MigrateUp, MigrateDown, MigrateReset,
// MigrateStatus) and writes one line per migration applied, rolled back or
// listed to out (nil: discard). Concurrent callers (controller replicas
// starting together) serialize on a PostgreSQL advisory lock, so each
// migration runs once. Each migration runs in its own transaction.
func Migrate(ctx context.Context, dsn, direction string, out io.Writer) error {
	if out == nil {
		out = io.Discard
	}
	switch direction {
	case MigrateUp, MigrateDown, MigrateReset, MigrateStatus:
	default:
		return invalidf("migrate database: direction %q is not one of up, down, reset, status", direction)
	}
	db, err := openSQL(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := newMigrationProvider(db)
	if err != nil {
		return err
	}

	var results []*goose.MigrationResult
	switch direction {
	case MigrateUp:
		results, err = p.Up(ctx)
	case MigrateDown:
		var r *goose.MigrationResult
		if r, err = p.Down(ctx); r != nil {
			results = append(results, r)
		}
	case MigrateReset:
		results, err = p.DownTo(ctx, 0)
	case MigrateStatus:
		st, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("read migration status: %w", err)
		}
		for _, m := range st {
			at := ""
			if !m.AppliedAt.IsZero() {
				at = " " + m.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
			}
			fmt.Fprintf(out, "%-8s %05d %s%s\n", m.State, m.Source.Version, baseName(m.Source.Path), at)
		}
		return nil
	}
	for _, r := range results {
		fmt.Fprintf(out, "%-4s %05d %s (%s)\n", r.Direction, r.Source.Version, baseName(r.Source.Path), r.Duration.Round(1e6))
	}
	if err != nil {
		return fmt.Errorf("migrate database %s: %w", direction, err)
	}
	return nil
}

// MigrateTo applies the embedded migrations up to and including version
// (for tests of a migration on data written by the schema before it, and to
// stop an upgrade at a known version). Like Migrate, concurrent callers
// serialize on the advisory lock.
func MigrateTo(ctx context.Context, dsn string, version int64) error {
	db, err := openSQL(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := newMigrationProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		return fmt.Errorf("migrate database up to %d: %w", version, err)
	}
	return nil
}

func newMigrationProvider(db *sql.DB) (*goose.Provider, error) {
	// Poll the advisory lock every second for up to 5 minutes (the default
	// polls every 5 s, which slows every start that loses the race).
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("create migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}

// SchemaVersion returns the newest migration applied to the database at dsn
// and the newest embedded one; they differ when the database needs Migrate up
// (or was migrated by a newer controller).
func SchemaVersion(ctx context.Context, dsn string) (current, latest int64, err error) {
	db, err := openSQL(dsn)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	p, err := newMigrationProvider(db)
	if err != nil {
		return 0, 0, err
	}
	current, latest, err = p.GetVersions(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read schema version: %w", err)
	}
	return current, latest, nil
}

// openSQL opens dsn for goose (database/sql). It parses dsn as Open does,
// with pgxpool, so every URL the controller accepts works here too: the
// pool's own settings (pool_max_conns, pool_min_conns, ...) are taken out
// instead of being sent to the server as unknown run-time parameters.
func openSQL(dsn string) (*sql.DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse database DSN: %w", err)
	}
	return stdlib.OpenDB(*cfg.ConnConfig), nil
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}
