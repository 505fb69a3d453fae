package store_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.EmptyDSN(t)
	version := func() (int64, int64) {
		t.Helper()
		cur, latest, err := store.SchemaVersion(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		return cur, latest
	}
	tables := func() []string {
		t.Helper()
		s, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rows, err := s.Pool().Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
			WHERE ns.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname <> 'goose_db_version' ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	want := []string{"breaker_decisions", "breaker_state", "clusters", "diagnoses", "events", "finding_partition_compactions", "findings", "nodes", "repair_audit", "repair_findings", "repairs", "security_audit", "sessions"}

	var out strings.Builder
	if err := store.Migrate(ctx, dsn, store.MigrateUp, &out); err != nil {
		t.Fatalf("up: %v", err)
	}
	if !strings.Contains(out.String(), "00001_init.sql") {
		t.Errorf("up printed %q, want a line per migration", out.String())
	}
	if cur, latest := version(); cur != latest {
		t.Fatalf("after up: version %d, latest %d", cur, latest)
	}
	if got := tables(); !slices.Equal(got, want) {
		t.Fatalf("after up: tables %v, want %v", got, want)
	}
	// Up again is a no-op.
	if err := store.Migrate(ctx, dsn, store.MigrateUp, nil); err != nil {
		t.Fatalf("second up: %v", err)
	}

	out.Reset()
	if err := store.Migrate(ctx, dsn, store.MigrateStatus, &out); err != nil {
		t.Fatalf("status: %v", err)
	}
	if !strings.Contains(out.String(), "applied") {
		t.Errorf("status printed %q, want applied migrations", out.String())
	}

	if err := store.Migrate(ctx, dsn, store.MigrateReset, nil); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if cur, _ := version(); cur != 0 {
		t.Fatalf("after reset: version %d, want 0", cur)
	}
	if got := tables(); len(got) != 0 {
		t.Fatalf("after reset: tables %v left behind", got)
	}

	if err := store.Migrate(ctx, dsn, store.MigrateUp, nil); err != nil {
		t.Fatalf("up after reset: %v", err)
	}
	if got := tables(); !slices.Equal(got, want) {
		t.Fatalf("after up again: tables %v, want %v", got, want)
	}
	cur, latest := version()
	if err := store.Migrate(ctx, dsn, store.MigrateDown, nil); err != nil {
		t.Fatalf("down: %v", err)
	}
	if c, _ := version(); c >= cur || latest != cur {
		t.Fatalf("down went from %d to %d", cur, c)
	}

	if err := store.Migrate(ctx, dsn, "sideways", nil); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Migrate(sideways) = %v, want ErrInvalid", err)
	}
}

// TestSchemaMatchesLedger checks that the state lists written into the
// migration agree with controller/ledger: the CHECK on repairs.state lists
// every state, the unique index on open repairs exactly the open ones.
func TestSchemaMatchesLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	quoted := regexp.MustCompile(`'([a-z_]+)'`)
	states := func(q string) []string {
		t.Helper()
		var def string
		if err := s.Pool().QueryRow(ctx, q).Scan(&def); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range quoted.FindAllStringSubmatch(def, -1) {
			out = append(out, m[1])
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	names := func(ss []ledger.State) []string {
		var out []string
		for _, s := range ss {
			out = append(out, string(s))
		}
		slices.Sort(out)
		return out
	}
	all := states(`SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'repairs_state_check'`)
	if want := names(ledger.AllStates); !slices.Equal(all, want) {
		t.Errorf("CHECK on repairs.state allows %v, ledger.AllStates is %v", all, want)
	}
	for _, q := range []string{
		`SELECT pg_get_indexdef('repairs_one_open_per_node'::regclass)`,
		`SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'repairs_closed_iff_terminal'`,
	} {
		if got, want := states(q), names(ledger.OpenStates()); !slices.Equal(got, want) {
			t.Errorf("%s lists %v, ledger.OpenStates is %v", q, got, want)
		}
	}
}

func TestAppendOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r, _, err := s.OpenRepair(ctx, store.Repair{Cluster: "c", Node: "n", Reason: "GPUFallenOffBus"}, "controller", "test", t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE repair_audit SET actor = 'mallory' WHERE repair_id = $1`,
		`DELETE FROM repair_audit WHERE repair_id = $1`,
	} {
		if _, err := s.Pool().Exec(ctx, q, r.ID); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: err = %v, want append-only refusal", q, err)
		}
	}
}

// TestMigrateWithPoolSettings: a database URL carrying pgxpool settings,
// which Open accepts, migrates too (issue 11: --migrate failed on
// pool_max_conns, sent to the server as a run-time parameter).
func TestMigrateWithPoolSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.EmptyDSN(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	if !strings.Contains(dsn, "://") {
		dsn += " pool_max_conns=4 pool_min_conns=1"
	} else {
		dsn += sep + "pool_max_conns=4&pool_min_conns=1"
	}
	if err := store.Migrate(ctx, dsn, store.MigrateUp, nil); err != nil {
		t.Fatalf("migrate with pool settings: %v", err)
	}
	if cur, latest, err := store.SchemaVersion(ctx, dsn); err != nil || cur != latest {
		t.Fatalf("schema version %d of %d (%v)", cur, latest, err)
	}
	s, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
