package kmsg

import (
	"strings"
	"testing"
	"time"
)

// TestCompleteYear: a date without a year never lands in the future beyond
// the largest zone offset (+14 h), around New Year too.
func TestCompleteYear(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		now, stamp, want string // stamp: "Jan _2 15:04:05"
	}{
		// The reported bug: scanning on 2026-12-01, "Dec  2 11:38:27" was put 18 h ahead.
		{"2026-12-01T17:40:00Z", "Dec  2 11:38:27", "2025-12-02T11:38:27Z"},
		{"2026-12-01T17:40:00Z", "Dec 31 00:00:00", "2025-12-31T00:00:00Z"},
		{"2026-12-01T17:40:00Z", "Dec  1 17:00:00", "2026-12-01T17:00:00Z"},
		// Up to 14 h ahead is a node in a zone east of the reader.
		{"2026-12-01T17:40:00Z", "Dec  2 07:40:00", "2026-12-02T07:40:00Z"},
		{"2026-12-01T17:40:00Z", "Dec  2 07:40:01", "2025-12-02T07:40:01Z"},
		// New Year: last December read on Jan 1 is last year's...
		{"2027-01-01T00:30:00Z", "Dec 31 23:59:59", "2026-12-31T23:59:59Z"},
		{"2027-01-01T00:30:00Z", "Jan  1 00:10:00", "2027-01-01T00:10:00Z"},
		{"2027-01-01T00:30:00Z", "Jan  1 15:00:00", "2026-01-01T15:00:00Z"},
		// ...and a node already in the new year, read on Dec 31, is next year's.
		{"2026-12-31T23:00:00Z", "Jan  1 05:00:00", "2027-01-01T05:00:00Z"},
		{"2026-12-31T23:00:00Z", "Dec 31 22:59:00", "2026-12-31T22:59:00Z"},
		// Feb 29 goes to the latest leap year that is not in the future.
		{"2026-12-01T12:00:00Z", "Feb 29 10:00:00", "2024-02-29T10:00:00Z"},
		{"2028-02-29T12:00:00Z", "Feb 29 10:00:00", "2028-02-29T10:00:00Z"},
	}
	for _, tt := range tests {
		v, err := time.Parse("Jan _2 15:04:05", tt.stamp)
		if err != nil {
			t.Fatal(err)
		}
		now := at(tt.now)
		got := CompleteYear(v, now)
		if !got.Equal(at(tt.want)) {
			t.Errorf("CompleteYear(%q, now %s) = %s, want %s", tt.stamp, tt.now, got.Format(time.RFC3339), tt.want)
		}
		if got.After(now.Add(MaxZoneAhead)) {
			t.Errorf("CompleteYear(%q, now %s) = %s: later than now + 14 h", tt.stamp, tt.now, got)
		}
	}
}

// TestParseTextYearAgainstNow: the syslog parser uses CompleteYear against
// TextOptions.Now; an explicit Year is kept as given.
func TestParseTextYearAgainstNow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 17, 40, 0, 0, time.UTC)
	in := "Dec  2 11:38:27 h kernel: a\nDec 31 10:00:00 h kernel: b\nDec  1 09:00:00 h kernel: c\n"
	recs, _, err := ParseText(strings.NewReader(in), FormatSyslog, TextOptions{Location: time.UTC, Now: now})
	if err != nil || len(recs) != 3 {
		t.Fatalf("records %d, err %v", len(recs), err)
	}
	for i, want := range []string{"2025-12-02T11:38:27Z", "2025-12-31T10:00:00Z", "2026-12-01T09:00:00Z"} {
		if got := recs[i].Time.Format(time.RFC3339); got != want {
			t.Errorf("record %d (%q): time %s, want %s", i, recs[i].Raw, got, want)
		}
	}
	recs, _, _ = ParseText(strings.NewReader(in), FormatSyslog, TextOptions{Location: time.UTC, Now: now, Year: 2030})
	if got := recs[0].Time.Year(); got != 2030 {
		t.Errorf("explicit Year: got %d, want 2030", got)
	}
}
