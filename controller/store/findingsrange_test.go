package store_test

import (
	"context"
	"testing"
	"time"
)

// TestFindingsForNodeRange pages forward: the oldest first within
// [since, until), where FindingsForNode returns the newest.
func TestFindingsForNodeRange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if _, err := s.IngestReport(ctx, report("c1", "n1", "b1", 10, t0), t0); err != nil {
		t.Fatal(err)
	}
	page, err := s.FindingsForNodeRange(ctx, "c1", "n1", t0.Add(2*time.Second), t0.Add(8*time.Second), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 3 || !page[0].Time.Equal(t0.Add(2*time.Second)) || !page[2].Time.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("first page = %d findings from %v, want 3 from t0+2s to t0+4s", len(page), page)
	}
	all, err := s.FindingsForNodeRange(ctx, "c1", "n1", t0.Add(2*time.Second), t0.Add(8*time.Second), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 6 || !all[5].Time.Equal(t0.Add(7*time.Second)) {
		t.Fatalf("range = %d findings, want 6 ending at t0+7s (until excluded)", len(all))
	}
	for _, f := range all {
		if !f.Received.Equal(t0) {
			t.Errorf("finding %s received %v, want t0 (the report's ingest time)", f.ID, f.Received)
		}
	}
	newest, _ := s.FindingsForNode(ctx, "c1", "n1", t0, 3)
	if len(newest) != 3 || !newest[0].Time.Equal(t0.Add(7*time.Second)) {
		t.Fatalf("FindingsForNode = %d findings, want the newest 3 from t0+7s", len(newest))
	}
}
