package repair_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// evidenceInGroup runs the evidence step of first (two nodes: each takes
// one of the two group senders, held) and then of rest, which therefore
// wait together and are written as one group once the senders are
// released. It returns each node's held flag and error, and fails the
// test unless rest went out in one group.
func evidenceInGroup(t *testing.T, rec *repair.Reconciler, first, rest []string) (held map[string]bool, errs map[string]error) {
	t.Helper()
	if len(first) != 2 {
		t.Fatal("evidenceInGroup: first must hold two nodes, one per sender")
	}
	release, groups := repair.HoldEvidenceWrites(rec)
	sent0, calls0, _ := groups()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	held, errs = map[string]bool{}, map[string]error{}
	start := func(n string) {
		wg.Go(func() {
			h, err := repair.EvidenceStep(context.Background(), rec, "c1", n)
			mu.Lock()
			defer mu.Unlock()
			held[n] = h
			if errs[n] == nil { // a node started twice keeps an error of either
				errs[n] = err
			}
		})
	}
	waitFor := func(what string, ok func(sent int64, waiting int) bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			sent, _, waiting := groups()
			if ok(sent-sent0, waiting) {
				return
			}
			if time.Now().After(deadline) {
				release()
				t.Fatalf("evidence groups: %s never happened (sent %d, waiting %d)", what, sent-sent0, waiting)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for i, n := range first {
		start(n)
		waitFor(fmt.Sprintf("sender %d holding %s", i+1, n), func(sent int64, _ int) bool { return sent == int64(i+1) })
	}
	for _, n := range rest {
		start(n)
	}
	waitFor("every later node waiting", func(sent int64, waiting int) bool { return sent == 2 && waiting == len(rest) })
	release()
	wg.Wait()
	sent, calls, _ := groups()
	if sent-sent0 != 3 || calls-calls0 != int64(len(first)+len(rest)) {
		t.Fatalf("%d groups held %d nodes, want 3 groups (the last of %d)", sent-sent0, calls-calls0, len(rest))
	}
	return held, errs
}

// TestEvidenceGroupOneWriteFails: in a group of evidence steps written in
// one transaction, one node's write fails in PostgreSQL (a trigger refuses
// its repair). The others' repairs open anyway, each exactly once with one
// audit entry; the failed node keeps nothing and reports its error (the
// work queue retries it), and opens its repair exactly once when retried.
func TestEvidenceGroupOneWriteFails(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `
CREATE FUNCTION refuse_bad_node() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'repair of % refused by the test', NEW.node;
END $$;
CREATE TRIGGER refuse_bad_node BEFORE INSERT ON repairs FOR EACH ROW WHEN (NEW.node = 'n-bad')
    EXECUTE FUNCTION refuse_bad_node();`); err != nil {
		t.Fatal(err)
	}
	names := []string{"n1", "n2", "n3", "n-bad", "n4", "n5"}
	var specs []karpentersim.NodeSpec
	for _, n := range names {
		specs = append(specs, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8})
	}
	k, sim := fakeFleet(t, specs)
	eng, _ := diagnose.New(diagnose.Options{})
	clk := newClock()
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": k}, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, k: k, sim: sim, rec: rec, clock: clk}
	for _, n := range names {
		e.ingest(t, n, xid79())
	}

	_, errs := evidenceInGroup(t, rec, names[:2], names[2:])
	if errs["n-bad"] == nil {
		t.Fatal("the refused node's evidence step succeeded")
	}
	repairsOf := func(node string) []store.Repair {
		rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: node})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	check := func(when string) {
		t.Helper()
		for _, n := range names {
			if n == "n-bad" {
				continue
			}
			if errs[n] != nil {
				t.Fatalf("%s: %s: %v", when, n, errs[n])
			}
			rs := repairsOf(n)
			if len(rs) != 1 || rs[0].State != ledger.Detected {
				t.Fatalf("%s: %s has repairs %+v, want exactly one detected", when, n, rs)
			}
			if audit, err := st.RepairAudit(ctx, rs[0].ID); err != nil || len(audit) != 1 {
				t.Fatalf("%s: %s audit %+v (%v), want one entry", when, n, audit, err)
			}
		}
	}
	check("after the group")
	if rs := repairsOf("n-bad"); len(rs) != 0 {
		t.Fatalf("the refused node has repairs %+v", rs)
	}
	if ds, err := st.ActiveDiagnoses(ctx, "c1", "n-bad"); err != nil || len(ds) != 0 {
		t.Fatalf("the refused node kept diagnoses %+v (%v): its write is all or nothing", ds, err)
	}

	// The trigger gone, the whole group again (the refused node's retry
	// and a duplicate trigger of the others): nothing opens twice.
	if _, err := conn.Exec(ctx, `DROP TRIGGER refuse_bad_node ON repairs`); err != nil {
		t.Fatal(err)
	}
	_, errs = evidenceInGroup(t, rec, names[:2], names[2:])
	if errs["n-bad"] != nil {
		t.Fatalf("the retried node: %v", errs["n-bad"])
	}
	check("after the retry")
	if rs := repairsOf("n-bad"); len(rs) != 1 {
		t.Fatalf("the retried node has repairs %+v, want one", rs)
	}
}

// TestEvidenceGroupBreakerHolds: the evidence steps of a zone wave and of
// a lone failure elsewhere in one group. Once the zone breaker tripped, the
// evidence step tells every wave node apart as held (PriorityHeld) and
// the lone one not; after the toleration window the follow-up deletes the
// lone failure's NodeClaim and none in the zone.
func TestEvidenceGroupBreakerHolds(t *testing.T) {
	ctx := context.Background()
	e, z1, z2 := zoneFleet(t, repair.Config{Toleration: time.Minute})
	st, rec, clk := e.st, e.rec, e.clock
	wave := z1[:6]
	failing := append(append([]string(nil), wave...), z2[0])
	for _, n := range failing {
		e.ingest(t, n, xid79())
	}
	held, errs := evidenceInGroup(t, rec, failing[:2], failing[2:])
	for _, n := range failing {
		if errs[n] != nil || held[n] {
			t.Fatalf("%s before any evaluation: held %v, %v", n, held[n], errs[n])
		}
	}
	clk.Add(time.Minute)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	doc, _, _ := st.BreakerState(ctx)
	var bs breaker.State
	if err := json.Unmarshal(doc, &bs); err != nil {
		t.Fatal(err)
	}
	if _, open := bs.Cohorts["zone=z1"]; !open || len(bs.Cohorts) != 1 {
		t.Fatalf("open breakers = %v, want exactly zone=z1", bs.OpenCohorts())
	}
	clk.Add(10 * time.Minute) // every toleration window over
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	held, errs = evidenceInGroup(t, rec, failing[:2], failing[2:])
	for _, n := range failing {
		if errs[n] != nil || held[n] != (n != z2[0]) {
			t.Fatalf("%s after the trip: held %v (%v), want %v", n, held[n], errs[n], n != z2[0])
		}
	}
	for _, n := range failing {
		e.reconcile(t, n) // the follow-up
	}
	for _, n := range wave {
		rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: n})
		if err != nil || len(rs) != 1 || rs[0].State != ledger.AwaitingApproval || rs[0].Detail["held_by"] != "breaker" {
			t.Fatalf("%s: repairs %+v (%v), want one awaiting approval, held by the breaker", n, rs, err)
		}
		if e.nodeClaimDeleting(t, n+"-nc") {
			t.Fatalf("%s: NodeClaim deleted behind the open zone breaker", n)
		}
	}
	if r := e.open(t, z2[0]); r.State != ledger.Deleting || !e.nodeClaimDeleting(t, z2[0]+"-nc") {
		t.Fatalf("lone failure elsewhere: %s, want deleting", r.State)
	}
}

// TestEvidenceGroupSameNodeTwice: two reconciles of one node wait in the
// same write group (the work queue never runs a node on two workers at
// once; ReconcileNode's callers may). Both succeed, the node's second
// write going in a transaction after the first, and the node has exactly
// one repair.
func TestEvidenceGroupSameNodeTwice(t *testing.T) {
	ctx := context.Background()
	names := []string{"n1", "n2", "n3", "n4"}
	var specs []karpentersim.NodeSpec
	for _, n := range names {
		specs = append(specs, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8})
	}
	st := pgtest.Store(t)
	k, sim := fakeFleet(t, specs)
	eng, _ := diagnose.New(diagnose.Options{})
	clk := newClock()
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": k}, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, k: k, sim: sim, rec: rec, clock: clk}
	for _, n := range names {
		e.ingest(t, n, xid79())
	}
	_, errs := evidenceInGroup(t, rec, names[:2], []string{"n3", "n3", "n4"})
	for n, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
	for _, n := range names {
		rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: n})
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 {
			t.Fatalf("%s: %d repairs, want exactly one", n, len(rs))
		}
	}
}
