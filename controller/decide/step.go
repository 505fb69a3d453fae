package decide

import (
	"errors"
	"fmt"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
)

// Repair is what Step reads of an open repair's ledger row.
type Repair struct {
	State ledger.State
	// NodeClaim and NodeClaimUID are the NodeClaim the repair deletes
	// ("" when no Karpenter NodeClaim owns the node).
	NodeClaim, NodeClaimUID string
	DryRun                  bool
	TolerationUntil         time.Time
	// HeldBy is HeldByBreaker or HeldByAction while awaiting approval.
	HeldBy string
	// ReleasedBy is Actor when the controller itself released a hold
	// (then the breakers guard the deletion again), else the approver or "".
	ReleasedBy string
	// Since is when the repair entered its state (the ledger row's
	// UpdatedAt): the approval expiry clock.
	Since time.Time
}

// Facts is what Step needs besides the repair and the headline diagnosis.
type Facts struct {
	// Action is the action the policy executes for the headline diagnosis
	// (policy.Effective.Action: the recommendation, or the policy file's).
	Action catalog.Action
	// NodeClaimUID is the UID of the NodeClaim that owns the node now.
	NodeClaimUID string
	// NodeGone: the Node no longer exists.
	NodeGone bool
	// ApprovalTTL is how long a repair waits for approval.
	ApprovalTTL time.Duration
	// BreakerAllows: the breakers let this node's repair go now (true when
	// breakers are off); read only for a breaker-held repair (NeedsBreakers).
	BreakerAllows bool
	// Drain takes one of this pass's paced releases (DrainPerPass) and
	// reports whether one was left; called only when a breaker-held repair
	// may be released. Nil: none left.
	Drain func() bool
	// Resumed names the human resume that closed the breaker holding the
	// repair (breaker.ResumeOf: the actor, "user:NAME", and the decision's
	// message, "breaker zone=z1 resumed by user:ada: AZ recovered"); called
	// only when a breaker-held repair is released, for its audit. Nil or ok
	// false: the breaker closed by itself (cool-down).
	Resumed func() (actor, message string, ok bool)
}

// NeedsBreakers reports whether Step reads Facts.BreakerAllows for r, so a
// caller reads the breaker state only then.
func NeedsBreakers(r Repair) bool {
	return r.State == ledger.AwaitingApproval && r.HeldBy == HeldByBreaker
}

// Kind is what the caller does to carry out a Next.
type Kind int

// Kinds of Next.
const (
	// Wait: nothing to do now; the next pass asks again.
	Wait Kind = iota
	// Transition: move the repair to Next.To, auditing Why and Detail,
	// setting Set on the repair's detail and ExecutedAction when not "".
	Transition
	// Guard: run the deletion guards (Deletion; live: in the store's guard
	// transaction, which moves the repair to deleting when they pass), then
	// AfterGuard.
	Guard
	// DeleteNodeClaim: the repair is deleting; issue the NodeClaim delete
	// with the UID precondition and, once it is gone, move the repair to
	// replaced (Replaced gives the text).
	DeleteNodeClaim
)

// Next is Step's answer.
type Next struct {
	Kind Kind
	To   ledger.State
	// Why is the audit reason.
	Why string
	// Detail is the audit entry's detail (numbers behind the decision).
	Detail map[string]any
	// Set are keys to set on the repair's detail ("held_by", "released_by").
	Set map[string]any
	// ExecutedAction, when not "", is recorded on the repair.
	ExecutedAction string
	// HumanApproved (Guard): an on-call approval overrides the breakers.
	HumanApproved bool
	// Retry (Wait after a guard) names what the caller waits for:
	// "breakers" asks for a breaker evaluation now.
	Retry string
	// Hold (Wait after a guard) names the guard holding the deletion
	// (HoldOf: budget, kill switch, opt-out, do-not-disrupt, minimum
	// healthy); "" for none.
	Hold string
}

// Step returns the next step of open repair r, whose node's headline
// diagnosis is head, at now. It encodes the ledger's policy (docs/design.md,
// "One decision model"): a node without a condition resolves its repair;
// detected -> quarantined -> tolerating; the toleration window; a changed
// NodeClaim UID cancels; a non-executable action (anything but replace,
// with Karpenter v1.14) waits for approval; no NodeClaim fails; otherwise
// the deletion guards; a held repair is released when its breakers allow
// (paced by Facts.Drain) or its diagnosis escalated to replace, and expires
// after ApprovalTTL; a deleting repair deletes its NodeClaim, or in dry run
// is cancelled with nothing deleted.
func Step(r Repair, head diagnose.Diagnosis, f Facts, now time.Time) Next {
	if f.NodeGone {
		if r.State == ledger.Deleting {
			return Deleting(r)
		}
		return Next{Kind: Transition, To: ledger.Cancelled, Why: "the Node no longer exists"}
	}
	if head.Severity != catalog.SeverityCondition {
		if r.State == ledger.Deleting {
			return Deleting(r)
		}
		return Next{Kind: Transition, To: ledger.Resolved, Why: "evidence cleared (no active condition diagnosis for the current boot)"}
	}
	switch r.State {
	case ledger.Detected:
		return Next{Kind: Transition, To: ledger.Quarantined, Why: "condition " + head.ConditionType + "=False and NoSchedule taint set"}
	case ledger.Quarantined:
		return Next{Kind: Transition, To: ledger.Tolerating, Why: fmt.Sprintf("toleration window until %s", r.TolerationUntil.Format(time.RFC3339)),
			Detail: map[string]any{"toleration_until": r.TolerationUntil}}
	case ledger.Tolerating, ledger.Approved:
		if r.State == ledger.Tolerating && now.Before(r.TolerationUntil) {
			return Next{Kind: Wait}
		}
		if r.NodeClaimUID != "" && f.NodeClaimUID != r.NodeClaimUID {
			return Next{Kind: Transition, To: ledger.Cancelled, Why: fmt.Sprintf("NodeClaim changed since the repair opened (uid %s, now %q): nothing deleted",
				r.NodeClaimUID, f.NodeClaimUID)}
		}
		if r.State == ledger.Tolerating && f.Action != catalog.ActionReplace {
			return Next{Kind: Transition, To: ledger.AwaitingApproval, Why: fmt.Sprintf(
				"recommended action %s is not executable here (NodeClaim replacement only); approve to replace the node, or reset/reboot it by hand", f.Action),
				Detail: map[string]any{"recommended_action": f.Action, "held_by": HeldByAction}, Set: map[string]any{"held_by": HeldByAction}}
		}
		if r.NodeClaim == "" {
			return Next{Kind: Transition, To: ledger.Failed, Why: "no Karpenter NodeClaim owns the node; replace it by hand"}
		}
		why := fmt.Sprintf("toleration window over; delete NodeClaim %s (uid %s)", r.NodeClaim, r.NodeClaimUID)
		if r.State == ledger.Approved {
			why = fmt.Sprintf("approved (see the approval above); delete NodeClaim %s (uid %s)", r.NodeClaim, r.NodeClaimUID)
		}
		if r.DryRun {
			why = "dry-run: " + why
		}
		return Next{Kind: Guard, To: ledger.Deleting, Why: why, HumanApproved: r.State == ledger.Approved && r.ReleasedBy != Actor}
	case ledger.AwaitingApproval:
		switch r.HeldBy {
		case HeldByAction:
			if head.Escalated && f.Action == catalog.ActionReplace {
				return released("the diagnosis escalated to replace (" + head.Message + "): no approval needed for an executable action")
			}
		case HeldByBreaker:
			if f.BreakerAllows && f.Drain != nil && f.Drain() {
				if f.Resumed != nil {
					if actor, msg, ok := f.Resumed(); ok {
						n := released("released (paced) for re-validation after " + msg)
						n.Detail["resumed_by"], n.Set["resumed_by"] = actor, actor
						return n
					}
				}
				return released("the breaker holding this repair closed; released (paced) for re-validation")
			}
		}
		if now.Sub(r.Since) < f.ApprovalTTL {
			return Next{Kind: Wait}
		}
		return Next{Kind: Transition, To: ledger.Expired, Why: fmt.Sprintf("no approval within %s", f.ApprovalTTL)}
	case ledger.Deleting:
		return Deleting(r)
	}
	return Next{Kind: Wait} // terminal
}

// Retarget reports whether an open repair in state, opened for reason,
// takes the node's headline diagnosis head as its reason now. Until its
// deletion starts a repair names the fault that decides its action
// (Facts.Action is the headline's), so a fault whose findings arrive in
// two agent reports (an AER surprise-down two seconds before its Xid 79)
// ends in the same ledger row as when they arrive in one: live
// (store.RetargetRepair), in the shadow report and in the simulator,
// whatever the timing. The toleration window, any hold and the approval
// clock stay as they are; a deleting or closed repair keeps its reason.
func Retarget(state ledger.State, reason string, head diagnose.Diagnosis) bool {
	if head.Severity != catalog.SeverityCondition || head.Reason == "" || head.Reason == reason {
		return false
	}
	switch state {
	case ledger.Detected, ledger.Quarantined, ledger.Tolerating, ledger.AwaitingApproval, ledger.Approved:
		return true
	}
	return false
}

func released(why string) Next {
	return Next{Kind: Transition, To: ledger.Approved, Why: why, Detail: map[string]any{"released_by": Actor},
		Set: map[string]any{"released_by": Actor}}
}

// Deleting is the step of a deleting repair: DeleteNodeClaim, or in dry
// run a cancellation that records the would-delete decision and deletes
// nothing (executed action "none").
func Deleting(r Repair) Next {
	if r.DryRun {
		return Next{Kind: Transition, To: ledger.Cancelled, Why: fmt.Sprintf("dry-run: NodeClaim %s would have been deleted now; nothing was deleted", r.NodeClaim),
			Detail: map[string]any{"dry_run": true}, ExecutedAction: "none"}
	}
	return Next{Kind: DeleteNodeClaim, To: ledger.Replaced}
}

// Replaced is the step once a deleting repair's NodeClaim is gone.
func Replaced(r Repair) Next {
	return Next{Kind: Transition, To: ledger.Replaced, Why: fmt.Sprintf("NodeClaim %s is gone; Karpenter replaces the node", r.NodeClaim),
		ExecutedAction: string(catalog.ActionReplace)}
}

// UIDChanged is the step when the NodeClaim delete found another NodeClaim
// under the same name.
func UIDChanged() Next {
	return Next{Kind: Transition, To: ledger.Cancelled, Why: "NodeClaim was replaced under the same name; nothing deleted"}
}

// AfterGuard maps the deletion guards' answer for a Guard step g to the
// step it leads to: nil -> deleting (g itself; live, the store already
// moved the repair); held by a breaker -> awaiting approval, naming the
// cohort; a budget, the minimum healthy count, the kill switch or a stale
// breaker state, the owners' opt-out or do-not-disrupt -> wait and retry
// (Retry "breakers" for a stale state; Hold names the others).
// Other errors are not guard decisions: it returns Wait and ok false.
func AfterGuard(g Next, err error) (next Next, ok bool) {
	switch {
	case err == nil:
		return g, true
	case errors.Is(err, ErrHeldByBreaker):
		return Next{Kind: Transition, To: ledger.AwaitingApproval, Why: "held for on-call approval: " + err.Error(),
			Detail: map[string]any{"held_by": HeldByBreaker}, Set: map[string]any{"held_by": HeldByBreaker}}, true
	case errors.Is(err, ErrBreakerStale):
		return Next{Kind: Wait, Retry: "breakers"}, true
	case HoldOf(err) != "":
		return Next{Kind: Wait, Hold: HoldOf(err)}, true
	}
	return Next{Kind: Wait}, false
}

// Suppressed reports whether a new repair for reason on a node whose
// latest repair is last (with the current NodeClaim UID) would repeat a
// settled decision: a dry run that reached its would-delete decision
// (dryRun: the controller runs dry now), or a rejection by on-call for the
// same reason. The node stays quarantined; a new reason (an escalation) or
// a new NodeClaim opens a repair again.
func Suppressed(last Repair, lastReason, uid, reason string, dryRun bool) bool {
	if last.NodeClaimUID != uid {
		return false
	}
	return dryRun && last.DryRun && last.State == ledger.Cancelled || last.State == ledger.Rejected && lastReason == reason
}
