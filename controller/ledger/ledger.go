// Package ledger defines the repair state machine (docs/design.md, decision 6):
// the states a repair passes through and the transitions allowed between
// them. It is pure; controller/store enforces it on every write and appends an
// audit entry for each transition.
package ledger

import "fmt"

// State is the state of one repair.
type State string

// Repair states. A repair is open until it reaches a terminal state; at most
// one repair per node is open at a time.
const (
	Detected         State = "detected"          // a condition-severity diagnosis exists
	Quarantined      State = "quarantined"       // condition set and NoSchedule taint applied
	Tolerating       State = "tolerating"        // waiting out the toleration window
	AwaitingApproval State = "awaiting_approval" // held by a breaker or policy, waiting for on-call
	Approved         State = "approved"          // on-call approved; goes through the guards again
	Rejected         State = "rejected"          // on-call rejected (terminal)
	Expired          State = "expired"           // approval not given in time (terminal)
	Deleting         State = "deleting"          // guards passed, NodeClaim deletion requested
	Replaced         State = "replaced"          // NodeClaim gone, Karpenter replaces the node
	Resolved         State = "resolved"          // evidence cleared before any deletion (terminal)
	Failed           State = "failed"            // the repair could not be carried out (terminal)
	Cancelled        State = "cancelled"         // node or NodeClaim vanished, or superseded (terminal)
)

// AllStates lists every state in the order of the happy path first.
var AllStates = []State{Detected, Quarantined, Tolerating, AwaitingApproval, Approved, Rejected,
	Expired, Deleting, Replaced, Resolved, Failed, Cancelled}

var transitions = map[State][]State{
	Detected:         {Quarantined, Tolerating, Resolved, Cancelled, Failed},
	Quarantined:      {Tolerating, Resolved, Cancelled, Failed},
	Tolerating:       {Deleting, AwaitingApproval, Resolved, Cancelled, Failed},
	AwaitingApproval: {Approved, Rejected, Expired, Resolved, Cancelled},
	Approved:         {Deleting, AwaitingApproval, Resolved, Cancelled, Failed},
	Deleting:         {Replaced, Failed, Cancelled},
	Replaced:         {},
	Rejected:         {},
	Expired:          {},
	Resolved:         {},
	Failed:           {},
	Cancelled:        {},
}

// Valid reports whether s is a known state.
func Valid(s State) bool {
	_, ok := transitions[s]
	return ok
}

// Terminal reports whether no transition leaves s. Replaced counts as
// terminal for the ledger: verification of the replacement is recorded on the
// repair, not as a further state.
func Terminal(s State) bool { return len(transitions[s]) == 0 }

// OpenStates lists the non-terminal states.
func OpenStates() []State {
	var out []State
	for _, s := range AllStates {
		if !Terminal(s) {
			out = append(out, s)
		}
	}
	return out
}

// ErrTransition is returned for a transition the state machine does not allow.
type ErrTransition struct{ From, To State }

func (e *ErrTransition) Error() string {
	return fmt.Sprintf("repair transition %s -> %s is not allowed", e.From, e.To)
}

// Check returns nil when from -> to is allowed, else an *ErrTransition.
func Check(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return &ErrTransition{From: from, To: to}
}
