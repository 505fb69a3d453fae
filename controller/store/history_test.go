package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// partitionOf returns the partition holding finding id of node n1.
func partitionOf(t *testing.T, s *store.Store, id string) string {
	t.Helper()
	var p string
	if err := s.Pool().QueryRow(context.Background(),
		`SELECT tableoid::regclass::text FROM findings WHERE cluster = 'c1' AND node = 'n1' AND id = $1`, id).Scan(&p); err != nil {
		t.Fatalf("partition of %s: %v", id, err)
	}
	return p
}

// TestMaintainFindings: partitions are created ahead (moving what landed in
// the default partition), retention drops whole days, and repairs,
// diagnoses and their audit survive the findings they point at.
func TestMaintainFindings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	// Far from the days the migration created partitions for.
	now := time.Date(2027, 3, 10, 12, 0, 0, 0, time.UTC)
	old := report("c1", "n1", "boot-a", 2, now.AddDate(0, 0, -40))
	cur := report("c1", "n1", "boot-a", 3, now)
	for _, r := range []struct {
		rep finding.Report
		at  time.Time
	}{{old, now.AddDate(0, 0, -40)}, {cur, now}} {
		if res, err := s.IngestReport(ctx, r.rep, r.at); err != nil || res.Inserted != len(r.rep.Findings) {
			t.Fatalf("ingest: %+v, %v", res, err)
		}
	}
	if p := partitionOf(t, s, cur.Findings[0].ID); p != "findings_default" {
		t.Fatalf("before maintenance the finding is in %s, want findings_default", p)
	}
	// A repair and a diagnosis pointing at the old findings.
	in := newRepair("n1", "gpu")
	in.FindingIDs = []string{old.Findings[0].ID, cur.Findings[0].ID}
	r := mustOpen(t, s, in, now)
	if _, _, err := s.UpsertDiagnosis(ctx, store.DiagnosisRecord{Cluster: "c1", Node: "n1", BootID: "boot-a", Reason: "GPUFallenOffBus",
		Severity: "condition", FirstSeen: now, LastSeen: now, FindingIDs: []string{old.Findings[1].ID}}, now); err != nil {
		t.Fatal(err)
	}

	res, err := s.MaintainFindings(ctx, now, store.FindingsMaintenance{Retention: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != store.DefaultPartitionsAhead+2 || res.Deleted != 2 {
		t.Errorf("maintenance: %+v; want %d partitions created, the 2 findings of 40 days ago deleted from the default partition",
			res, store.DefaultPartitionsAhead+2)
	}
	// The migration's partitions (around the real date, December 2026) are
	// all past retention at this clock.
	if len(res.Dropped) == 0 || res.Dropped[0] > res.Dropped[len(res.Dropped)-1] {
		t.Errorf("dropped %v, want the old partitions oldest first", res.Dropped)
	}
	if p := partitionOf(t, s, cur.Findings[0].ID); p != "findings_p20270310" {
		t.Errorf("after maintenance the finding is in %s, want findings_p20270310", p)
	}
	parts, err := s.FindingPartitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range parts {
		names = append(names, p.Name)
	}
	want := []string{}
	for d := -1; d <= store.DefaultPartitionsAhead; d++ {
		want = append(want, "findings_p"+now.AddDate(0, 0, d).Format("20060102"))
	}
	if !slices.Equal(names, want) {
		t.Errorf("partitions %v, want %v", names, want)
	}
	// Moved findings are still recognised when resent.
	if res, err := s.IngestReport(ctx, cur, now.Add(time.Minute)); err != nil || res.Inserted != 0 {
		t.Errorf("resend after the move: %+v, %v; want 0 inserted", res, err)
	}
	// The repair, its links, its audit and the diagnosis survive; links to
	// dropped findings are skipped when read.
	got, err := s.GetRepair(ctx, r.ID)
	if err != nil || len(got.FindingIDs) != 2 {
		t.Fatalf("repair after retention: %+v, %v", got, err)
	}
	fs, err := s.RepairFindings(ctx, r.ID)
	if err != nil || len(fs) != 1 || fs[0].ID != cur.Findings[0].ID {
		t.Errorf("RepairFindings after retention: %+v, %v; want only the kept finding", fs, err)
	}
	if audit, err := s.RepairAudit(ctx, r.ID); err != nil || len(audit) == 0 {
		t.Errorf("audit after retention: %+v, %v", audit, err)
	}
	if ds, err := s.ActiveDiagnoses(ctx, "c1", "n1"); err != nil || len(ds) != 1 || len(ds[0].FindingIDs) != 1 {
		t.Errorf("diagnoses after retention: %+v, %v", ds, err)
	}

	// Again: nothing to do.
	res, err = s.MaintainFindings(ctx, now.Add(time.Hour), store.FindingsMaintenance{Retention: 30 * 24 * time.Hour})
	if err != nil || res.Created != 0 || len(res.Dropped) != 0 || res.Deleted != 0 {
		t.Errorf("second maintenance: %+v, %v; want nothing done", res, err)
	}
	// Retention 0 keeps everything; a negative one is refused.
	if res, err := s.MaintainFindings(ctx, now.AddDate(1, 0, 0), store.FindingsMaintenance{}); err != nil || len(res.Dropped) != 0 {
		t.Errorf("retention 0: %+v, %v; want nothing dropped", res, err)
	}
	if _, err := s.MaintainFindings(ctx, now, store.FindingsMaintenance{Retention: -time.Hour}); err == nil {
		t.Error("negative retention accepted")
	}
}

// TestMigrationPartitionsExistingFindings: migrating a database holding
// findings up to 00006 keeps every one, in its day's partition, and down
// again keeps them too (of two nodes' findings sharing an ID, the older).
func TestMigrationPartitionsExistingFindings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.EmptyDSN(t)
	if err := store.MigrateTo(ctx, dsn, 5); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	day := time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)
	if _, err := s.Pool().Exec(ctx, `INSERT INTO clusters (name, created_at) VALUES ('c1', $1)`, day); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := s.Pool().Exec(ctx, `INSERT INTO findings (id, cluster, node, detector, received_at) VALUES ($1, 'c1', 'n1', 'xid', $2)`,
			fmt.Sprintf("f%d", i), day.AddDate(0, 0, i)); err != nil {
			t.Fatal(err)
		}
	}
	// Up to 00006 (not the newest: the down step below undoes 00006).
	if err := store.MigrateTo(ctx, dsn, 6); err != nil {
		t.Fatal(err)
	}
	s.Pool().Reset() // cached plans name the old table
	if p := partitionOf(t, s, "f3"); p != "findings_p20260604" {
		t.Errorf("migrated finding in %s, want findings_p20260604", p)
	}
	fs, err := s.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	if err != nil || len(fs) != 5 {
		t.Fatalf("after up: %d findings, %v", len(fs), err)
	}
	// A colliding ID from another node, then down.
	if res, err := s.IngestReport(ctx, report("c1", "n2", "boot-a", 0, day), day.AddDate(0, 0, 9)); err != nil || !res.Changed {
		t.Fatal(res, err)
	}
	if _, err := s.Pool().Exec(ctx, `INSERT INTO findings (id, cluster, node, detector, received_at) VALUES ('f0', 'c1', 'n2', 'xid', $1)`,
		day.AddDate(0, 0, 9)); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, dsn, store.MigrateDown, nil); err != nil {
		t.Fatal(err)
	}
	s.Pool().Reset()
	var n int
	var node string
	if err := s.Pool().QueryRow(ctx, `SELECT count(*), min(node) FILTER (WHERE id = 'f0') FROM findings`).Scan(&n, &node); err != nil || n != 5 || node != "n1" {
		t.Errorf("after down: %d findings, f0 of %q, %v; want 5, the older f0 (n1)", n, node, err)
	}
}
