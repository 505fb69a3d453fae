package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestIngestProbePlan: the duplicate probe stays a primary key probe when
// the day partitions were ANALYZEd while empty (reltuples 0), the
// statistics under which PostgreSQL otherwise plans a sequential scan of
// each partition per finding and keeps that generic plan as the day fills
// (findings.go, sqlStoredProbe). First the plan itself: the generic plan
// of the insert statement without sqlProbePlan scans the partitions
// sequentially (the risk is real on this server), with it probes each
// partition's primary key. Then the real path: reports written by the
// Store (both ways, the single statement and the COPY) after such an
// ANALYZE scan no day partition sequentially (pg_stat_user_tables).
func TestIngestProbePlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	own, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close(ctx)
	// Table statistics, read by own once every other backend of the
	// database exited: a backend reports its scans before it leaves
	// pg_stat_activity (or when idle, seconds later), so each phase's Store
	// is closed first.
	day := t0.UTC().Format("20060102")
	scans := func() [2]int64 {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var others int
			err := own.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&others)
			if err != nil {
				t.Fatal(err)
			}
			if others == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d backends of the Store still connected", others)
			}
		}
		if _, err := own.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		var got [2]int64
		err := own.QueryRow(ctx, `SELECT COALESCE(sum(seq_scan), 0), COALESCE(sum(idx_scan) FILTER (WHERE relname = $1), 0)
		    FROM pg_stat_user_tables WHERE relname ~ '^findings_p[0-9]{8}$'`, "findings_p"+day).Scan(&got[0], &got[1])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	setup, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.MaintainFindings(ctx, t0, store.FindingsMaintenance{Compact: -1}); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Pool().Exec(ctx, `ANALYZE findings`); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	// The setup's own scans (ATTACH PARTITION validates a new partition
	// by scanning it).
	base := scans()

	s, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	conn, err := s.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plan := func(name string, pinned bool) string {
		t.Helper()
		var out strings.Builder
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if pinned {
				if _, err := tx.Exec(ctx, store.SQLProbePlan); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `PREPARE `+name+` AS `+store.SQLInsertNewFindings); err != nil {
				return err
			}
			at := t0.Format(time.RFC3339)
			rows, err := tx.Query(ctx, fmt.Sprintf(`EXPLAIN (COSTS OFF) EXECUTE %s('{f1}', '{c1}', '{n1}', '{b}', '{xid}', '{""}', '{""}',
			    '{79}', '{1}', '{"{}"}', '{"[]"}', '{0}', '{%s}', '{%s}', '{%s}', '24 hours')`,
				name, at, at, t0.Add(-store.DedupClockSkew).Format(time.RFC3339)))
			if err != nil {
				return err
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			out.WriteString(strings.Join(lines, "\n"))
			return err
		})
		if err != nil {
			t.Fatalf("plan of the finding insert: %v", err)
		}
		return out.String()
	}
	if p := plan("probe_default", false); !strings.Contains(p, "Seq Scan on findings_p"+day) {
		t.Fatalf("test setup: without the setting the generic plan should scan the partition sequentially:\n%s", p)
	}
	p := plan("probe_pinned", true)
	if strings.Contains(p, "Seq Scan") || !strings.Contains(p, "Index Only Scan using findings_p"+day+"_pkey") ||
		strings.Contains(p, "coalesce") {
		t.Errorf("generic plan of the finding insert with sqlProbePlan: want a primary key probe per partition, no sequential scan, not the timeline index:\n%s", p)
	}
	conn.Release()

	// The real path: small groups (one statement) and a large one (COPY),
	// more than five statements per connection, so that the generic plans
	// are made too.
	for i := range 40 {
		r := report("c1", fmt.Sprintf("n%d", i%8), "boot-a", 1+i%3, t0.Add(time.Duration(i)*time.Second))
		if res, err := s.IngestReport(ctx, r, t0.Add(time.Duration(i)*time.Second)); err != nil || res.Inserted != len(r.Findings) {
			t.Fatalf("ingest: %+v, %v", res, err)
		}
	}
	for i := range 3 {
		r := report("c1", fmt.Sprintf("big%d", i), "boot-a", 300, t0.Add(time.Minute))
		if res, err := s.IngestReport(ctx, r, t0.Add(time.Minute)); err != nil || res.Inserted != 300 {
			t.Fatalf("ingest: %+v, %v", res, err)
		}
		if res, err := s.IngestReport(ctx, r, t0.Add(2*time.Minute)); err != nil || res.Inserted != 0 {
			t.Fatalf("resend: %+v, %v; want 0 inserted", res, err)
		}
	}
	s.Close()
	got := scans()
	if got[0] != base[0] || got[1] == base[1] {
		t.Errorf("day partitions after ingest: %d sequential scans, %d index scans of findings_p%s; want none, some",
			got[0]-base[0], got[1]-base[1], day)
	}
}
