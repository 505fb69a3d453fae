package repair_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestNewEvidenceBeforeBacklog: on a real kube-apiserver, a backlog of
// background work (a trigger of each of 60 nodes, as watches and the
// periodic pass make) is queued ahead of a lone node whose report stored a GPU-lost
// finding (TriggerFindings). With one worker, the lone node's repair opens
// before any backlog node is reconciled, and its quarantine (the follow-up
// at PriorityFollowUp) is written before the backlog is through. A FIFO
// queue reconciles the 60 first: every backlog node's row is then older than
// the repair.
//
// Order is read from the store's own timestamps (the reconciler's clock,
// strictly increasing here), never from wall-clock durations.
func TestNewEvidenceBeforeBacklog(t *testing.T) {
	env := envtest.StartN(t, 1, envtest.Options{})[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := pgtest.Store(t)
	sim := karpentersim.New(env.Client, 0)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	const backlog = 60
	var names []string
	for i := 0; i <= backlog; i++ {
		name := fmt.Sprintf("gpu-%02d", i)
		names = append(names, name)
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: name, NodePool: "gpu", Zone: fmt.Sprintf("z%d", i%4),
			InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	lone, rest := names[backlog], names[:backlog]
	// Reads straight from the API server (no informers): the backlog below
	// is exactly what is queued, no watch adds to it.
	k := kube.New("east", env.Client)
	eng, _ := diagnose.New(diagnose.Options{})
	// A strictly increasing clock: every reconcile stamps distinct times.
	now := strictClock(time.Now)
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"east": k},
		Toleration: time.Hour, Resync: time.Hour, Workers: 1, Now: now})
	if err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(60 * time.Second)
	f := finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0", Node: lone, BootID: "boot-1", Count: 1,
		Time: time.Now(), Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
	f.ID = finding.NewID(f)
	if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "east", Node: lone,
		BootID: "boot-1", Findings: []finding.Finding{f}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, n := range rest {
		rec.Trigger("east", n) // the backlog, queued first
	}
	rec.TriggerFindings("east", lone) // the lone failure's report, queued last

	defer runReconciler(ctx, rec)()

	// The ingest stored the lone node's row; reconciles store the others'.
	waitFor(t, deadline, "every backlog node reconciled and the lone repair open", func() bool {
		ns, err := st.ListNodes(ctx, "east")
		_, open := st.OpenRepairForNode(ctx, "east", lone)
		return err == nil && len(ns) == backlog+1 && open == nil
	}, nil)
	rp, err := st.OpenRepairForNode(ctx, "east", lone)
	if err != nil {
		t.Fatalf("lone failure's repair: %v", err)
	}
	ns, err := st.ListNodes(ctx, "east")
	if err != nil {
		t.Fatal(err)
	}
	before := 0
	var firstBacklog time.Time
	for _, n := range ns {
		if n.Name == lone {
			continue
		}
		if firstBacklog.IsZero() || n.CreatedAt.Before(firstBacklog) {
			firstBacklog = n.CreatedAt
		}
		if n.CreatedAt.Before(rp.CreatedAt) {
			before++
		}
	}
	if before > 0 {
		t.Fatalf("%d of %d backlog nodes were reconciled before the lone failure's repair opened (at %s): new evidence must go first",
			before, backlog, rp.CreatedAt.Format(time.RFC3339Nano))
	}

	// The quarantine (the follow-up) went before the backlog too: the
	// quarantined step is recorded before the last backlog node's row.
	waitFor(t, deadline, "the lone node quarantined", func() bool {
		q, err := k.Quarantined(ctx, lone)
		return err == nil && q
	}, nil)
	var lastBacklog time.Time
	for _, n := range ns {
		if n.Name != lone && n.CreatedAt.After(lastBacklog) {
			lastBacklog = n.CreatedAt
		}
	}
	audit, err := st.RepairAudit(ctx, rp.ID)
	if err != nil {
		t.Fatal(err)
	}
	var quarantinedAt time.Time
	for _, a := range audit {
		if a.To == ledger.Quarantined {
			quarantinedAt = a.At
		}
	}
	if quarantinedAt.IsZero() || !quarantinedAt.Before(lastBacklog) {
		t.Fatalf("lone failure quarantined at %v, last backlog node reconciled at %v (first at %v): the follow-up must precede the background backlog",
			quarantinedAt, lastBacklog, firstBacklog)
	}
}
