package repair_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestNewLeaderFreshEvidenceFirst is the failover mid-wave (docs/scale.md,
// "The wave with the Lease holder killed"): the old leader died with the
// wave's triggers, so the new leader learns of the wave only from its
// catch-up, which also holds every node with findings in the last
// CatchUpLookback. Here 30 nodes had application Xids 10 minutes ago and 3
// lost a GPU 5 s ago; nothing is queued, and the standby's own first pass
// is over. Taking the Lease alone (Resync is an hour) must run the catch-up, and with one worker the 3 GPU-lost nodes'
// evidence is recorded before any of the 30 older nodes is reconciled: the
// freshest evidence first. With every catch-up node at one priority in the
// database's order, the 30 interleave with the 3.
//
// Order is read from the diagnoses' IDs (one sequence, one worker), never
// from wall-clock durations.
func TestNewLeaderFreshEvidenceFirst(t *testing.T) {
	ctx := context.Background()
	st := pgtest.Store(t)
	const older, fresh = 30, 3
	var specs []karpentersim.NodeSpec
	var oldNodes, freshNodes []string
	for i := 0; i < older+fresh; i++ {
		name := fmt.Sprintf("old-%02d", i)
		if i >= older {
			name = fmt.Sprintf("wave-%d", i-older)
			freshNodes = append(freshNodes, name)
		} else {
			oldNodes = append(oldNodes, name)
		}
		specs = append(specs, karpentersim.NodeSpec{Name: name, NodePool: "gpu", Zone: fmt.Sprintf("z%d", i%4), InstanceType: "p5.48xlarge", GPUs: 8})
	}
	k, _ := fakeFleet(t, specs)
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// A strictly increasing clock from a fixed start.
	clk := strictClock(func() time.Time { return time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC) })
	start := clk()
	ingest := func(node string, at time.Time, f finding.Finding) {
		t.Helper()
		f.Node, f.BootID, f.Count, f.Time = node, "boot-1", 1, at
		f.ID = finding.NewID(f)
		if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: node,
			BootID: "boot-1", Findings: []finding.Finding{f}}, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range oldNodes {
		ingest(n, start.Add(-10*time.Minute), finding.Finding{Detector: finding.DetectorXid, Xid: 13, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 13"}})
	}
	for _, n := range freshNodes {
		ingest(n, start.Add(-5*time.Second), xid79())
	}

	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": k},
		Toleration: time.Hour, Resync: time.Hour, Workers: 1, Now: clk})
	if err != nil {
		t.Fatal(err)
	}
	rec.UseLeaderElection() // a standby: it leads nothing yet
	defer runReconciler(ctx, rec)()
	deadline := time.Now().Add(60 * time.Second)
	// The standby's first pass is over once it has probed the cluster
	// (listFleet, after the catch-up); the next is an hour away.
	waitFor(t, deadline, "the standby's first pass", func() bool {
		cs := rec.Clusters()
		return len(cs) == 1 && cs[0].Reachable
	}, nil)
	rec.SetLeading("c1", true) // the old leader is gone; nothing else asks for a pass

	diagID := func(node string) (int64, bool) {
		ds, err := st.ActiveDiagnoses(ctx, "c1", node)
		if err != nil || len(ds) == 0 {
			return 0, false
		}
		return ds[0].ID, true
	}
	waitFor(t, deadline, "every node diagnosed by the new leader's catch-up", func() bool {
		for _, n := range append(append([]string{}, oldNodes...), freshNodes...) {
			if _, ok := diagID(n); !ok {
				return false
			}
		}
		return true
	}, nil)
	var lastFresh, firstOld int64
	for _, n := range freshNodes {
		id, _ := diagID(n)
		lastFresh = max(lastFresh, id)
		if _, err := st.OpenRepairForNode(ctx, "c1", n); err != nil {
			t.Errorf("%s lost a GPU 5 s before the failover and has no open repair: %v", n, err)
		}
	}
	before := 0
	for _, n := range oldNodes {
		id, _ := diagID(n)
		if firstOld == 0 || id < firstOld {
			firstOld = id
		}
		if id < lastFresh {
			before++
		}
	}
	if before > 0 {
		t.Fatalf("%d of %d nodes with 10-minute-old findings were reconciled before the last GPU-lost node's evidence (diagnosis IDs: first older %d, last fresh %d): the new leader must take the freshest evidence first",
			before, older, firstOld, lastFresh)
	}
}
