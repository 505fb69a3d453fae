package repair_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestTriggersReachTheLeader: two replicas with leader election, A leading
// c1, both with an hour between periodic passes. A report ingested by B
// (B's Trigger) is reconciled by A, which can only have heard of it through
// PostgreSQL NOTIFY (A's first pass is over, B leads nothing); a finding
// stored with no trigger at all (the ingesting replica crashed before it
// triggered) is found by A's next pass's catch-up.
func TestTriggersReachTheLeader(t *testing.T) {
	r := newReplicas(t, nil, "n1", "n2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eng, _ := diagnose.New(diagnose.Options{})
	dsn := pgtest.DSN(t)
	var err error
	if r.st, err = store.Open(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.st.Close)
	mk := func() *repair.Reconciler {
		st, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": r.k},
			Now: r.clock.Now, Resync: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	r.a, r.b = mk(), mk()
	r.a.UseLeaderElection()
	r.b.UseLeaderElection()
	r.a.SetLeading("c1", true)
	r.b.SetLeading("c1", false)
	done := make(chan error, 2)
	go func() { done <- r.a.Run(ctx) }()
	go func() { done <- r.b.Run(ctx) }()
	defer func() { cancel(); <-done; <-done }()

	ingest := func(node string) {
		f := finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0", Node: node, BootID: "boot-1", Count: 1,
			Time: r.clock.Now(), Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
		f.ID = finding.NewID(f)
		if _, err := r.st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: node,
			BootID: "boot-1", Findings: []finding.Finding{f}}, r.clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	waitOpen := func(node string) store.Repair {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second) // liveness bound, not a speed assertion
		for {
			rp, err := r.st.OpenRepairForNode(ctx, "c1", node)
			if err == nil {
				return rp
			}
			if time.Now().After(deadline) {
				t.Fatalf("no repair opened on %s: %v", node, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for deadline := time.Now().Add(60 * time.Second); !r.a.Reachable("c1"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) { // reachability is observed after the pass's catch-up
			t.Fatal("A's first pass never ran")
		}
	}
	ingest("n1")
	r.b.Trigger("c1", "n1") // B ingested it; A leads c1
	rp := waitOpen("n1")
	audit, err := r.st.RepairAudit(ctx, rp.ID)
	if err != nil || len(audit) == 0 {
		t.Fatalf("audit of n1's repair: %v %v", audit, err)
	}

	ingest("n2")   // stored, nobody triggered
	r.a.PassSoon() // A's next pass
	waitOpen("n2")
}
