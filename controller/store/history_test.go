package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	if _, _, err := writeDiagnosis(ctx, s, store.DiagnosisRecord{Cluster: "c1", Node: "n1", BootID: "boot-a", Reason: "GPUFallenOffBus",
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

// TestCompactFindings: a closed day's partition is rewritten in
// node-timeline order with every row, its bound, its indexes and the
// append-only trigger kept, once; readers go on meanwhile; a swap that
// cannot take its lock leaves the partition as it was and is retried.
func TestCompactFindings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	day := time.Date(2027, 5, 8, 0, 0, 0, 0, time.UTC)
	const part, other = "findings_p20270508", "findings_p20270507"
	if _, err := s.MaintainFindings(ctx, day, store.FindingsMaintenance{Compact: -1}); err != nil {
		t.Fatal(err)
	}
	// Three nodes' findings interleaved in arrival order, as a fleet's are.
	nodes := []string{"n1", "n2", "n3"}
	var reps []finding.Report
	for i := range 20 {
		for _, n := range nodes {
			at := day.Add(10*time.Hour + time.Duration(i)*time.Minute)
			r := report("c1", n, "boot-a", 3, at)
			if res, err := s.IngestReport(ctx, r, at); err != nil || res.Inserted != 3 {
				t.Fatalf("ingest: %+v, %v", res, err)
			}
			reps = append(reps, r)
		}
	}
	timelines := func() map[string][]string {
		out := map[string][]string{}
		for _, n := range nodes {
			fs, err := s.FindingsForNode(ctx, "c1", n, time.Time{}, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fs {
				out[n] = append(out[n], f.ID+"@"+f.Time.String())
			}
		}
		return out
	}
	strs := func(q string, args ...any) []string {
		t.Helper()
		rows, _ := s.Pool().Query(ctx, q, args...)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return out
	}
	// Index names and definitions and triggers, the partition's own name
	// taken out; its bound.
	shape := func(p string) []string {
		out := strs(`SELECT replace(pg_get_indexdef(i.indexrelid), $1, 'P') FROM pg_index i WHERE i.indrelid = $1::regclass`, p)
		out = append(out, strs(`SELECT tgname FROM pg_trigger WHERE tgrelid = $1::regclass`, p)...)
		slices.Sort(out)
		return out
	}
	bound := func(p string) []string {
		return strs(`SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c WHERE c.relname = $1`, p)
	}
	before, wantShape, wantBound := timelines(), shape(other), bound(part)
	if got := shape(part); !slices.Equal(got, wantShape) || len(got) != 4 {
		t.Fatalf("partitions differ before compaction: %v vs %v", got, wantShape)
	}
	if got := strs(`SELECT node FROM ` + part + ` ORDER BY ctid`); slices.IsSorted(got) {
		t.Fatalf("test data not interleaved: heap already in node order")
	}

	// A swap that cannot take its lock on findings: ErrUnavailable, nothing
	// changed. (The days around closed are created first: their ATTACH
	// would wait on the lock too.)
	closed := day.Add(24*time.Hour + store.DefaultCompactAfter)
	if res, err := s.MaintainFindings(ctx, closed, store.FindingsMaintenance{Compact: -1}); err != nil || len(res.Compacted) != 0 {
		t.Fatalf("maintenance with compaction off (--finding-compaction=false): %+v, %v; want nothing compacted", res, err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE ONLY findings IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	res, err := s.MaintainFindings(ctx, closed, store.FindingsMaintenance{})
	_ = tx.Rollback(ctx)
	if !errors.Is(err, store.ErrUnavailable) || len(res.Compacted) != 0 {
		t.Fatalf("compaction under a held lock: %+v, %v; want ErrUnavailable and nothing compacted", res, err)
	}
	if got := strs(`SELECT partition FROM finding_partition_compactions`); len(got) != 0 {
		t.Fatalf("recorded %v after a failed swap", got)
	}

	// Another replica rewriting a partition: this call skips its turn.
	tx, err = s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('fleetrepair_findings_compact', 0))`); err != nil {
		t.Fatal(err)
	}
	done, err := s.CompactFindings(ctx, closed, time.Time{}, 5)
	_ = tx.Rollback(ctx)
	if err != nil || len(done) != 0 {
		t.Fatalf("compaction while another runs: %v, %v; want nothing and no error", done, err)
	}

	// Readers go on during the rewrite.
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.FindingsForNode(ctx, "c1", "n2", time.Time{}, 1000); err != nil {
				readErr <- err
				return
			}
		}
	}()
	// The day is not closed long enough yet: the newest day that is (the
	// one before) goes first. Then this one.
	if res, err := s.MaintainFindings(ctx, closed.Add(-time.Minute), store.FindingsMaintenance{}); err != nil || !slices.Equal(res.Compacted, []string{other}) {
		t.Fatalf("compaction before CompactAfter: %+v, %v; want only %s", res, err, other)
	}
	res, err = s.MaintainFindings(ctx, closed, store.FindingsMaintenance{})
	close(stop)
	if err != nil || !slices.Equal(res.Compacted, []string{part}) {
		t.Fatalf("compaction: %+v, %v; want %s", res, err, part)
	}
	if err := <-readErr; err != nil {
		t.Fatalf("reader during compaction: %v", err)
	}

	if after := timelines(); !reflect.DeepEqual(after, before) {
		t.Errorf("timelines changed by compaction:\n%v\nwant\n%v", after, before)
	}
	if got := shape(part); !slices.Equal(got, wantShape) {
		t.Errorf("compacted partition's indexes or triggers %v, want %v", got, wantShape)
	}
	if got := bound(part); !slices.Equal(got, wantBound) {
		t.Errorf("compacted partition's bound %v, want %v", got, wantBound)
	}
	if got := strs(`SELECT node FROM ` + part + ` ORDER BY ctid`); !slices.IsSorted(got) || len(got) != 180 {
		t.Errorf("heap order after compaction: %d rows, sorted by node %v", len(got), slices.IsSorted(got))
	}
	if got := strs(`SELECT partition || ':' || rows FROM finding_partition_compactions ORDER BY 1`); !slices.Equal(got, []string{other + ":0", part + ":180"}) {
		t.Errorf("compactions recorded %v", got)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE findings SET count = 2 WHERE received_at >= $1 AND received_at < $2`, day, day.AddDate(0, 0, 1)); err == nil {
		t.Error("a compacted partition accepted an UPDATE: the append-only trigger is gone")
	}
	// A resend of a compacted finding is still a duplicate.
	if res, err := s.IngestReport(ctx, reps[7], closed); err != nil || res.Inserted != 0 {
		t.Errorf("resend after compaction: %+v, %v; want 0 inserted", res, err)
	}
	// Once only: a later pass goes on with older days (the migration's).
	res, err = s.MaintainFindings(ctx, closed.Add(time.Hour), store.FindingsMaintenance{Compact: 5})
	if err != nil || slices.Contains(res.Compacted, part) || slices.Contains(res.Compacted, other) || len(res.Compacted) != 5 {
		t.Errorf("second pass: %+v, %v; want 5 older days, not %s or %s again", res, err, part, other)
	}
	// Retention forgets the record with the partition; a too short
	// CompactAfter is refused.
	if _, err := s.MaintainFindings(ctx, closed.AddDate(0, 0, 40), store.FindingsMaintenance{Retention: 24 * time.Hour, Compact: -1}); err != nil {
		t.Fatal(err)
	}
	if got := strs(`SELECT partition FROM finding_partition_compactions WHERE partition IN ($1, $2)`, part, other); len(got) != 0 {
		t.Errorf("records of dropped partitions kept: %v", got)
	}
	if _, err := s.MaintainFindings(ctx, closed, store.FindingsMaintenance{CompactAfter: time.Minute}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("CompactAfter 1m: %v, want ErrInvalid", err)
	}
}
