package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

func TestListRepairs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	// 30 repairs, one a minute: clusters c1/c2 alternate, every third is
	// resolved, reasons alternate in blocks of five.
	type row struct {
		id      int64
		cluster string
		state   ledger.State
		reason  string
		at      time.Time
	}
	var rows []row
	for i := range 30 {
		in := newRepair(fmt.Sprintf("n%02d", i), "gpu")
		in.Cluster = []string{"c1", "c2"}[i%2]
		in.Reason = []string{"GPUFallenOffBus", "GPUMemoryRowRemapFailure"}[(i/5)%2]
		at := t0.Add(time.Duration(i) * time.Minute)
		r := mustOpen(t, s, in, at)
		if i%3 == 0 {
			r = step(t, s, r.ID, ledger.Detected, ledger.Resolved, at)
		}
		rows = append(rows, row{r.ID, r.Cluster, r.State, r.Reason, at})
	}
	// expected returns the IDs matching keep, newest first.
	expected := func(keep func(row) bool) []int64 {
		var out []int64
		for i := len(rows) - 1; i >= 0; i-- {
			if keep(rows[i]) {
				out = append(out, rows[i].id)
			}
		}
		return out
	}
	// all pages through f with page size limit and checks page sizes and
	// the end-of-list cursor.
	all := func(f store.RepairFilter, limit int) []int64 {
		t.Helper()
		f.Limit = limit
		var out []int64
		for page := 0; ; page++ {
			rs, next, err := s.ListRepairs(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) > limit || (next != 0 && len(rs) != limit) {
				t.Fatalf("page %d: %d repairs, next %d, limit %d", page, len(rs), next, limit)
			}
			for _, r := range rs {
				out = append(out, r.ID)
			}
			if next == 0 {
				return out
			}
			if next != rs[len(rs)-1].ID {
				t.Fatalf("page %d: next %d, want the last ID %d", page, next, rs[len(rs)-1].ID)
			}
			f.Cursor = next
		}
	}

	for _, tc := range []struct {
		name string
		f    store.RepairFilter
		keep func(row) bool
	}{
		{"all", store.RepairFilter{}, func(row) bool { return true }},
		{"cluster", store.RepairFilter{Cluster: "c2"}, func(r row) bool { return r.cluster == "c2" }},
		{"node", store.RepairFilter{Node: "n07"}, func(r row) bool { return r.id == rows[7].id }},
		{"state", store.RepairFilter{State: ledger.Resolved}, func(r row) bool { return r.state == ledger.Resolved }},
		{"reason", store.RepairFilter{Reason: "GPUMemoryRowRemapFailure"}, func(r row) bool { return r.reason == "GPUMemoryRowRemapFailure" }},
		{"time", store.RepairFilter{Since: t0.Add(10 * time.Minute), Until: t0.Add(20 * time.Minute)},
			func(r row) bool { return !r.at.Before(t0.Add(10*time.Minute)) && r.at.Before(t0.Add(20*time.Minute)) }},
		{"combined", store.RepairFilter{Cluster: "c1", State: ledger.Detected, Since: t0.Add(5 * time.Minute)},
			func(r row) bool {
				return r.cluster == "c1" && r.state == ledger.Detected && !r.at.Before(t0.Add(5*time.Minute))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := expected(tc.keep)
			for _, limit := range []int{1, 4, 7, 100} {
				if got := all(tc.f, limit); !slices.Equal(got, want) {
					t.Errorf("limit %d: got %v\nwant %v", limit, got, want)
				}
			}
		})
	}

	// Pages stay stable while new repairs are opened between them.
	first, next, err := s.ListRepairs(ctx, store.RepairFilter{Limit: 10})
	if err != nil || len(first) != 10 {
		t.Fatal(len(first), err)
	}
	mustOpen(t, s, newRepair("late", "gpu"), t0.Add(time.Hour))
	second, _, err := s.ListRepairs(ctx, store.RepairFilter{Limit: 10, Cursor: next})
	if err != nil || second[0].ID != first[9].ID-1 {
		t.Fatalf("second page starts at %d, want %d", second[0].ID, first[9].ID-1)
	}

	if rs, _, _ := s.ListRepairs(ctx, store.RepairFilter{Limit: 1_000_000}); len(rs) != 31 {
		t.Errorf("huge limit: %d repairs", len(rs))
	}
	if _, _, err := s.ListRepairs(ctx, store.RepairFilter{State: "bogus"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("unknown state: %v, want ErrInvalid", err)
	}
	open, _ := s.RepairsInState(ctx)
	resolved, _ := s.RepairsInState(ctx, ledger.Resolved)
	if len(open) != 21 || len(resolved) != 10 {
		t.Errorf("RepairsInState: %d open, %d resolved; want 21 and 10", len(open), len(resolved))
	}
	if _, err := s.RepairsInState(ctx, "bogus"); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("RepairsInState(bogus): %v, want ErrInvalid", err)
	}
}
