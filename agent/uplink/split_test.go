package uplink

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// TestTooLargeBatchIsSplit: a report the controller refuses as too large
// (413) is split in halves until each part fits; every finding is delivered
// exactly once and none is dropped. While a part waits for a retry the spool
// keeps every finding not delivered yet, even after another part was
// accepted, and it is removed only once the last part is.
func TestTooLargeBatchIsSplit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var mu sync.Mutex
	accepted := map[string]int{}
	failedOnce := false
	h := newHarness(t, func(_ int, rep finding.Report, _ *http.Request) (int, string) {
		if len(rep.Findings) > 2 {
			return http.StatusRequestEntityTooLarge, `{"message":"report too large","detail":"the body is over 4194304 bytes"}`
		}
		mu.Lock()
		defer mu.Unlock()
		if len(rep.Findings) > 0 && rep.Findings[0].ID == "f4" && !failedOnce {
			failedOnce = true
			return http.StatusServiceUnavailable, `{"message":"database unavailable"}`
		}
		for _, f := range rep.Findings {
			accepted[f.ID]++
		}
		return http.StatusOK, `{}`
	}, func(c *Config) {
		spoolConfig(dir)(c)
		c.BatchSize = 8
	})
	for _, id := range idList(8, "f") {
		h.u.Enqueue(norm(id))
	}
	h.run(t)
	h.clk.waitIdle(t) // [f4 f5] answered 503: waiting to retry
	mu.Lock()
	if got := len(accepted); got != 4 {
		mu.Unlock()
		t.Fatalf("before the retry %d findings accepted (%v), want f0..f3", got, accepted)
	}
	mu.Unlock()
	b, err := os.ReadFile(filepath.Join(dir, spoolFileName))
	if err != nil {
		t.Fatalf("spool while a part waits: %v (the parts not delivered yet must be on disk)", err)
	}
	for _, id := range []string{"f4", "f5", "f6", "f7"} {
		if !strings.Contains(string(b), `"id":"`+id+`"`) {
			t.Fatalf("spool lacks %s, not delivered yet:\n%s", id, b)
		}
	}
	h.clk.Step(time.Minute)
	deadline := time.Now().Add(guard)
	for {
		mu.Lock()
		n := len(accepted)
		mu.Unlock()
		if n == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of 8 findings accepted", n)
		}
		time.Sleep(time.Millisecond)
	}
	h.clk.waitIdle(t)
	mu.Lock()
	for _, id := range idList(8, "f") {
		if accepted[id] != 1 {
			t.Errorf("finding %s accepted %d times, want once", id, accepted[id])
		}
	}
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range accepted {
			if !yield(id) {
				return
			}
		}
	})
	mu.Unlock()
	if len(ids) != 8 {
		t.Fatalf("accepted %v", ids)
	}
	if got := h.metric(t, mp+"dropped_total", "reason", DropRejected); got != 0 {
		t.Errorf("dropped_total{rejected} = %v, want 0", got)
	}
	if spoolExists(t, dir) {
		t.Errorf("spool still on disk after every part was delivered")
	}
}

// TestTooLargeSingleFindingIsDropped: a single finding over the limit
// cannot be split; it is dropped and counted, and the agent goes on.
func TestTooLargeSingleFindingIsDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(_ int, rep finding.Report, _ *http.Request) (int, string) {
		if len(rep.Findings) == 1 && rep.Findings[0].ID == "huge" {
			return http.StatusRequestEntityTooLarge, `{"message":"report too large"}`
		}
		return http.StatusOK, `{}`
	}, func(c *Config) { c.FlushInterval, c.HeartbeatInterval = time.Hour, time.Hour })
	h.u.Enqueue(crit("huge"))
	h.run(t)
	if got := h.col.next(t).ids(); !slices.Equal(got, []string{"huge"}) {
		t.Fatalf("first report %v", got)
	}
	h.clk.waitIdle(t)
	h.col.none(t)
	if got := h.metric(t, mp+"dropped_total", "reason", DropRejected); got != 1 {
		t.Errorf("dropped_total{rejected} = %v, want 1", got)
	}
}
