package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// openWide is open with a pool large enough for n concurrent callers, so
// races happen in PostgreSQL and not in the pool's queue.
func openWide(t *testing.T, n int) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), pgtest.DSN(t)+fmt.Sprintf("&pool_max_conns=%d", n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newRepair(node, pool string) store.Repair {
	return store.Repair{
		Cluster: "c1", Node: node, NodeClaim: "claim-" + node, NodeClaimUID: "uid-" + node, NodePool: pool,
		Reason: "GPUFallenOffBus", FaultClass: "accelerated-hardware", RecommendedAction: "replace",
	}
}

func mustOpen(t *testing.T, s *store.Store, r store.Repair, now time.Time) store.Repair {
	t.Helper()
	got, created, err := s.OpenRepair(context.Background(), r, "controller", "diagnosis", now)
	if err != nil || !created {
		t.Fatalf("OpenRepair(%s): created %v, %v", r.Node, created, err)
	}
	return got
}

func step(t *testing.T, s *store.Store, id int64, from, to ledger.State, now time.Time) store.Repair {
	t.Helper()
	r, err := s.Transition(context.Background(), store.TransitionRequest{ID: id, From: from, To: to, Actor: "controller", Reason: "test"}, now)
	if err != nil {
		t.Fatalf("Transition %d %s -> %s: %v", id, from, to, err)
	}
	return r
}

func TestOpenRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	in := newRepair("n1", "gpu")
	in.FindingIDs = []string{"f2", "f1"}
	in.DryRun = true
	in.Detail = map[string]any{"gpus": []any{"0000:3b:00.0"}}
	r := mustOpen(t, s, in, t0)
	if r.ID == 0 || r.State != ledger.Detected || !r.CreatedAt.Equal(t0) || !r.ClosedAt.IsZero() || !r.DryRun ||
		r.NodeClaimUID != "uid-n1" || !reflect.DeepEqual(r.FindingIDs, []string{"f1", "f2"}) || r.Detail["gpus"] == nil {
		t.Fatalf("opened %+v", r)
	}
	// The node's open repair is returned, unchanged, to a second opener.
	again, created, err := s.OpenRepair(ctx, newRepair("n1", "gpu"), "controller", "again", t0.Add(time.Minute))
	if err != nil || created || again.ID != r.ID || !reflect.DeepEqual(again, r) {
		t.Fatalf("second OpenRepair: %+v created %v, %v", again, created, err)
	}
	if got, err := s.OpenRepairForNode(ctx, "c1", "n1"); err != nil || got.ID != r.ID {
		t.Fatalf("OpenRepairForNode: %+v, %v", got, err)
	}
	// Once closed, the node can get a new repair.
	step(t, s, r.ID, ledger.Detected, ledger.Resolved, t0.Add(2*time.Minute))
	if _, err := s.OpenRepairForNode(ctx, "c1", "n1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("OpenRepairForNode after close: %v, want ErrNotFound", err)
	}
	r2 := mustOpen(t, s, newRepair("n1", "gpu"), t0.Add(3*time.Minute))
	if r2.ID == r.ID {
		t.Fatal("new repair reused the closed one's ID")
	}

	for _, bad := range []store.Repair{
		{Cluster: "c1", Node: "n2"},                                        // no reason
		{Cluster: "c1", Node: "n2", Reason: "X", State: ledger.Replaced},   // terminal
		{Cluster: "c1", Node: "n2", Reason: "X", State: ledger.State("?")}, // unknown
	} {
		if _, _, err := s.OpenRepair(ctx, bad, "controller", "", t0); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("OpenRepair(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := s.GetRepair(ctx, 424242); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetRepair(missing) = %v, want ErrNotFound", err)
	}
}

func TestOpenRepairConcurrent(t *testing.T) {
	t.Parallel()
	const n = 16
	ctx := context.Background()
	s := openWide(t, n+2)
	for round := range 3 {
		node := fmt.Sprintf("n%d", round)
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			ids     = make([]int64, n)
			created = make([]bool, n)
			errs    = make([]error, n)
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, c, err := s.OpenRepair(ctx, newRepair(node, "gpu"), fmt.Sprintf("replica-%d", i), "race", t0)
				ids[i], created[i], errs[i] = r.ID, c, err
			}()
		}
		close(start)
		wg.Wait()
		winners := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d opener %d: %v", round, i, errs[i])
			}
			if created[i] {
				winners++
			}
			if ids[i] != ids[0] {
				t.Fatalf("round %d: openers got different repairs %d and %d", round, ids[0], ids[i])
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d openers created a repair, want exactly 1", round, winners)
		}
		audit, err := s.RepairAudit(ctx, ids[0])
		if err != nil || len(audit) != 1 {
			t.Fatalf("round %d: audit %+v, %v; want the one creation entry", round, audit, err)
		}
	}
	all, err := s.RepairsInState(ctx)
	if err != nil || len(all) != 3 {
		t.Fatalf("open repairs: %d, %v; want 3", len(all), err)
	}
}

func TestTransition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r := mustOpen(t, s, newRepair("n1", "gpu"), t0)

	// Mutate sets the toleration clock and may not touch identity fields.
	got, err := s.Transition(ctx, store.TransitionRequest{
		ID: r.ID, From: ledger.Detected, To: ledger.Tolerating, Actor: "controller", Reason: "condition set",
		Detail: map[string]any{"toleration": "10m"},
		Mutate: func(r *store.Repair) {
			r.TolerationStartedAt, r.TolerationUntil = t0, t0.Add(10*time.Minute)
			r.Node, r.State, r.ID = "evil", ledger.Replaced, 7
		},
	}, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != ledger.Tolerating || got.Node != "n1" || got.ID != r.ID || !got.TolerationUntil.Equal(t0.Add(10*time.Minute)) ||
		!got.UpdatedAt.Equal(t0.Add(time.Second)) || !got.ClosedAt.IsZero() {
		t.Fatalf("after transition: %+v", got)
	}

	// Compare-and-set: a second decider that read "detected" loses.
	_, err = s.Transition(ctx, store.TransitionRequest{ID: r.ID, From: ledger.Detected, To: ledger.Resolved, Actor: "replica-2"}, t0.Add(2*time.Second))
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale transition: %v, want ErrConflict", err)
	}

	// Not allowed by the state machine: refused before touching the row.
	_, err = s.Transition(ctx, store.TransitionRequest{ID: r.ID, From: ledger.Tolerating, To: ledger.Replaced, Actor: "controller"}, t0)
	var te *ledger.ErrTransition
	if !errors.As(err, &te) || !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("tolerating -> replaced: %v, want *ledger.ErrTransition and ErrInvalid", err)
	}
	if _, err = s.Transition(ctx, store.TransitionRequest{ID: 9999, From: ledger.Detected, To: ledger.Resolved, Actor: "x"}, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing repair: %v, want ErrNotFound", err)
	}
	cur, _ := s.GetRepair(ctx, r.ID)
	audit, _ := s.RepairAudit(ctx, r.ID)
	if cur.State != ledger.Tolerating || len(audit) != 2 {
		t.Fatalf("refused transitions changed the repair: state %s, %d audit entries", cur.State, len(audit))
	}

	// Racing deciders: exactly one wins.
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Transition(ctx, store.TransitionRequest{ID: r.ID, From: ledger.Tolerating, To: ledger.AwaitingApproval,
				Actor: fmt.Sprintf("replica-%d", i)}, t0.Add(time.Minute))
		}()
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, store.ErrConflict):
			t.Fatalf("racing transition: %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d racing transitions won, want 1", wins)
	}
}

func TestAuditTrail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if _, err := s.SetClusterBudget(ctx, "c1", 5, 5, t0); err != nil {
		t.Fatal(err)
	}
	r := mustOpen(t, s, newRepair("n1", "gpu"), t0)
	step(t, s, r.ID, ledger.Detected, ledger.Quarantined, t0.Add(1*time.Second))
	step(t, s, r.ID, ledger.Quarantined, ledger.Tolerating, t0.Add(2*time.Second))
	step(t, s, r.ID, ledger.Tolerating, ledger.AwaitingApproval, t0.Add(3*time.Second))
	if _, err := s.Transition(ctx, store.TransitionRequest{ID: r.ID, From: ledger.AwaitingApproval, To: ledger.Approved,
		Actor: "alice@example.com", Reason: "zone outage over"}, t0.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginDeletion(ctx, r.ID, ledger.Approved, "controller", "guards passed", t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	final, err := s.Transition(ctx, store.TransitionRequest{ID: r.ID, From: ledger.Deleting, To: ledger.Replaced, Actor: "controller",
		Mutate: func(r *store.Repair) { r.ExecutedAction = "replace" }}, t0.Add(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !final.ClosedAt.Equal(t0.Add(6*time.Second)) || final.ExecutedAction != "replace" {
		t.Fatalf("closed repair: %+v", final)
	}

	audit, err := s.RepairAudit(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []ledger.State{"", ledger.Detected, ledger.Quarantined, ledger.Tolerating, ledger.AwaitingApproval,
		ledger.Approved, ledger.Deleting, ledger.Replaced}
	if len(audit) != len(want)-1 {
		t.Fatalf("%d audit entries, want %d", len(audit), len(want)-1)
	}
	for i, a := range audit {
		if a.From != want[i] || a.To != want[i+1] || !a.At.Equal(t0.Add(time.Duration(i)*time.Second)) || a.RepairID != r.ID {
			t.Errorf("audit[%d] = %s -> %s at %v, want %s -> %s at %v", i, a.From, a.To, a.At, want[i], want[i+1], t0.Add(time.Duration(i)*time.Second))
		}
	}
	if audit[4].Actor != "alice@example.com" || audit[4].Reason != "zone outage over" {
		t.Errorf("approval entry: %+v", audit[4])
	}
	if d := audit[5].Detail; d["deletions_per_hour"] != float64(5) || d["deletions_last_hour"] != float64(0) || d["nodepool"] != "gpu" {
		t.Errorf("deletion entry detail: %v", d)
	}
	if _, err := s.RepairAudit(ctx, 777); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RepairAudit(missing) = %v, want ErrNotFound", err)
	}
}

func TestRepairFindings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	rep := report("c1", "n1", "boot-a", 3, t0)
	if _, err := s.IngestReport(ctx, rep, t0); err != nil {
		t.Fatal(err)
	}
	in := newRepair("n1", "gpu")
	in.FindingIDs = []string{rep.Findings[2].ID}
	r := mustOpen(t, s, in, t0)
	// A later reconcile links more findings to the open repair, as the
	// reconciler does (WriteNodeLedger); one already linked stays one link.
	if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1", LinkTo: r.ID,
		LinkFindings: []string{rep.Findings[0].ID, rep.Findings[2].ID, "gone-by-retention"}}, t0); err != nil {
		t.Fatalf("link findings: %v", err)
	}
	fs, err := s.RepairFindings(ctx, r.ID)
	if err != nil || len(fs) != 2 || fs[0].ID != rep.Findings[0].ID || fs[1].ID != rep.Findings[2].ID {
		t.Fatalf("RepairFindings: %+v, %v", fs, err)
	}
	if got, _ := s.GetRepair(ctx, r.ID); len(got.FindingIDs) != 3 {
		t.Errorf("FindingIDs = %v, want 3 links", got.FindingIDs)
	}
	// Links to a repair that does not exist are refused, and nothing of
	// that ledger is written.
	if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n2", LinkTo: 5555, LinkFindings: []string{"x"},
		Diagnoses: []store.DiagnosisRecord{{Cluster: "c1", Node: "n2", Reason: "XidEvent", Severity: "event"}}}, t0); err == nil {
		t.Error("findings linked to a missing repair: no error")
	}
	if ds, _ := s.ActiveDiagnoses(ctx, "c1", "n2"); len(ds) != 0 {
		t.Errorf("a refused ledger write kept its diagnoses %+v", ds)
	}
}

// TestNodePoolDeletionsPerHour: a NodePool's hourly budget holds even when
// the cluster's is larger, and other pools keep theirs.
func TestNodePoolDeletionsPerHour(t *testing.T) {
	t.Parallel()
	s := open(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if _, err := s.SetClusterBudget(ctx, "c1", 100, 100, now); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodePoolBudget(ctx, "c1", 2, now); err != nil {
		t.Fatal(err)
	}
	begin := func(node, pool string) error {
		r, _, err := s.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: node, NodePool: pool, Reason: "GPULost", State: ledger.Tolerating}, "t", "t", now)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.BeginDeletion(ctx, r.ID, ledger.Tolerating, "t", "t", now)
		return err
	}
	for i, want := range []bool{true, true, false} {
		err := begin(fmt.Sprintf("a%d", i), "a")
		if ok := err == nil; ok != want {
			t.Fatalf("pool a deletion %d: err = %v, want ok=%v", i, err, want)
		}
		var be *store.BudgetExceededError
		if !want && (!errors.As(err, &be) || be.Budget != store.BudgetNodePoolDeletionsPerHour) {
			t.Fatalf("err = %v, want the nodepool hourly budget", err)
		}
	}
	if err := begin("b0", "b"); err != nil {
		t.Fatalf("pool b spent by pool a: %v", err)
	}
}

// TestRetargetRepair: an open repair is renamed compare-and-set on its
// state and reason, audited with the state kept and updated_at unchanged;
// a stale caller gets ErrConflict, a deleting repair ErrInvalid.
func TestRetargetRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r := mustOpen(t, s, newRepair("n1", "gpu"), t0)
	to := store.Retarget{Reason: "GPULost", FaultClass: "hardware", RecommendedAction: "replace"}
	got, err := s.RetargetRepair(ctx, r, to, "controller", "headline is now GPULost", t0.Add(time.Minute))
	if err != nil || got.ID != r.ID || got.Reason != "GPULost" || got.FaultClass != "hardware" || got.RecommendedAction != "replace" ||
		got.State != r.State || !got.UpdatedAt.Equal(r.UpdatedAt) {
		t.Fatalf("RetargetRepair = %+v, %v; want repair %d renamed, state and updated_at kept", got, err, r.ID)
	}
	audit, err := s.RepairAudit(ctx, r.ID)
	if err != nil || len(audit) != 2 || audit[1].From != r.State || audit[1].To != r.State || audit[1].Reason != "headline is now GPULost" ||
		audit[1].Detail["from_reason"] != r.Reason || audit[1].Detail["to_reason"] != "GPULost" {
		t.Fatalf("audit %+v, %v; want the creation entry and one rename, state kept", audit, err)
	}
	// The caller still holds the old reason: someone renamed it meanwhile.
	if _, err := s.RetargetRepair(ctx, r, to, "controller", "again", t0.Add(2*time.Minute)); !errors.Is(err, store.ErrConflict) {
		t.Errorf("stale RetargetRepair = %v, want ErrConflict", err)
	}
	del := got
	del.State = ledger.Deleting
	if _, err := s.RetargetRepair(ctx, del, to, "controller", "late", t0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("RetargetRepair of a deleting repair = %v, want ErrInvalid", err)
	}
	if _, err := s.RetargetRepair(ctx, got, store.Retarget{}, "controller", "empty", t0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("RetargetRepair without a reason = %v, want ErrInvalid", err)
	}
}
