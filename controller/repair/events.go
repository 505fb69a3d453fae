package repair

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Reasons of the Events a repair's steps write on its Node and NodeClaim
// (docs/design.md, "Events"), so `kubectl describe node` and `kubectl
// describe nodeclaim` tell the repair's story. Diagnosis Events use the
// catalog's reason codes instead. Each is recorded once per fact: at the
// ledger transition, or when a hold starts (the ledger's "waiting_on").
const (
	ReasonQuarantined            = "Quarantined"            // condition False and the NoSchedule taint set
	ReasonNodeClaimDeleted       = "NodeClaimDeleted"       // the NodeClaim delete was issued
	ReasonDryRunDeletion         = "DryRunDeletion"         // dry run: it would have been deleted now
	ReasonAwaitingApproval       = "RepairAwaitingApproval" // the action is not executable: on-call decides
	ReasonHeldByBreaker          = "RepairHeldByBreaker"    // a cohort breaker holds it for on-call
	ReasonHeldByBudget           = "RepairHeldByBudget"     // a deletion budget delays it
	ReasonHeldByMinHealthy       = "RepairHeldByMinHealthy" // the NodePool is below its minimum healthy count
	ReasonHeldByKillSwitch       = "RepairHeldByKillSwitch" // the kill switch stops every deletion
	ReasonHeldByDoNotDisrupt     = "RepairHeldByDoNotDisrupt"
	ReasonOptedOut               = "RepairOptedOut"
	ReasonNodeClaimStuck         = "NodeClaimStuck" // stuck in Karpenter's lifecycle (TellStuck)
	ActionQuarantine, ActionHold = "Quarantine", "Hold"
	ActionObserve                = "Observe"
	ActionDeleteNodeClaim        = "DeleteNodeClaim"
)

// holdReasons maps a guard hold (decide.Hold*) to its Event reason and
// type: the owners' holds are their choice (Normal), the others need
// someone's attention (Warning).
var holdReasons = map[string]struct{ reason, typ string }{
	decide.HoldBudget:       {ReasonHeldByBudget, corev1.EventTypeWarning},
	decide.HoldMinHealthy:   {ReasonHeldByMinHealthy, corev1.EventTypeWarning},
	decide.HoldKillSwitch:   {ReasonHeldByKillSwitch, corev1.EventTypeWarning},
	decide.HoldDoNotDisrupt: {ReasonHeldByDoNotDisrupt, corev1.EventTypeNormal},
	decide.HoldOptOut:       {ReasonOptedOut, corev1.EventTypeNormal},
}

// tell records ev about repair rp's Node and NodeClaim (Config.Events; nil
// records nothing).
func (r *Reconciler) tell(rp store.Repair, ev kube.Event) {
	k := r.kubeFor(rp.Cluster)
	if r.cfg.Events == nil || k == nil {
		return
	}
	if ev.Note != "" {
		ev.Note = fmt.Sprintf("repair %d (%s): %s", rp.ID, rp.Reason, ev.Note)
	}
	r.cfg.Events.Record(k, kube.Subject{Node: rp.Node, NodeClaim: rp.NodeClaim, NodeClaimUID: types.UID(rp.NodeClaimUID)}, ev)
}

// tellTransition records the Event of a ledger transition worth one:
// quarantine, a hold for on-call, a dry-run deletion.
func (r *Reconciler) tellTransition(rp store.Repair, next decide.Next) {
	switch {
	case next.To == ledger.Quarantined:
		r.tell(rp, kube.Event{Type: corev1.EventTypeWarning, Reason: ReasonQuarantined, Action: ActionQuarantine,
			Note: next.Why + " (" + kube.QuarantineTaintKey + ")"})
	case next.To == ledger.AwaitingApproval && next.Set["held_by"] == decide.HeldByBreaker:
		r.tell(rp, kube.Event{Type: corev1.EventTypeWarning, Reason: ReasonHeldByBreaker, Action: ActionHold, Note: next.Why})
	case next.To == ledger.AwaitingApproval:
		r.tell(rp, kube.Event{Type: corev1.EventTypeWarning, Reason: ReasonAwaitingApproval, Action: ActionHold, Note: next.Why})
	case next.To == ledger.Cancelled && next.Detail["dry_run"] == true:
		r.tell(rp, kube.Event{Type: corev1.EventTypeNormal, Reason: ReasonDryRunDeletion, Action: ActionDeleteNodeClaim, Note: next.Why})
	}
}

// held records that a guard holds repair rp's deletion (hold, a
// decide.Hold* name; why, the guard's words): once per hold, not per pass
// — an audit entry and the detail's "waiting_on" in the ledger, and an
// Event. A hold already recorded returns at once. A failed write is
// returned: the next pass records it again.
func (r *Reconciler) held(ctx context.Context, rp store.Repair, hold string, why error) error {
	if cur, _ := rp.Detail["waiting_on"].(string); cur == hold {
		return nil
	}
	words := guardWords(why)
	if err := r.cfg.Store.NoteRepair(ctx, rp.ID, Actor, "deletion held ("+hold+"): "+words,
		map[string]any{"waiting_on": hold, "waiting_why": words}, r.cfg.Now()); err != nil {
		return fmt.Errorf("record hold of repair %d: %w", rp.ID, err)
	}
	h := holdReasons[hold]
	r.tell(rp, kube.Event{Type: h.typ, Reason: h.reason, Action: ActionHold, Note: "NodeClaim deletion held: " + words})
	return nil
}

// guardWords is a guard refusal without the wrapping of the guard
// transaction ("begin deletion of repair 7: guard: "): the guard's own
// words, for the audit and the Event.
func guardWords(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "guard: "); i >= 0 {
		return msg[i+len("guard: "):]
	}
	if strings.HasPrefix(msg, "begin deletion of repair ") {
		if i := strings.Index(msg, ": "); i >= 0 {
			return msg[i+2:]
		}
	}
	return msg
}

// StuckClaim is a NodeClaim stuck in Karpenter's lifecycle as the periodic
// pass classifies it (controller/lifecycle: stuck terminating, not
// registered, no Node, not initialized).
type StuckClaim struct {
	Name  string // the NodeClaim
	Node  string // its Node, "" before registration
	State string // the lifecycle state ("stuck-terminating", ...)
	// Detail says why, in words, with the numbers ("deletion pending 7d 2h,
	// past the termination grace of 1h; finalizers karpenter.sh/termination").
	Detail string
}

// TellStuck records a Warning Event NodeClaimStuck on each NodeClaim of
// cluster in stuck (and on its Node, when it has one) that was not already
// told in that state: one Event per NodeClaim and stuck state, not one per
// pass. stuck is the cluster's whole stuck list now: a NodeClaim left out
// is no longer stuck and is told again if it gets stuck again. fleetrepair
// writes nothing else for a lifecycle state (docs/design.md). The
// NodeClaim's UID is read from the cluster (its cache, for a cached
// cluster); one that is gone is skipped.
func (r *Reconciler) TellStuck(ctx context.Context, cluster string, stuck []StuckClaim) {
	k := r.kubeFor(cluster)
	if k == nil {
		return
	}
	r.mu.Lock()
	if r.stuckTold == nil {
		r.stuckTold = map[string]map[string]string{}
	}
	prev := r.stuckTold[cluster]
	now := make(map[string]string, len(stuck))
	var tell []StuckClaim
	for _, c := range stuck {
		now[c.Name] = c.State
		if prev[c.Name] != c.State {
			tell = append(tell, c)
		}
	}
	r.stuckTold[cluster] = now
	r.mu.Unlock()
	for _, c := range tell {
		var nc karpv1.NodeClaim
		if err := k.Client().Get(ctx, client.ObjectKey{Name: c.Name}, &nc); err != nil {
			if !apierrors.IsNotFound(err) {
				r.log.WarnContext(ctx, "stuck nodeclaim event", "cluster", cluster, "nodeclaim", c.Name, "err", err)
				r.forgetStuck(cluster, c.Name) // told on the next pass
			}
			continue
		}
		ev := kube.Event{Type: corev1.EventTypeWarning, Reason: ReasonNodeClaimStuck, Action: ActionObserve,
			Note: c.State + ": " + c.Detail + " (fleetrepair deletes nothing for it and removes no finalizer)"}
		if c.Node != "" {
			r.cfg.Events.Record(k, kube.Subject{Node: c.Node, NodeClaim: c.Name, NodeClaimUID: nc.UID}, ev)
		} else {
			r.cfg.Events.RecordNodeClaim(k, c.Name, nc.UID, ev)
		}
	}
}

// forgetStuck drops what TellStuck told of one NodeClaim.
func (r *Reconciler) forgetStuck(cluster, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.stuckTold[cluster], name)
}
