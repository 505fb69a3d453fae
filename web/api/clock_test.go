package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// TestPastSentAtDoesNotFreezeNode: a node whose clock went back a year (an
// RTC reset at boot) still has its new boot applied, and its fresh Xid is
// stored at the time it happened by the controller's clock, not a year
// ago, where no diagnosis window would see it; the agent's own time stays
// in the finding's attrs.
func TestPastSentAtDoesNotFreezeNode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	send := func(boot string, sentAt time.Time, fs ...finding.Finding) {
		t.Helper()
		e.sendAt(t, boot, sentAt, fs...)
	}
	now := time.Now()
	send("boot-1", now)
	behind := now.Add(-365 * 24 * time.Hour)
	x := xid("after-reboot", 79)
	x.Time = behind.Add(-10 * time.Second)
	send("boot-2", behind, x)
	n, err := e.st.GetNode(ctx, "c1", "n1")
	if err != nil || n.BootID != "boot-2" {
		t.Fatalf("after a reboot with the clock a year behind, node boot ID = %q (%v), want boot-2", n.BootID, err)
	}
	fs, _ := e.st.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	if len(fs) != 1 {
		t.Fatalf("stored %d findings, want 1", len(fs))
	}
	if d := now.Sub(fs[0].Time); d < 0 || d > time.Minute {
		t.Fatalf("finding stored at %s, %s before the controller's clock; want about 10s (moved by the agent's measured offset)", fs[0].Time, d)
	}
	if got := fs[0].Attrs["agent_time"]; got != x.Time.UTC().Format(time.RFC3339Nano) {
		t.Fatalf("agent_time = %q, want the agent's own time %s", got, x.Time.UTC().Format(time.RFC3339Nano))
	}
	// A clock within the allowed skew is left alone.
	y := xid("in-skew", 79)
	y.Time = now.Add(-2 * time.Minute).Truncate(time.Microsecond)
	send("boot-2", now.Add(-time.Minute), y)
	fs, _ = e.st.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	for _, f := range fs {
		if f.ID == "in-skew" && (!f.Time.Equal(y.Time) || f.Attrs["agent_time"] != "") {
			t.Fatalf("a finding of an agent within the skew was moved: %+v", f)
		}
	}
}
