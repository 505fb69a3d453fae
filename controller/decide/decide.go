// Package decide is the repair ledger's policy as pure functions, the one
// model that the live reconciler (controller/repair), the shadow report
// (controller/shadow) and the simulator (controller/simulate) all call:
//
//   - Signals: which diagnoses are cohort breaker signals;
//   - Budget.Allows and Deletion: whether the deletion guards (budgets,
//     kill switch, breakers, their freshness, minimum healthy) let a
//     NodeClaim deletion through;
//   - Step and AfterGuard: which step an open repair takes next, with the
//     audit text the ledger records.
//
// It does no I/O (no net, os, database or Kubernetes imports, checked by a
// test) and reads no clock: every function that depends on time takes
// now. Callers gather the facts (the ledger row, the headline diagnosis,
// budget counts, breaker state), call decide, and carry out its answer.
// The rules and why they are so are in docs/design.md ("One decision
// model").
package decide

import (
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

// Actor is the audit identity of the controller's own decisions.
const Actor = "controller"

// Held reasons, recorded in a repair's detail under "held_by".
const (
	HeldByBreaker = "breaker"
	HeldByAction  = "action"
)

// Fault classes that are never breaker signals.
const (
	// FaultClassNone: informational diagnoses (an application's Xid 13 is
	// the workload's, not the node's).
	FaultClassNone = "none"
	// FaultClassProvisioning: a NodeClaim that never registered a Node.
	// It is a launch failure of new capacity (image, user data, network,
	// cloud capacity), not a failure of a running node of the cohort, and
	// it has no Node, so it has no place in the breakers' fleet; counting
	// it would let a launch problem pause the repair of broken hardware.
	// Replacements that fail are replacement verification's to judge
	// (controller/repair verify.go).
	FaultClassProvisioning = "provisioning"
)

// IsSignal reports whether a diagnosis of this fault class and severity is
// a breaker signal: fault class neither none nor provisioning, severity
// condition or event (an Xid 31 event on every node of one driver version
// is the correlation the breaker exists for; see breaker.Signal).
func IsSignal(faultClass string, severity catalog.Severity) bool {
	return faultClass != FaultClassNone && faultClass != FaultClassProvisioning && severity != catalog.SeverityNone
}

// NodeName is the breaker's name of a node: "cluster/node", or the node
// alone without a cluster (the simulator's single-cluster fleet). Node
// names repeat across clusters.
func NodeName(cluster, node string) string {
	if cluster == "" {
		return node
	}
	return cluster + "/" + node
}

// Signals returns the breaker signals of a set of active diagnoses at now:
// each signal diagnosis (IsSignal) is a new-failure signal at its
// LastSeen, and one of condition severity also an ongoing signal at now
// (its fault is still there: it keeps an open breaker from cooling down
// but counts towards no trip; see breaker.Signal). A repair waiting for
// approval still sends its ongoing signal: the node is still broken. The
// node is named NodeName(d.Cluster, d.Node).
func Signals(ds []diagnose.Diagnosis, now time.Time) []breaker.Signal {
	return AppendSignals(nil, ds, now)
}

// AppendSignals is Signals appending to dst (replays reuse one buffer).
func AppendSignals(dst []breaker.Signal, ds []diagnose.Diagnosis, now time.Time) []breaker.Signal {
	return AppendReplacementSignals(dst, ds, now, nil, nil)
}

// Joined says where and when a node joined: its NodePool (named like the
// Pool of breaker.Replaced) and the time, zero when unknown.
type Joined func(cluster, node string) (pool string, at time.Time)

// AppendReplacementSignals is AppendSignals that also marks the new-failure
// signals of replacement machines failing the same way as the nodes they
// replaced (Signal.Replacement, by breaker.ReplacementFailure over
// replaced); joined nil marks none.
func AppendReplacementSignals(dst []breaker.Signal, ds []diagnose.Diagnosis, now time.Time, joined Joined, replaced []breaker.Replaced) []breaker.Signal {
	var cluster, name, node string // one name per run of a node's diagnoses
	var pool string
	var at time.Time
	for _, d := range ds {
		if !IsSignal(d.FaultClass, d.Severity) {
			continue
		}
		if node == "" || d.Cluster != cluster || d.Node != name {
			cluster, name, node = d.Cluster, d.Node, NodeName(d.Cluster, d.Node)
			if joined != nil && len(replaced) > 0 {
				pool, at = joined(d.Cluster, d.Node)
			}
		}
		rep := len(replaced) > 0 && joined != nil && breaker.ReplacementFailure(pool, d.FaultClass, at, d.LastSeen, replaced)
		dst = append(dst, breaker.Signal{Node: node, At: d.LastSeen, Replacement: rep})
		if d.Severity == catalog.SeverityCondition {
			dst = append(dst, breaker.Signal{Node: node, At: now, Ongoing: true})
		}
	}
	return dst
}

// Toleration returns the toleration a new repair waits out: the policy's
// (catalog default, policy file or override), or zero when the headline
// diagnosis is escalated (the first remedy already failed: waiting again
// helps nothing). It is fixed when the repair opens; an escalation during
// an open repair does not cut it short.
func Toleration(head diagnose.Diagnosis, policy time.Duration) time.Duration {
	if head.Escalated {
		return 0
	}
	return policy
}
