package repair_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
)

// TestHeartbeatsDoNotStarveBreakers is the fleet-scale safety bug
// (issue 9) in small: every node of the fleet heartbeats faster than the
// reconciler drains, and a zone wave arrives while Run is running. The
// breaker must still be evaluated and trip before any deletion in the zone,
// and the lone failure elsewhere must still be repaired. Before the fix the
// periodic pass (breaker evaluation) only ran once the trigger set was
// empty, heartbeats kept it full, and the zone's NodeClaims were deleted.
//
// The deadline below is a liveness bound (the run must make progress at
// all), not a speed assertion.
func TestHeartbeatsDoNotStarveBreakers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, z1, z2 := zoneFleet(t, repair.Config{Toleration: time.Minute, Resync: 20 * time.Millisecond})
	st, rec, clk := e.st, e.rec, e.clock
	all := append(append([]string(nil), z1...), z2...)

	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	// Heartbeats: every node, again and again, far faster than one
	// reconcile per node can drain.
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	go func() {
		for hbCtx.Err() == nil {
			for _, n := range all {
				rec.Trigger("c1", n)
			}
			time.Sleep(time.Millisecond)
		}
	}()

	// Let the heartbeat backlog build, then the wave: six of z1's ten
	// nodes and one of z2's forty lose a GPU.
	time.Sleep(200 * time.Millisecond)
	failing := append(append([]string(nil), z1[:6]...), z2[0])
	for _, n := range failing {
		e.ingest(t, n, xid79())
		rec.Trigger("c1", n)
	}
	deadline := time.Now().Add(60 * time.Second)
	states := func() string {
		var out []string
		for _, n := range failing {
			r, err := st.OpenRepairForNode(ctx, "c1", n)
			out = append(out, fmt.Sprintf("%s=%s%v(deleting=%v)", n, r.State, err, e.nodeClaimDeleting(t, n+"-nc")))
		}
		return fmt.Sprint("repairs: ", out)
	}
	waitFor(t, deadline, "the wave's repairs to open", func() bool {
		for _, n := range failing {
			if _, err := st.OpenRepairForNode(ctx, "c1", n); err != nil {
				return false
			}
		}
		return true
	}, states)
	clk.Add(2 * time.Minute) // every toleration window is over

	zoneOpen := func() bool {
		doc, _, err := st.BreakerState(ctx)
		if err != nil || doc == nil {
			return false
		}
		var bs breaker.State
		if err := json.Unmarshal(doc, &bs); err != nil {
			t.Fatal(err)
		}
		_, open := bs.Cohorts["zone=z1"]
		return open && !bs.EvaluatedAt.Before(clk.Now())
	}
	z1Settled := func() bool {
		for _, n := range z1[:6] {
			if e.nodeClaimDeleting(t, n+"-nc") {
				t.Fatalf("%s: NodeClaim in the outage zone deleted (breaker evaluated: %v)", n, zoneOpen())
			}
			r, err := st.OpenRepairForNode(ctx, "c1", n)
			if err != nil || r.State != ledger.AwaitingApproval {
				return false
			}
		}
		return true
	}
	waitFor(t, deadline, "the zone breaker to trip and hold z1", func() bool { settled := z1Settled(); return zoneOpen() && settled }, states)
	waitFor(t, deadline, "the lone z2 failure to be deleted", func() bool {
		z1Settled()
		r, err := st.OpenRepairForNode(ctx, "c1", z2[0])
		return err == nil && r.State == ledger.Deleting || e.nodeClaimDeleting(t, z2[0]+"-nc")
	}, states)
	for _, n := range z1[:6] {
		r := e.open(t, n)
		if r.Detail["held_by"] != "breaker" {
			t.Fatalf("%s: held_by=%v, want the breaker", n, r.Detail["held_by"])
		}
	}
	stopHB()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
