package breaker

import "time"

// Replaced is a repair that replaced a node: the NodePool, the fault class
// it was replaced for and when the NodeClaim deletion was asked for.
type Replaced struct {
	Pool       string
	FaultClass string
	At         time.Time
}

// ReplacementFailure reports whether a failure of fault class class at time
// at, on a node of pool that joined at joined, is a replacement failing the
// same way (Signal.Replacement): a node of the same pool was replaced for
// the same fault class before the node joined, and the failure comes within
// DefaultReplacementCycle of joining. The live reconciler and the simulator
// both decide with it.
func ReplacementFailure(pool, class string, joined, at time.Time, replaced []Replaced) bool {
	if pool == "" || class == "" || class == "none" || joined.IsZero() || at.Before(joined) || at.Sub(joined) > DefaultReplacementCycle {
		return false
	}
	for _, r := range replaced {
		if r.Pool == pool && r.FaultClass == class && !r.At.After(joined) && joined.Sub(r.At) <= DefaultReplacementCycle {
			return true
		}
	}
	return false
}

// LaunchFailure reports whether a NodeClaim of pool, created at created and
// stuck without a registered Node past its registration grace, is a
// replacement that failed to launch: a node of the same pool was replaced
// (for any fault class) at or before created, within
// DefaultReplacementCycle. Such a claim counts against its pool like a
// replacement failing the same way (Signal.Replacement): deleting more of
// the pool's nodes would trade working capacity for machines that do not
// come. The live reconciler decides with it.
func LaunchFailure(pool string, created time.Time, replaced []Replaced) bool {
	if pool == "" || created.IsZero() {
		return false
	}
	for _, r := range replaced {
		if r.Pool == pool && !r.At.After(created) && created.Sub(r.At) <= DefaultReplacementCycle {
			return true
		}
	}
	return false
}
