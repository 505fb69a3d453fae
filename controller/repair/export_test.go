package repair

import (
	"context"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// EvidenceStep runs the evidence step of one node (reconcile with
// ledgerOnly, as a worker does for PriorityEvidence) and reports whether
// an open breaker holds its repair.
func EvidenceStep(ctx context.Context, r *Reconciler, cluster, node string) (held bool, err error) {
	out, err := r.reconcile(ctx, cluster, node, true)
	return out.held, err
}

// HoldEvidenceWrites makes every group of the evidence step's ledger writes
// wait before it is sent until release is called, so a test can gather
// nodes into one group; groups reports the groups sent so far, the calls
// they held and the calls waiting for a sender. r must group its writes
// (Config.EvidenceGroup > 1).
func HoldEvidenceWrites(r *Reconciler) (release func(), groups func() (sent, calls int64, waiting int)) {
	g := r.evidence.(*evidenceGroups).writes
	gate := make(chan struct{})
	send := g.send
	g.send = func(ctx context.Context, ws []store.NodeLedger, now time.Time) ([]store.NodeLedgerResult, []error) {
		<-gate
		return send(ctx, ws, now)
	}
	return func() { close(gate) }, func() (int64, int64, int) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.sent.Load(), g.calls.Load(), len(g.waiting)
	}
}
