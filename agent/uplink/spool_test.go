package uplink

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

func controllerDown(int, finding.Report, *http.Request) (int, string) {
	return http.StatusServiceUnavailable, `{"message":"down"}`
}

func spoolConfig(dir string) func(*Config) {
	return func(c *Config) {
		c.SpoolDir = dir
		c.FlushInterval, c.HeartbeatInterval = time.Hour, time.Hour
		c.ShutdownTimeout = 200 * time.Millisecond
	}
}

func spoolExists(t *testing.T, dir string) bool {
	t.Helper()
	_, err := os.Stat(filepath.Join(dir, spoolFileName))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestSpoolSurvivesRestart: the controller is down, the agent restarts, and
// the new agent delivers what the old one could not, with the same IDs.
func TestSpoolSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	noBoot := norm("n2")
	noBoot.BootID = ""

	old := newHarness(t, controllerDown, spoolConfig(dir))
	old.u.Enqueue(norm("n1"))
	old.u.Enqueue(crit("c1"))
	old.u.Enqueue(noBoot)
	stop := old.run(t)
	old.col.next(t)     // first attempt fails
	old.clk.waitIdle(t) // waiting to retry; the snapshot is on disk
	if !spoolExists(t, dir) || old.metric(t, mp+"spool_findings") != 3 {
		t.Fatalf("no checkpoint after a failed attempt (spool_findings = %v)", old.metric(t, mp+"spool_findings"))
	}
	old.u.Enqueue(norm("n3")) // arrives during the outage
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil: the undelivered findings are spooled", err)
	}
	if got := old.metric(t, mp+"dropped_total", "reason", DropShutdown); got != 0 {
		t.Fatalf("dropped_total{shutdown} = %v, want 0 with a spool", got)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("spool dir: %v, %v; want mode 0700", fi, err)
	}

	restarted := newHarness(t, nil, spoolConfig(dir))
	if got := restarted.metric(t, mp+"queue_length"); got != 4 {
		t.Fatalf("queue_length after restart = %v, want 4", got)
	}
	restarted.run(t)
	r := restarted.col.next(t) // c1 is critical: sent at once
	if got := r.ids(); !slices.Equal(got, []string{"n1", "c1", "n2", "n3"}) {
		t.Fatalf("after restart the controller got %v", got)
	}
	for _, f := range r.report.Findings {
		if f.BootID != "boot-1" {
			t.Errorf("finding %s has bootID %q, want the boot it was seen in", f.ID, f.BootID)
		}
	}
	restarted.clk.waitIdle(t)
	if spoolExists(t, dir) {
		t.Error("spool file still there after everything was delivered")
	}
	if got := restarted.metric(t, mp+"spool_findings"); got != 0 {
		t.Errorf("spool_findings = %v, want 0", got)
	}
}

// TestSpoolCheckpointSurvivesCrash: the agent dies without shutting down
// while the controller is down; the checkpoint taken after the failed
// attempt is enough for the next start.
func TestSpoolCheckpointSurvivesCrash(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	crashed := newHarness(t, controllerDown, spoolConfig(dir))
	crashed.u.Enqueue(crit("c1"))
	crashed.run(t)
	crashed.col.next(t)
	crashed.clk.waitIdle(t)
	// The first agent is never stopped before the second starts: a crash.

	next := newHarness(t, nil, spoolConfig(dir))
	next.run(t)
	if got := next.col.next(t).ids(); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("after the crash the controller got %v", got)
	}
}

func TestSpoolSaveBounded(t *testing.T) {
	t.Parallel()
	fs := []finding.Finding{norm("n1"), crit("c1"), norm("n2"), crit("c2"), norm("n3")}
	header, _ := json.Marshal(spoolHeader{Format: spoolFormat, Node: "node-a1", SavedAt: t0})
	size := func(n int) int64 { // header plus n findings (all the same size)
		line, _ := json.Marshal(fs[0])
		return int64(len(header)+1) + int64(n)*int64(len(line)+1)
	}
	tests := []struct {
		name     string
		maxBytes int64
		want     []string
	}{
		{"all fit", size(5), []string{"n1", "c1", "n2", "c2", "n3"}},
		{"oldest non-critical left out first", size(3), []string{"c1", "c2", "n3"}},
		{"then the oldest critical", size(1), []string{"c2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := &spool{dir: t.TempDir(), maxBytes: tt.maxBytes, node: "node-a1"}
			omitted, err := s.save(slices.Clone(fs), DefaultCritical, t0)
			if err != nil {
				t.Fatal(err)
			}
			if omitted != len(fs)-len(tt.want) {
				t.Errorf("omitted = %d, want %d", omitted, len(fs)-len(tt.want))
			}
			if fi, err := os.Stat(s.path()); err != nil || fi.Size() > tt.maxBytes {
				t.Errorf("spool file: %v, %v; want at most %d bytes", fi, err, tt.maxBytes)
			}
			got, skipped, err := (&spool{dir: s.dir, maxBytes: tt.maxBytes}).load()
			if err != nil || skipped != 0 {
				t.Fatalf("load: %v, skipped %d", err, skipped)
			}
			var ids []string
			for _, f := range got {
				ids = append(ids, f.ID)
			}
			if !slices.Equal(ids, tt.want) {
				t.Errorf("spooled %v, want %v", ids, tt.want)
			}
		})
	}
}

func TestSpoolLoadDamaged(t *testing.T) {
	t.Parallel()
	line := func(v any) string { b, _ := json.Marshal(v); return string(b) + "\n" }
	header := line(spoolHeader{Format: spoolFormat})
	tests := []struct {
		name        string
		content     string
		wantIDs     []string
		wantSkipped float64
		wantLog     string
	}{
		{"torn last line", header + line(crit("c1")) + `{"id":"c2","dete`, []string{"c1"}, 1, "skip unreadable findings"},
		{"garbage in the middle", header + line(norm("n1")) + "\x00\x00garbage\n" + line(norm("n2")), []string{"n1", "n2"}, 1, "skip unreadable"},
		{"unknown format", line(spoolHeader{Format: "something/v9"}) + line(norm("n1")), nil, 0, "ignore unreadable spool"},
		{"empty file", "", nil, 0, "ignore unreadable spool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, spoolFileName), []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			stale := filepath.Join(dir, "."+spoolFileName+"-123.tmp") // left by a crash mid-save
			if err := os.WriteFile(stale, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, nil, spoolConfig(dir))
			var ids []string
			for _, f := range h.u.q.take(100) {
				ids = append(ids, f.ID)
			}
			if !slices.Equal(ids, tt.wantIDs) {
				t.Errorf("loaded %v, want %v", ids, tt.wantIDs)
			}
			if got := h.metric(t, mp+"dropped_total", "reason", DropSpoolCorrupt); got != tt.wantSkipped {
				t.Errorf("dropped_total{spool_corrupt} = %v, want %v", got, tt.wantSkipped)
			}
			if !strings.Contains(h.logs.String(), tt.wantLog) {
				t.Errorf("log lacks %q:\n%s", tt.wantLog, h.logs.String())
			}
			if _, err := os.Stat(stale); !os.IsNotExist(err) {
				t.Errorf("stale temporary file not removed: %v", err)
			}
		})
	}
}
