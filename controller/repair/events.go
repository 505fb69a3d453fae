package repair

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

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
	ActionQuarantine, ActionHold = "Quarantine", "Hold"
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
