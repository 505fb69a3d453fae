package decide_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
)

// BenchmarkSignals: the signals of 10,000 active diagnoses (a periodic
// pass over a large fleet), into a reused buffer as the replays do.
func BenchmarkSignals(b *testing.B) {
	ds := make([]diagnose.Diagnosis, 10_000)
	for i := range ds {
		ds[i] = diagnose.Diagnosis{Cluster: "c1", Node: fmt.Sprintf("n%d", i), FaultClass: "gpu-lost",
			Severity: catalog.SeverityCondition, LastSeen: t0}
		if i%3 == 0 {
			ds[i].FaultClass, ds[i].Severity = "none", catalog.SeverityEvent
		}
	}
	var buf []breaker.Signal
	b.ReportAllocs()
	for b.Loop() {
		buf = decide.AppendSignals(buf[:0], ds, t0)
	}
}

// BenchmarkDeletion: the guard sequence on an open breaker state, the work
// done while the budget row is locked.
func BenchmarkDeletion(b *testing.B) {
	st, held, _ := openZone(b)
	g := decide.Guards{Budget: decide.Budget{DeletionsPerHour: 10, MaxInFlightPerNodePool: 1, NodePoolDeletionsPerHour: 5},
		Breakers: true, State: st, Node: held, MaxBreakerAge: time.Minute}
	b.ReportAllocs()
	for b.Loop() {
		_ = decide.Deletion(g, t0)
	}
}

// BenchmarkStep: one ledger step of a repair whose toleration is over.
func BenchmarkStep(b *testing.B) {
	r := decide.Repair{State: ledger.Tolerating, NodeClaim: "nc", NodeClaimUID: "u1", TolerationUntil: t0}
	head := diagnose.Diagnosis{Severity: catalog.SeverityCondition}
	f := decide.Facts{Action: catalog.ActionReplace, NodeClaimUID: "u1", ApprovalTTL: 24 * time.Hour}
	b.ReportAllocs()
	for b.Loop() {
		_ = decide.Step(r, head, f, t0)
	}
}
