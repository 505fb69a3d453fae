package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// storedIn returns, per partition, how many findings of cluster/node are
// stored.
func storedIn(t *testing.T, s *store.Store, cluster, node string) map[string]int {
	t.Helper()
	rows, err := s.Pool().Query(context.Background(),
		`SELECT tableoid::regclass::text, count(*) FROM findings WHERE cluster = $1 AND node = $2 GROUP BY 1`, cluster, node)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var part string
		var n int
		if err := rows.Scan(&part, &n); err != nil {
			t.Fatal(err)
		}
		out[part] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReportGroupOneInvalid: in one group, a report with a finding the
// schema refuses fails alone; the group's other reports, a new one and a
// partial resend, are stored with their own inserted counts. Small groups
// are one statement, large ones (300 findings) a lookup and a COPY.
func TestReportGroupOneInvalid(t *testing.T) {
	t.Parallel()
	for _, size := range []int{10, 300} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			testReportGroupOneInvalid(t, size)
		})
	}
}

func testReportGroupOneInvalid(t *testing.T, size int) {
	ctx := context.Background()
	s := open(t)
	at := t0.Add(time.Minute)
	resent := report("c1", "c", "boot-a", 8, at)
	first := resent
	first.Findings = resent.Findings[:5]
	if res, err := s.IngestReport(ctx, first, at); err != nil || res.Inserted != 5 {
		t.Fatalf("first report of c: %+v, %v", res, err)
	}
	bad := report("c1", "b", "boot-a", 5, at)
	bad.Findings[3].Count = 0
	res, errs := store.WriteReportGroup(s, []finding.Report{report("c1", "a", "boot-a", size, at), bad, resent}, at.Add(time.Second))
	if errs[0] != nil || res[0].Inserted != size || !res[0].Changed {
		t.Errorf("new report in the group: %+v, %v; want %d inserted, changed", res[0], errs[0], size)
	}
	if !errors.Is(errs[1], store.ErrInvalid) {
		t.Errorf("report with a refused finding: %+v, %v; want ErrInvalid", res[1], errs[1])
	}
	if errs[2] != nil || res[2].Inserted != 3 {
		t.Errorf("partial resend in the group: %+v, %v; want 3 inserted", res[2], errs[2])
	}
	if _, err := s.GetNode(ctx, "c1", "b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("refused report's node row: %v, want ErrNotFound", err)
	}
	for node, want := range map[string]int{"a": size, "b": 0, "c": 8} {
		fs, err := s.FindingsForNode(ctx, "c1", node, time.Time{}, 0)
		if err != nil || len(fs) != want {
			t.Errorf("%s: %d findings stored, %v; want %d", node, len(fs), err, want)
		}
	}
	// The same group again: everything is a resend.
	bad.Findings[3].Count = 1
	res, errs = store.WriteReportGroup(s, []finding.Report{report("c1", "a", "boot-a", size, at), bad, resent}, at.Add(2*time.Second))
	for i, want := range []int{0, 5, 0} {
		if errs[i] != nil || res[i].Inserted != want {
			t.Errorf("group resent, report %d: %+v, %v; want %d inserted", i, res[i], errs[i], want)
		}
	}
}

// TestIngestResendAcrossPartitions: a resend received on the next day (the
// next partition), or an untimed finding resent days later from the
// default partition into a day's partition, is recognised; the first copy
// stays where it was. The timed report (300 findings) takes the COPY path,
// the untimed one the single statement.
func TestIngestResendAcrossPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	// Partitions for 2020-01-02 and 2020-01-03 only: 2020-01-01 lands in
	// the default partition.
	if _, err := s.Pool().Exec(ctx, `SELECT fleetrepair_findings_partitions('2020-01-02', 2)`); err != nil {
		t.Fatal(err)
	}
	day2 := time.Date(2020, 1, 2, 0, 0, 0, 0, time.UTC)

	timed := report("c1", "n1", "boot-a", 300, day2.Add(24*time.Hour-10*time.Minute))
	if res, err := s.IngestReport(ctx, timed, day2.Add(24*time.Hour-time.Millisecond)); err != nil || res.Inserted != 300 {
		t.Fatalf("first copy: %+v, %v", res, err)
	}
	if res, err := s.IngestReport(ctx, timed, day2.Add(24*time.Hour+time.Millisecond)); err != nil || res.Inserted != 0 {
		t.Errorf("resent after midnight: %+v, %v; want 0 inserted", res, err)
	}
	if got, want := storedIn(t, s, "c1", "n1"), map[string]int{"findings_p20200102": 300}; !reflect.DeepEqual(got, want) {
		t.Errorf("n1 stored %v, want %v", got, want)
	}

	untimed := report("c1", "n2", "boot-a", 3, day2)
	for i := range untimed.Findings {
		untimed.Findings[i].Time = time.Time{}
		untimed.Findings[i].ID = fmt.Sprintf("untimed-%d", i)
	}
	first := day2.Add(-time.Hour) // 2020-01-01 23:00, the default partition
	if res, err := s.IngestReport(ctx, untimed, first); err != nil || res.Inserted != 3 {
		t.Fatalf("untimed first copy: %+v, %v", res, err)
	}
	// Grouped with a new report of another node, 1.5 days later.
	res, errs := store.WriteReportGroup(s, []finding.Report{untimed, report("c1", "n3", "boot-a", 2, day2)}, day2.Add(36*time.Hour))
	if errs[0] != nil || res[0].Inserted != 0 || errs[1] != nil || res[1].Inserted != 2 {
		t.Errorf("untimed resend grouped with a new report: %+v, %v; want 0 and 2 inserted", res, errs)
	}
	if got, want := storedIn(t, s, "c1", "n2"), map[string]int{"findings_default": 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("n2 stored %v, want %v", got, want)
	}
	// Past DedupUntimedWindow the untimed findings are stored again: a
	// duplicate, never a loss.
	if res, err := s.IngestReport(ctx, untimed, first.Add(store.DedupUntimedWindow+time.Second)); err != nil || res.Inserted != 3 {
		t.Errorf("untimed resend after the window: %+v, %v; want 3 inserted", res, err)
	}
}

// TestIngestJobFindingsDedup: a job's findings are stored once per node,
// across a resent job report and the nodes' own agent reports.
func TestIngestJobFindingsDedup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	a, b := report("c1", "n1", "boot-a", 4, t0), report("c1", "n2", "boot-b", 3, t0)
	fs := append(append([]finding.Finding(nil), a.Findings...), b.Findings...)
	res, err := s.IngestJobFindings(ctx, "c1", fs, t0)
	if err != nil || res.Inserted != 7 || !reflect.DeepEqual(res.Nodes, []string{"n1", "n2"}) {
		t.Fatalf("job findings: %+v, %v; want 7 inserted on n1, n2", res, err)
	}
	if res, err = s.IngestJobFindings(ctx, "c1", fs, t0.Add(time.Minute)); err != nil || res.Inserted != 0 || len(res.Nodes) != 0 {
		t.Errorf("job findings resent: %+v, %v; want nothing inserted", res, err)
	}
	more := report("c1", "n1", "boot-a", 6, t0)
	if r, err := s.IngestReport(ctx, more, t0.Add(2*time.Minute)); err != nil || r.Inserted != 2 {
		t.Errorf("agent report overlapping the job's: %+v, %v; want 2 inserted", r, err)
	}
	if _, err := s.GetNode(ctx, "c1", "n2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("job findings made a node row: %v", err)
	}
}
