package repair_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/expect"
)

// TestRepairFollowsHeadline: a GPU that falls off the bus shows an AER
// surprise-down before its Xid 79. Arriving in two reports, reconciled in
// between, the first opens a PCIeFatalError repair (reboot: would wait
// for on-call); the second makes GPULost the headline, and the repair is
// renamed (audited, same state, same toleration), then replaced without
// an approval, as if both had arrived in one report.
func TestRepairFollowsHeadline(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	e.ingest(t, "node-lost", finding.Finding{Detector: finding.DetectorAERFatal, GPUPCI: "0000:02:00.0", DevicePCI: "0000:00:01.0",
		Attrs: map[string]string{finding.AttrErrors: "SurpriseDown"}, Evidence: []string{"pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received"}})
	e.reconcile(t, "node-lost")
	first := e.open(t, "node-lost")
	if first.Reason != catalog.ReasonPCIeFatalError || first.State != ledger.Tolerating {
		t.Fatalf("repair after the AER report = %s %s, want PCIeFatalError tolerating", first.Reason, first.State)
	}

	e.clock.Add(2 * time.Second)
	e.ingest(t, "node-lost", xid79())
	e.reconcile(t, "node-lost")
	r := e.open(t, "node-lost")
	if r.ID != first.ID || r.Reason != catalog.ReasonGPULost || r.RecommendedAction != string(catalog.ActionReplace) ||
		r.State != ledger.Tolerating || !r.TolerationUntil.Equal(first.TolerationUntil) || !r.UpdatedAt.Equal(first.UpdatedAt) {
		t.Fatalf("repair after Xid 79 = %+v; want repair %d renamed GPULost/replace, still tolerating until %v (updated %v)",
			r, first.ID, first.TolerationUntil, first.UpdatedAt)
	}
	audit, err := e.st.RepairAudit(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	last := audit[len(audit)-1]
	if last.From != ledger.Tolerating || last.To != ledger.Tolerating || last.Detail["from_reason"] != catalog.ReasonPCIeFatalError ||
		last.Detail["to_reason"] != catalog.ReasonGPULost {
		t.Fatalf("last audit entry %+v; want tolerating -> tolerating, PCIeFatalError to GPULost", last)
	}

	e.clock.Add(11 * time.Minute)
	e.reconcile(t, "node-lost")
	expect.ExpectNodeClaimDeleting(t, e.k.Client(), "node-lost-nc")
	rs, _, err := e.st.ListRepairs(ctx, store.RepairFilter{Node: "node-lost"})
	if err != nil || len(rs) != 1 || rs[0].Reason != catalog.ReasonGPULost || rs[0].State != ledger.Deleting {
		t.Fatalf("repairs = %+v (%v); want one, GPULost, deleting without an approval", rs, err)
	}
}
