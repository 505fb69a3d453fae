package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// report builds a report of n Xid findings for node, observed one second
// apart from at.
func report(cluster, node, boot string, n int, at time.Time) finding.Report {
	r := finding.Report{
		SchemaVersion: finding.SchemaVersion,
		Cluster:       cluster, Node: node, BootID: boot, AgentVersion: "v0.1.0", SentAt: at,
		Heartbeat: &finding.Heartbeat{
			DriverVersion: "570.133.20", KernelVersion: "6.8.0",
			GPUCount: 8, Monitors: []finding.MonitorState{{Name: "kmsg", State: finding.StateOK, Since: at}},
		},
	}
	for i := range n {
		f := finding.Finding{
			Detector: finding.DetectorXid, Node: node, BootID: boot,
			Time: at.Add(time.Duration(i) * time.Second), GPUPCI: "0000:3b:00.0", Xid: 79, Count: 1,
			Attrs:    map[string]string{finding.AttrPID: fmt.Sprint(i)},
			Evidence: []string{fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): 79, pid=%d, name=x, GPU has fallen off the bus.", i)},
			Seq:      uint64(1000 + i),
		}
		f.ID = finding.NewID(f)
		r.Findings = append(r.Findings, f)
	}
	return r
}

func TestIngestReportIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r := report("c1", "n1", "boot-a", 100, t0)

	res, err := s.IngestReport(ctx, r, t0.Add(time.Minute))
	if err != nil || res.Inserted != 100 || !res.Changed {
		t.Fatalf("first ingest: %+v, %v; want 100 new, node changed", res, err)
	}
	res, err = s.IngestReport(ctx, r, t0.Add(2*time.Minute))
	if err != nil || res.Inserted != 0 || res.Changed {
		t.Fatalf("same report again: %+v, %v; want 0 new, nothing changed", res, err)
	}
	// A report overlapping the first: only the new findings count.
	r2 := report("c1", "n1", "boot-a", 110, t0)
	if res, err = s.IngestReport(ctx, r2, t0.Add(3*time.Minute)); err != nil || res.Inserted != 10 {
		t.Fatalf("overlapping report: %+v, %v; want 10 new", res, err)
	}
	// Resent two days later (the agent was cut off meanwhile): still
	// recognised, across partitions.
	if res, err = s.IngestReport(ctx, r2, t0.Add(50*time.Hour)); err != nil || res.Inserted != 0 {
		t.Fatalf("resent two days later: %+v, %v; want 0 new", res, err)
	}

	got, err := s.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 110 {
		t.Fatalf("stored %d findings, want 110", len(got))
	}
	for i, f := range got {
		want := r2.Findings[i]
		if !reflect.DeepEqual(f, want) {
			t.Fatalf("finding %d round trip:\n got %+v\nwant %+v", i, f, want)
		}
	}

	node, err := s.GetNode(ctx, "c1", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if node.BootID != "boot-a" || node.DriverVersion != "570.133.20" || node.KernelVersion != "6.8.0" ||
		node.AgentVersion != "v0.1.0" || !node.LastSeen.Equal(t0.Add(50*time.Hour)) ||
		node.Heartbeat == nil || node.Heartbeat.GPUCount != 8 || len(node.Heartbeat.Monitors) != 1 {
		t.Fatalf("node after ingest: %+v", node)
	}
	c, err := s.GetCluster(ctx, "c1")
	if err != nil || c.DeletionsPerHour != 10 || c.MaxInFlightPerNodePool != 1 {
		t.Fatalf("cluster created with defaults: %+v, %v", c, err)
	}
}

func TestIngestReportAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)

	// A batch whose last finding the schema refuses (count 0) stores nothing:
	// no cluster, no node, none of the valid findings.
	bad := report("c1", "n1", "boot-a", 5, t0)
	bad.Findings[4].Count = 0
	if _, err := s.IngestReport(ctx, bad, t0); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ingest with a bad finding: %v, want ErrInvalid", err)
	}
	if _, err := s.GetCluster(ctx, "c1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cluster row after a failed ingest: %v, want ErrNotFound", err)
	}
	if _, err := s.GetNode(ctx, "c1", "n1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node row after a failed ingest: %v, want ErrNotFound", err)
	}
	if fs, err := s.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0); err != nil || len(fs) != 0 {
		t.Errorf("findings after a failed ingest: %d, %v; want none", len(fs), err)
	}

	// On a known node, a failed report leaves the node as it was.
	good := report("c1", "n1", "boot-a", 2, t0)
	if _, err := s.IngestReport(ctx, good, t0); err != nil {
		t.Fatal(err)
	}
	before, _ := s.GetNode(ctx, "c1", "n1")
	bad = report("c1", "n1", "boot-b", 3, t0.Add(time.Hour))
	bad.Findings[1].Detector = "" // violates detector <> ''
	if _, err := s.IngestReport(ctx, bad, t0.Add(time.Hour)); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ingest with an empty detector: %v, want ErrInvalid", err)
	}
	after, _ := s.GetNode(ctx, "c1", "n1")
	if !reflect.DeepEqual(before, after) {
		t.Errorf("node changed by a failed report:\nbefore %+v\nafter  %+v", before, after)
	}
	if fs, _ := s.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0); len(fs) != 2 {
		t.Errorf("%d findings after a failed report, want the 2 earlier ones", len(fs))
	}

	// A finding for another node is refused before anything is written.
	other := report("c1", "n1", "boot-a", 1, t0)
	other.Findings[0].Node = "n2"
	if _, err := s.IngestReport(ctx, other, t0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("finding for another node: %v, want ErrInvalid", err)
	}
}

func TestIngestReportOutOfOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	newer := report("c1", "n1", "boot-b", 0, t0.Add(time.Hour))
	newer.Heartbeat.DriverVersion = "580.1"
	if _, err := s.IngestReport(ctx, newer, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// A retried report from the previous boot arrives later: its findings
	// are stored, last_seen moves, but boot ID and heartbeat stay.
	older := report("c1", "n1", "boot-a", 3, t0)
	if res, err := s.IngestReport(ctx, older, t0.Add(2*time.Hour)); err != nil || res.Inserted != 3 {
		t.Fatalf("older report: %+v, %v", res, err)
	}
	n, err := s.GetNode(ctx, "c1", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if n.BootID != "boot-b" || n.DriverVersion != "580.1" || !n.LastSeen.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("node after an out-of-order report: boot %q driver %q last seen %v", n.BootID, n.DriverVersion, n.LastSeen)
	}
	// The findings keep their own boot ID.
	fs, _ := s.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	if len(fs) != 3 || fs[0].BootID != "boot-a" {
		t.Fatalf("findings: %+v", fs)
	}
}

func TestFindingsQueries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r := report("c1", "n1", "boot-a", 5, t0)
	// A finding without an observed time sorts by when it was received
	// (t0+2.5s), between the 3rd and 4th.
	untimed := finding.Finding{Detector: finding.DetectorUnparsed, Count: 1, Evidence: []string{"???"}}
	untimed.ID = finding.NewID(untimed)
	first := r
	first.Findings = r.Findings[:3]
	if _, err := s.IngestReport(ctx, first, t0.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	second := r
	second.Findings = append([]finding.Finding{untimed}, r.Findings[3:]...)
	if _, err := s.IngestReport(ctx, second, t0.Add(2500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}

	got, err := s.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(fs []finding.Finding) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.ID)
		}
		return out
	}
	want := []string{r.Findings[0].ID, r.Findings[1].ID, r.Findings[2].ID, untimed.ID, r.Findings[3].ID, r.Findings[4].ID}
	if !reflect.DeepEqual(ids(got), want) {
		t.Fatalf("order: got %v\nwant %v", ids(got), want)
	}
	if !got[3].Time.IsZero() || got[3].Node != "n1" || got[3].BootID != "boot-a" {
		t.Errorf("untimed finding: %+v (want zero Time, node and boot from the report)", got[3])
	}

	// since and limit: the newest two of those since t0+2s, oldest first.
	got, _ = s.FindingsForNode(ctx, "c1", "n1", t0.Add(2*time.Second), 2)
	if !reflect.DeepEqual(ids(got), want[4:6]) {
		t.Errorf("since t0+2s, limit 2: %v, want %v", ids(got), want[4:6])
	}
	// Another node sees nothing.
	if got, _ := s.FindingsForNode(ctx, "c1", "n2", time.Time{}, 0); len(got) != 0 {
		t.Errorf("other node: %d findings", len(got))
	}

	byID, err := s.FindingsByIDs(ctx, "c1", "n1", []string{want[4], "missing", want[0]})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ids(byID), []string{want[4], want[0]}) {
		t.Errorf("FindingsByIDs: %v", ids(byID))
	}
}

// TestNodesWithFindingsSince: each node once, with its newest received_at,
// the newest first; a node whose findings are all older is left out.
func TestNodesWithFindingsSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	for _, in := range []struct {
		node string
		at   time.Duration
	}{{"n1", 2500 * time.Millisecond}, {"n2", 5 * time.Second}, {"n1", 10 * time.Second}, {"n3", -time.Minute}} {
		r := report("c1", in.node, "boot-a", 1, t0.Add(in.at))
		if _, err := s.IngestReport(ctx, r, t0.Add(in.at)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.NodesWithFindingsSince(ctx, t0)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.RecentNode{
		{NodeRef: store.NodeRef{Cluster: "c1", Node: "n1"}, Newest: t0.Add(10 * time.Second)},
		{NodeRef: store.NodeRef{Cluster: "c1", Node: "n2"}, Newest: t0.Add(5 * time.Second)},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].NodeRef != want[i].NodeRef || !got[i].Newest.Equal(want[i].Newest) {
			t.Errorf("[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestNodeMeta(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if _, err := s.IngestReport(ctx, report("c1", "n1", "boot-a", 1, t0), t0); err != nil {
		t.Fatal(err)
	}
	snap, err := s.ReadNode(ctx, store.Node{Cluster: "c1", Name: "n1", NodePool: "gpu", Zone: "us-east-1a",
		InstanceType: "p5.48xlarge", NodeClaim: "gpu-abcde", BootID: "ignored", DriverVersion: "ignored",
		Labels: map[string]string{"topology.kubernetes.io/rack": "r7"}}, 1, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	n := snap.Node
	if n.NodePool != "gpu" || n.Zone != "us-east-1a" || n.InstanceType != "p5.48xlarge" || n.NodeClaim != "gpu-abcde" ||
		n.BootID != "boot-a" || n.DriverVersion != "570.133.20" || n.Heartbeat == nil || !n.LastSeen.Equal(t0) {
		t.Fatalf("after ReadNode recorded the Kubernetes facts: %+v", n)
	}
	// A node known only from Kubernetes, in another cluster.
	if _, err := s.ReadNode(ctx, store.Node{Cluster: "c2", Name: "n9", NodePool: "cpu"}, 1, t0); err != nil {
		t.Fatal(err)
	}
	// The agent's next report does not erase the Kubernetes facts.
	if _, err := s.IngestReport(ctx, report("c1", "n1", "boot-b", 0, t0.Add(time.Hour)), t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ns, err := s.ListNodes(ctx, "c1")
	if err != nil || len(ns) != 1 || ns[0].NodePool != "gpu" || ns[0].BootID != "boot-b" || ns[0].Labels["topology.kubernetes.io/rack"] != "r7" {
		t.Fatalf("ListNodes(c1) = %+v, %v", ns, err)
	}
	all, _ := s.ListNodes(ctx, "")
	if len(all) != 2 || all[1].Cluster != "c2" || !all[1].LastSeen.IsZero() || all[1].Heartbeat != nil || all[1].Labels != nil {
		t.Fatalf("ListNodes(all) = %+v", all)
	}
	if _, err := s.GetNode(ctx, "c1", "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetNode(missing) = %v, want ErrNotFound", err)
	}
}

func TestSecurityEvents(t *testing.T) {
	t.Parallel()
	s := open(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if err := s.RecordSecurityEvent(ctx, store.SecurityEvent{Cluster: "c1", Node: "n1", Action: "ingest", Outcome: "denied",
		Status: 403, Reason: "token bound to node n2"}, now); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordSecurityEvent(ctx, store.SecurityEvent{Action: "ingest", Outcome: "maybe"}, now); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("unknown outcome: err = %v, want ErrInvalid", err)
	}
	evs, err := s.SecurityEvents(ctx, 10)
	if err != nil || len(evs) != 1 || evs[0].Status != 403 || evs[0].Node != "n1" || !evs[0].At.Equal(now) {
		t.Fatalf("events = %+v, %v", evs, err)
	}
	if _, err := s.Pool().Exec(ctx, "DELETE FROM security_audit"); err == nil {
		t.Fatal("security_audit accepted a DELETE")
	}
}

// TestFindingIDsAreScopedByCluster: two clusters may have nodes of the same
// name whose agents compute the same finding IDs; both are stored.
func TestFindingIDsAreScopedByCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	for _, c := range []string{"east", "west"} {
		res, err := s.IngestReport(ctx, report(c, "gpu-1", "boot-1", 3, t0), t0)
		if err != nil || res.Inserted != 3 {
			t.Fatalf("ingest %s: %+v, %v; want 3 inserted", c, res, err)
		}
	}
	for _, c := range []string{"east", "west"} {
		fs, err := s.FindingsForNode(ctx, c, "gpu-1", time.Time{}, 0)
		if err != nil || len(fs) != 3 {
			t.Fatalf("%s findings = %d, %v", c, len(fs), err)
		}
	}
}

func TestBreakerStateCompareAndSet(t *testing.T) {
	t.Parallel()
	s := open(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	doc, v, err := s.BreakerState(ctx)
	if err != nil || doc != nil || v != 0 {
		t.Fatalf("initial state = %s v%d %v", doc, v, err)
	}
	d := store.BreakerDecision{At: now, Scope: "cohort", Cohort: "zone=b", From: "closed", To: "open", Cause: "tripped", Actor: "breaker",
		Evidence: []byte(`{"pValue":1e-9}`)}
	if err := s.SaveBreakerState(ctx, []byte(`{"cohorts":{"zone=b":{}}}`), 0, []store.BreakerDecision{d}, now); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBreakerState(ctx, []byte(`{}`), 0, nil, now); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second first-save: err = %v, want ErrConflict", err)
	}
	_, v, _ = s.BreakerState(ctx)
	if err := s.SaveBreakerState(ctx, []byte(`{}`), v, nil, now); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBreakerState(ctx, []byte(`{"stale":true}`), v, []store.BreakerDecision{d}, now); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale save: err = %v, want ErrConflict", err)
	}
	ds, err := s.BreakerDecisions(ctx, 10)
	if err != nil || len(ds) != 1 || ds[0].Cohort != "zone=b" {
		t.Fatalf("decisions = %+v, %v; want exactly the one saved with the winning write", ds, err)
	}
}

// TestIngestReportChanged: IngestResult.Changed tells whether the node's
// agent facts changed, so that a heartbeat that changes nothing need not
// wake the reconciler.
func TestIngestReportChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if _, err := s.ReadNode(ctx, store.Node{Cluster: "c1", Name: "n1", NodePool: "gpu"}, 1, t0); err != nil {
		t.Fatal(err)
	}
	at := t0
	step := func(name string, want bool, edit func(r *finding.Report)) {
		t.Helper()
		at = at.Add(30 * time.Second)
		r := report("c1", "n1", "boot-a", 0, t0)
		r.SentAt = at
		edit(&r)
		res, err := s.IngestReport(ctx, r, at)
		if err != nil || res.Changed != want || res.Inserted != 0 {
			t.Errorf("%s: %+v, %v; want Changed %v", name, res, err, want)
		}
	}
	same := func(*finding.Report) {}
	step("first report of a node known from Kubernetes", true, same)
	step("same heartbeat", false, same)
	step("same heartbeat again", false, same)
	step("a monitor failing", true, func(r *finding.Report) { r.Heartbeat.Monitors[0].State = finding.StateFailing })
	step("still failing", false, func(r *finding.Report) { r.Heartbeat.Monitors[0].State = finding.StateFailing })
	step("no heartbeat at all", false, func(r *finding.Report) { r.Heartbeat = nil })
	step("new agent version", true, func(r *finding.Report) { r.AgentVersion = "v0.2.0"; r.Heartbeat = nil })
	step("reboot", true, func(r *finding.Report) { r.BootID = "boot-b"; r.AgentVersion = "v0.2.0" })
	step("an older report (by SentAt) changes nothing", false, func(r *finding.Report) {
		r.BootID, r.SentAt = "boot-a", t0
	})
	n, err := s.GetNode(ctx, "c1", "n1")
	if err != nil || n.BootID != "boot-b" || n.NodePool != "gpu" || !n.LastSeen.Equal(at) {
		t.Errorf("node = %+v, %v", n, err)
	}
}

// TestIngestHeartbeatsConcurrently: heartbeats of many nodes at once, several
// of the same node in flight together, are written in groups with the same
// answers as one by one.
func TestIngestHeartbeatsConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	const nodes, workers, rounds = 100, 20, 10
	for i := range nodes {
		if res, err := s.IngestReport(ctx, report("c1", fmt.Sprintf("n%d", i), "boot-a", 0, t0), t0); err != nil || !res.Changed {
			t.Fatalf("first heartbeat: %+v, %v", res, err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				node := fmt.Sprintf("n%d", (w*rounds+i)%nodes)
				r := report("c1", node, "boot-a", 0, t0)
				r.SentAt = t0.Add(time.Duration(1+i) * time.Second)
				res, err := s.IngestReport(ctx, r, r.SentAt)
				if err != nil || res.Changed {
					errs <- fmt.Errorf("%s: %+v, %v; want stored, unchanged", node, res, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A change in the middle of a fleet's heartbeats is still seen.
	r := report("c1", "n7", "boot-b", 0, t0)
	r.SentAt = t0.Add(time.Minute)
	if res, err := s.IngestReport(ctx, r, r.SentAt); err != nil || !res.Changed {
		t.Errorf("reboot of n7: %+v, %v; want Changed", res, err)
	}
	if n, err := s.GetNode(ctx, "c1", "n7"); err != nil || n.BootID != "boot-b" || !n.LastSeen.Equal(t0.Add(time.Minute)) {
		t.Errorf("n7 = %+v, %v", n, err)
	}
}

// TestIngestFindingsConcurrently: reports with findings from many agents at
// once are written in groups (group commit) with the answers of one by one:
// three reports of each node in flight together (two overlapping, one a
// resend of the first) insert each finding exactly once between them, and
// a report the schema refuses fails alone, storing nothing, while the
// reports grouped with it are stored.
func TestIngestFindingsConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	const nodes = 60
	if _, err := s.IngestReport(ctx, report("c1", "first", "boot-a", 0, t0), t0); err != nil {
		t.Fatal(err) // the cluster row: every report below is grouped
	}
	at := t0.Add(time.Minute)
	var wg sync.WaitGroup
	inserted := make([][3]int, nodes)
	errs := make(chan error, 3*nodes+1)
	for i := range nodes {
		node := fmt.Sprintf("n%d", i)
		all := report("c1", node, "boot-a", 15, at)
		for j, r := range []finding.Report{
			{SchemaVersion: all.SchemaVersion, Cluster: "c1", Node: node, BootID: "boot-a", SentAt: at, Findings: all.Findings[:10]},
			{SchemaVersion: all.SchemaVersion, Cluster: "c1", Node: node, BootID: "boot-a", SentAt: at, Findings: all.Findings[5:]},
			{SchemaVersion: all.SchemaVersion, Cluster: "c1", Node: node, BootID: "boot-a", SentAt: at, Findings: all.Findings[:10]},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := s.IngestReport(ctx, r, at)
				if err != nil {
					errs <- fmt.Errorf("%s report %d: %w", node, j, err)
					return
				}
				inserted[i][j] = res.Inserted
			}()
		}
	}
	bad := report("c1", "bad", "boot-a", 3, at)
	bad.Findings[2].Count = 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := s.IngestReport(ctx, bad, at); !errors.Is(err, store.ErrInvalid) {
			errs <- fmt.Errorf("report with a refused finding: %v, want ErrInvalid", err)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range nodes {
		node := fmt.Sprintf("n%d", i)
		if got := inserted[i][0] + inserted[i][1] + inserted[i][2]; got != 15 {
			t.Errorf("%s: inserted %v, sum %d; want 15 (each finding once)", node, inserted[i], got)
		}
		fs, err := s.FindingsForNode(ctx, "c1", node, time.Time{}, 0)
		if err != nil || len(fs) != 15 {
			t.Errorf("%s: %d findings stored, %v; want 15", node, len(fs), err)
		}
	}
	if fs, err := s.FindingsForNode(ctx, "c1", "bad", time.Time{}, 0); err != nil || len(fs) != 0 {
		t.Errorf("refused report: %d findings stored, %v; want none", len(fs), err)
	}
	if _, err := s.GetNode(ctx, "c1", "bad"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("refused report's node row: %v, want ErrNotFound", err)
	}
	groups, reports := store.GroupStats(s)
	t.Logf("%d reports in %d transactions", reports, groups)
}

// TestIngestResendToReplicaBehind: replicas' clocks differ; a report stored
// by a replica whose clock is ahead and resent to one whose clock is behind
// is still recognised, and a colliding ID from another node is still stored.
func TestIngestResendToReplicaBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r := report("c1", "n1", "boot-a", 5, t0)
	if res, err := s.IngestReport(ctx, r, t0.Add(time.Hour)); err != nil || res.Inserted != 5 {
		t.Fatalf("first: %+v, %v", res, err)
	}
	if res, err := s.IngestReport(ctx, r, t0); err != nil || res.Inserted != 0 {
		t.Errorf("resent to a replica an hour behind: %+v, %v; want 0 inserted", res, err)
	}
	other := r
	other.Node, other.Findings = "n2", append([]finding.Finding(nil), r.Findings...)
	for i := range other.Findings {
		other.Findings[i].Node = "n2"
	}
	if res, err := s.IngestReport(ctx, other, t0); err != nil || res.Inserted != 5 {
		t.Errorf("same IDs from n2: %+v, %v; want 5 inserted", res, err)
	}
}
