package simulate

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

func TestScratch(t *testing.T) {
	e, _ := diagnose.New(diagnose.Options{})
	t0 := time.Date(2026, 1, 1, 3, 51, 0, 0, time.UTC)
	var fs []finding.Finding
	seq := uint64(0)
	inc := func(at time.Duration, boot string) {
		for _, x := range []struct {
			xid int
			cnt int
			ra  string
		}{{48, 1, ""}, {63, 1, ""}, {94, 4, ""}, {154, 1, "drain-and-reset"}} {
			seq++
			f := finding.Finding{Detector: "xid", Xid: x.xid, GPUPCI: "0000:9c:00.0", Count: x.cnt, Node: "node-a1", BootID: boot, Time: t0.Add(at), Seq: seq, Attrs: map[string]string{}}
			if x.ra != "" {
				f.Attrs["recovery_action"] = x.ra
			}
			f.ID = finding.NewID(f)
			fs = append(fs, f)
		}
	}
	show := func(at time.Duration, boot string) {
		ds := e.Diagnose(diagnose.Input{Node: "node-a1", BootID: boot, Findings: fs, Now: t0.Add(at)})
		for _, d := range ds {
			fmt.Println(at, d.Reason, d.Severity, d.FaultClass, d.Action, d.Escalated, d.Message)
		}
	}
	inc(0, "b1")
	show(time.Minute, "b1")
	inc(106*time.Minute, "b1")
	show(107*time.Minute, "b1")
	inc(686*time.Minute, "b1")
	show(688*time.Minute, "b1")
	inc(706*time.Minute, "b2")
	show(710*time.Minute, "b2")
}
