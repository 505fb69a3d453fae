package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// tolerating opens a repair for node in pool and walks it to tolerating.
func tolerating(t *testing.T, s *store.Store, node, pool string, dryRun bool, now time.Time) store.Repair {
	t.Helper()
	in := newRepair(node, pool)
	in.DryRun = dryRun
	r := mustOpen(t, s, in, now)
	return step(t, s, r.ID, ledger.Detected, ledger.Tolerating, now)
}

// unchanged fails the test when repair r moved or gained audit entries.
func unchanged(t *testing.T, s *store.Store, r store.Repair, audits int) {
	t.Helper()
	cur, err := s.GetRepair(context.Background(), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.RepairAudit(context.Background(), r.ID)
	if cur.State != r.State || len(a) != audits {
		t.Fatalf("refused deletion wrote: state %s (was %s), %d audit entries (was %d)", cur.State, r.State, len(a), audits)
	}
}

func TestBeginDeletionPerHour(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if _, err := s.SetClusterBudget(ctx, "c1", 2, 100, t0); err != nil {
		t.Fatal(err)
	}
	var rs []store.Repair
	for i := range 4 {
		rs = append(rs, tolerating(t, s, fmt.Sprintf("n%d", i), fmt.Sprintf("pool%d", i), false, t0))
	}
	for i := range 2 {
		d, err := s.BeginDeletion(ctx, rs[i].ID, ledger.Tolerating, "controller", "toleration over", t0.Add(time.Duration(i)*time.Minute))
		if err != nil || d.State != ledger.Deleting {
			t.Fatalf("deletion %d: %+v, %v", i, d, err)
		}
	}
	// The first deletion has already finished: it still counts for the hour.
	step(t, s, rs[0].ID, ledger.Deleting, ledger.Replaced, t0.Add(2*time.Minute))

	_, err := s.BeginDeletion(ctx, rs[2].ID, ledger.Tolerating, "controller", "toleration over", t0.Add(30*time.Minute))
	var be *store.BudgetExceededError
	if !errors.Is(err, store.ErrBudgetExceeded) || !errors.As(err, &be) {
		t.Fatalf("third deletion within the hour: %v, want ErrBudgetExceeded", err)
	}
	if be.Budget != store.BudgetDeletionsPerHour || be.DeletionsLastHour != 2 || be.DeletionsPerHour != 2 || be.Cluster != "c1" || be.RepairID != rs[2].ID {
		t.Fatalf("budget error: %+v", be)
	}
	unchanged(t, s, rs[2], 2)

	// Dry-run repairs have their own count.
	dry := tolerating(t, s, "dry", "pool9", true, t0)
	if _, err := s.BeginDeletion(ctx, dry.ID, ledger.Tolerating, "controller", "", t0.Add(30*time.Minute)); err != nil {
		t.Fatalf("dry-run deletion: %v", err)
	}

	// One hour after the first deletion, one unit is back (the window is
	// (now-1h, now]).
	if _, err := s.BeginDeletion(ctx, rs[2].ID, ledger.Tolerating, "controller", "", t0.Add(time.Hour)); err != nil {
		t.Fatalf("deletion an hour later: %v", err)
	}
	if _, err := s.BeginDeletion(ctx, rs[3].ID, ledger.Tolerating, "controller", "", t0.Add(time.Hour)); !errors.Is(err, store.ErrBudgetExceeded) {
		t.Fatalf("second deletion an hour later: %v, want ErrBudgetExceeded", err)
	}

	// A budget of 0 stops deletions.
	if _, err := s.SetClusterBudget(ctx, "c1", 0, 100, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginDeletion(ctx, rs[3].ID, ledger.Tolerating, "controller", "", t0.Add(10*time.Hour)); !errors.Is(err, store.ErrBudgetExceeded) {
		t.Fatalf("deletion with a budget of 0: %v, want ErrBudgetExceeded", err)
	}
}

func TestBeginDeletionMaxInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if _, err := s.SetClusterBudget(ctx, "c1", 100, 1, t0); err != nil {
		t.Fatal(err)
	}
	a := tolerating(t, s, "a", "gpu", false, t0)
	b := tolerating(t, s, "b", "gpu", false, t0)
	c := tolerating(t, s, "c", "cpu", false, t0)
	if _, err := s.BeginDeletion(ctx, a.ID, ledger.Tolerating, "controller", "", t0); err != nil {
		t.Fatal(err)
	}
	_, err := s.BeginDeletion(ctx, b.ID, ledger.Tolerating, "controller", "", t0)
	var be *store.BudgetExceededError
	if !errors.As(err, &be) || be.Budget != store.BudgetMaxInFlightPerNodePool || be.InFlight != 1 || be.NodePool != "gpu" || be.MaxInFlightPerNodePool != 1 {
		t.Fatalf("second deletion in the nodepool: %v (%+v), want max in flight exceeded", err, be)
	}
	unchanged(t, s, b, 2)
	// Another nodepool has its own allowance.
	if _, err := s.BeginDeletion(ctx, c.ID, ledger.Tolerating, "controller", "", t0); err != nil {
		t.Fatalf("deletion in another nodepool: %v", err)
	}
	// When the first is done, the next may go.
	step(t, s, a.ID, ledger.Deleting, ledger.Replaced, t0.Add(time.Minute))
	if _, err := s.BeginDeletion(ctx, b.ID, ledger.Tolerating, "controller", "", t0.Add(time.Minute)); err != nil {
		t.Fatalf("deletion after the in-flight one finished: %v", err)
	}
}

func TestBeginDeletionChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r := tolerating(t, s, "a", "gpu", false, t0)
	// From a state that does not lead to deleting.
	if _, err := s.BeginDeletion(ctx, r.ID, ledger.Detected, "controller", "", t0); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("from detected: %v, want ErrInvalid", err)
	}
	// A stale from.
	if _, err := s.BeginDeletion(ctx, r.ID, ledger.Approved, "controller", "", t0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale from: %v, want ErrConflict", err)
	}
	if _, err := s.BeginDeletion(ctx, 31337, ledger.Tolerating, "controller", "", t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing repair: %v, want ErrNotFound", err)
	}
	// A guard (breaker re-check) vetoes: nothing written.
	errTripped := errors.New("breaker zone=us-east-1a tripped")
	var seen store.DeletionBudget
	_, err := s.BeginDeletion(ctx, r.ID, ledger.Tolerating, "controller", "", t0,
		func(got store.Repair, b store.DeletionBudget, breakerState json.RawMessage) error {
			seen = b
			if breakerState != nil {
				return fmt.Errorf("guard got breaker state %s, none was saved", breakerState)
			}
			if got.ID != r.ID {
				return fmt.Errorf("guard got repair %d", got.ID)
			}
			return errTripped
		})
	if !errors.Is(err, errTripped) {
		t.Fatalf("guard veto: %v", err)
	}
	if seen.DeletionsPerHour != 10 || seen.MaxInFlightPerNodePool != 1 || seen.NodePool != "gpu" {
		t.Errorf("guard saw budget %+v", seen)
	}
	unchanged(t, s, r, 2)
}

// TestBeginDeletionRace: two replicas decide two deletions at the same
// moment with one unit of budget left; the budget row lock lets exactly one
// through, every time.
func TestBeginDeletionRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openWide(t, 8)
	for round := range 10 {
		cluster := fmt.Sprintf("c%d", round)
		if _, err := s.SetClusterBudget(ctx, cluster, 1, 10, t0); err != nil {
			t.Fatal(err)
		}
		var ids [2]int64
		for i := range ids {
			in := newRepair(fmt.Sprintf("n%d", i), fmt.Sprintf("pool%d", i))
			in.Cluster = cluster
			r, _, err := s.OpenRepair(ctx, in, "controller", "", t0)
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = step(t, s, r.ID, ledger.Detected, ledger.Tolerating, t0).ID
		}
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  [2]error
		)
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = s.BeginDeletion(ctx, ids[i], ledger.Tolerating, fmt.Sprintf("replica-%d", i), "", t0.Add(time.Minute))
			}()
		}
		close(start)
		wg.Wait()
		ok, exceeded := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, store.ErrBudgetExceeded):
				exceeded++
			default:
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok != 1 || exceeded != 1 {
			t.Fatalf("round %d: %d deletions began, %d refused; want 1 and 1", round, ok, exceeded)
		}
		deleting, _ := s.RepairsInState(ctx, ledger.Deleting)
		n := 0
		for _, r := range deleting {
			if r.Cluster == cluster {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("round %d: %d repairs in deleting, want 1", round, n)
		}
	}
}

// TestBeginDeletionGuardSeesBreakerState: the guards get the saved breaker
// state read through the guard transaction itself, so they are pure checks
// on values and no second connection is used while the budget row is locked.
func TestBeginDeletionGuardSeesBreakerState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	r := tolerating(t, s, "a", "gpu", false, t0)
	doc := json.RawMessage(`{"killSwitch":{"on":true}}`)
	if err := s.SaveBreakerState(ctx, doc, 0, nil, t0); err != nil {
		t.Fatal(err)
	}
	var seen json.RawMessage
	calls := 0
	out, err := s.BeginDeletion(ctx, r.ID, ledger.Tolerating, "controller", "guards passed", t0,
		func(_ store.Repair, _ store.DeletionBudget, st json.RawMessage) error { calls++; seen = st; return nil },
		func(_ store.Repair, _ store.DeletionBudget, st json.RawMessage) error { calls++; return nil })
	if err != nil || out.State != ledger.Deleting {
		t.Fatalf("BeginDeletion = %s, %v; want deleting", out.State, err)
	}
	var got, want map[string]any
	_ = json.Unmarshal(seen, &got)
	_ = json.Unmarshal(doc, &want)
	if calls != 2 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("guards called %d times, saw breaker state %s; want 2 calls seeing %s", calls, seen, doc)
	}
}
