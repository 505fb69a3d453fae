package store_test

import (
	"context"
	"testing"
	"time"
)

// TestCountFindings: the count honours the clusters, the window by the time
// a fault happened, and stops at the cap.
func TestCountFindings(t *testing.T) {
	t.Parallel()
	s := open(t)
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, r := range [][3]string{{"a", "n1", "b"}, {"a", "n2", "b"}, {"b", "n1", "b"}} {
		if _, err := s.IngestReport(ctx, report(r[0], r[1], r[2], 10, at), at); err != nil {
			t.Fatal(err)
		}
	}
	for name, tc := range map[string]struct {
		clusters    []string
		from, until time.Time
		upTo, want  int
	}{
		"every cluster":     {nil, at, at.Add(time.Hour), 100, 30},
		"one cluster":       {[]string{"a"}, at, at.Add(time.Hour), 100, 20},
		"window":            {nil, at.Add(5 * time.Second), at.Add(8 * time.Second), 100, 9},
		"capped":            {nil, at, at.Add(time.Hour), 4, 5},
		"unknown cluster":   {[]string{"zz"}, at, at.Add(time.Hour), 100, 0},
		"before everything": {nil, at.Add(-time.Hour), at, 100, 0},
	} {
		got, err := s.CountFindings(ctx, tc.clusters, tc.from, tc.until, tc.upTo)
		if err != nil || got != tc.want {
			t.Errorf("%s: %d (%v), want %d", name, got, err, tc.want)
		}
	}
}
